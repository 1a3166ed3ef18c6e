#!/bin/sh
# test_plan_task: the 'plan' task end to end.
#   - the 13B deck on the first target (4 x 6 V100 32 GB) finds a layout that fits, prints the
#     deck lines, days, MWh and tCO2e, the fastest layout for each tp (1 and 2), and writes plan.json;
#     the 20B deck on one 16 GB node finds nothing and says how many nodes would do;
#   - the memory model stays honest: the deck's layout predicted on this machine against the
#     peak resident memory of real runs (1 rank; 2 pipeline stages; 2 replicas with ZeRO-1; 2 tensor
#     ranks), within 10% (not under the sanitizers, whose shadow memory is not the program's);
#   - every machine file of input/machines plans the 1.3B deck on its ranks;
#   - bad input: a missing machine file, a key of the wrong group in it, bf16 on a V100.
. "$(dirname "$0")/lib.sh"
fresh_out plan
machines="$TOP_SRCDIR/input/machines"

greenlm --plan --machine "$machines/v100-4x6.nml" --set "job.run_dir='$out/13b'" "$TOP_SRCDIR/input/neo-13b.nml" > "$out/13b.out" 2>&1
check_status $? "13B plan failed: $(tail -n 3 "$out/13b.out")"
check "13B plan: no recommendation" grep -q '^recommended (the fastest that fits' "$out/13b.out"
check "13B plan: no deck lines" \
  grep -q '^&parallel pipeline_stages = [0-9]*, tensor_parallel = [12], data_parallel = [0-9]*' "$out/13b.out"
by_t=$(grep -A2 '^the fastest that fits for each tp' "$out/13b.out" | tail -n 2 | cut -c8-10 | tr -d ' ' | tr '\n' ' ')
check "13B plan: no fastest layout for tp = 1 and tp = 2: '$by_t'" [ "$by_t" = "1 2 " ]
check "13B plan.json: no fastest layout per T" grep -q '"fastest_by_tensor_parallel"' "$out/13b/plan.json"
check "13B plan: no days, MWh, tCO2e" grep -q '^predicted: .* days for .*tokens (20 per parameter)' "$out/13b.out"
check "13B plan: no energy line" grep -q '^energy: .* MWh (.*) with PUE 1.20; .* tCO2e' "$out/13b.out"
check "13B plan: no plan.json" grep -q '"recommended_nodes": 4' "$out/13b/plan.json"

# every machine file of input/machines plans the 1.3B deck at fp16 on all of its ranks
for f in "$machines"/*.nml; do
  m=$(basename "$f" .nml)
  greenlm --plan --machine "$f" --set "system.precision='fp16'" --set "job.run_dir='$out/m-$m'" \
    "$TOP_SRCDIR/input/neo-1.3b.nml" > "$out/m-$m.out" 2>&1
  check_status $? "$m: the plan failed: $(tail -n 3 "$out/m-$m.out")"
  ranks=$(( $(sed -n 's/^ *nodes *= *\([0-9]*\).*/\1/p' "$f") * $(sed -n 's/^ *devices_per_node *= *\([0-9]*\).*/\1/p' "$f") ))
  check "$m: no recommendation on its $ranks ranks: $(grep '^recommended:' "$out/m-$m.out")" \
    grep -q "^recommended: nodes=[0-9]* ranks=$ranks " "$out/m-$m.out"
done

greenlm --plan --machine "$machines/v100-4x6.nml" --set machine.nodes=1 --set "machine.device='v100-16gb'" \
  --set "job.run_dir='$out/20b'" "$TOP_SRCDIR/input/neo-20b.nml" > "$out/20b.out" 2>&1
check "20B on one node: nothing fits, and what would: $(grep -A1 '^nothing fits' "$out/20b.out")" \
  grep -q '^what would: [0-9]* nodes' "$out/20b.out"

