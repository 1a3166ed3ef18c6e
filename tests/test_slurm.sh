#!/bin/sh
# test_slurm: the Slurm templates without Slurm. Each run/slurm/gpuG-Nnode.sbatch is valid bash,
# asks for N nodes, G tasks and G GPUs per node, --signal=USR1@300, and resubmits itself; run as a
# job against stand-ins for sbatch, srun and scancel (tests/slurm-stub), the restart chain submits
# the next link held until this job ends, keeps it when greenlm stopped in time (verdict: signal,
# time_limit), cancels it when the run completed or failed, starts nothing after a completed run,
# and stops at GREENLM_CHAIN_MAX; with greenlm itself behind srun, a job stopped by its time limit
# is continued from its checkpoint by the next link to completion. run/slurm.sbatch chains only
# with GREENLM_CHAIN=1.
. "$(dirname "$0")/lib.sh"
fresh_out slurm tree bin
ln -s "$TOP_SRCDIR/run" "$out/tree/run"
for s in sbatch srun scancel mpirun; do cp "$TOP_SRCDIR/tests/slurm-stub/$s" "$out/bin/$s" && chmod +x "$out/bin/$s"; done
PATH="$out/bin:$PATH"
STUB_LOG="$out/calls.log"
export PATH STUB_LOG

# the #SBATCH value of OPTION in FILE
opt() { sed -n "s/^#SBATCH --$2=\([^ ]*\).*/\1/p" "$1"; }
n=0
for g in 6 8; do
  for nodes in 1 2 4 8; do
    f="run/slurm/gpu$g-${nodes}node.sbatch"
    t="$TOP_SRCDIR/$f"
    n=$((n + 1))
    check "$f: missing" [ -f "$t" ]
    check "$f: not valid bash" bash -n "$t"
    check "$f: --nodes is '$(opt "$t" nodes)', not $nodes" [ "$(opt "$t" nodes)" = "$nodes" ]
    check "$f: --ntasks-per-node is '$(opt "$t" ntasks-per-node)', not $g (one rank per GPU)" [ "$(opt "$t" ntasks-per-node)" = "$g" ]
    check "$f: --gpus-per-node is '$(opt "$t" gpus-per-node)', not $g" [ "$(opt "$t" gpus-per-node)" = "$g" ]
    check "$f: --signal is '$(opt "$t" signal)', not USR1@300" [ "$(opt "$t" signal)" = USR1@300 ]
    check "$f: no --account line (the user gives -A)" [ -z "$(opt "$t" account)" ]
    # sbatch reads #SBATCH lines only before the first command
    check "$f: an #SBATCH line after the first command" \
      sh -c "awk '/^#SBATCH/ && cmd { bad = 1 } !/^#/ && !/^[[:space:]]*\$/ { cmd = 1 } END { exit bad }' '$t'"
    check "$f: does not resubmit itself" grep -q "^exec run/slurm/chain $f \"\$@\"\$" "$t"
  done
done

