#!/bin/sh
# test_hostile_io: hostile input to the readers of models, benchmarks, machines and restarts
# (doc/testing.md, "Hostile input, second round"). Every case runs greenlm under a time limit (a
# case still running at the limit is a hang, and fails), and checks the exit status and the
# message; the table of cases is written to tests/out/hostile-io/table.txt.
#   - paths that are not files: a directory, a FIFO and a character device (/dev/zero) where each
#     reader wants a file (a deck, a machine file, a checkpoint to restart from, a benchmark file,
#     config.json, model.safetensors, model.safetensors.index.json, a shard) are named as such;
#   - in-range values whose product or loop runs away: a machine of nodes x devices_per_node beyond
#     the ranks a plan lays out, a default global batch beyond its range, config.json counts beyond
#     the deck's ranges (num_layers, hidden_size, num_heads, an attention_types repeat count);
#   - work that grew without bound: the plan of a 1e12-parameter deck ends within the limit and says
#     what it tries;
#   - silent acceptance: a NaN in a safetensors tensor or in a checkpoint (with checksums that agree),
#     a restart with another &training seq_len, max_steps below or at the checkpoint's step.
. "$(dirname "$0")/lib.sh"
fresh_out hostile-io
ref="$TOP_SRCDIR/tests/reference"
data="$TOP_SRCDIR/tests/data"
LIMIT=${HOSTILE_LIMIT:-120}
: "${NC_EDIT:=$PWD/tests/nc_edit}"
: > "$out/table.txt"

# expect NAME STATUS TEXT [greenlm arguments...]: greenlm exits with STATUS within LIMIT seconds and
# its output has TEXT; the case goes into the table
expect() {
  name=$1 want=$2 text=$3
  shift 3
  timeout "$LIMIT" $MPIEXEC -n 1 "$GREENLM" "$@" > "$out/$name.out" 2>&1
  rc=$?
  first=$(grep -m 1 'error:' "$out/$name.out" | cut -c 1-200)
  printf '%-36s exit %3s  %s\n' "$name" "$rc" "${first:-$(grep -m 1 "$text" "$out/$name.out" | cut -c 1-160)}" >> "$out/table.txt"
  if [ "$rc" -eq 124 ]; then
    bad "$name: still running after $LIMIT s"
    return
  fi
  check "$name: exit $rc, expected $want: $(grep -A1 'error:' "$out/$name.out" | head -n 4)" [ "$rc" -eq "$want" ]
  check "$name: no '$text' in the output: $(grep -A1 'error:' "$out/$name.out" | head -n 4)" grep -qF -- "$text" "$out/$name.out"
}

# not_a_file KIND PATH: PATH made a directory, a FIFO or a character device (a link to /dev/zero,
# which never ends); the words greenlm names it with into $kind_words
not_a_file() {
  rm -rf "$2"
  case $1 in
    dir) mkdir -p "$2"; kind_words="a directory" ;;
    fifo) mkfifo "$2"; kind_words="a FIFO (named pipe)" ;;
    dev) ln -s /dev/zero "$2"; kind_words="a character device" ;;
  esac
}

# ---- the models, decks and runs the cases start from ----------------------------------------------
cat > "$out/eval.nml" <<EOD
&job task = 'eval', run_dir = '$out/eval-run', overwrite = .true. /
&tokenizer kind = 'bytes' /
&model vocab_size = 265, block_size = 64, n_layer = 2, n_embd = 32, n_head = 4,
  attention_types = 'global', 'local', window_size = 4, init_from = '$ref/hf-neo' /
&training seq_len = 16, micro_batch_size = 2 /
&checkpoint dir = '$out/no-checkpoints' /
&eval val = 'none', benchmarks = 'lambada:$data/bench-lambada.jsonl' /
&system peak_gflops = 100 /
EOD
mkdir -p "$out/no-checkpoints"
gpt2="--set model.arch='gpt2' --set model.attention_types='global'"
expect eval-neo 0 "lambada:bench-lambada" "$out/eval.nml"
expect eval-gpt2-shards 0 "lambada:bench-lambada" $gpt2 --set "model.init_from='$ref/hf-gpt2-sharded'" "$out/eval.nml"

