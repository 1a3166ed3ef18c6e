#!/bin/sh
# test_neox: a GPT-NeoX deck (partial rotary embeddings, the parallel residual, attention biases, gelu, an
# untied head) and a Llama deck (grouped-query attention, 2 key/value heads of 4; Llama 3's scaled rotary
# embedding; attention_types left to the architecture) through greenlm's tasks on real processes:
#   - trained on 2 pipeline stages, and the same run stopped half-way and restarted from its checkpoint:
#     bitwise the same parameters (the verdicts' param_hash);
#   - eval on 1 and 2 ranks gives the same scores; sample generates;
#   - export writes a GPTNeoXForCausalLM (LlamaForCausalLM) directory, and eval from it (&model init_from)
#     scores as the checkpoint did.
. "$(dirname "$0")/lib.sh"
# one_arch NAME MODEL_TYPE MODEL_KEYS: the whole case for one architecture, in $TEST_OUT/NAME
one_arch() {
arch_name=$1 model_type=$2 model=$3
fresh_out "$arch_name"
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', 'train', seed = 3, run_dir = '$out/run', log_every = 4 /
$(genesis_prepare)
&data train = '$out/train.nc', val = '$out/val.nc' /
&model vocab_size = 256, block_size = 64, n_layer = 2, n_embd = 64, n_head = 4, $model /
&training seq_len = 32, micro_batch_size = 4, global_batch_size = 8, max_steps = 12, lr = 3e-3,
  warmup_steps = 2, eval_every = 0, eval_batches = 2 /
&parallel pipeline_stages = 2 /
&checkpoint dir = '$out/ckpt', every_steps = 6 /
&sample n_tokens = 8, prompt = 'And God' /
&system peak_gflops = 100 /
EOD
run() { # run NP NAME [--set ...]: the deck on NP ranks, output in NAME.out
  np=$1 name=$2; shift 2
  $MPIEXEC -n "$np" "$GREENLM" "$@" "$deck" > "$out/$name.out" 2>&1
}
hash_of() { sed -n 's/.*"param_hash": "\([0-9a-f]*\)".*/\1/p' "$1/verdict.json" 2>/dev/null; }

run 2 train
check_status $? "training on 2 stages failed: $(tail -n 4 "$out/train.out")"
check "the resolved deck does not name the architecture" grep -q "arch *= *'$arch_name'" "$out/run/deck.resolved.nml"
run 2 half --set "job.task='train'" --set "job.run_dir='$out/half'" --set "checkpoint.dir='$out/ckpt-half'" \
  --set training.max_steps=6
check_status $? "the first half failed: $(tail -n 4 "$out/half.out")"
run 2 rest --set "job.task='train'" --set "job.run_dir='$out/rest'" --set "checkpoint.dir='$out/ckpt-half'" \
  --set "checkpoint.restart='latest'"
check_status $? "the restart failed: $(tail -n 4 "$out/rest.out")"
a=$(hash_of "$out/run") b=$(hash_of "$out/rest")
check "the restarted run is not the uninterrupted one: $a vs $b" [ -n "$a" ] && [ "$a" = "$b" ]

for np in 1 2; do
  run $np eval$np --set "job.task='eval'" --set "job.run_dir='$out/eval$np'"
  check_status $? "eval on $np ranks failed: $(tail -n 4 "$out/eval$np.out")"
done
loss() { awk -F, '$2 == "loss" { print $3 }' "$out/$1/eval.csv"; }
check "eval: the dataset loss differs between 1 and 2 ranks: $(loss eval1) vs $(loss eval2)" \
  awk -v a="$(loss eval1)" -v b="$(loss eval2)" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 1e-6) }'
run 1 sample --set "job.task='sample'" --set "job.run_dir='$out/sample'"
check_status $? "sample failed: $(tail -n 4 "$out/sample.out")"

run 1 export --set "job.task='export'" --set "export.dir='$out/hf'"
check_status $? "export failed: $(tail -n 4 "$out/export.out")"
check "export: not a $model_type config" grep -q "\"model_type\": \"$model_type\"" "$out/hf/config.json"
mkdir -p "$out/none"
run 2 import --set "job.task='eval'" --set "job.run_dir='$out/import'" --set "checkpoint.dir='$out/none'" \
  --set "model.init_from='$out/hf'"
check_status $? "eval from the export failed: $(tail -n 4 "$out/import.out")"
check "eval from the export: loss $(loss import), the checkpoint's $(loss eval2)" [ "$(loss import)" = "$(loss eval2)" ]
echo "$arch_name: restart bitwise ($a), eval loss $(loss eval1), from the export $(loss import)"
}
one_arch gpt-neox gpt_neox "arch = 'gpt-neox', attention_types = 'global', rotary_pct = 0.25"
one_arch llama llama "arch = 'llama', n_kv_head = 2, rope_scaling = 'llama3', rope_original_positions = 16"
check "llama: attention_types is not derived 'global'" grep -q "attention_types *= *'global' *! derived" \
  "$TEST_OUT/llama/run/deck.resolved.nml"
check "llama: the export has no Llama 3 rope scaling" grep -q '"rope_type": "llama3"' "$TEST_OUT/llama/hf/config.json"
finish