# the site templates: 4 nodes of G GPUs (--gres=gpu:G), G ranks each, 6-hour jobs, chained
for site in aimos:6 satori:4; do
  f="run/slurm/${site%:*}.sbatch" g=${site#*:}
  t="$TOP_SRCDIR/$f"
  n=$((n + 1))
  check "$f: missing" [ -f "$t" ]
  check "$f: not valid bash" bash -n "$t"
  check "$f: --nodes is '$(opt "$t" nodes)', not 4" [ "$(opt "$t" nodes)" = 4 ]
  check "$f: --ntasks-per-node is '$(opt "$t" ntasks-per-node)', not $g" [ "$(opt "$t" ntasks-per-node)" = "$g" ]
  check "$f: --gres is '$(opt "$t" gres)', not gpu:$g" [ "$(opt "$t" gres)" = "gpu:$g" ]
  check "$f: --time is '$(opt "$t" time)', not the sites' 06:00:00" [ "$(opt "$t" time)" = 06:00:00 ]
  check "$f: --signal is '$(opt "$t" signal)', not USR1@300" [ "$(opt "$t" signal)" = USR1@300 ]
  check "$f: does not resubmit itself" grep -q "^exec run/slurm/chain $f \"\$@\"\$" "$t"
done

# job SCRIPT [greenlm options]: run SCRIPT as Slurm would, from the tree, as job 4242 named
# chaintest, on input/deck.nml; rc in $out/rc
job() {
  script=$1
  shift
  [ $# -gt 0 ] || set -- --set training.max_steps=9
  (cd "$out/tree" && SLURM_SUBMIT_DIR="$out/tree" SLURM_JOB_ID=4242 SLURM_JOB_NAME=chaintest SLURM_JOB_ACCOUNT=proj \
     SLURM_JOB_NUM_NODES=4 SLURM_NTASKS=24 SLURM_NTASKS_PER_NODE='6(x4)' SLURM_CPUS_PER_TASK=4 bash "$TOP_SRCDIR/$script" input/deck.nml "$@") > "$out/job.out" 2>&1
  echo $? > "$out/rc"
}
calls() { grep -c "^$1 " "$STUB_LOG"; }
fresh() { rm -rf "$out/tree/runs"; : > "$STUB_LOG"; }
t=run/slurm/gpu8-4node.sbatch

# stopped by the time-limit warning: the next link stays, held until this job ends
fresh
STUB_STATUS=signal job $t
check "signal: the job failed ($(cat "$out/rc")): $(cat "$out/job.out")" [ "$(cat "$out/rc")" = 0 ]
check "signal: not one sbatch: $(cat "$STUB_LOG")" [ "$(calls sbatch)" = 1 ]
check "signal: the next link is not held until this job ends" grep -q -- "--dependency=afterany:4242 " "$STUB_LOG"
check "signal: the next link is not the same template, deck and options" \
  grep -q "^sbatch .*--account=proj .*--nodes=4 .*GREENLM_CHAIN_LINK=2 $t input/deck.nml --set training.max_steps=9\$" "$STUB_LOG"
check "signal: the next link was cancelled" [ "$(calls scancel)" = 0 ]
check "signal: srun not one rank per task bound to cores, restarting from the latest checkpoint" \
  grep -q "^srun --cpu-bind=cores --cpus-per-task=4 src/greenlm .*job.run_dir=runs/chaintest --set checkpoint.restart=latest --set training.max_steps=9 input/deck.nml\$" "$STUB_LOG"
STUB_STATUS=time_limit job $t
check "time_limit: the next link was cancelled" [ "$(calls scancel)" = 0 ]

# the run completed: the next link is cancelled; a link that starts later does nothing
fresh
STUB_STATUS=completed job $t
check "completed: the job failed: $(cat "$out/job.out")" [ "$(cat "$out/rc")" = 0 ]
check "completed: the next link was not cancelled: $(cat "$STUB_LOG")" grep -q "^scancel 4243\$" "$STUB_LOG"
: > "$STUB_LOG"
STUB_STATUS=completed job $t
check "after completion: a link ran or submitted something: $(cat "$STUB_LOG")" [ ! -s "$STUB_LOG" ]
check "after completion: the link failed" [ "$(cat "$out/rc")" = 0 ]

# greenlm failed, an earlier link's verdict (signal) still there: the chain stops, the job fails
fresh
STUB_STATUS=signal job $t
: > "$STUB_LOG"
STUB_STATUS=none STUB_RC=3 job $t
check "failure: the job exited $(cat "$out/rc"), not greenlm's 3" [ "$(cat "$out/rc")" = 3 ]
check "failure: the next link was not cancelled: $(cat "$STUB_LOG")" grep -q "^scancel 4243\$" "$STUB_LOG"
check "failure: the message does not say the chain stops" grep -q "the chain stops" "$out/job.out"

# the last link allowed submits nothing
fresh
GREENLM_CHAIN_MAX=3 GREENLM_CHAIN_LINK=3 STUB_STATUS=signal job $t
check "GREENLM_CHAIN_MAX: a link beyond it was submitted" [ "$(calls sbatch)" = 0 ]

# the chain with greenlm itself (srun's stand-in runs it on one rank): a job stopped by its time
# limit (&training max_minutes, 1e-9: after the first step) keeps the next link, which restarts from the checkpoint and
# completes; the link after that finds the run done
mkdir -p "$out/tree/input"
cat > "$out/tree/input/deck.nml" <<EOD
&job task = 'train', log_every = 1 /
$(genesis_prepare)
&model vocab_size = 256, block_size = 16, n_layer = 1, n_embd = 16, n_head = 2 /
&training seq_len = 16, micro_batch_size = 2, global_batch_size = 2, max_steps = 4, eval_every = 0, eval_batches = 1 /
&sample n_tokens = 0 /
&system peak_gflops = 100 /
EOD
(cd "$out/tree" && greenlm --set job.task=prepare input/deck.nml) > "$out/prepare.out" 2>&1
check "the chain's datasets: $(tail -n 5 "$out/prepare.out")" [ -s "$out/train.nc" ]
fresh
STUB_STATUS=real job $t --set training.max_minutes=1e-9
check "real, time limit: the job failed: $(tail -n 5 "$out/job.out")" [ "$(cat "$out/rc")" = 0 ]
check "real, time limit: verdict not time_limit" grep -q '^  "status": "time_limit"' "$out/tree/runs/chaintest/verdict.json"
check "real, time limit: not one next link, or it was cancelled: $(cat "$STUB_LOG")" [ "$(calls sbatch) $(calls scancel)" = "1 0" ]
: > "$STUB_LOG"
GREENLM_CHAIN_LINK=2 STUB_STATUS=real job $t --set training.max_minutes=0
check "real, link 2: the job failed: $(tail -n 5 "$out/job.out")" [ "$(cat "$out/rc")" = 0 ]
check "real, link 2: did not continue from the step-1 checkpoint" grep -q "^restart: runs/chaintest/checkpoints/ckpt-00000001.nc, step 1:" "$out/tree/runs/chaintest/log.txt"
check "real, link 2: verdict not completed" grep -q '^  "status": "completed"' "$out/tree/runs/chaintest/verdict.json"
check "real, link 2: the next link was not cancelled: $(cat "$STUB_LOG")" grep -q "^scancel 4243\$" "$STUB_LOG"
: > "$STUB_LOG"
GREENLM_CHAIN_LINK=3 STUB_STATUS=real job $t
check "real, link 3: ran after the run was done: $(cat "$STUB_LOG")" [ ! -s "$STUB_LOG" ]

# AiMOS: Spectrum MPI's mpirun -gpu over a hostfile of the InfiniBand names, the next link the same
fresh
STUB_STATUS=signal job run/slurm/aimos.sbatch
check "aimos: the job failed ($(cat "$out/rc")): $(cat "$out/job.out")" [ "$(cat "$out/rc")" = 0 ]
check "aimos: not Spectrum MPI's mpirun -gpu, 24 ranks, CUDA-aware, restarting: $(cat "$STUB_LOG")" \
  grep -q "^mpirun -gpu --bind-to core -hostfile runs/chaintest/hosts.4242 -np 24 -x OPENBLAS_NUM_THREADS -x GREENLM_CUDA_AWARE_MPI=1 src/greenlm .*--set checkpoint.restart=latest .*input/deck.nml\$" "$STUB_LOG"
check "aimos: the hostfile is not this node's InfiniBand name with 6 slots: $(cat "$STUB_LOG")" \
  grep -qx "hostfile: $(hostname -s)-ib slots=6" "$STUB_LOG"
check "aimos: the hostfile was left behind" [ ! -e "$out/tree/runs/chaintest/hosts.4242" ]
check "aimos: the next link is not aimos.sbatch: $(cat "$STUB_LOG")" grep -q "^sbatch .* run/slurm/aimos.sbatch input/deck.nml" "$STUB_LOG"
fresh
GREENLM_LAUNCHER=mpiexec STUB_STATUS=signal job run/slurm/aimos.sbatch
check "an unknown GREENLM_LAUNCHER: the job did not fail" [ "$(cat "$out/rc")" != 0 ]
check "an unknown GREENLM_LAUNCHER: not named with the choices: $(cat "$out/job.out")" grep -q "GREENLM_LAUNCHER='mpiexec' names no launcher: srun or spectrum" "$out/job.out"
fresh
STUB_STATUS=signal job run/slurm/satori.sbatch
check "satori: not srun one rank per task: $(cat "$STUB_LOG")" grep -q "^srun --cpu-bind=cores --cpus-per-task=4 src/greenlm " "$STUB_LOG"

# run/slurm.sbatch: no chain unless asked for
fresh
STUB_STATUS=signal job run/slurm.sbatch
check "run/slurm.sbatch chained by itself: $(cat "$STUB_LOG")" [ "$(calls sbatch)" = 0 ]
check "run/slurm.sbatch did not run greenlm" [ "$(calls srun)" = 1 ]
fresh
GREENLM_CHAIN=1 STUB_STATUS=signal job run/slurm.sbatch
check "run/slurm.sbatch with GREENLM_CHAIN=1 did not submit itself: $(cat "$STUB_LOG")" grep -q "^sbatch .* run/slurm.sbatch input/deck.nml" "$STUB_LOG"
echo "test_slurm: $n templates"
finish
