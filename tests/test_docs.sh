#!/bin/sh
# test_docs: doc/deck-reference.md is what the deck tables generate (make deck-reference updates it).
. "$(dirname "$0")/lib.sh"
mkdir -p "$TEST_OUT"
greenlm --deck-reference > "$TEST_OUT/deck-reference.md" 2>&1
check "greenlm --deck-reference failed" [ $? -eq 0 ]
if ! diff -u "$TOP_SRCDIR/doc/deck-reference.md" "$TEST_OUT/deck-reference.md" > "$TEST_OUT/deck-reference.diff"; then
  bad "doc/deck-reference.md disagrees with the deck tables (run make deck-reference):"
  head -n 40 "$TEST_OUT/deck-reference.diff" >&2
else
  ok
fi
finish
