#!/bin/sh
# test_tasks: the tasks that use a trained model, end to end.
#   - a model trained on 2 pipeline stages is evaluated on 1 and 2 ranks: the dataset score within
#     1e-6, every benchmark score the same;
#   - the 'sample' task gives the same texts on 1 and 2 ranks (prompts spread across them);
#   - 'export' writes a Hugging Face directory (one file, bf16, shards with an index); reading it back
#     with &model init_from evaluates exactly as the checkpoint did (fp32, one file or shards);
#     training from it starts from the trained model's loss, not a random one's, and scores the
#     benchmarks at its evaluations (&eval during_training);
#   - bad input: an existing export directory, a deck whose shape disagrees with config.json, no
#     model at all, a missing prompt file: clear errors, nothing written.
. "$(dirname "$0")/lib.sh"
fresh_out tasks
data="$TOP_SRCDIR/tests/data"
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'tokenizer', 'prepare', 'train', seed = 5, log_every = 5, run_dir = '$out/train' /
&tokenizer kind = 'bpe', dir = '$out/tok', vocab_size = 300 /
&prepare input = '$data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,
  train_out = '$out/train.nc', val_out = '$out/val.nc' /
&model vocab_size = 300, block_size = 64, n_layer = 2, n_embd = 64, n_head = 4,
  attention_types = 'global', 'local', window_size = 8 /
&training seq_len = 32, micro_batch_size = 4, global_batch_size = 8, max_steps = 30, lr = 3e-3,
  warmup_steps = 3, eval_every = 0, eval_batches = 2 /
&parallel pipeline_stages = 2 /
&checkpoint dir = '$out/ckpt' /
&eval benchmarks = 'lambada:$data/bench-lambada.jsonl', 'hellaswag:$data/bench-hellaswag.jsonl',
  'arc:$data/bench-arc.jsonl', 'winogrande:$data/bench-winogrande.jsonl', num_fewshot = 1 /
&sample n_tokens = 16, prompt = 'And God', stop_eot = .false. /
&system peak_gflops = 100 /
EOD
run() { # run NP NAME [--set ...]: the deck on NP ranks, output in NAME.out
  np=$1 name=$2; shift 2
  $MPIEXEC -n "$np" "$GREENLM" "$@" "$deck" > "$out/$name.out" 2>&1
}
tail_of() { tail -n 4 "$out/$1.out"; }

run 2 train
check_status $? "training on 2 stages failed: $(tail_of train)"

# eval on 1 and 2 ranks of the checkpoint written by 2 stages
for np in 1 2; do
  run $np eval$np --set "job.task='eval'" --set "job.run_dir='$out/eval$np'"
  check_status $? "eval on $np ranks failed: $(tail_of eval$np)"
  check "eval on $np ranks: no eval.json" [ -s "$out/eval$np/eval.json" ]
done
scores() { grep -v '^run,' "$out/$1/eval.csv"; } # without the run's time and energy
scores eval1 | grep -v '^dataset' > "$out/bench1.csv"
scores eval2 | grep -v '^dataset' > "$out/bench2.csv"
check "eval: benchmark scores differ between 1 and 2 ranks" cmp -s "$out/bench1.csv" "$out/bench2.csv"
check "eval: the dataset loss differs by more than 1e-6 between 1 and 2 ranks" awk -F, '
  FNR == NR && $2 == "loss" { a = $3 } FNR != NR && $2 == "loss" { b = $3 }
  END { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 1e-6) }' "$out/eval1/eval.csv" "$out/eval2/eval.csv"
for kind in lambada hellaswag arc winogrande; do
  check "eval: no $kind accuracy in eval.csv" grep -q "^$kind:bench-$kind,acc," "$out/eval1/eval.csv"
done
check "eval: no bits per byte" grep -q '^dataset:.*,bits_per_byte,[0-9]' "$out/eval1/eval.csv"

# sample: the same texts on 1 and 2 ranks
printf 'And God said\nIn the beginning\\nGod\nAnd Adam\n' > "$out/prompts.txt"
for np in 1 2; do
  run $np sample$np --set "job.task='sample'" --set "job.run_dir='$out/sample$np'" --set "sample.prompt_file='$out/prompts.txt'"
  check_status $? "sample on $np ranks failed: $(tail_of sample$np)"
done
check "sample: samples.jsonl differs between 1 and 2 ranks" cmp -s "$out/sample1/samples.jsonl" "$out/sample2/samples.jsonl"
check "sample: not 3 samples" [ "$(wc -l < "$out/sample1/samples.jsonl")" -eq 3 ]
check "sample: a prompt's newline was not kept" grep -q '"In the beginning\\nGod' "$out/sample1/samples.jsonl"

# export: one file, bf16, shards
run 1 export --set "job.task='export'" --set "export.dir='$out/hf'"
check_status $? "export failed: $(tail_of export)"
for f in config.json model.safetensors generation_config.json vocab.json merges.txt tokenizer_config.json; do
  check "export: $f missing" [ -s "$out/hf/$f" ]
done
run 1 export16 --set "job.task='export'" --set "export.dir='$out/hf16'" --set "export.dtype='bf16'"
check_status $? "bf16 export failed: $(tail_of export16)"
check "bf16 export is not about half the size" [ "$(wc -c < "$out/hf16/model.safetensors")" -lt "$(($(wc -c < "$out/hf/model.safetensors") * 6 / 10))" ]
run 1 shards --set "job.task='export'" --set "export.dir='$out/hfs'" --set export.shard_mb=0.05
check_status $? "sharded export failed: $(tail_of shards)"
check "sharded export: no index" [ -s "$out/hfs/model.safetensors.index.json" ]
check "sharded export: fewer than 2 shards" [ "$(ls "$out/hfs"/model-0000*-of-*.safetensors 2>/dev/null | wc -l)" -ge 2 ]

