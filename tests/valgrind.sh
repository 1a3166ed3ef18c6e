#!/bin/sh
# valgrind.sh: the single-rank test programs, and greenlm preparing data, training a few steps,
# evaluating, sampling and exporting on one rank, under valgrind's memcheck: any invalid access, use of uninitialised memory or
# definite leak fails (make check-valgrind, doc/testing.md). Ends with "N clean, N failed".
#
#   tests/valgrind.sh PROGRAM...      (VALGRIND_FLAGS=--track-origins=yes for the origins of errors)
. "$(dirname "$0")/lib.sh"
fresh_out valgrind
# hwloc's plugins (Debian's libhwloc-plugins, on any machine that has Open MPI's packages) leak
# when hwloc unloads them, with no frame left to suppress: load none, as tests/sancheck does
HWLOC_PLUGINS_PATH=/nonexistent
export HWLOC_PLUGINS_PATH
# valgrind ignores the CPU's flush-to-zero bits (test_ops' fpenv check then expects subnormals kept)
TEST_NO_FLUSH_MODE=1
export TEST_NO_FLUSH_MODE
vg() { # vg NAME command...
  name=$1; shift
  valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    -q ${VALGRIND_FLAGS:-} "$@" > "$out/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 99 ] || grep -q "^==[0-9]*== [A-Z].*\(Invalid\|uninitialised\|definitely lost\)" "$out/$name.log"; then
    bad "$name: valgrind errors ($out/$name.log):"
    grep "^==" "$out/$name.log" | head -n 30 >&2
  elif [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    bad "$name: exit status $rc ($out/$name.log)"
    tail -n 10 "$out/$name.log" >&2
  else
    ok
    printf '%s: clean%s\n' "$name" "$([ $rc -eq 77 ] && echo ' (skipped itself)')"
  fi
}
for p in "$@"; do vg "$(basename "$p")" "$p"; done
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', 'train', run_dir = '$out/run' /
&prepare input = '$TOP_SRCDIR/tests/data/kjv-genesis.txt', documents = 'line', train_out = '$out/train.nc',
  val_out = '$out/val.nc' /
&model vocab_size = 256, block_size = 32, n_layer = 2, n_embd = 32, n_head = 4, window_size = 8 /
&training seq_len = 32, micro_batch_size = 2, max_steps = 3, eval_batches = 1 /
&checkpoint every_steps = 2 /
&sample n_tokens = 4 /
&system peak_gflops = 1 /
EOD
vg greenlm-train "$GREENLM" "$deck"
vg greenlm-restart "$GREENLM" --set job.task=train --set checkpoint.restart=latest --set training.max_steps=4 "$deck"
vg greenlm-tasks "$GREENLM" --set "job.task='eval','sample','export'" --set "job.run_dir='$out/tasks'" \
  --set "checkpoint.dir='$out/run/checkpoints'" --set "eval.benchmarks='lambada:$TOP_SRCDIR/tests/data/bench-lambada.jsonl'" "$deck"
echo "$pass clean, $fail failed"
[ "$fail" -eq 0 ]
