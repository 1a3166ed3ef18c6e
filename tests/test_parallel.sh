#!/bin/sh
# test_parallel: the layout-equivalence program on 4 ranks (oversubscribed on small machines), and
# the dry run's memory per rank: AdamW state drops to 1/D of it with ZeRO-1.
. "$(dirname "$0")/lib.sh"
$MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_parallel"
check "the parallel layouts differ from the serial run (see above)" [ $? -eq 0 ]

adam() { # adam ZERO: the AdamW bytes of stage 0 planned for 4 replicas, in MiB
  greenlm --dry-run --ranks 4 --set parallel.zero_stage="$1" --set training.global_batch_size=32 \
    "$TOP_SRCDIR/input/bench-b.nml" | sed -n 's/^! memory per rank, stage 0: .*AdamW \([0-9.]*\) MiB.*/\1/p'
}
a0=$(adam 0)
a1=$(adam 1)
check "dry run: AdamW with ZeRO-1 on 4 replicas is $a1 MiB, not a quarter of $a0 MiB" \
  awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(a > 0 && b > 0 && (a / b) > 3.99 && (a / b) < 4.01) }'
finish
