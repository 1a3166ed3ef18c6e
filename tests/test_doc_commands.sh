#!/bin/sh
# test_doc_commands: every command of the ```sh blocks of README.md and doc/ runs as written in a
# tree that looks like a fresh checkout after run/build, and exits 0; or it is one of the long
# commands listed (with when they were last run) in doc/testing.md, "Commands in the documentation".
. "$(dirname "$0")/lib.sh"
fresh_out doc-commands tree
for d in input run tests doc; do ln -s "$TOP_SRCDIR/$d" "$out/tree/$d"; done
ln -s "$(dirname "$GREENLM")" "$out/tree/src"
# key: the command without a trailing comment, blanks folded (the form of the long-command table)
key() { sed 's/[[:space:]]#.*$//; s/[[:space:]][[:space:]]*/ /g; s/^ //; s/ $//'; }
sed -n '/^<!-- long-commands/,/^<!-- end long-commands/p' "$TOP_SRCDIR/doc/testing.md" |
  sed -n 's/^| `\(.*\)` | .* | .* | .* |$/\1/p' | sed 's/\\|/|/g' | key > "$out/long.txt"
check "no long commands listed in doc/testing.md" [ -s "$out/long.txt" ]
for md in "$TOP_SRCDIR/README.md" "$TOP_SRCDIR"/doc/*.md "$TOP_SRCDIR"/doc/howto/*.md; do
  [ -f "$md" ] || continue
  # the ```sh blocks' lines, continuation lines joined
  awk '/^```sh$/ { on = 1; next } /^```/ { on = 0 } on { if (sub(/\\$/, "")) { acc = acc $0; next } print acc $0; acc = "" }' "$md"
done | grep -v '^[[:space:]]*$' | grep -v '^[[:space:]]*#' > "$out/commands.txt"
n=0 ran=0 listed=0
while IFS= read -r cmd; do
  n=$((n + 1))
  k=$(printf '%s\n' "$cmd" | key)
  if grep -qxF -- "$k" "$out/long.txt"; then
    listed=$((listed + 1))
    continue
  fi
  ran=$((ran + 1))
  (cd "$out/tree" && OPENBLAS_NUM_THREADS=1 timeout 300 sh -c "$cmd") < /dev/null > "$out/$n.log" 2>&1
  rc=$?
  check "'$cmd' exited $rc ($out/$n.log): $(tail -n 4 "$out/$n.log")" [ $rc -eq 0 ]
done < "$out/commands.txt"
# every listed command is still in the documentation
key < "$out/commands.txt" > "$out/keys.txt"
while IFS= read -r k; do
  check "doc/testing.md lists '$k', which no document shows any more" grep -qxF -- "$k" "$out/keys.txt"
done < "$out/long.txt"
echo "test_doc_commands: $n commands: $ran run, $listed listed as long"
finish
