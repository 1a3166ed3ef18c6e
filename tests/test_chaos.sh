#!/bin/sh
# test_chaos: the fault loop (run/chaos) in short. A tiny model trains 120 steps on 2 ranks in three
# layouts (data parallel; 2 pipeline stages; 2 replicas with ZeRO-1 and the compressed exchange,
# qsgd at 4 bits), and 40 steps on 4 ranks (2 stages x 2 replicas, ZeRO-1, qsgd), checkpointing
# every 5 steps and every 0.6 s, and is killed with SIGKILL 24 times in all (every rank, or one rank
# whose launcher ends the others; during start-up, after a step, inside checkpoint writes), restarted
# each time with &checkpoint restart = 'latest'. Every checkpoint left under a final name verifies
# (after every kill), and every case ends with bitwise the parameters of its uninterrupted run and
# its record of the steps (metrics.csv, val.csv, windows.csv: each step once, as uninterrupted).
# The kill schedule's seed is printed; CHAOS_SEED=N make check TESTS=tests/test_chaos.sh draws
# another (and replays a failure's). Then, without kills: a restart drops the rows a stopped job
# wrote after its checkpoint, and a row cut short (no newline), from metrics.csv, val.csv and
# windows.csv.
. "$(dirname "$0")/lib.sh"
fresh_out chaos
seed=${CHAOS_SEED:-20261207}
echo "test_chaos: kill schedule seed $seed (CHAOS_SEED=$seed make check TESTS=tests/test_chaos.sh replays it)"
chaos() { # chaos NAME [run/chaos options]: the loop into $out/NAME
  name=$1; shift
  GREENLM=$GREENLM MPIEXEC=$MPIEXEC bash "$TOP_SRCDIR/run/chaos" --seed "$seed" --out "$out/$name" "$@" > "$out/$name.out" 2>&1
}
# (each status is taken before the message is built: a command substitution would reset $?)
chaos two --ranks 2 --layouts "plain pipe zero" --kills 7 --steps 120
rc=$?
check "the fault loop on 2 ranks failed: $(grep 'FAIL\|^  [0-9]* kills' "$out/two.out" | head -n 6)" [ $rc -eq 0 ]
chaos four --ranks 4 --layouts zero --kills 3 --steps 40
rc=$?
check "the fault loop on 4 ranks failed: $(grep 'FAIL\|^  [0-9]* kills' "$out/four.out" | head -n 6)" [ $rc -eq 0 ]
cat "$out/two/summary.txt" "$out/four/summary.txt" 2>/dev/null
# the loop's figures, case by case (run/chaos's cases.txt): every case killed as often as asked,
# nothing that failed to verify, the reference's parameters at the end
cases=$(cat "$out/two/cases.txt" "$out/four/cases.txt" 2>/dev/null)
n=$(printf '%s\n' "$cases" | grep -c '^case')
check "$n cases of 4 ran" [ "$n" -eq 4 ]
sum() { printf '%s\n' "$cases" | awk -v f="$1" '$1 == "case" { s += $f } END { print s + 0 }'; }
kills=$(sum 5) inwrite=$(sum 7) one=$(sum 9) restarts=$(sum 11) redone=$(sum 15) bad=$(sum 21)
echo "test_chaos: $kills kills ($inwrite inside checkpoint writes, $one of one rank), $restarts restarts," \
  "$redone steps recomputed, $bad failures"
check "$kills kills, not 24" [ "$kills" -eq 24 ]
check "$restarts restarts after $kills kills" [ "$restarts" -eq "$kills" ]
check "$inwrite kills inside checkpoint writes (at least 3)" [ "$inwrite" -ge 3 ]
check "$one kills of one rank (at least 3)" [ "$one" -ge 3 ]
check "$redone steps recomputed: no rows of lost work for the restarts to drop" [ "$redone" -gt 0 ]
check "$bad checkpoints or jobs failed" [ "$bad" -eq 0 ]
check "a case ended with other parameters than its uninterrupted run's" [ -z "$(printf '%s\n' "$cases" | grep -v ' equal yes$')" ]

# a job that stopped at step 12 (its validation at step 12 in val.csv) with its last checkpoint at step
# 10, in the middle of writing the row of step 13 (no newline): the restart keeps the header and the
# rows of steps 1 to 10, then adds its own
rows() { $MPIEXEC -n 2 "$GREENLM" --set "job.run_dir=$out/rows" --set parallel.pipeline_stages=1 "$@" "$out/two/deck.nml" \
  >> "$out/rows.out" 2>&1; }
rows --set training.max_steps=12 --set checkpoint.every_steps=10 --set checkpoint.every_minutes=0 --set checkpoint.at_end=F
rc=$?
check "the run of 12 steps failed: $(tail -n 3 "$out/rows.out")" [ $rc -eq 0 ]
printf '13,4.5' >> "$out/rows/metrics.csv"
rows --set training.max_steps=14 --set checkpoint.every_steps=10 --set checkpoint.restart=latest
rc=$?
check "the restart from step 10 failed: $(tail -n 3 "$out/rows.out")" [ $rc -eq 0 ]
check "no 'rows of steps after 10 dropped' in: $(grep '^restart' "$out/rows.out")" \
  grep -q "^restart: metrics.csv, val.csv, windows.csv: the rows of steps after 10 dropped" "$out/rows.out"
check "metrics.csv's steps are not 1 to 14 once each: $(cut -d, -f1 "$out/rows/metrics.csv" | tr '\n' ' ')" \
  [ "$(cut -d, -f1 "$out/rows/metrics.csv" | tr '\n' ' ')" = "step $(seq 14 | tr '\n' ' ')" ]
check "metrics.csv has a row of another width: $(awk -F, '{ print NF }' "$out/rows/metrics.csv" | sort -u | tr '\n' ' ')" \
  [ "$(awk -F, '{ print NF }' "$out/rows/metrics.csv" | sort -u | wc -l)" -eq 1 ]
check "val.csv has other steps than the end's 14: $(cut -d, -f1 "$out/rows/val.csv" | tr '\n' ' ')" \
  [ "$(cut -d, -f1 "$out/rows/val.csv" | tr '\n' ' ')" = "step 14 " ]
check "windows.csv's steps are not 1 to 14 in order" \
  [ "$(awk -F, 'NR > 1 && $1 != prev { printf "%s ", $1; prev = $1 }' "$out/rows/windows.csv")" = "$(seq 14 | tr '\n' ' ')" ]
finish
