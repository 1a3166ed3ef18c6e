#!/bin/sh
# test_blend: training on a blend of two datasets (the training and validation splits of the
# Genesis slice, weights 0.7 and 0.3; doc/data.md).
#   - the loader's windows of a blend are the same on 1, 2 and 3 ranks (test_loader prints their
#     hash on each rank count);
#   - a run restarted from its step-6 checkpoint ends with bitwise the parameters of the run
#     that went straight through, and has drawn the same windows from each dataset;
#   - the end-of-run lines and verdict.json give each dataset's windows and realised share;
#   - the blend's checkpoint is refused by a run on one of its datasets alone;
#   - validation on a blend of two datasets (weights 1 and 3): each evaluation's log line and val.csv
#     give each one's loss, the validation loss is their weighted mean, verdict.json has val_blend,
#     and the restarted run evaluates the same losses;
#   - greenlm-loadbench runs on the blend (2 ranks) and reports each phase; a bad option is refused;
#   - the eval task scores each dataset of &eval val (by default &data val's);
#   - a weight count that is not the dataset count, a zero weight and a dataset listed twice are
#     deck errors, for training and validation.
. "$(dirname "$0")/lib.sh"
fresh_out blend
loader="$(dirname "$GREENLM")/../tests/test_loader"

for np in 1 2 3; do
  mkdir -p "$out/loader-$np"
  TEST_OUT="$out/loader-$np" $MPIEXEC -n $np "$loader" > "$out/loader-$np.out" 2>&1
  rc=$?; check "test_loader on $np ranks failed: $(tail -n 3 "$out/loader-$np.out")" [ $rc -eq 0 ]
  h=$(sed -n 's/^blend windows hash //p' "$out/loader-$np.out" | sort -u)
  check "the $np ranks drew other windows: '$h'" [ "$(echo "$h" | wc -l)" -eq 1 ] && [ -n "$h" ]
  [ $np = 1 ] && h1=$h
  check "$np ranks draw other windows than 1 ($h, $h1)" [ "$h" = "$h1" ]
done

deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'train', seed = 5, log_every = 4 /
$(genesis_prepare)
&data train = '$out/train.nc', '$out/val.nc', train_weights = 0.7, 0.3,
  val = '$out/val.nc', '$out/train.nc', val_weights = 1, 3 /
&model vocab_size = 256, block_size = 32, n_layer = 2, n_embd = 32, n_head = 2 /
&training seq_len = 32, micro_batch_size = 4, global_batch_size = 8, max_steps = 12, warmup_steps = 2,
  eval_every = 6, eval_batches = 2 /
&checkpoint every_steps = 6, keep = 3 /
&sample n_tokens = 0 /
&system peak_gflops = 100 /
EOD
hash_of() { sed -n 's/.*"param_hash": "\([0-9a-f]*\)".*/\1/p' "$out/$1/verdict.json" 2>/dev/null; }
blend_of() { tr -d ' \n' < "$out/$1/verdict.json" | sed -n 's/.*"data_blend":\(\[[^]]*\]\).*/\1/p'; }

greenlm --set job.task=prepare "$deck" > "$out/prepare.out" 2>&1
rc=$?; check "prepare failed: $(tail -n 3 "$out/prepare.out")" [ $rc -eq 0 ]
greenlm --set "job.run_dir=$out/ref" "$deck" > "$out/ref.out" 2>&1
rc=$?; check "the blend run failed: $(tail -n 5 "$out/ref.out")" [ $rc -eq 0 ]
check "no line of the blend's shares" grep -q "^data: $out/val.nc: [0-9]* windows since step 0 .*share 0\.[0-9]* of weight 0\.3000" "$out/ref.out"
b=$(blend_of ref)
check "verdict.json has no data_blend: $b" [ -n "$b" ]
check "data_blend does not sum to 12 steps x 8 windows: $b" [ "$(echo "$b" | grep -o '"windows":[0-9]*' | cut -d: -f2 | paste -sd+ | bc)" = 96 ]

# the validation blend: the mean of the two losses, weighted 0.25 and 0.75, at steps 6 and 12
check "val.csv does not have 2 datasets at steps 6 and 12: $(cat "$out/ref/val.csv")" \
  [ "$(cut -d, -f1,2 "$out/ref/val.csv" | tr '\n' ' ')" = "step,dataset 6,$out/val.nc 6,$out/train.nc 12,$out/val.nc 12,$out/train.nc " ]
line=$(grep "^val: step 12 | loss " "$out/ref.out")
check "no log line of the validation blend at step 12" [ -n "$line" ]
la=$(awk -F, '$1 == 12 && NR == 4 {print $4}' "$out/ref/val.csv")
lb=$(awk -F, '$1 == 12 && NR == 5 {print $4}' "$out/ref/val.csv")
v=$(echo "$line" | sed -n 's/^val: step 12 | loss \([0-9.]*\) = 0.25 x .* (.*val.nc) + 0.75 x .* (.*train.nc)$/\1/p')
check "the log's validation loss '$v' is not 0.25 x $la + 0.75 x $lb: $line" \
  awk -v v="$v" -v a="$la" -v b="$lb" 'BEGIN { exit !(v != "" && a != b && (v - (0.25 * a + 0.75 * b)) ^ 2 < 1e-8) }'