cat > "$out/train.nml" <<EOD
&job task = 'train', seed = 3, run_dir = '$out/run', log_every = 1 /
&prepare input = '$data/kjv-genesis.txt', documents = 'line', train_out = '$out/train.nc', val_out = '$out/val.nc' /
&model vocab_size = 256, block_size = 16, n_layer = 1, n_embd = 8, n_head = 2, window_size = 4 /
&training seq_len = 8, micro_batch_size = 1, max_steps = 4, eval_batches = 1, eval_every = 0 /
&checkpoint every_steps = 2 /
&sample n_tokens = 0 /
&system peak_gflops = 1 /
EOD
expect train 0 "verdict: completed" --set "job.task='prepare','train'" "$out/train.nml"
ck="$out/run/checkpoints/ckpt-00000004.nc"
check "train: no checkpoint at step 4" [ -s "$ck" ]
verdict_sum=$(cksum < "$out/run/verdict.json")

# ---- paths that are not files ------------------------------------------------------------------------
for kind in dir fifo dev; do
  not_a_file $kind "$out/$kind.nml"
  expect path-$kind-deck 1 "$out/$kind.nml: error: $kind_words, not a deck file" "$out/$kind.nml"
  not_a_file $kind "$out/$kind-machine.nml"
  expect path-$kind-machine-file 1 "$kind_words, not a machine file" --plan --machine "$out/$kind-machine.nml" \
    "$TOP_SRCDIR/input/neo-13b.nml"
  not_a_file $kind "$out/$kind-ckpt.nc"
  expect path-$kind-checkpoint 1 "$kind_words, not a checkpoint file" --set "checkpoint.restart='$out/$kind-ckpt.nc'" \
    --set "job.run_dir='$out/run-$kind'" "$out/train.nml"
  not_a_file $kind "$out/$kind-bench.jsonl"
  expect path-$kind-benchmark 1 "$kind_words, not a benchmark file" --set "eval.benchmarks='lambada:$out/$kind-bench.jsonl'" \
    "$out/eval.nml"
  for f in config.json model.safetensors; do
    d="$out/hf-$kind-$f"
    cp -r "$ref/hf-neo" "$d"
    not_a_file $kind "$d/$f"
    what="a safetensors file"
    [ $f = config.json ] && what="a model config file"
    expect path-$kind-$f 1 "$d/$f: error: $kind_words, not $what" --set "model.init_from='$d'" "$out/eval.nml"
  done
  for f in model.safetensors.index.json model-00002-of-00004.safetensors; do
    d="$out/hf-$kind-$f"
    cp -r "$ref/hf-gpt2-sharded" "$d"
    not_a_file $kind "$d/$f"
    what="a safetensors file"
    [ $f = model.safetensors.index.json ] && what="a safetensors index file"
    expect path-$kind-$f 1 "$d/$f: error: $kind_words, not $what" $gpt2 --set "model.init_from='$d'" "$out/eval.nml"
  done
done
check "a message says 'file file'" sh -c "! grep -l 'file file' '$out'/path-*.out"

# ---- in-range values whose product or loop runs away -----------------------------------------------
printf "&machine nodes = 1048576, device = 'h100-80gb', devices_per_node = 4096 /\n" > "$out/huge-machine.nml"
expect machine-ranks-overflow 1 "nodes x devices_per_node = 1048576 x 4096 = 4294967296 ranks, more than the 16777216" \
  --plan --machine "$out/huge-machine.nml" "$TOP_SRCDIR/input/neo-13b.nml"
printf "&machine nodes = 4096, device = 'h100-80gb', devices_per_node = 4096 /\n" > "$out/big-machine.nml"
expect machine-global-batch-beyond-range 1 "micro_batch_size x ranks = 65536 x 16777216 = 1099511627776 sequences, more than 1073741824" \
  --plan --machine "$out/big-machine.nml" --set training.global_batch_size=0 --set training.micro_batch_size=65536 \
  "$TOP_SRCDIR/input/neo-13b.nml"