# import: the exported directories evaluate as the checkpoint did
mkdir -p "$out/none"
for d in hf hfs; do
  run 2 import-$d --set "job.task='eval'" --set "job.run_dir='$out/import-$d'" --set "checkpoint.dir='$out/none'" \
    --set "model.init_from='$out/$d'" --set "tokenizer.dir=''"
  check_status $? "eval from the export $d failed: $(tail_of import-$d)"
  check "eval from the export $d differs from the checkpoint's" [ "$(scores eval2)" = "$(scores import-$d)" ]
done
check "eval.json does not name the Hugging Face directory" grep -q "Hugging Face directory $out/hf" "$out/import-hf/eval.json"
run 1 import16 --set "job.task='eval'" --set "job.run_dir='$out/import16'" --set "checkpoint.dir='$out/none'" \
  --set "model.init_from='$out/hf16'" --set "eval.benchmarks=''"
check_status $? "eval from the bf16 export failed: $(tail_of import16)"
check "bf16 export: the dataset loss moved by more than 0.02" awk -F, '
  FNR == NR && $2 == "loss" { a = $3 } FNR != NR && $2 == "loss" { b = $3 }
  END { d = a - b; if (d < 0) d = -d; exit !(b != "" && d < 0.02) }' "$out/eval1/eval.csv" "$out/import16/eval.csv"

# training from the export starts where the trained model is
run 1 finetune --set "job.task='train'" --set "job.run_dir='$out/finetune'" --set "checkpoint.dir='$out/finetune/ckpt'" \
  --set "model.init_from='$out/hf'" --set parallel.pipeline_stages=1 --set training.max_steps=5 --set training.lr=1e-5 \
  --set training.min_lr=1e-6 --set eval.during_training=T
check_status $? "training from the export failed: $(tail_of finetune)"
check "training from the export: no init line" grep -q "^init: weights from the Hugging Face directory" "$out/finetune.out"
check "benchmarks during training: no bench line" grep -q "^bench: step 5 | hellaswag:bench-hellaswag | acc " "$out/finetune.out"
check "benchmarks during training: no rows in bench.csv" grep -q "^5,arc:bench-arc,acc_norm," "$out/finetune/bench.csv"
first=$(awk -F, 'NR == 2 { print $2 }' "$out/finetune/metrics.csv")
val=$(awk -F, '$2 == "loss" { print $3 }' "$out/eval1/eval.csv")
check "training from the export: first loss $first is not near the trained model's $val" \
  awk -v a="$first" -v b="$val" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 0.5) }'

# the same start on 2 tensor ranks: each reads its shards of the export's whole tensors
run 2 finetune-tp --set "job.task='train'" --set "job.run_dir='$out/finetune-tp'" \
  --set "checkpoint.dir='$out/finetune-tp/ckpt'" --set "model.init_from='$out/hf'" --set parallel.pipeline_stages=1 \
  --set parallel.tensor_parallel=2 --set training.max_steps=5 --set training.lr=1e-5 --set training.min_lr=1e-6
check_status $? "training from the export on 2 tensor ranks failed: $(tail_of finetune-tp)"
first_tp=$(awk -F, 'NR == 2 { print $2 }' "$out/finetune-tp/metrics.csv")
check "training from the export on 2 tensor ranks: first loss $first_tp, on one rank $first" \
  awk -v a="$first_tp" -v b="$first" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * b) }'

# bad input
echo keep > "$out/hf/extra.txt"
run 1 again --set "job.task='export'" --set "export.dir='$out/hf'"
check "export over an existing directory did not fail" [ $? -ne 0 ]
check "export over an existing directory: no clear error" grep -q "$out/hf" "$out/again.out"
check "export over an existing directory changed it" [ -s "$out/hf/extra.txt" ]
run 1 mismatch --set "job.task='eval'" --set "job.run_dir='$out/mismatch'" --set "checkpoint.dir='$out/none'" \
  --set "model.init_from='$out/hf'" --set "tokenizer.dir=''" --set model.n_layer=3 --set model.n_embd=32
check "a deck disagreeing with config.json did not fail" [ $? -ne 0 ]
check "the mismatch does not name n_layer" grep -q "n_layer" "$out/mismatch.out"
check "the mismatch does not name n_embd" grep -q "n_embd" "$out/mismatch.out"
check "a failed eval wrote eval.json" [ ! -e "$out/mismatch/eval.json" ]
run 1 nomodel --set "job.task='eval'" --set "job.run_dir='$out/nomodel'" --set "checkpoint.dir='$out/none'"
check "eval without a model did not fail" [ $? -ne 0 ]
check "eval without a model: no clear error" grep -q "no model to use" "$out/nomodel.out"
run 1 noprompts --set "job.task='sample'" --set "job.run_dir='$out/noprompts'" --set "sample.prompt_file='$out/missing.txt'"
check "a missing prompt file did not fail" [ $? -ne 0 ]
check "a missing prompt file: the error is not at &sample prompt_file" grep -q "prompt_file" "$out/noprompts.out"
finish
