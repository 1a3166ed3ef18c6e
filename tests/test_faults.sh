#!/bin/sh
# test_faults: the bad-input and fault table of doc/testing.md. One case per class of what greenlm
# must survive: damaged and mismatched datasets, a damaged or mismatched checkpoint run state, an
# overwritten run directory, decks and overrides that are not what they seem, batch-job mishaps
# (a damaged newest checkpoint, a stalled rank, a full run directory, an unusable checkpoint
# directory, Ctrl-C) and unclear messages. Each case has its expected exit status and message,
# and after each one every good file (datasets, tokenizer, checkpoints) is byte for byte as it was.
# The cases and their outcomes are written to $TEST_OUT/faults/table.txt.
. "$(dirname "$0")/lib.sh"
fresh_out faults
: "${NC_EDIT:=$PWD/tests/nc_edit}"
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'train', seed = 11, log_every = 5, run_dir = '$out/ref' /
$(genesis_prepare)
&model vocab_size = 300, block_size = 64, n_layer = 2, n_embd = 64, n_head = 4 /
&training seq_len = 64, micro_batch_size = 4, global_batch_size = 8, max_steps = 30, warmup_steps = 2,
  eval_every = 0, eval_batches = 2 /
&checkpoint every_steps = 10, keep = 3 /
&sample n_tokens = 0 /
&system peak_gflops = 100 /
EOD
edit() { $MPIEXEC -n 1 "$NC_EDIT" "$@" > "$out/edit.log" 2>&1 || bad "nc_edit $*: $(cat "$out/edit.log")"; }

# ---- the good files ----------------------------------------------------------------------------
greenlm --set job.task=prepare "$deck" > "$out/prepare.out" 2>&1 || bad "prepare: $(tail -n 3 "$out/prepare.out")"
greenlm "$deck" > "$out/ref.out" 2>&1 || bad "reference run: $(tail -n 3 "$out/ref.out")"
# a BPE vocabulary of the same size and its datasets (for a restart with another tokenizer)
greenlm --set "job.task='tokenizer','prepare'" --set tokenizer.kind=bpe --set "tokenizer.dir=$out/bpe" \
  --set tokenizer.vocab_size=300 --set "prepare.train_out=$out/bpe-train.nc" --set "prepare.val_out=$out/bpe-val.nc" \
  "$deck" > "$out/bpe.out" 2>&1 || bad "BPE datasets: $(tail -n 3 "$out/bpe.out")"
# a smaller dataset (for a restart on another dataset)
head -c 20000 "$TOP_SRCDIR/tests/data/kjv-genesis.txt" > "$out/small.txt"
greenlm --set job.task=prepare --set "prepare.input=$out/small.txt" --set prepare.documents=line \
  --set "prepare.train_out=$out/small-train.nc" --set "prepare.val_out=$out/small-val.nc" "$deck" > "$out/small.out" 2>&1 \
  || bad "small datasets: $(tail -n 3 "$out/small.out")"
good="$out/train.nc $out/val.nc $out/bpe-train.nc $out/bpe/encoder.json $out/bpe/vocab.bpe $(ls "$out"/ref/checkpoints/ckpt-*.nc)"
snapshot() { for f in $good; do cksum "$f" 2>&1; done; }
snapshot > "$out/good.before"
last=$(ls "$out/ref/checkpoints" | grep '^ckpt-.*\.nc$' | tail -n 1)
printf '%-28s %-18s %-6s %-6s %s\n' case class exit want message > "$out/table.txt"