check "verdict.json has no val_blend" grep -q '"val_blend"' "$out/ref/verdict.json"
check "no end-of-run line of a validation dataset" grep -q "^validation: $out/train.nc: loss [0-9.]*, weight 0.7500" "$out/ref.out"

mkdir -p "$out/again/checkpoints"
cp "$out/ref/checkpoints/ckpt-00000006.nc" "$out/again/checkpoints/"
greenlm --set "job.run_dir=$out/again" --set checkpoint.restart=latest "$deck" > "$out/again.out" 2>&1
rc=$?; check "the restarted blend run failed: $(tail -n 5 "$out/again.out")" [ $rc -eq 0 ]
check "the restart did not begin at step 6" grep -q "step 6" "$out/again.out"
check "the restart ends with other parameters ($(hash_of again), straight through $(hash_of ref))" \
  [ -n "$(hash_of ref)" ] && [ "$(hash_of again)" = "$(hash_of ref)" ]
check "the restart drew other windows: $(blend_of again) against $b" [ "$(blend_of again)" = "$b" ]
check "the restart's validation at step 12 differs: $(tail -n 2 "$out/again/val.csv") against $(tail -n 2 "$out/ref/val.csv")" \
  [ "$(tail -n 2 "$out/again/val.csv")" = "$(tail -n 2 "$out/ref/val.csv")" ]

greenlm --set job.task=eval --set "job.run_dir=$out/ref" --set checkpoint.restart=latest --set eval.seq_len=16 \
  "$deck" > "$out/eval.out" 2>&1
rc=$?; check "the eval task failed: $(tail -n 3 "$out/eval.out")" [ $rc -eq 0 ]
for f in val train; do
  check "the eval task did not score $f.nc: $(grep '^eval:' "$out/eval.out" | head -n 4)" \
    grep -q "^eval: $out/$f.nc: [0-9]* windows of 16 tokens, loss" "$out/eval.out"
done

mkdir -p "$out/alone/checkpoints"
cp "$out/ref/checkpoints/ckpt-00000006.nc" "$out/alone/checkpoints/"
greenlm --set "job.run_dir=$out/alone" --set checkpoint.restart=latest --set "data.train=$out/train.nc" \
  --set "data.train_weights=1" "$deck" > "$out/alone.out" 2>&1
check "a run on one dataset of the blend took its checkpoint" [ $? -ne 0 ]
check "no reason given for refusing the blend's checkpoint: $(tail -n 3 "$out/alone.out")" grep -q "trained on another dataset" "$out/alone.out"

# the loader benchmark on the blend: it runs on 2 ranks and reports every phase
bench="$(dirname "$GREENLM")/greenlm-loadbench"
$MPIEXEC -n 2 "$bench" --steps 5 --step-ms 1 "$deck" > "$out/loadbench.out" 2>&1
rc=$?; check "greenlm-loadbench failed: $(tail -n 3 "$out/loadbench.out")" [ $rc -eq 0 ]
check "greenlm-loadbench's result line lacks a phase: $(grep result "$out/loadbench.out")" \
  grep -q "^result: ranks=2 T=32 windows_per_step=4 cold_wps=[0-9.]* warm_wps=[0-9.]* warm_ms_1=[0-9.]* cold_ms_1=[0-9.]* ahead_ms_1=[0-9.]*$" "$out/loadbench.out"
$MPIEXEC -n 1 "$bench" --step-ms 0 "$deck" > "$out/loadbench-bad.out" 2>&1
check "greenlm-loadbench took --step-ms 0 (status $?)" grep -q "bad option or value '--step-ms 0'" "$out/loadbench-bad.out"

deck_error() { # deck_error MESSAGE --set ...: the deck with these overrides is refused with MESSAGE
  msg=$1; shift
  greenlm "$@" --set "job.run_dir=$out/bad" "$deck" > "$out/bad.out" 2>&1
  check "not refused with '$msg': $(grep error "$out/bad.out" | head -n 2)" grep -q "$msg" "$out/bad.out"
}
deck_error "3 weights for 2 training datasets" --set data.train_weights=0.5,0.2,0.3
deck_error "train_weights = 0 is out of range" --set data.train_weights=0,1
deck_error "is listed twice (entries 1 and 2)" --set "data.train=$out/val.nc,$out/val.nc"
deck_error "1 weights for 2 validation datasets" --set data.val_weights=1
deck_error "val_weights = 0 is out of range" --set data.val_weights=1,0
deck_error "is listed twice (entries 1 and 2)" --set "data.val=$out/val.nc,$out/val.nc" --set data.val_weights=1,1
finish
