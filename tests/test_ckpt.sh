#!/bin/sh
# test_ckpt: checkpoints survive crashes, signals and bad input.
#   - an uninterrupted run of 2 ranks (D=2, ZeRO-1) checkpointing every step is the reference;
#   - the same run killed with kill -9 at random moments (in steps and in checkpoint writes) and
#     restarted from 'latest' each time ends with bitwise the same parameters;
#   - SIGUSR1 makes a run write a checkpoint and exit 0; the restart ends the same way too; SIGTERM
#     does the same, and every_minutes writes checkpoints by wall time;
#   - a checkpoint written by 2 ranks restarts on 1 rank, read straight from the disk and through
#     the page cache alike;
#   - with error feedback the replicas' residuals are checkpointed: the restart continues bit for
#     bit on 2 replicas, starts them from zero on 4, and a damaged residual is refused;
#   - PowerSGD's warm start Q is checkpointed: the restart continues bit for bit, a damaged Q is refused;
#   - a complete run whose last job died before its verdict gets it from the restart that finds it complete;
#   - a truncated or corrupted checkpoint, one of another model shape or vocabulary, an unwritable
#     directory and a full disk (a file-size limit) give clear errors and leave older checkpoints
#     as they were.
. "$(dirname "$0")/lib.sh"
fresh_out ckpt
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'train', seed = 11, log_every = 5 /
$(genesis_prepare)
&model vocab_size = 256, block_size = 64, n_layer = 4, n_embd = 96, n_head = 4 /
&training seq_len = 64, micro_batch_size = 4, global_batch_size = 8, max_steps = 40, warmup_steps = 2,
  eval_every = 0, eval_batches = 2 /