# expect NAME CLASS STATUS MESSAGE command...: STATUS is a number or 'nonzero'
expect() {
  name=$1 class=$2 want=$3 msg=$4; shift 4
  "$@" > "$out/$name.out" 2>&1
  rc=$?
  if [ "$want" = nonzero ]; then check "$name: exit status $rc, expected non-zero" [ "$rc" -ne 0 ]
  else check "$name: exit status $rc, expected $want: $(tail -n 4 "$out/$name.out")" [ "$rc" -eq "$want" ]; fi
  check "$name: no '$msg' in: $(grep -i 'error\|warning' "$out/$name.out" | head -n 4)" grep -qF -- "$msg" "$out/$name.out"
  snapshot > "$out/good.after"
  check "$name: a good file changed: $(diff "$out/good.before" "$out/good.after" | head -n 4)" \
    cmp -s "$out/good.before" "$out/good.after"
  printf '%-28s %-18s %-6s %-6s %s\n' "$name" "$class" "$rc" "$want" "$msg" >> "$out/table.txt"
}
run() { greenlm --set "job.run_dir=$out/$name.run" "$@" "$deck"; }
run2() { $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/$name.run" "$@" "$deck"; }

# ---- token datasets: nothing read from one is trusted -------------------------------------------
cp "$out/train.nc" "$out/id.nc" && edit "$out/id.nc" var tokens 100 299
name=ds-id-past-vocabulary
expect $name dataset 1 "token 100 has id 299, outside the vocabulary of 256" run --set "data.train=$out/id.nc"
cp "$out/val.nc" "$out/val-id.nc" && edit "$out/val-id.nc" var tokens 5 299
name=ds-id-unverified
expect $name dataset nonzero "token 5 has id 299, outside the vocabulary of 256" \
  run --set "data.val=$out/val-id.nc" --set data.verify=F
cp "$out/train.nc" "$out/flip.nc" && edit "$out/flip.nc" var tokens 1000 0
name=ds-flipped-token
expect $name dataset 1 "tokens 0 to 54247 do not match their checksum" run --set "data.train=$out/flip.nc"
cp "$out/train.nc" "$out/trunc.nc" && truncate -s $(($(wc -c < "$out/train.nc") / 2)) "$out/trunc.nc"
name=ds-truncated
expect $name dataset 1 "truncated: the dataset's header needs" run --set "data.train=$out/trunc.nc"

# ---- the checkpoint's run state -----------------------------------------------------------------
step=$(echo "$last" | sed 's/ckpt-0*\([0-9]*\)\.nc/\1/')
cp "$out/ref/checkpoints/$last" "$out/state.nc" && edit "$out/state.nc" att step int64 $((step + 1))
name=ck-state-flipped
expect $name checkpoint 1 "the run state does not match its checksum" run --set "checkpoint.restart=$out/state.nc"
name=ck-other-tokenizer
expect $name checkpoint 1 "the checkpoint was trained with another tokenizer" \
  run --set tokenizer.kind=bpe --set "tokenizer.dir=$out/bpe" --set "data.train=$out/bpe-train.nc" \
  --set "data.val=$out/bpe-val.nc" --set "checkpoint.restart=$out/ref/checkpoints/$last"
name=ck-other-dataset
expect $name checkpoint 1 "the checkpoint was trained on another dataset" \
  run --set "data.train=$out/small-train.nc" --set "checkpoint.restart=$out/ref/checkpoints/$last"
name=ck-other-seed
expect $name checkpoint 1 "the checkpoint's &job seed is 11, the deck's 12" \
  run --set job.seed=12 --set "checkpoint.restart=$out/ref/checkpoints/$last"

# ---- overwrite never mixes two runs ------------------------------------------------------------
name=overwrite-moves-aside
cp -r "$out/ref" "$out/$name.run"
expect $name overwrite 0 "the earlier run's checkpoints were moved to" \
  run --set job.overwrite=T --set training.max_steps=10 --set checkpoint.every_steps=5
check "$name: the earlier run's checkpoints are gone" [ -f "$(ls -d "$out/$name.run"/checkpoints.replaced-*)/$last" ]
check "$name: the new run's checkpoint was pruned: $(ls "$out/$name.run/checkpoints")" \
  [ -f "$out/$name.run/checkpoints/ckpt-00000010.nc" ]
run --set checkpoint.restart=latest --set training.max_steps=12 > "$out/$name.resume.out" 2>&1
check "$name: 'latest' did not resume the new run: $(grep restart: "$out/$name.resume.out")" \
  grep -q "ckpt-00000010.nc, step 10:" "$out/$name.resume.out"
name=overwrite-refused
cp -r "$out/ref" "$out/$name.run" && rm "$out/$name.run/metrics.csv"
expect $name overwrite 1 "holds 3 checkpoints of an earlier run" run
name=overwrite-refused-first
cp -r "$out/ref" "$out/$name.run"
expect $name overwrite 1 "already holds a run (metrics.csv exists)" run --set "job.task=prepare,train"
check "$name: the prepare task ran before the run directory was refused" sh -c "! grep -q '== task: prepare' '$out/$name.out'"

# ---- decks and overrides -----------------------------------------------------------------------
printf '&job\n name = "a\000b" /\n' > "$out/nul.nml"
name=deck-nul-byte
expect $name deck 1 "nul.nml:2:11: error: byte 0x00 is not text (a NUL byte)" greenlm --dry-run "$out/nul.nml"
gzip -c "$deck" > "$out/binary.nml"
name=deck-binary
expect $name deck 1 "binary.nml:1:1: error: byte 0x1f is not text (a control character)" greenlm --dry-run "$out/binary.nml"
head -c 10000000 /dev/zero | tr '\0' '!' > "$out/huge.nml"
name=deck-10MB
expect $name deck 1 "10000000 bytes: more than a deck can be (1048576 bytes at most)" greenlm --dry-run "$out/huge.nml"
i=0; while [ $i -lt 20000 ]; do echo "&job bogus_key_$i = 1 /"; i=$((i + 1)); done > "$out/flood.nml"
name=deck-flood-of-errors
expect $name deck 1 "greenlm: ... and" $MPIEXEC -n 2 "$GREENLM" --dry-run "$out/flood.nml"
check "$name: more than 20 errors printed" [ "$(grep -c ': error: ' "$out/$name.out")" -le 20 ]
name=deck-set-smuggles
expect $name deck 1 "the value reaches beyond its key (into another group)" \
  greenlm --dry-run --set "training.lr=1e-3 / &model n_layer=1" "$deck"
: > "$out/empty.nml"
name=deck-empty
expect $name deck 1 "the deck is empty: no &group in it" greenlm --dry-run "$out/empty.nml"

# ---- batch jobs ----------------------------------------------------------------------------------
name=job-damaged-newest
cp -r "$out/ref" "$out/$name.run"
size=$(wc -c < "$out/$name.run/checkpoints/$last")
printf 'garbage!' | dd of="$out/$name.run/checkpoints/$last" bs=1 seek=$((size - 4000)) conv=notrunc 2>/dev/null
expect $name batch-job 0 "is damaged: set aside as .damaged; trying the next older checkpoint" \
  run --set checkpoint.restart=latest --set training.max_steps=32
name=job-damaged-no-fallback
cp -r "$out/ref" "$out/$name.run" && cp "$out/job-damaged-newest.run/checkpoints/$last.damaged" "$out/$name.run/checkpoints/$last"
expect $name batch-job 1 "&checkpoint fallback = .true. would try them" \
  run --set checkpoint.restart=latest --set checkpoint.fallback=F
name=job-stalled-rank
t0=$(date +%s)
expect $name batch-job 5 "rank 1 stopped answering: busy outside MPI" \
  env GREENLM_FAULT=stall:1:3 $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/$name.run" --set job.step_timeout=2 "$deck"
check "$name: the stalled job took $(($(date +%s) - t0)) s to end" [ $(($(date +%s) - t0)) -lt 30 ]
# the adaptive limit (the default): a stopped process (SIGSTOP: no heartbeats) ends the job after the floor
name=job-stopped-rank
t0=$(date +%s)
expect $name batch-job 5 "rank 1 stopped answering: no heartbeat" \
  env GREENLM_FAULT=stop:1:5 $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/$name.run" --set job.watchdog_floor=4 \
  --set training.max_steps=100000 --set checkpoint.every_steps=0 --set checkpoint.at_end=F "$deck"
check "$name: the stopped job took $(($(date +%s) - t0)) s to end" [ $(($(date +%s) - t0)) -lt 60 ]
# a phase slower than the floor / 10 raises the limit, announced, and the job goes on; the pause is in
# step 29, so the announcement at step 30 cannot wait for rank 1's heartbeat to reach rank 0
name=job-slower-phase
expect $name batch-job 0 "watchdog: the limit is now" \
  env GREENLM_FAULT=slow:1:29 $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/$name.run" --set job.watchdog_floor=3 "$deck"
check "$name: the header does not announce the adaptive watchdog" grep -q "^watchdog: adaptive" "$out/$name.run/log.txt"
name=job-full-run-dir
limit=$(($(wc -c < "$out/ref/deck.resolved.nml") + 400))
expect $name batch-job 4 "writing log.txt or metrics.csv failed" \
  env GREENLM_FILE_SIZE_LIMIT=$limit $MPIEXEC -n 1 "$GREENLM" --set "job.run_dir=$out/$name.run" --set checkpoint.at_end=F \
  --set checkpoint.every_steps=0 "$deck"
# a checkpoint that does not fit: the message says how much it needed and what stood in the way
name=job-checkpoint-does-not-fit
expect $name batch-job 4 "above the process's file-size limit" \
  env GREENLM_FILE_SIZE_LIMIT=500000 $MPIEXEC -n 1 "$GREENLM" --set "job.run_dir=$out/$name.run" "$deck"
check "$name: a checkpoint under a final name: $(ls "$out/$name.run/checkpoints" 2>&1)" \
  [ -z "$(ls "$out/$name.run/checkpoints" 2>/dev/null | grep '^ckpt-.*\.nc$')" ]
echo x > "$out/blocker"
name=job-checkpoint-dir-unusable
expect $name batch-job 1 "cannot create the checkpoint directory" run --set "checkpoint.dir=$out/blocker/ckpt"
check "$name: training began before the checkpoint directory was checked" [ ! -e "$out/$name.run/metrics.csv" ]
name=job-sigint
run2 --set training.max_steps=100000 --set checkpoint.every_steps=0 > "$out/$name.out" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "^== training" "$out/$name.out" 2>/dev/null && break; sleep 0.1; done
pkill -INT -f "^$GREENLM .*job.run_dir=$out/$name.run"
wait $job
rc=$?
check "$name: exit status $rc after SIGINT, expected 0" [ "$rc" -eq 0 ]
check "$name: no 'signal 2 (SIGINT)' in the log" grep -q "stopping: signal 2 (SIGINT)" "$out/$name.out"
check "$name: no checkpoint written on SIGINT" [ -n "$(ls "$out/$name.run/checkpoints" | grep '^ckpt-.*\.nc$')" ]
printf '%-28s %-18s %-6s %-6s %s\n' "$name" batch-job "$rc" 0 "stopping: signal 2 (SIGINT)" >> "$out/table.txt"
# a restart chain: each job's verdict says which job of the chain it is (jobs.csv lists them all)
name=job-chain
cp -r "$out/ref" "$out/$name.run"
expect $name batch-job 0 "== verdict: completed (job 2 of the run's chain, steps 31 to 34) ==" \
  run --set checkpoint.restart=latest --set training.max_steps=34
check "$name: jobs.csv does not list both jobs: $(cat "$out/$name.run/jobs.csv")" \
  grep -q '^2,.*,31,".*ckpt-00000030.nc"$' "$out/$name.run/jobs.csv"
check "$name: verdict.json does not name the job" grep -q '"index": 2' "$out/$name.run/verdict.json"

# ---- messages ------------------------------------------------------------------------------------
# a run faster than its peak: MFU is not a figure of merit then
name=msg-mfu-above-peak
expect $name message 0 "MFU not valid" run --set system.peak_gflops=0.001 --set training.max_steps=10
check "$name: verdict.json's mfu is not null" grep -q '"mfu": null' "$out/$name.run/verdict.json"
printf '&job name = %s /\n' "$(head -c 5000 /dev/zero | tr '\0' x)" > "$out/long.nml"
name=msg-long-token
expect $name message 1 "xxx...'); logicals are .true. or .false." greenlm --dry-run "$out/long.nml"
mkdir -p "$out/a-directory.nc"
name=msg-directory-for-file
expect $name message 1 "a directory, not a dataset file" run --set "data.train=$out/a-directory.nc"
: > "$out/empty.nc"
name=msg-empty-file
expect $name message 1 "an empty file, not a dataset" run --set "data.train=$out/empty.nc"
if command -v ncgen >/dev/null 2>&1; then
  printf 'netcdf x { dimensions: token = 2; variables: ushort tokens(token); }\n' > "$out/nc4.cdl"
  ncgen -k nc4 -o "$out/nc4.nc" "$out/nc4.cdl"
  name=msg-netcdf4
  expect $name message 1 "a NetCDF-4 (HDF5) file, not a greenlm dataset" run --set "data.train=$out/nc4.nc"
fi
name=msg-odd-checkpoint-names
mkdir -p "$out/$name.run/checkpoints/ckpt-00000099.nc"
for f in ckpt-5.nc ckpt-00000005.nc.bak ckpt-0000005a.nc; do echo x > "$out/$name.run/checkpoints/$f"; done
expect $name message 0 "no checkpoint in $out/$name.run/checkpoints yet: starting from step 0" \
  run --set checkpoint.restart=latest --set training.max_steps=2
name=msg-malformed-environment
expect $name message 1 "GREENLM_FILE_SIZE_LIMIT: error: '12x' is not a number of bytes" \
  env GREENLM_FILE_SIZE_LIMIT=12x $MPIEXEC -n 1 "$GREENLM" --dry-run "$deck"
name=msg-unknown-path
expect $name message 1 "GREENLM_EPILOGUES: error: 'cublas' is neither auto nor kernels" \
  env GREENLM_EPILOGUES=cublas $MPIEXEC -n 1 "$GREENLM" --dry-run "$deck"
name=msg-misspelt-environment
expect $name message 1 "did you mean GREENLM_FILE_SIZE_LIMIT?" env GREENLM_FILE_SIZE_LIMT=100 $MPIEXEC -n 1 "$GREENLM" --dry-run "$deck"

cat "$out/table.txt"
finish