# ---- the memory model against real runs -----------------------------------------------------------
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', 'train', run_dir = '$out/run', overwrite = .true. /
$(genesis_prepare)
&model vocab_size = 50257, block_size = 128, n_layer = 4, n_embd = 384, n_head = 6 /
&training seq_len = 128, micro_batch_size = 2, global_batch_size = 4, max_steps = 1, eval_every = 0,
  eval_batches = 1 /
&checkpoint at_end = .false. /
&sample n_tokens = 0 /
&system peak_gflops = 100 /
EOD
json_number() { sed -n "s/.*\"$2\": \([-0-9.e+]*\).*/\1/p" "$1" | head -n 1; }
memory() { # NAME NP [--set ...]: the run's peak resident memory against the plan's prediction
  name=$1 np=$2
  shift 2
  $MPIEXEC -n "$np" "$GREENLM" "$@" "$deck" > "$out/$name.out" 2>&1
  check "$name: the run failed: $(tail -n 3 "$out/$name.out")" [ -s "$out/run/verdict.json" ]
  rss=$(json_number "$out/run/verdict.json" peak_rss_bytes)
  rm -f "$out/run/verdict.json"
  greenlm --plan --set machine.devices_per_node="$np" --set "job.run_dir='$out/plan-$name'" "$@" "$deck" > "$out/plan-$name.out" 2>&1
  predicted=$(sed -n 's/^result: .* memory_bytes=\([0-9]*\) .*/\1/p' "$out/plan-$name.out")
  echo "$name: predicted $predicted bytes, peak resident $rss"
  check "$name: predicted memory $predicted bytes against a peak resident $rss (more than 10% apart)" \
    awk -v p="${predicted:-0}" -v m="${rss:-1}" 'BEGIN { exit !(p / m > 0.9 && p / m < 1.1) }'
}
case "${ASAN_OPTIONS:-}" in
*log_path*) echo "test_plan: the memory comparison is skipped under the sanitizers" ;;
*)
  memory serial 1
  memory stages 2 --set parallel.pipeline_stages=2
  memory zero 2 --set parallel.zero_stage=1 --set training.recompute=T
  memory tensor 2 --set parallel.tensor_parallel=2
  ;;
esac

# ---- bad input --------------------------------------------------------------------------------------
greenlm --plan --machine "$out/none.nml" "$TOP_SRCDIR/input/neo-13b.nml" > "$out/bad1.out" 2>&1
check "a missing machine file is not an error naming it" [ $? -ne 0 ]
check "a missing machine file: $(head -n 2 "$out/bad1.out")" grep -q "none.nml.*machine file" "$out/bad1.out"
printf '&machine nodes = 2, pue = 1.3 /\n' > "$out/wrong.nml"
greenlm --plan --machine "$out/wrong.nml" "$TOP_SRCDIR/input/neo-13b.nml" > "$out/bad2.out" 2>&1
check "a key of another group in the machine file: $(head -n 3 "$out/bad2.out")" \
  grep -q "wrong.nml:1:.*unknown key 'pue'" "$out/bad2.out"
check "a key of another group in the machine file: no hint" grep -q "'pue' belongs to &energy" "$out/bad2.out"
greenlm --plan --machine "$machines/v100-4x6.nml" --set "system.precision='bf16'" --set "job.run_dir='$out/bad3'" \
  "$TOP_SRCDIR/input/neo-13b.nml" > "$out/bad3.out" 2>&1
check "bf16 on a V100 is not refused with the fp16 hint: $(grep -i error "$out/bad3.out" | head -n 2)" \
  grep -q "has no bf16 arithmetic" "$out/bad3.out"
check "bf16 on a V100 wrote a plan" [ ! -e "$out/bad3/plan.json" ]
greenlm --plan --set machine.devices_per_node=5 --set "job.run_dir='$out/bad4'" "$deck" > "$out/bad4.out" 2>&1
check "5 ranks with no layout is not an error" [ $? -ne 0 ]
check "no layout: $(grep -A1 error "$out/bad4.out" | head -n 2)" grep -q "devices_per_node.*no layout of 5 ranks" "$out/bad4.out"
check "no layout wrote a plan" [ ! -e "$out/bad4/plan.json" ]
finish
