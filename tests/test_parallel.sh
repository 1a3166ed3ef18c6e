#!/bin/sh
# test_parallel: the layout-equivalence program on 4 ranks (oversubscribed on small machines), for GPT-Neo,
# GPT-NeoX and Llama (grouped-query attention), its two-level exchange on 3 nodes x 2 ranks (6 ranks; one
# after another: two such programs at once on a small machine spin each other's time away), PowerSGD's
# exchange on 4 ranks (test_psgd), and
# the dry run's memory per rank: AdamW state drops to 1/D of it with ZeRO-1, activations with
# recomputation.
. "$(dirname "$0")/lib.sh"
# a hang (mismatched collectives) fails instead of stopping the suite; the limit leaves room for a
# loaded machine, where MPICH's ranks busy-poll each other's time away (the default program took 851 s
# of its former 900 beside a 4-rank training run on 2 cores)
timeout 1800 $MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_parallel"
check_status $? "the parallel layouts differ from the serial run (see above)"
timeout 1800 $MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_parallel" gpt-neox
check_status $? "the parallel layouts of a GPT-NeoX differ from the serial run (see above)"
timeout 1800 $MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_parallel" llama
check_status $? "the parallel layouts of a Llama with grouped-query attention differ from the serial run (see above)"
timeout 1800 $MPIEXEC -n 6 "$(dirname "$GREENLM")/../tests/test_parallel" hierarchy
check_status $? "the two-level exchange on 3 nodes x 2 replicas differs (see above)"
timeout 300 $MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_psgd"
check_status $? "PowerSGD's exchange fails its identities (see above)"

adam() { # adam ZERO: the AdamW bytes of stage 0 planned for 4 replicas, in MiB
  greenlm --dry-run --ranks 4 --set parallel.zero_stage="$1" --set training.global_batch_size=32 \
    "$TOP_SRCDIR/input/bench-b.nml" | sed -n 's/^! memory per rank, stage 0: .*AdamW \([0-9.]*\) MiB.*/\1/p'
}
a0=$(adam 0)
a1=$(adam 1)
check "dry run: AdamW with ZeRO-1 on 4 replicas is $a1 MiB, not a quarter of $a0 MiB" \
  awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(a > 0 && b > 0 && (a / b) > 3.99 && (a / b) < 4.01) }'
acts() { # acts RECOMPUTE: the activation GiB of GPT-Neo 1.3B planned for 1 rank
  greenlm --dry-run --set training.recompute="$1" "$TOP_SRCDIR/input/neo-1.3b.nml" |
    sed -n 's/^! memory per rank, stage 0: .*activations \([0-9.]*\) GiB.*/\1/p'
}
k0=$(acts F)
k1=$(acts T)
check "dry run: activations of GPT-Neo 1.3B with recomputation $k1 GiB, not below a quarter of $k0 GiB" \
  awk -v a="$k0" -v b="$k1" 'BEGIN { exit !(a > 0 && b > 0 && b < a / 4) }'
finish
