# lib.sh: helpers shared by the shell tests (sourced).
# make check exports MPIEXEC, GREENLM, TOP_SRCDIR and TEST_OUT; defaults let a test run by hand
# from the build directory.
: "${TOP_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${GREENLM:=$PWD/src/greenlm}"
: "${MPIEXEC:=mpiexec}"
: "${TEST_OUT:=$PWD/tests/out}"
mkdir -p "$TEST_OUT" # a test run alone in a fresh tree writes its logs here too
export OPENBLAS_NUM_THREADS=1

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); printf 'FAIL: %s\n' "$*" >&2; }
check() { # check "description" command...
  local what=$1; shift
  if "$@"; then ok; else bad "$what"; fi
}
# check_status STATUS "description": passes when STATUS (a command's $?, passed first so that it is
# expanded before any command substitution in the description) is 0
check_status() {
  local rc=$1; shift
  if [ "$rc" -eq 0 ]; then ok; else bad "$* (exit status $rc)"; fi
}
greenlm() { $MPIEXEC -n 1 "$GREENLM" "$@"; }
# genesis_prepare: a deck's &prepare group (for an unquoted here-document) that turns
# tests/data/kjv-genesis.txt, a document a line and a tenth held out, into $out/train.nc and $out/val.nc
genesis_prepare() {
  printf "&prepare input = '%s', documents = 'line', val_fraction = 0.1,\n  train_out = '%s', val_out = '%s' /\n" \
    "$TOP_SRCDIR/tests/data/kjv-genesis.txt" "$out/train.nc" "$out/val.nc"
}
# fresh_out NAME [SUBDIR...]: sets out to this test's own directory, TEST_OUT/NAME, emptied and made
# anew, with the SUBDIRs in it
fresh_out() {
  out="$TEST_OUT/$1"
  shift
  rm -rf "$out"
  mkdir -p "$out"
  local d
  for d in "$@"; do mkdir -p "$out/$d"; done
}
# need_program NAME PATH HINT: a test that cannot show its result without PATH (a program configure
# looked for) stops here with a failure that names it, not with "command not found" in each check
need_program() {
  [ -n "$2" ] && [ -x "$2" ] && return 0
  printf 'FAIL: %s: %s not found at configure time (%s)\n' "$(basename "$0")" "$1" "$3" >&2
  exit 1
}
finish() {
  printf '%s: %d checks, %d failed\n' "$(basename "$0")" $((pass + fail)) "$fail"
  [ "$fail" -eq 0 ]
}
