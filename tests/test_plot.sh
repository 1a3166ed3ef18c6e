#!/bin/sh
# test_plot: run/plot draws valid PNGs from the metrics.csv of several runs side by side (tokens from
# deck.resolved.nml, or from a tokens column), skips plots no run has values for, and stops with a
# clear error when a run directory has no metrics.csv. Skipped (77) without gnuplot.
. "$(dirname "$0")/lib.sh"
command -v gnuplot > /dev/null || { echo "gnuplot not found: skipped"; exit 77; }
fresh_out plot a b c
# two runs as training writes them (metrics.csv with its header; a resolved deck), one with power
for r in a b; do
  cat > "$out/$r/deck.resolved.nml" <<EOD
&job
  name         = 'run-$r'
/
&training
  seq_len           = 32
  micro_batch_size  = 4
  global_batch_size = $([ $r = a ] && echo 8 || echo 16)  ! comment
/
&eval
  seq_len = 64  ! derived
/
EOD
  awk -v r=$r 'BEGIN {
    print "step,loss,lr,grad_norm,ms_per_step,tokens_per_s,mfu,val_loss,watts,energy_j,energy_status,compute,bubble," \
          "exchange,bytes_per_step,grad_bytes_per_step,grad_ratio,encode_ms,decode_ms,q_error,q_error_expected,grad_inter_bytes_per_step"
    for (s = 5; s <= 60; s += 5)
      printf "%d,%.4f,%.3e,1.0,4.0,%.1f,%.4f,%s,%s,%s,%s,0.97,0,0,0,0,,0,0,,,0\n", s, 5 - s / 20, 6e-4 * (1 - s / 70),
        60000 + s * 10, 0.45 + s / 1000, s % 20 ? "" : 4.9 - s / 25, r == "a" ? 110 + s : "", r == "a" ? s * 440 : "",
        r == "a" ? "measured" : "not measured"
  }' > "$out/$r/metrics.csv"
done
# a run whose metrics.csv counts its tokens itself, and no resolved deck
printf 'step,tokens,loss,lr\n1,1000,5.5,1e-4\n2,2000,5.1,2e-4\n3,3000,4.8,3e-4\n' > "$out/c/metrics.csv"

"$TOP_SRCDIR/run/plot" "$out/a" "$out/b" "$out/c" -o "$out/png" > "$out/plot.out" 2>&1
check_status $? "run/plot failed: $(tail -n 5 "$out/plot.out")"
is_png() { # is_png FILE: the PNG signature and more than a trivial size
  [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && [ "$(wc -c < "$1")" -gt 5000 ]
}
for p in loss lr tokens_per_s mfu power energy; do
  check "$p.png is not a valid PNG of some size" is_png "$out/png/$p.png"
done
# a run without power: its plots are drawn, the power plot is skipped with a note
"$TOP_SRCDIR/run/plot" "$out/b" > "$out/b.out" 2>&1
check_status $? "run/plot on one run failed: $(tail -n 5 "$out/b.out")"
check "one run: loss.png not in RUN_DIR/plots" is_png "$out/b/plots/loss.png"
check "no note for the skipped power plot" grep -q "no run has watts values: power.png skipped" "$out/b.out"
check "power.png drawn without values" [ ! -e "$out/b/plots/power.png" ]
# a directory without metrics.csv
"$TOP_SRCDIR/run/plot" "$out/a" "$out/nothing" -o "$out/none" > "$out/none.out" 2>&1
check "run/plot succeeded without metrics.csv" [ $? -ne 0 ]
check "no clear error: $(cat "$out/none.out")" grep -q "$out/nothing/metrics.csv: no such file" "$out/none.out"
finish
