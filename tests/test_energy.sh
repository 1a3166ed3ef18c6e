#!/bin/sh
# test_energy: the energy module on 4 ranks with a fake powercap tree and the stub NVML library
# (tests/test_energy.c), then real training runs: their progress lines, verdicts, energy.csv and
# report.json say how each number was obtained: estimated from the built-in table (the default),
# from a deck TDP, not at all (&energy estimate = .false.), and with fake RAPL counters.
. "$(dirname "$0")/lib.sh"
fresh_out energy
$MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_energy"
check "the energy module tests failed (see above)" [ $? -eq 0 ]

deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', 'train', seed = 3, log_every = 10 /
$(genesis_prepare)
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
comp() { # comp RUN COMPONENT KEY: a string of a component in RUN's report.json
  sed -n "/^ *\"$2\": {/,/}/s/^ *\"$3\": \"\([^\"]*\)\".*/\1/p" "$out/$1/report.json" | head -n 1
}
# no sensor here (GREENLM_POWERCAP_ROOT points nowhere), a TDP: estimated, and labelled so
GREENLM_POWERCAP_ROOT=/nonexistent $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/est" --set energy.cpu_tdp_w=120 \
  --set energy.region=quebec --set energy.pue=1.3 "$deck" > "$out/est.out" 2>&1
check_status $? "the run with an estimate failed: $(tail -n 5 "$out/est.out")"
check "progress lines do not label the estimate" grep -q "W est | .* Wh est" "$out/est.out"
check "the verdict claims a measurement: $(grep '^IT energy' "$out/est.out")" grep -q "^IT energy: not measured; estimated" "$out/est.out"
check "no labelled estimated CO2e in the verdict" grep -q "^CO2e (estimated, not measured): .* at 0.36 gCO2e/kWh" "$out/est.out"
check "the verdict does not name the deck's TDP" grep -q "^energy: cpu .* an estimate (deck_tdp_estimate" "$out/est.out"
check "report.json: cpu not 'estimated'" grep -q '"status": "estimated"' "$out/est/report.json"
check "report.json: cpu method $(comp est cpu method)" [ "$(comp est cpu method)" = deck_tdp_estimate ]
check "report.json: energy_consumed is not null: $(json est energy_consumed)" [ "$(json est energy_consumed)" = null ]
check "report.json: emissions is not null: $(json est emissions)" [ "$(json est emissions)" = null ]
check "report.json: energy_basis $(json est energy_basis)" [ "$(json est energy_basis)" = estimated ]
check "report.json: region $(json est region)" [ "$(json est region)" = quebec ]
check "report.json: pue $(json est pue)" [ "$(json est pue)" = 1.3 ]
check "energy.csv has no estimated rows" awk -F, 'NR > 1 && $3 == "cpu" && $5 > 0 { found = 1 } END { exit !found }' "$out/est/energy.csv"

# nothing in the deck: the built-in table (this machine's model, or the per-core default), DRAM per GB
GREENLM_POWERCAP_ROOT=/nonexistent $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/table" --set training.max_steps=10 \
  "$deck" > "$out/table.out" 2>&1
check_status $? "the run with the default estimate failed: $(tail -n 5 "$out/table.out")"
m=$(comp table cpu method)
check "report.json: cpu method '$m'" grep -Eq '"method": "(tdp_table_estimate|per_core_default_estimate)"' "$out/table/report.json"
check "report.json: dram method $(comp table dram method)" [ "$(comp table dram method)" = dram_per_gb_estimate ]
check "the run header does not name the methods" grep -q "^energy: dram estimated, dram_per_gb_estimate: estimate: 0.3725 W per GB" "$out/table.out"
check "no labelled estimated CO2e in the verdict" grep -q "^CO2e (estimated, not measured): .* at 475 gCO2e/kWh" "$out/table.out"
check "estimated_emissions not positive: $(json table estimated_emissions)" awk -v x="$(json table estimated_emissions)" 'BEGIN { exit !(x > 0) }'

# &energy estimate = .false.: not measured, as before estimates were the default
GREENLM_POWERCAP_ROOT=/nonexistent $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/none" --set training.max_steps=10 \
  --set energy.estimate=.false. "$deck" > "$out/none.out" 2>&1
check_status $? "the run without estimates failed: $(tail -n 5 "$out/none.out")"
check "estimate = .false. still estimates" grep -q "^IT energy: not measured; CO2e not computed" "$out/none.out"
check "progress lines show a figure without a sensor" grep -q "step .* | -- W | -- Wh | ETA" "$out/none.out"
check "report.json: cpu method $(comp none cpu method)" [ "$(comp none cpu method)" = none ]
check "report.json: energy_basis $(json none energy_basis)" [ "$(json none energy_basis)" = none ]

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
check_status $? "the run with fake RAPL failed: $(tail -n 5 "$out/rapl.out")"
kill $feeder 2>/dev/null
wait $feeder 2>/dev/null
it=$(json rapl energy_consumed)
em=$(json rapl emissions)
check "report.json: energy_consumed '$it' not positive" awk -v x="$it" 'BEGIN { exit !(x > 0) }'
check "report.json: emissions $em kg != energy $it kWh x PUE 1.5 x 100 g/kWh" \
  awk -v e="$em" -v k="$it" 'BEGIN { d = e - k * 1.5 * 0.1; exit !(d < 1e-12 && d > -1e-12) }'
check "the verdict has no CO2e line" grep -q "^CO2e: .* at 100 gCO2e/kWh" "$out/rapl.out"
check "report.json: measured cpu method $(comp rapl cpu method)" [ "$(comp rapl cpu method)" = rapl_sysfs ]
check "report.json: dram (no RAPL zone) method $(comp rapl dram method)" [ "$(comp rapl dram method)" = dram_per_gb_estimate ]
check "the verdict does not add the estimates apart" grep -q "^with the estimates for the components without a sensor: .* g estimated)" "$out/rapl.out"
check "the verdict has no comparison with published footprints" grep -q "^per token: this run .* GPT-3 175B" "$out/rapl.out"
check "progress lines show no measured watts" grep -q "step .* | [0-9.]* W | [0-9.e+-]* Wh | ETA" "$out/rapl.out"
finish