# config.json: a key's value, or the attention_types list, replaced
hf_config() { # NAME SED-EXPRESSION: a copy of hf-neo whose config.json is edited, in $out/hf-NAME
  cp -r "$ref/hf-neo" "$out/hf-$1"
  sed -i "$2" "$out/hf-$1/config.json"
}
hf_config layers 's/"num_layers": 2/"num_layers": 1000000000000/'
expect config-num-layers-huge 1 "num_layers = 1000000000000 is more than greenlm takes (&model n_layer, at most 4096)" \
  --set "model.init_from='$out/hf-layers'" "$out/eval.nml"
hf_config hidden 's/"hidden_size": 32/"hidden_size": 1099511627776/'
expect config-hidden-size-huge 1 "hidden_size = 1099511627776 is more than greenlm takes (&model n_embd, at most 1048576)" \
  --set "model.init_from='$out/hf-hidden'" "$out/eval.nml"
hf_config heads 's/"num_heads": 4/"num_heads": 4294967296/'
expect config-num-heads-huge 1 "num_heads = 4294967296 is more than greenlm takes (&model n_head, at most 4096)" \
  --set "model.init_from='$out/hf-heads'" "$out/eval.nml"
hf_config repeats '/"attention_types"/,/^  \],/c\  "attention_types": [[["global", "local"], 1000000000000000]],'
expect config-attention-repeats-huge 1 "attention_types entry 0 repeats its kinds 1000000000000000 times" \
  --set "model.init_from='$out/hf-repeats'" "$out/eval.nml"
hf_config repeats-empty '/"attention_types"/,/^  \],/c\  "attention_types": [[[], 1000000000000000000]],'
expect config-attention-repeats-empty 1 "attention_types entry 0 repeats its kinds 1000000000000000000 times" \
  --set "model.init_from='$out/hf-repeats-empty'" "$out/eval.nml"

# ---- work that grew without bound: a 1e12-parameter, 128-layer deck planned on 4 x 6 V100 ------------
cat > "$out/neo-1t.nml" <<EOD
&job run_dir = '$out/plan-1t' /
&model vocab_size = 50257, block_size = 2048, n_layer = 128, n_embd = 25600, n_head = 160 /
&training seq_len = 2048, micro_batch_size = 4, global_batch_size = 1536 /
&system precision = 'fp16' /
EOD
expect plan-1e12-parameters 0 "plan: nothing fits on 4 nodes; trying 8 nodes (48 ranks)" \
  --plan --machine "$TOP_SRCDIR/input/machines/v100-4x6.nml" "$out/neo-1t.nml"
check "plan-1e12-parameters: no verdict on what would fit" grep -q '^what would: ' "$out/plan-1e12-parameters.out"

# ---- silent acceptance ---------------------------------------------------------------------------------
# a NaN in model.safetensors: the first float of transformer.h.0.ln_1.weight's data (little-endian F32)
d="$out/hf-nan"
cp -r "$ref/hf-neo" "$d"
st="$d/model.safetensors"
hl=$(od -An -tu8 -N8 "$st" | tr -d ' ')
begin=$(dd if="$st" bs=1 skip=8 count="$hl" 2> /dev/null |
  sed -n 's/.*"transformer\.h\.0\.ln_1\.weight":{[^}]*"data_offsets":\[\([0-9]*\),.*/\1/p')
printf '\000\000\300\177' | dd of="$st" bs=1 seek=$((8 + hl + begin + 4 * 3)) conv=notrunc 2> /dev/null
expect safetensors-nan 1 "tensor transformer.h.0.ln_1.weight: element 3 [3] is NaN" --set "model.init_from='$d'" "$out/eval.nml"

# a NaN in a checkpoint whose checksums agree: named by variable and element, never trained from
cp "$ck" "$out/nan.nc"
$MPIEXEC -n 1 "$NC_EDIT" "$out/nan.nc" float transformer.h.0.mlp.c_fc.weight 37 nan > "$out/edit.log" 2>&1 ||
  bad "nc_edit: $(cat "$out/edit.log")"
