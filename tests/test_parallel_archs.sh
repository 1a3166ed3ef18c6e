#!/bin/sh
# test_parallel_archs: the layout-equivalence program for GPT-NeoX and Llama (grouped-query
# attention) on 4 ranks, and its two-level exchange on 3 nodes x 2 ranks (6 ranks); GPT-Neo's
# layouts and the exchange's other cases are test_parallel.sh's, which make check runs beside it.
. "$(dirname "$0")/lib.sh"
# a hang (mismatched collectives) fails instead of stopping the suite
timeout 900 $MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_parallel" gpt-neox
check_status $? "the parallel layouts of a GPT-NeoX differ from the serial run (see above)"
timeout 900 $MPIEXEC -n 4 "$(dirname "$GREENLM")/../tests/test_parallel" llama
check_status $? "the parallel layouts of a Llama with grouped-query attention differ from the serial run (see above)"
timeout 900 $MPIEXEC -n 6 "$(dirname "$GREENLM")/../tests/test_parallel" hierarchy
check_status $? "the two-level exchange on 3 nodes x 2 replicas differs (see above)"
finish
