#!/bin/sh
# test_docs: doc/deck-reference.md is what the deck tables generate (make deck-reference updates it),
# and the environment table of doc/reference.md is what greenlm --env-reference prints.
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
greenlm --env-reference > "$TEST_OUT/env-reference.md" 2>&1
sed -n '/^<!-- env-reference/,/^<!-- end env-reference/p' "$TOP_SRCDIR/doc/reference.md" | sed '1d;$d' > "$TEST_OUT/env-reference.doc"
check "doc/reference.md's environment table differs from greenlm --env-reference: $(diff "$TEST_OUT/env-reference.doc" "$TEST_OUT/env-reference.md" | head -n 6)" \
  cmp -s "$TEST_OUT/env-reference.doc" "$TEST_OUT/env-reference.md"
finish
