#!/bin/sh
# test_decks: every malformed deck in tests/decks/bad/ is rejected with its exact place and message,
# exits non-zero and writes nothing; every deck in input/ passes --dry-run.
#
# Each bad deck starts with
#   ! expect-at: LINE:COL      (or "none" for errors without a place in the deck)
#   ! expect-msg: TEXT         (a fragment of the message or its hint)
# and optionally "! args: ..." (extra options), "! expect-run" (found when the run starts, not
# by --dry-run; the run directory must then not be created), "! only-without-cuda" (an error of
# builds without the CUDA backend; GREENLM_CUDA=yes skips the deck) and "! only-with-cuda" (an
# error of builds with it: skipped unless GREENLM_CUDA=yes). @TOP@ is the source tree and @OUT@
# this test's output directory (with an empty directory empty-dir).
. "$(dirname "$0")/lib.sh"
fresh_out decks empty-dir

for src in "$TOP_SRCDIR"/tests/decks/bad/*.nml; do
  name=$(basename "$src" .nml)
  deck="$out/$name.nml"
  rundir="$out/$name.run"
  sed "s|@TOP@|$TOP_SRCDIR|g; s|@OUT@|$out|g" "$src" > "$deck"
  grep -q '^! only-without-cuda' "$deck" && [ "${GREENLM_CUDA:-no}" = yes ] && continue
  grep -q '^! only-with-cuda' "$deck" && [ "${GREENLM_CUDA:-no}" != yes ] && continue
  at=$(sed -n 's/^! expect-at: //p' "$deck")
  msg=$(sed -n 's/^! expect-msg: //p' "$deck")
  args=$(sed -n 's/^! args: //p' "$deck")
  mode=--dry-run
  grep -q '^! expect-run' "$deck" && mode=
  # shellcheck disable=SC2086
  greenlm $mode $args --set "job.run_dir='$rundir'" "$deck" >"$out/$name.out" 2>"$out/$name.err"
  rc=$?
  check "$name: exit status $rc, expected non-zero" [ "$rc" -ne 0 ]
  if [ "$at" = none ]; then
    check "$name: message '$msg' not in: $(cat "$out/$name.err")" grep -qF -- "$msg" "$out/$name.err"
  else
    check "$name: no '$deck:$at: error:' in: $(cat "$out/$name.err")" grep -qF -- "$deck:$at: error:" "$out/$name.err"
    check "$name: message '$msg' not in: $(cat "$out/$name.err")" grep -qF -- "$msg" "$out/$name.err"
  fi
  check "$name: something was written to $rundir" [ ! -e "$rundir" ]
  check "$name: a half-written file was left: $(ls "$out"/*.tmp "$out"/*/*.tmp 2>/dev/null)" \
    [ -z "$(ls "$out"/*.tmp "$out"/*/*.tmp 2>/dev/null)" ]
done

for deck in "$TOP_SRCDIR"/input/*.nml; do
  name=$(basename "$deck" .nml)
  greenlm --dry-run --set "job.run_dir='$out/$name.run'" "$deck" >"$out/input-$name.out" 2>&1
  check_status $? "input/$name.nml fails --dry-run: $(tail -n 5 "$out/input-$name.out")"
  check "input/$name.nml: dry run prints no memory estimate" grep -q 'memory per rank total' "$out/input-$name.out"
done
finish
