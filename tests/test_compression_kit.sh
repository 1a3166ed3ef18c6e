#!/bin/sh
# test_compression_kit: run/compression, the compressed-exchange experiment, on a tiny deck: 2
# replicas, fp32 and QSGD-inf at 4 bits with error feedback, 2 seeds of 3 steps. Its table's mean
# is the seeds' mean in results.csv, fp32's row is 0 against itself, the compressed row puts fewer
# bytes per step, frontier.dat has a line per method; --resume trains only the method and seed
# pairs results.csv lacks; --report writes the table again, training nothing (a method with no run
# yet left out); --score scores each
# final model on a token file (the eval task on its last checkpoint) into results.csv, the table and
# frontier.dat, and a file that is not there stops it before any training.
. "$(dirname "$0")/lib.sh"
fresh_out compression-kit
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', seed = 1, log_every = 1 /
$(genesis_prepare)
&model vocab_size = 256, block_size = 32, n_layer = 2, n_embd = 32, n_head = 2 /
&training seq_len = 32, micro_batch_size = 2, max_steps = 3, warmup_steps = 1, eval_every = 3, eval_batches = 2 /
&comm min_numel = 64 /
&checkpoint at_end = .false. /
&sample n_tokens = 0 /
EOD
kit() { # kit LOG [options] [methods]: run/compression on the deck, 2 replicas, into $out
  log=$1; shift
  MPIEXEC="$MPIEXEC" GREENLM="$GREENLM" timeout 300 "$TOP_SRCDIR/run/compression" --ranks 2 --out "$out" --name kit "$@" \
    > "$out/$log" 2>&1
}
res="$out/kit/results.csv"
rows() { awk 'END { print NR - 1 }' "$res"; }

kit first.out --seeds 2 "$deck" "none:32 qsgdinf:4:ef"
check_status $? "run/compression failed: $(tail -n 15 "$out/first.out")"
check "not 4 rows (2 methods x 2 seeds) in results.csv: $(cat "$res")" [ "$(rows)" = 4 ]
table="$out/kit/table.md"
row() { grep "^| $1 | $2 |" "$table"; }
check "fp32's row is not 0 against itself: $(row none 32)" grep -q "^| none | 32 | .* | +0.0000 " "$table"
# the table's mean of the compressed run: the seeds' mean in results.csv, to 4 decimals
want=$(awk -F, '$1 == "qsgdinf" { s += $4; n++ } END { printf "%.4f", s / n }' "$res")
check "the table's mean is not the seeds' mean $want: $(row qsgdinf 4-ef)" grep -q "^| qsgdinf | 4-ef | $want +- " "$table"
fewer=$(row qsgdinf 4-ef | awk -F'|' '{ gsub(/[ x]/, "", $7); print $7 }')
check "the compressed exchange puts no fewer bytes a step: '$fewer'x" awk -v f="$fewer" 'BEGIN { exit !(f > 1.5) }'
check "frontier.dat has not a line per method: $(cat "$out/kit/frontier.dat")" \
  [ "$(grep -c '^[^#]' "$out/kit/frontier.dat")" = 2 ]

before=$(cksum < "$res")
kit resume.out --resume --seeds 2 "$deck" "none:32 qsgdinf:4:ef"
check_status $? "run/compression --resume failed: $(tail -n 15 "$out/resume.out")"
check "--resume with every pair done trained again: $(grep -c 'already' "$out/resume.out") of 4 skipped" \
  [ "$(grep -c 'in .*results.csv already' "$out/resume.out")" = 4 ]
check "--resume with every pair done changed results.csv" [ "$(cksum < "$res")" = "$before" ]
kit more.out --resume --seeds 3 "$deck" "none:32"
check_status $? "run/compression --resume --seeds 3 failed: $(tail -n 15 "$out/more.out")"
check "--resume --seeds 3 did not train seed 3 alone: $(grep seed "$out/more.out")" \
  sh -c "[ \"\$(grep -c 'seed .*: validation' '$out/more.out')\" = 1 ] && grep -q 'seed 3: validation' '$out/more.out'"
check "not 5 rows after --resume --seeds 3: $(rows)" [ "$(rows)" = 5 ]
rm -f "$table"
kit report.out --report --seeds 3 "$deck" "none:32 qsgdinf:4:ef minmax:4"
check_status $? "run/compression --report failed: $(tail -n 15 "$out/report.out")"
check "--report wrote no table" [ -s "$table" ]
# a method not trained yet (minmax) has no row; the others keep theirs
check "--report with an untrained method: not the 2 trained rows: $(cat "$table")" \
  sh -c "[ \"\$(grep -c '^| \(none\|qsgdinf\) |' '$table')\" = 2 ] && ! grep -q '^| minmax |' '$table'"
check "--report trained: $(grep -c validation "$out/report.out") runs" [ "$(grep -c 'seed .*: validation' "$out/report.out")" = 0 ]
before=$(cksum < "$res")
kit noscore.out --resume --seeds 3 --score "$out/absent.nc" "$deck" "none:32 minmax:4"
rc=$?
check "--score with no such file did not exit 2 before training: $rc $(cat "$out/noscore.out")" \
  sh -c "[ $rc = 2 ] && grep -q 'absent.nc: no such token file' '$out/noscore.out' && [ ! -e '$out/kit/minmax-4-s1' ]"
check "--score with no such file changed results.csv" [ "$(cksum < "$res")" = "$before" ]
kit score.out --name kit-score --seeds 1 --score "$out/train.nc" "$deck" "none:32 qsgdinf:4:ef"
check_status $? "run/compression --score failed: $(tail -n 15 "$out/score.out")"
sres="$out/kit-score/results.csv"
check "--score left a run unscored: $(cat "$sres")" \
  [ "$(awk -F, 'NR > 1 && $10 + 0 > 0 { n++ } END { print n + 0 }' "$sres")" = 2 ]
# the scored loss is the eval task's on the run's last checkpoint
ev=$(awk -F, -v t="dataset:$out/train.nc" '$1 == t && $2 == "loss" { print $3 }' "$out/kit-score/qsgdinf-4-ef-s1/score/eval.csv")
check "results.csv's scored loss is not the eval task's $ev: $(cat "$sres")" \
  awk -F, -v e="$ev" '$1 == "qsgdinf" { f = ($10 == e) } END { exit !f }' "$sres"
check "the table has no scored column: $(head -n 1 "$out/kit-score/table.md")" \
  grep -q "^| none | 32 | .* | +0.0000 |$" "$out/kit-score/table.md"
check "frontier.dat has no scored mean: $(cat "$out/kit-score/frontier.dat")" \
  awk '$1 == "qsgdinf-4-ef" { f = ($5 > 0) } END { exit !f }' "$out/kit-score/frontier.dat"
finish
