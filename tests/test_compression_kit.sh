#!/bin/sh
# test_compression_kit: run/compression, the compressed-exchange experiment, on a tiny deck: 2
# replicas, fp32 and QSGD-inf at 4 bits with error feedback, 2 seeds of 3 steps. Its table's mean
# is the seeds' mean in results.csv, fp32's row is 0 against itself, the compressed row puts fewer
# bytes per step, frontier.dat has a line per method; --resume trains only the method and seed
# pairs results.csv lacks, --seeds A-B only seeds A..B (without seed 1: no curves, no gnuplot
# error), an empty range exits 2; --report writes the table again, training nothing (a method with
# no run yet left out); --score scores each final model on a token file (the eval task on its last
# checkpoint) into results.csv, the table and frontier.dat, and a file that is not there stops it
# before any training. The seconds to the target are each reaching seed's (the mean, "(n of S)");
# with a paced rate in pace.csv, each reaching seed's step times the paced time a step; --pace
# needs --net (exit 2), and where network namespaces can be made it times each method on the
# emulated network into pace.csv, training nothing into results.csv.
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
# a range of seeds: seed 4 alone, not QSGD-inf's missing seed 3
kit range.out --resume --seeds 4-4 "$deck" "qsgdinf:4:ef"
check_status $? "run/compression --resume --seeds 4-4 failed: $(tail -n 15 "$out/range.out")"
check "--seeds 4-4 did not train seed 4 alone: $(grep seed "$out/range.out")" \
  sh -c "[ \"\$(grep -c 'seed .*: validation' '$out/range.out')\" = 1 ] && grep -q 'seed 4: validation' '$out/range.out'"
check "not 6 rows after --seeds 4-4: $(rows)" [ "$(rows)" = 6 ]
# seeds without seed 1 (whose runs the curves show): the table and frontier, and no empty gnuplot plot
kit range2.out --name kit-range --seeds 2-2 "$deck" "none:32"
check_status $? "run/compression --seeds 2-2 failed: $(tail -n 15 "$out/range2.out")"
check "--seeds 2-2 did not train seed 2 alone: $(cat "$out/kit-range/results.csv")" \
  sh -c "[ \"\$(awk -F, 'NR > 1 { print \$3 }' '$out/kit-range/results.csv' | tr '\n' ' ')\" = '2 ' ]"
if command -v gnuplot > /dev/null; then
  check "--seeds 2-2: gnuplot failed or curves.png drawn: $(cat "$out/kit-range/gnuplot.log")" \
    sh -c "[ -s '$out/kit-range/frontier.png' ] && [ ! -e '$out/kit-range/curves.png' ] && ! grep -q 'gnuplot failed' '$out/range2.out'"
fi
kit norange.out --seeds 3-2 "$deck" "none:32"
rc=$?
check "--seeds 3-2 (an empty range) did not exit 2 with its error: $rc $(cat "$out/norange.out")" \
  sh -c "[ $rc = 2 ] && grep -q 'the range is empty' '$out/norange.out'"
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

# a family at two bucket sizes: one block of frontier.dat, and (with gnuplot) buckets.png drawn without a gnuplot error
kit buckets.out --name kit-buckets --seeds 1 "$deck" "none:32 qsgd:4:q64 qsgd:4:q256"
check_status $? "run/compression with two bucket sizes failed: $(tail -n 15 "$out/buckets.out")"
bdat="$out/kit-buckets/frontier.dat"
check "frontier.dat has not qsgd-4's two bucket sizes in one block: $(cat "$bdat")" \
  sh -c "grep -q '^qsgd-4-q64 .* q64\$' '$bdat' && grep -q '^qsgd-4-q256 .* q256\$' '$bdat' && [ \"\$(grep -c '^# qsgd-4\$' '$bdat')\" = 1 ]"
if command -v gnuplot > /dev/null; then
  check "buckets.png not drawn, or gnuplot failed: $(cat "$out/kit-buckets/gnuplot.log")" \
    sh -c "[ -s '$out/kit-buckets/buckets.png' ] && ! grep -q 'gnuplot failed' '$out/buckets.out'"
