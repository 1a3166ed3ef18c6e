#!/bin/sh
# test_energy: the energy module on 4 ranks with a fake powercap tree and the stub NVML library
# (tests/test_energy.c), then a real training run: its progress lines, energy.csv and report.json
# say how each number was obtained (estimated from a TDP here, with fake RAPL counters there).
. "$(dirname "$0")/lib.sh"
out="$TEST_OUT/energy"
rm -rf "$out"
mkdir -p "$out"
$MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_energy"
check "the energy module tests failed (see above)" [ $? -eq 0 ]

deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', 'train', seed = 3, log_every = 10 /
&prepare input = '$TOP_SRCDIR/tests/data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,
  train_out = '$out/train.nc', val_out = '$out/val.nc' /
&model vocab_size = 256, block_size = 32, n_layer = 4, n_embd = 128, n_head = 4 /
&training seq_len = 32, micro_batch_size = 4, global_batch_size = 8, max_steps = 30, warmup_steps = 1,
  eval_every = 0, eval_batches = 1 /
&checkpoint at_end = .false. /
&sample n_tokens = 0 /
&system peak_gflops = 100 /
EOD
json() { # json RUN KEY: a top-level number or string of RUN's report.json
  sed -n "s/^ *\"$2\": \"*\([^\",]*\)\"*,*\$/\1/p" "$out/$1/report.json" | head -n 1
}
# no sensor here (GREENLM_POWERCAP_ROOT points nowhere), a TDP: estimated, and labelled so
GREENLM_POWERCAP_ROOT=/nonexistent $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/est" --set energy.cpu_tdp_w=120 \
  --set energy.region=quebec --set energy.pue=1.3 "$deck" > "$out/est.out" 2>&1
check "the run with an estimate failed: $(tail -n 5 "$out/est.out")" [ $? -eq 0 ]
check "progress lines do not label the estimate" grep -q "W est | .* Wh est" "$out/est.out"
check "the verdict claims a measurement: $(grep '^IT energy' "$out/est.out")" grep -q "^IT energy: not measured" "$out/est.out"
check "no labelled estimate in the verdict" grep -q "^estimated (not measured, not in the totals)" "$out/est.out"
check "report.json: cpu not 'estimated'" grep -q '"status": "estimated"' "$out/est/report.json"
check "report.json: energy_consumed is not null: $(json est energy_consumed)" [ "$(json est energy_consumed)" = null ]
check "report.json: region $(json est region)" [ "$(json est region)" = quebec ]
check "report.json: pue $(json est pue)" [ "$(json est pue)" = 1.3 ]
check "energy.csv has no estimated rows" awk -F, 'NR > 1 && $3 == "cpu" && $5 > 0 { found = 1 } END { exit !found }' "$out/est/energy.csv"

# fake RAPL counters advancing during the run: measured, CO2e from PUE and intensity
pc="$out/run-powercap"
rm -rf "$pc"
mkdir -p "$pc/intel-rapl:0"
echo package-0 > "$pc/intel-rapl:0/name"
echo 262143328850 > "$pc/intel-rapl:0/max_energy_range_uj"
printf '%020d\n' 1000 > "$pc/intel-rapl:0/energy_uj"
( i=1; while [ $i -le 400 ]; do printf '%020d\n' $((1000 + i * 500000)) | dd of="$pc/intel-rapl:0/energy_uj" conv=notrunc status=none; i=$((i + 1)); sleep 0.05; done ) &
feeder=$!
GREENLM_POWERCAP_ROOT="$pc" $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/rapl" --set energy.grid_intensity=100 \
  --set energy.pue=1.5 "$deck" > "$out/rapl.out" 2>&1
check "the run with fake RAPL failed: $(tail -n 5 "$out/rapl.out")" [ $? -eq 0 ]
kill $feeder 2>/dev/null
wait $feeder 2>/dev/null
it=$(json rapl energy_consumed)
em=$(json rapl emissions)
check "report.json: energy_consumed '$it' not positive" awk -v x="$it" 'BEGIN { exit !(x > 0) }'
check "report.json: emissions $em kg != energy $it kWh x PUE 1.5 x 100 g/kWh" \
  awk -v e="$em" -v k="$it" 'BEGIN { d = e - k * 1.5 * 0.1; exit !(d < 1e-12 && d > -1e-12) }'
check "the verdict has no CO2e line" grep -q "^CO2e: .* at 100 gCO2e/kWh" "$out/rapl.out"
check "the verdict has no comparison with published footprints" grep -q "^per token: this run .* GPT-3 175B" "$out/rapl.out"
check "progress lines show no measured watts" grep -q "step .* | [0-9.]* W | [0-9.e+-]* Wh | ETA" "$out/rapl.out"
finish
