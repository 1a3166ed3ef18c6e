#!/bin/sh
# test_golden: a fixed tiny deck on a fixed slice of text (tests/decks/golden.nml) trains to a
# validation loss below THRESHOLD, and a second run repeats it bit for bit (same losses, same
# parameter hash). Also: a finished run directory is not overwritten without &job overwrite.
. "$(dirname "$0")/lib.sh"
THRESHOLD=2.55   # validation loss after 80 steps; 2.471 when committed (doc/performance.md)
out="$TEST_OUT/golden"
rm -rf "$out"
mkdir -p "$out"
sed "s|@TOP@|$TOP_SRCDIR|g" "$TOP_SRCDIR/tests/decks/golden.nml" > "$out/golden.nml"

for r in a b; do
  greenlm --set "job.run_dir='$out/run-$r'" "$out/golden.nml" > "$out/$r.out" 2>&1
  check "run $r failed: $(tail -n 5 "$out/$r.out")" [ $? -eq 0 ]
  for f in deck.resolved.nml log.txt metrics.csv verdict.json sample.txt; do
    check "run $r: $f missing" [ -s "$out/run-$r/$f" ]
  done
done

val=$(sed -n 's/.*"val_loss": \([0-9.eE+-]*\).*/\1/p' "$out/run-a/verdict.json")
check "no val_loss in verdict.json" [ -n "$val" ]
check "validation loss $val is not below $THRESHOLD" awk -v v="$val" -v t="$THRESHOLD" 'BEGIN { exit !(v < t) }'
first=$(awk -F, 'NR == 2 { print $2 }' "$out/run-a/metrics.csv")
check "loss does not fall: first logged $first, final validation $val" \
  awk -v a="$first" -v b="$val" 'BEGIN { exit !(b < a - 1.0) }'

ha=$(sed -n 's/.*"param_hash": "\([0-9a-f]*\)".*/\1/p' "$out/run-a/verdict.json")
hb=$(sed -n 's/.*"param_hash": "\([0-9a-f]*\)".*/\1/p' "$out/run-b/verdict.json")
check "parameter hashes differ between identical runs: $ha vs $hb" [ -n "$ha" ] && [ "$ha" = "$hb" ]
cut -d, -f1-4,8 "$out/run-a/metrics.csv" > "$out/a.loss"
cut -d, -f1-4,8 "$out/run-b/metrics.csv" > "$out/b.loss"
check "loss curves differ between identical runs" cmp -s "$out/a.loss" "$out/b.loss"
check "samples differ between identical runs" cmp -s "$out/run-a/sample.txt" "$out/run-b/sample.txt"

# the resolved deck is itself a valid deck
greenlm --dry-run "$out/run-a/deck.resolved.nml" > "$out/resolved.out" 2>&1
check "deck.resolved.nml does not pass --dry-run: $(tail -n 3 "$out/resolved.out")" [ $? -eq 0 ]

# a wall-time limit ends the run early with a verdict
greenlm --set "job.run_dir='$out/run-limit'" --set training.max_minutes=0.0005 "$out/golden.nml" > "$out/limit.out" 2>&1
check "time-limited run failed: $(tail -n 5 "$out/limit.out")" [ $? -eq 0 ]
check "time-limited run: no time_limit status in verdict.json" grep -q '"status": "time_limit"' "$out/run-limit/verdict.json"
check "time-limited run: no validation loss" grep -q '"val_loss": [0-9]' "$out/run-limit/verdict.json"

# a finished run is not overwritten
sum=$(cksum < "$out/run-a/metrics.csv")
greenlm --set "job.run_dir='$out/run-a'" "$out/golden.nml" > "$out/again.out" 2>&1
check "rerun into a finished run directory succeeded" [ $? -ne 0 ]
check "rerun error does not name run_dir: $(cat "$out/again.out")" grep -q "already holds a run" "$out/again.out"
check "rerun changed the finished run's metrics.csv" [ "$(cksum < "$out/run-a/metrics.csv")" = "$sum" ]
finish
