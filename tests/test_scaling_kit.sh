#!/bin/sh
# test_scaling_kit: run/scaling works on a fresh clone, as a new user runs it. The checkout's
# tracked files are copied to an empty directory (no runs/, no text, no datasets; the programs of
# this build stand in for run/build), and the command doc/performance.md gives runs there on
# input/bench-b.nml shrunk to a tiny model through GREENLM_OPTS, at 1 and 2 ranks for 3 steps: it
# writes the quickstart's text, prepares the deck's datasets, runs both layouts, and writes the
# table, the CSV and the plot, with a prediction joined to the one layout it is given for; then
# again with --plan, the planner's predictions for both layouts.
# Skipped (77) where the sources are not the top of a git checkout (a distribution tarball, even
# one unpacked inside a checkout as make distcheck does, has no list of tracked files).
. "$(dirname "$0")/lib.sh"
if [ "$(git -C "$TOP_SRCDIR" rev-parse --show-toplevel 2> /dev/null)" != "$(cd "$TOP_SRCDIR" && pwd -P)" ]; then
  echo "$TOP_SRCDIR is not the top of a git checkout: no tracked files to make a fresh clone of: skipped"
  exit 77
fi
fresh_out scaling-kit clone
clone="$out/clone"
git -C "$TOP_SRCDIR" ls-files -z | tar -C "$TOP_SRCDIR" --null -T - --ignore-failed-read -cf - | tar -C "$clone" -xf -
check "the copy of the tracked files has no run/scaling" [ -x "$clone/run/scaling" ]
check "the fresh clone already has runs/" [ ! -e "$clone/runs" ]
ln -s "$GREENLM" "$clone/src/greenlm"

# the layouts' predicted tokens/s: one for 1:1x1, none for 2:1x2
printf 'np,P,D,tokens_per_s\n1,1,1,1000\n' > "$out/predicted.csv"
tiny="--set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 --set model.vocab_size=256 --set model.block_size=32"
tiny="$tiny --set training.seq_len=32 --set training.micro_batch_size=4 --set checkpoint.at_end=F"
(cd "$clone" && MPIEXEC="$MPIEXEC" GREENLM_OPTS="$tiny" timeout 300 run/scaling --weak --steps 3 --predicted "$out/predicted.csv" \
  input/bench-b.nml "1:1x1 2:1x2") > "$out/scaling.out" 2>&1
rc=$?
check "run/scaling exited $rc on a fresh clone: $(tail -n 15 "$out/scaling.out")" [ $rc -eq 0 ]
check "the quickstart's text was not written" [ -s "$clone/runs/data/kjv/66-Rev.txt" ]
check "no note that the text was written" grep -q "no text yet; writing the quickstart's text" "$out/scaling.out"
check "the deck's datasets were not prepared" [ -s "$clone/runs/data/kjv-bytes-train.nc" ]
res="$clone/runs/scaling/bench-b-weak"
for r in np1-p1-d1 np2-p1-d2; do
  check "$r: not 3 steps in metrics.csv" [ "$(awk 'END { print NR - 1 }' "$res/$r/metrics.csv" 2> /dev/null)" = 3 ]
done
table="$res/table.md"
check "table.md: not 2 layouts: $(cat "$table" 2> /dev/null)" [ "$(grep -c '^| [0-9]' "$table" 2> /dev/null)" = 2 ]
# | ranks | P | T | D | global batch | tokens/s | MFU | bubble | exchange | efficiency | predicted | measured / predicted |
row() { grep "^| $1 |" "$table" | tr -d ' ' | cut -d'|' -f"$2"; }
check "1 rank: not P = 1, tp = 1, D = 1, global batch 8" [ "$(row 1 3-6)" = "1|1|1|8" ]
check "2 ranks (weak): not P = 1, tp = 1, D = 2, global batch 16" [ "$(row 2 3-6)" = "1|1|2|16" ]
for n in 1 2; do
  check "$n rank(s): tokens/s '$(row $n 7)' is not a positive number" awk -v t="$(row $n 7)" 'BEGIN { exit !(t + 0 > 0) }'
done
check "1 rank: efficiency not 100.0%" [ "$(row 1 11)" = "100.0%" ]
check "1 rank: the prediction is not joined" [ "$(row 1 12)" = 1000 ]
check "1 rank: measured / predicted '$(row 1 13)' is not tokens/s / 1000" \
  awk -v t="$(row 1 7)" -v r="$(row 1 13)" 'BEGIN { exit !(r != "" && (t / 1000 - r) ^ 2 < 0.006 ^ 2) }'
check "2 ranks: a prediction where none was given" [ "$(row 2 12)|$(row 2 13)" = "-|-" ]
check "scaling.csv lacks the predicted columns" \
  grep -q '^np,P,D,global_batch,tokens_per_s,mfu,bubble,exchange,efficiency,predicted_tokens_per_s,measured_over_predicted,T$' "$res/scaling.csv"
if command -v gnuplot > /dev/null; then
  check "no scaling.png: $(cat "$res/gnuplot.log" 2> /dev/null)" [ -s "$res/scaling.png" ]
fi

# --plan: the planner predicts both layouts on a machine file (this CPU at a given peak)
printf "&machine device = 'cpu', peak_tflops = 0.05, efficiency = 0.7 /\n" > "$out/machine.nml"
(cd "$clone" && MPIEXEC="$MPIEXEC" GREENLM_OPTS="$tiny" timeout 300 run/scaling --weak --steps 3 --name planned \
  --plan "$out/machine.nml" input/bench-b.nml "1:1x1 2:1x2") > "$out/planned.out" 2>&1
rc=$?
check "run/scaling --plan exited $rc: $(tail -n 15 "$out/planned.out")" [ $rc -eq 0 ]
table="$clone/runs/scaling/planned/table.md"
for n in 1 2; do
  check "--plan: $n rank(s): no predicted tokens/s: $(row $n 12)" awk -v t="$(row $n 12)" 'BEGIN { exit !(t + 0 > 0) }'
  check "--plan: $n rank(s): no measured / predicted: $(row $n 13)" awk -v t="$(row $n 13)" 'BEGIN { exit !(t + 0 > 0) }'
done
finish
