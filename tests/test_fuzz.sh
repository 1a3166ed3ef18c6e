#!/bin/sh
# test_fuzz: every fuzz target (tests/fuzz/) runs its committed corpus and the reproducers of past
# findings once: no crash, no sanitizer report (in sanitizer builds), no broken property. In builds
# configured --enable-fuzzing the targets are libFuzzer programs, run with -runs=0.
. "$(dirname "$0")/lib.sh"
for t in deck set tokenizer tokjson dataset checkpoint hf bench machine text; do
  prog="$PWD/tests/fuzz/fuzz_$t"
  dirs=""
  for d in "$TOP_SRCDIR/tests/fuzz/corpus/$t" "$TOP_SRCDIR/tests/fuzz/crashes/$t"; do [ -d "$d" ] && dirs="$dirs $d"; done
  [ "$t" = deck ] && dirs="$dirs $TOP_SRCDIR/input $TOP_SRCDIR/tests/decks $TOP_SRCDIR/tests/decks/bad" # its seeds
  [ "$t" = machine ] && dirs="$dirs $TOP_SRCDIR/input/machines"
  [ "$t" = tokjson ] && for d in neox llama3 refuse; do dirs="$dirs $TOP_SRCDIR/tests/data/tokjson/$d"; done
  n=$(find $dirs -maxdepth 1 -type f | wc -l)
  check "fuzz_$t: no inputs to replay in$dirs" [ "$n" -gt 0 ]
  if [ -n "${FUZZING:-}" ]; then
    $MPIEXEC -n 1 "$prog" -runs=0 $dirs > "$TEST_OUT/fuzz_$t.log" 2>&1
  else
    $MPIEXEC -n 1 "$prog" $dirs > "$TEST_OUT/fuzz_$t.log" 2>&1
  fi
  rc=$?
  check "fuzz_$t: replaying $n inputs failed (exit $rc): $(tail -n 15 "$TEST_OUT/fuzz_$t.log")" [ $rc -eq 0 ]
done
finish