expect checkpoint-nan 1 "variable transformer.h.0.mlp.c_fc.weight: element 37 (row 4, column 5) is a NaN or an infinity" \
  --set "checkpoint.restart='$out/nan.nc'" --set training.max_steps=6 --set "job.run_dir='$out/run-nan'" "$out/train.nml"
expect checkpoint-nan-eval 1 "is a NaN or an infinity" --set "job.task='eval'" --set "eval.val='$out/val.nc'" \
  --set "checkpoint.restart='$out/nan.nc'" --set "job.run_dir='$out/run-nan-eval'" "$out/train.nml"
# with 'latest' the newest, so damaged, is set aside and the older one read
cp -r "$out/run" "$out/run-fallback"
cp "$out/nan.nc" "$out/run-fallback/checkpoints/ckpt-00000004.nc"
expect checkpoint-nan-latest 0 "ckpt-00000004.nc is damaged: set aside as .damaged" --set checkpoint.restart=latest \
  --set "job.run_dir='$out/run-fallback'" --set training.max_steps=6 "$out/train.nml"
check "checkpoint-nan-latest: not restarted from step 2" grep -q 'ckpt-00000002.nc, step 2: run state and checksums verified' \
  "$out/checkpoint-nan-latest.out"

# a restart with another seq_len: refused at the key (the cursor counts windows of the checkpoint's)
expect restart-other-seq-len 1 "&training seq_len: 16, but the checkpoint $ck was trained on windows of seq_len = 8" \
  --set checkpoint.restart=latest --set training.seq_len=16 --set training.max_steps=6 "$out/train.nml"
check "restart-other-seq-len: the hint does not say what to set" grep -q 'hint: set &training seq_len = 8 to continue' \
  "$out/restart-other-seq-len.out"
# the file's data_seq_len decides, not its deck (which a long resolved deck could leave unread)
cp -r "$out/run" "$out/run-deck16"
$MPIEXEC -n 1 "$NC_EDIT" "$out/run-deck16/checkpoints/ckpt-00000004.nc" att deck text "&training seq_len = 16 /" \
  > "$out/edit.log" 2>&1 || bad "nc_edit: $(cat "$out/edit.log")"
expect restart-seq-len-not-from-deck 1 "was trained on windows of seq_len = 8" --set checkpoint.restart=latest \
  --set training.seq_len=16 --set training.max_steps=6 --set "job.run_dir='$out/run-deck16'" "$out/train.nml"
# a data_seq_len of several values: damaged, never read past its one value
cp -r "$out/run" "$out/run-seqlen3"
$MPIEXEC -n 1 "$NC_EDIT" "$out/run-seqlen3/checkpoints/ckpt-00000004.nc" att data_seq_len int64 "8,8,8" \
  > "$out/edit.log" 2>&1 || bad "nc_edit: $(cat "$out/edit.log")"
expect restart-seq-len-three-values 1 "the run state (step, tokens, loader cursor, seed) is missing or damaged" \
  --set "checkpoint.restart='$out/run-seqlen3/checkpoints/ckpt-00000004.nc'" --set training.max_steps=6 \
  --set "job.run_dir='$out/run-seqlen3'" "$out/train.nml"
# max_steps below the checkpoint's step: an error at the key; at it: nothing to do; the run's files alone
expect restart-max-steps-below 1 "&training max_steps: 2, but the checkpoint $ck is at step 4" \
  --set checkpoint.restart=latest --set training.max_steps=2 "$out/train.nml"
expect restart-max-steps-reached 0 "restart: step 4 is &training max_steps: the run is complete, nothing to train" \
  --set checkpoint.restart=latest "$out/train.nml"
check "restart-max-steps-reached: it trained" sh -c "! grep -q '== training: steps' '$out/restart-max-steps-reached.out'"
check "a restart at or past max_steps changed verdict.json" [ "$(cksum < "$out/run/verdict.json")" = "$verdict_sum" ]

cat "$out/table.txt"
finish