&parallel zero_stage = 1 /
&checkpoint every_steps = 1, keep = 3 /
&sample n_tokens = 0 /
&system peak_gflops = 100 /
EOD
run2() { # run2 NAME [options]: the deck on 2 ranks into run dir NAME
  name=$1; shift
  $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/$name" "$@" "$deck" >> "$out/$name.out" 2>&1
}
hash_of() { sed -n 's/.*"param_hash": "\([0-9a-f]*\)".*/\1/p' "$out/$1/verdict.json" 2>/dev/null; }
# again_same RUN [options]: RUN restarted from its step-5 checkpoint (as RUN-again) ends with its parameters
again_same() {
  run=$1; shift
  run2 "$run-again" "$@" --set "checkpoint.restart=$out/$run/checkpoints/ckpt-00000005.nc"
  check_status $? "the restart of $run failed: $(tail -n 5 "$out/$run-again.out")"
  check "the restart of $run continued differently ($(hash_of "$run-again") vs $(hash_of "$run"))" \
    [ -n "$(hash_of "$run")" -a "$(hash_of "$run-again")" = "$(hash_of "$run")" ]
}
# damaged_refused RUN VAR INDEX WANT [options]: RUN's step-5 checkpoint with value INDEX of VAR changed
# (as RUN-corrupt) is refused with a message saying WANT, and no run is written
damaged_refused() {
  run=$1 var=$2 at=$3 want=$4; shift 4
  cp "$out/$run/checkpoints/ckpt-00000005.nc" "$out/$run-corrupt.nc"
  $MPIEXEC -n 1 "$NC_EDIT" "$out/$run-corrupt.nc" var "$var" "$at" 7 > "$out/$run-edit.log" 2>&1
  check_status $? "nc_edit failed: $(cat "$out/$run-edit.log")"
  run2 "$run-corrupt" "$@" --set "checkpoint.restart=$out/$run-corrupt.nc"
  check "a damaged $var was accepted" [ $? -ne 0 ]
  check "no '$want' in: $(grep -i error "$out/$run-corrupt.out" | head -n 3)" grep -q "$want" "$out/$run-corrupt.out"
  check "a refused restart wrote a run: $(ls "$out/$run-corrupt" 2>/dev/null)" [ ! -e "$out/$run-corrupt/verdict.json" ]
}
when_training() { # when_training NAME: wait (at most 30 s) until the run NAME has begun its steps
  for _ in $(seq 300); do grep -q "^== training" "$out/$1.out" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

greenlm --set job.task=prepare "$deck" > "$out/prepare.out" 2>&1
check_status $? "prepare failed: $(tail -n 3 "$out/prepare.out")"
run2 ref
check_status $? "reference run failed: $(tail -n 5 "$out/ref.out")"
ref=$(hash_of ref)
check "no parameter hash in the reference verdict" [ -n "$ref" ]
n=$(ls "$out/ref/checkpoints" | grep -c '^ckpt-.*\.nc$')
check "keep = 3: $n checkpoints kept" [ "$n" -eq 3 ]

# crashes: kill -9 at random moments, restart from the latest checkpoint each time (and a
# half-written file of an older crash lies there: never read, removed by the next write)
mkdir -p "$out/crash/checkpoints"
echo "half-written by a job killed long ago" > "$out/crash/checkpoints/ckpt-00000001.nc.tmp"
i=0
while [ $i -lt 6 ]; do
  i=$((i + 1))
  before=$(grep -c "^== training" "$out/crash.out" 2>/dev/null)
  run2 crash --set checkpoint.restart=latest &
  job=$!
  # kill at a random moment after training began, however long the start took (a loaded machine,
  # a sanitizer build): at most 60 s of waiting
  for _ in $(seq 600); do
    now=$(grep -c "^== training" "$out/crash.out" 2>/dev/null)
    [ "${now:-0}" -gt "${before:-0}" ] && break
    sleep 0.1
  done
  sleep "$(awk -v s="$i" 'BEGIN { srand(s * 7919); printf "%.2f", 0.3 + 1.5 * rand() }')"
  pkill -9 -f "job.run_dir=$out/crash" 2>/dev/null
  wait $job 2>/dev/null
done
run2 crash --set checkpoint.restart=latest
rc=$?
check "an unfinished checkpoint (.tmp) was not removed: $(ls "$out/crash/checkpoints")" \
  [ -z "$(ls "$out/crash/checkpoints" | grep '\.tmp$')" ]
check "the last restart after the crashes failed: $(tail -n 5 "$out/crash.out")" [ $rc -eq 0 ]
check "a restart read a checkpoint that failed its checksums: $(grep -i 'checksum\|damaged' "$out/crash.out" | head -n 3)" \
  sh -c "! grep -qi 'checksum mismatch\|damaged' '$out/crash.out'"
restarts=$(grep -c "checksums verified" "$out/crash.out")
echo "crash test: 6 kills, $restarts restarts from a checkpoint"
check "fewer than 3 kills came before the end of training" [ "$restarts" -ge 3 ]
check "after kills and restarts the parameters differ from the uninterrupted run's ($(hash_of crash) vs $ref)" \
  [ "$(hash_of crash)" = "$ref" ]

# a signal: checkpoint, exit 0; the restart ends as the reference
run2 sig &
job=$!
when_training sig
pkill -USR1 -f "job.run_dir=$out/sig"
wait $job
check "a run stopped by SIGUSR1 did not exit 0" [ $? -eq 0 ]
check "no signal status in the verdict" grep -q '"status": "signal"' "$out/sig/verdict.json"
run2 sig --set checkpoint.restart=latest
check "restart after the signal failed" [ $? -eq 0 ]
check "after a signal and a restart the parameters differ" [ "$(hash_of sig)" = "$ref" ]

# SIGTERM (what batch systems send at the time limit), to the greenlm processes only
run2 term --set checkpoint.every_steps=0 --set checkpoint.at_end=F --set training.max_steps=100000 &
job=$!
when_training term
pkill -TERM -f "^$GREENLM .*job.run_dir=$out/term"
wait $job
check_status $? "a run stopped by SIGTERM did not exit 0: $(tail -n 3 "$out/term.out")"
check "no 'stopping: signal' message after SIGTERM" grep -q "stopping: signal 15 (SIGTERM)" "$out/term.out"
check "no checkpoint written on SIGTERM (with no other trigger)" [ -n "$(ls "$out/term/checkpoints" | grep '^ckpt-.*\.nc$')" ]

# by wall time only: every_minutes, no step trigger, no final checkpoint
run2 timed --set checkpoint.every_steps=0 --set checkpoint.every_minutes=0.0015 --set checkpoint.at_end=F \
  --set checkpoint.keep=1000 --set training.max_steps=80
check "the run with timed checkpoints failed" [ $? -eq 0 ]
n=$(ls "$out/timed/checkpoints" | grep -c '^ckpt-.*\.nc$')
check "every_minutes: $n checkpoints in a run of 80 steps (at least 2)" [ "$n" -ge 2 ]
# by time, not by step: consecutive checkpoints at least every_minutes (0.09 s) apart, however fast
# or slow the steps (a loaded machine or a sanitizer build may take longer than that per step)
gaps=$(for f in "$out/timed/checkpoints"/ckpt-*.nc; do date -r "$f" +%s.%N; done |
  awk 'NR > 1 && $1 - prev < 0.085 { bad++ } { prev = $1 } END { print bad + 0 }')
check "every_minutes: $gaps checkpoints came sooner than 0.09 s after the one before" [ "$gaps" -eq 0 ]

# 2 ranks wrote it, 1 rank reads it (ZeRO-1 pieces into a whole optimizer)
mid=$(ls "$out/ref/checkpoints" | grep '^ckpt-.*\.nc$' | head -n 1)
greenlm --set "job.run_dir=$out/one" --set parallel.zero_stage=0 --set "checkpoint.restart=$out/ref/checkpoints/$mid" \
  "$deck" > "$out/one.out" 2>&1
check_status $? "restarting a 2-rank checkpoint on 1 rank failed: $(tail -n 5 "$out/one.out")"
# the same through the page cache instead of straight from the disk: the same run
greenlm --set "job.run_dir=$out/cached" --set parallel.zero_stage=0 --set "checkpoint.restart=$out/ref/checkpoints/$mid" \
  --set checkpoint.direct_read=F "$deck" > "$out/cached.out" 2>&1
check_status $? "restarting through the page cache failed: $(tail -n 5 "$out/cached.out")"
check "direct_read = F did not read through the page cache" grep -q "through the page cache" "$out/cached.out"
check "the two ways of reading continued differently ($(hash_of cached) vs $(hash_of one))" \
  [ -n "$(hash_of one)" -a "$(hash_of cached)" = "$(hash_of one)" ]

# bad input: nothing is run, the error names the problem
last=$(ls "$out/ref/checkpoints" | grep '^ckpt-.*\.nc$' | tail -n 1)
cp "$out/ref/checkpoints/$last" "$out/truncated.nc"
size=$(wc -c < "$out/truncated.nc")
truncate -s $((size / 2)) "$out/truncated.nc"
cp "$out/ref/checkpoints/$last" "$out/corrupt.nc"
printf 'garbage!' | dd of="$out/corrupt.nc" bs=1 seek=$((size - 4000)) conv=notrunc 2>/dev/null
refused() { # refused NAME EXPECTED [options]
  name=$1 want=$2; shift 2
  greenlm --set "job.run_dir=$out/$name" "$@" "$deck" > "$out/$name.out" 2>&1
  check "$name: accepted" [ $? -ne 0 ]
  check "$name: no '$want' in: $(head -n 4 "$out/$name.out")" grep -q "$want" "$out/$name.out"
  check "$name: a run was written" [ ! -e "$out/$name/verdict.json" ]
}
refused truncated "truncated\|checksum mismatch" --set "checkpoint.restart=$out/truncated.nc"
refused corrupt "checksum mismatch in variable" --set "checkpoint.restart=$out/corrupt.nc"
refused shape "variable .* has shape" --set model.n_embd=64 --set "checkpoint.restart=$out/ref/checkpoints/$last"
refused vocab "vocab_size is 256, the deck's 300" --set model.vocab_size=300 --set "checkpoint.restart=$out/ref/checkpoints/$last"
refused missing "cannot open the checkpoint" --set "checkpoint.restart=$out/no-such.nc"

# error feedback (&comm): the residuals, one per replica, are in the checkpoint: a restart on the same
# replicas continues bit for bit, on other replicas starts them from zero (and says so); a damaged
# residual is refused
ef="--set comm.method='qsgdinf' --set comm.error_feedback=T --set comm.min_numel=1000 --set training.max_steps=10"
# shellcheck disable=SC2086
run2 ef $ef --set checkpoint.keep=10
check_status $? "the error-feedback run failed: $(tail -n 5 "$out/ef.out")"
# shellcheck disable=SC2086
again_same ef $ef
check "no 'residual restored' in: $(grep restart "$out/ef-again.out")" grep -q "error-feedback residual restored" "$out/ef-again.out"
# shellcheck disable=SC2086
$MPIEXEC -n 4 "$GREENLM" --set "job.run_dir=$out/ef-four" $ef --set training.micro_batch_size=2 \
  --set "checkpoint.restart=$out/ef/checkpoints/ckpt-00000005.nc" "$deck" > "$out/ef-four.out" 2>&1
check_status $? "restart of a 2-replica run on 4 replicas failed: $(tail -n 5 "$out/ef-four.out")"
check "no 'starts from zero' in: $(grep restart "$out/ef-four.out")" grep -q "residual starts from zero" "$out/ef-four.out"
# shellcheck disable=SC2086
damaged_refused ef comm_residual 1000 "error-feedback residual comm_residual is damaged" $ef

# in two levels (&comm hierarchy = 'node') each replica's residual covers the pieces it leads: a
# restart with the same pieces restores the residuals, one with others (another ranks_per_node)
# starts them from zero and says how each job held them
hi="$ef --set comm.hierarchy='node' --set training.micro_batch_size=2"
hier_run() { # name ranks_per_node [overrides]: a 4-rank two-level run
  local name=$1 rpn=$2
  shift 2
  # shellcheck disable=SC2086
  $MPIEXEC -n 4 "$GREENLM" --set "job.run_dir=$out/$name" $hi --set comm.ranks_per_node="$rpn" "$@" "$deck" > "$out/$name.out" 2>&1
  check_status $? "$name (4 ranks, $rpn a node) failed: $(tail -n 5 "$out/$name.out")"
}
hier_run ef-hier 2 --set checkpoint.keep=10
hier_run ef-hier-same 2 --set "checkpoint.restart=$out/ef-hier/checkpoints/ckpt-00000005.nc"
check "same pieces: no 'residual restored' in: $(grep restart "$out/ef-hier-same.out")" \
  grep -q "error-feedback residual restored" "$out/ef-hier-same.out"
check "same pieces: the final loss differs from the run's: $(grep -h '^loss:' "$out/ef-hier.out" "$out/ef-hier-same.out")" \
  [ "$(grep '^loss:' "$out/ef-hier.out")" = "$(grep '^loss:' "$out/ef-hier-same.out")" ]
hier_run ef-hier-moved 1 --set "checkpoint.restart=$out/ef-hier/checkpoints/ckpt-00000005.nc"
check "other pieces: no 'held by 4 replicas, 2 a node' in: $(grep restart "$out/ef-hier-moved.out")" \
  grep -q "residual starts from zero (the checkpoint's was held by 4 replicas, 2 a node, each over the pieces it leads (map [0-9a-f]*); this job's by 4 replicas, each over all its values)" "$out/ef-hier-moved.out"

# PowerSGD (&comm method = 'powersgd'): its warm start Q is in the checkpoint with a checksum; a
# restart continues bit for bit, and a damaged Q is refused
ps="--set comm.method='powersgd' --set comm.powersgd_rank=2 --set comm.error_feedback=T --set comm.min_numel=1000 --set training.max_steps=10"
# shellcheck disable=SC2086
run2 ps $ps --set checkpoint.keep=10
check_status $? "the PowerSGD run failed: $(tail -n 5 "$out/ps.out")"
# shellcheck disable=SC2086
again_same ps $ps
# shellcheck disable=SC2086
damaged_refused ps comm_powersgd_q 10 "warm start comm_powersgd_q is damaged" $ps

# a job killed after its last checkpoint and before its verdict: the restart that finds the run
# complete writes the verdict (the same parameters, no step trained); the next one leaves it alone
cp -r "$out/ps" "$out/ps-noverdict"
rm -f "$out/ps-noverdict/verdict.json"
# shellcheck disable=SC2086
run2 ps-noverdict $ps --set checkpoint.restart=latest
check_status $? "the restart of a complete run without its verdict failed: $(tail -n 5 "$out/ps-noverdict.out")"
check "the restart of a complete run wrote no verdict, or other parameters ($(hash_of ps-noverdict) vs $(hash_of ps))" \
  [ -n "$(hash_of ps)" -a "$(hash_of ps-noverdict)" = "$(hash_of ps)" ]
check "no 'no steps left' in: $(grep '== verdict' "$out/ps-noverdict.out")" grep -q "no steps left" "$out/ps-noverdict.out"
before=$(cksum < "$out/ps-noverdict/verdict.json")
# shellcheck disable=SC2086
run2 ps-noverdict $ps --set checkpoint.restart=latest
check_status $? "the restart of a complete run failed: $(tail -n 5 "$out/ps-noverdict.out")"
check "the restart of a complete run with its verdict wrote it again" [ "$(cksum < "$out/ps-noverdict/verdict.json")" = "$before" ]
check "no 'nothing to train' in: $(tail -n 2 "$out/ps-noverdict.out")" grep -q "nothing to train" "$out/ps-noverdict.out"

# an unwritable directory (a file stands in its way)
echo x > "$out/blocker"
run2 blocked --set "checkpoint.dir=$out/blocker/ckpt"
check "checkpointing into an unwritable directory succeeded" [ $? -ne 0 ]
check "no error naming the directory: $(grep error "$out/blocked.out")" grep -q "cannot create the checkpoint directory" "$out/blocked.out"
check "an unusable checkpoint directory was found only after training began" [ ! -e "$out/blocked/metrics.csv" ]

# a full disk: a file-size limit below a checkpoint's size; the older checkpoints stay usable
before=$(cksum "$out/ref/checkpoints/$last")
GREENLM_FILE_SIZE_LIMIT=1000000 run2 ref --set checkpoint.restart=latest --set training.max_steps=45
check "a checkpoint write on a full disk succeeded" [ $? -ne 0 ]
check "no checkpoint error on the full disk: $(grep error "$out/ref.out" | tail -n 2)" grep -q "writing the checkpoint failed" "$out/ref.out"
check "the newest good checkpoint changed" [ "$(cksum "$out/ref/checkpoints/$last")" = "$before" ]
check "a half-written checkpoint was left: $(ls "$out/ref/checkpoints")" [ -z "$(ls "$out/ref/checkpoints" | grep tmp)" ]
run2 ref --set checkpoint.restart=latest --set training.max_steps=42
check "restart from the checkpoints kept after the full disk failed" [ $? -eq 0 ]
finish