fi

# the seconds to the target: the first (and only) evaluation is at the last step, so a reaching seed's
# measured time is its training seconds, and its paced time 3 steps x the paced milliseconds
target=$(sed -n '1s/.*| s to \([0-9.]*\) |.*/\1/p' "$table")
# (reaching judged on the evaluation in each seed's metrics.csv, the figure run/compression reads)
reaching() { # reaching M B: how many of the 3 seeds reach the target, their mean training seconds
  for s in 1 2 3; do
    awk -F, -v t="$target" -v s="$s" 'NR > 1 && $8 != "" && $8 <= t { print s }' "$out/kit/$1-$2-s$s/metrics.csv" | tail -n 1
  done | while read -r s; do awk -F, -v m="$1" -v b="$2" -v s="$s" '$1 == m && $2 == b && $3 == s { print $7 }' "$res"; done |
    awk '{ n++; t += $1 } END { printf "%d %.1f", n, n ? t / n : 0 }'
}
read -r n secs <<EOF_
$(reaching none 32)
EOF_
want="$secs$([ "$n" -gt 1 ] && echo " +- ")"
[ "$n" -lt 3 ] && [ "$n" -gt 0 ] && want="$secs.* ($n of 3)"
[ "$n" = 0 ] && want="-"
check "fp32's seconds to $target are not its $n reaching seeds' mean $secs: $(row none 32)" \
  grep -q "^| none | 32 | \([^|]*|\)\{7\} $want" "$table"
printf 'method,bits,net,ms_per_step,steps\nnone,32,5gbit,2000,12\nqsgdinf,4-ef,5gbit,1000,12\nnone,32,5gbit,3000,12\n' > "$out/kit/pace.csv"
kit paced.out --report --seeds 3 "$deck" "none:32 qsgdinf:4:ef"
check_status $? "run/compression --report with a paced rate failed: $(tail -n 15 "$out/paced.out")"
check "no paced column at 5gbit: $(head -n 1 "$table")" grep -q "| s to $target at 5gbit (paced) |" "$table"
# the latest row of a method and rate counts: fp32 at 3000 ms a step, 9.0 s to the target
pwant="9.0$([ "$n" -gt 1 ] && echo " +- 0.0")$([ "$n" -lt 3 ] && echo " ($n of 3)") (3000 ms a step)"
[ "$n" = 0 ] && pwant="- (3000 ms a step)"
check "fp32's paced seconds to the target are not '$pwant': $(row none 32)" \
  grep -q -F "| $pwant |" "$table"
kit nonet.out --pace 12 "$deck" "none:32"
rc=$?
check "--pace without --net did not exit 2: $rc $(cat "$out/nonet.out")" sh -c "[ $rc = 2 ] && grep -q 'needs\|takes' '$out/nonet.out'"
if [ "$(id -u)" = 0 ] && ip netns add "glmkit$$" 2> /dev/null; then
  ip netns del "glmkit$$"
  before=$(cksum < "$res")
  kit pace.out --pace 12 --net 1gbit --seeds 1 "$deck" "none:32 qsgdinf:4:ef"
  check_status $? "run/compression --pace failed: $(tail -n 15 "$out/pace.out")"
  check "--pace did not time both methods at 1gbit: $(cat "$out/kit/pace.csv")" \
    [ "$(awk -F, '$3 == "1gbit" && $4 > 0 && $5 == 12 { n++ } END { print n + 0 }' "$out/kit/pace.csv")" = 2 ]
  check "--pace changed results.csv" [ "$(cksum < "$res")" = "$before" ]
  check "--pace: no paced column at 1gbit: $(head -n 1 "$table")" grep -q "at 1gbit (paced) |" "$table"
  check "--pace's run did not stop at 12 steps: $(tail -n 1 "$out/kit/pace/none-32-1gbit/metrics.csv")" \
    [ "$(awk -F, 'END { print $1 }' "$out/kit/pace/none-32-1gbit/metrics.csv")" = 12 ]
else
  echo "note: --pace on the emulated network not run: network namespaces cannot be made here"
fi
finish
