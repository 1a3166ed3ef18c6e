#!/bin/sh
# test_hostile_text: hostile input to the text side (the 'tokenizer', 'prepare', 'train' and 'sample'
# tasks' readers), the second round of doc/testing.md's fault table. Each case has its exit status and
# message, runs under a time limit (a FIFO must never make greenlm wait), and after each one every good
# file (the inputs, datasets, vocabularies) is byte for byte as it was. The classes:
#   path-   a directory, a FIFO or a device where a file belongs is named as such;
#   line-   a line that decompresses to far more than its file (or is just long) is refused or left out
#           with its file and line, in memory bounded by &prepare buffer_mb, the same on any rank count;
#   out-    an output that is an input (or another output) under any spelling is refused before
#           anything is written;
#   quiet-  what used to pass silently: trailing garbage after gzip or zstd data, blend weights that
#           overflow or vanish, a dataset blended with itself; multi-member gzip is read whole;
#   pair-   encoder.json and vocab.bpe are written as one (a mixed pair is refused); BPE training
#           learns no token longer than the reader takes.
# The cases and their outcomes are written to $TEST_OUT/hostile_text/table.txt.
. "$(dirname "$0")/lib.sh"
need_program ncmpidiff "${NCMPIDIFF:-}" "PnetCDF's tools: run/deps builds them; Debian: pnetcdf-bin"
fresh_out hostile_text in fifo
genesis="$TOP_SRCDIR/tests/data/kjv-genesis.txt"
head -c 60000 "$genesis" > "$out/in/a.txt"
tail -c 40000 "$genesis" > "$out/in/b.txt"
deck="$out/deck.nml"
cat > "$deck" <<EOD
&job task = 'prepare', seed = 3 /
&tokenizer kind = 'bytes', dir = '$out/tok', vocab_size = 300 /
&prepare input = '$out/in/a.txt', documents = 'line', val_fraction = 0.1,
  train_out = '$out/data/train.nc', val_out = '$out/data/val.nc' /
&data train = '$out/data/train.nc', val = '$out/data/val.nc' /
&model vocab_size = 300, block_size = 32, n_layer = 1, n_embd = 32, n_head = 2 /
&training seq_len = 32, micro_batch_size = 2, global_batch_size = 2, max_steps = 2, eval_every = 0, eval_batches = 1 /
&sample n_tokens = 4, prompt = 'In' /
&system peak_gflops = 10 /
EOD
limit=120 # seconds any case may take: a hang is a failure, not a stuck test
g() { timeout $limit $MPIEXEC -n 1 "$GREENLM" "$@" "$deck"; }
g2() { timeout $limit $MPIEXEC -n 2 "$GREENLM" "$@" "$deck"; }

# ---- the good files ------------------------------------------------------------------------------
g > "$out/prepare.out" 2>&1 || bad "prepare: $(tail -n 3 "$out/prepare.out")"
g --set "job.task='tokenizer'" --set tokenizer.kind=bpe --set "tokenizer.dir=$out/bpe" > "$out/bpe.out" 2>&1 \
  || bad "tokenizer: $(tail -n 3 "$out/bpe.out")"
g --set "job.task='tokenizer'" --set tokenizer.kind=bpe --set "tokenizer.dir=$out/bpe280" --set tokenizer.vocab_size=280 \
  --set "tokenizer.corpus='$out/in/b.txt'" > "$out/bpe280.out" 2>&1 || bad "tokenizer 280: $(tail -n 3 "$out/bpe280.out")"
good="$out/in/a.txt $out/in/b.txt $out/data/train.nc $out/data/val.nc $out/bpe/encoder.json $out/bpe/vocab.bpe"
snapshot() { for f in $good; do cksum "$f" 2>&1; done; }
snapshot > "$out/good.before"
printf '%-30s %-6s %-6s %-6s %s\n' case class exit want message > "$out/table.txt"

# expect NAME STATUS MESSAGE command...: STATUS a number or 'nonzero'; the class is NAME's prefix
expect() {
  name=$1 want=$2 msg=$3; shift 3
  "$@" > "$out/$name.out" 2>&1
  rc=$?
  check "$name: timed out after $limit s" [ "$rc" -ne 124 ]
  if [ "$want" = nonzero ]; then check "$name: exit status $rc, expected non-zero" [ "$rc" -ne 0 ]
  else check "$name: exit status $rc, expected $want: $(tail -n 4 "$out/$name.out")" [ "$rc" -eq "$want" ]; fi
  check "$name: no '$msg' in: $(grep -i 'error\|warning\|left out\|skipped' "$out/$name.out" | head -n 4)" \
    grep -qF -- "$msg" "$out/$name.out"
  snapshot > "$out/good.after"
  check "$name: a good file changed: $(diff "$out/good.before" "$out/good.after" | head -n 4)" \
    cmp -s "$out/good.before" "$out/good.after"
  printf '%-30s %-6s %-6s %-6s %s\n' "$name" "${name%%-*}" "$rc" "$want" "$msg" >> "$out/table.txt"
}
nothing() { # nothing NAME PATH...: no file is at or under the paths after case NAME
  n=$1; shift
  for p in "$@"; do check "$n: '$p' was written: $(find "$p" -type f 2>/dev/null | head -n 3)" [ -z "$(find "$p" ! -type d 2>/dev/null)" ]; done
}

# ---- path: a directory, a FIFO, a device where a file belongs -----------------------------------
mkfifo "$out/fifo/text.txt" "$out/fifo/data.nc" "$out/fifo/prompts.txt"
mkdir -p "$out/tok-dir/encoder.json" "$out/tok-fifo" "$out/tok-hf"
cp "$out/bpe/encoder.json" "$out/tok-fifo/" && mkfifo "$out/tok-fifo/vocab.bpe"
cp "$out/bpe/encoder.json" "$out/tok-hf/vocab.json" && mkfifo "$out/tok-hf/merges.txt"
cp "$out/bpe/vocab.bpe" "$out/tok-dir/"
bpe() { echo --set tokenizer.kind=bpe --set "tokenizer.dir=$out/$1"; }
expect path-encoder-directory 1 "tok-dir/encoder.json': a directory, not a tokenizer file" \
  g $(bpe tok-dir) --set "prepare.train_out='$out/p1/train.nc'"
expect path-merges-fifo 1 "tok-fifo/vocab.bpe': a FIFO (named pipe), not a tokenizer file" \
  g $(bpe tok-fifo) --set "prepare.train_out='$out/p2/train.nc'"
expect path-hf-merges-fifo 1 "tok-hf/merges.txt': a FIFO (named pipe), not a tokenizer file" \
  g $(bpe tok-hf) --set "prepare.train_out='$out/p3/train.nc'"
nothing path-tokenizer "$out/p1" "$out/p2" "$out/p3"
expect path-input-fifo 1 "'$out/fifo/text.txt' is a FIFO (named pipe), not a text file" \
  g --set "prepare.input='$out/fifo/text.txt'" --set "prepare.train_out='$out/p4/train.nc'"
expect path-input-device 1 "'/dev/null' is a character device, not a text file" \
  g --set "prepare.input='$out/in/a.txt','/dev/null'" --set "prepare.train_out='$out/p5/train.nc'"
expect path-corpus-fifo 1 "'$out/fifo/text.txt' is a FIFO (named pipe), not a text file" \
  g --set "job.task='tokenizer'" $(bpe p6) --set "tokenizer.corpus='$out/fifo/text.txt'"
nothing path-input "$out/p4" "$out/p5" "$out/p6"
mkdir -p "$out/mixed" && cp "$out/in/b.txt" "$out/mixed/" && mkfifo "$out/mixed/pipe.txt" && mkdir "$out/mixed/sub"
expect path-input-directory-passes-over 0 "prepare: 1 file, plain" \
  g --set "prepare.input='$out/mixed'" --set "prepare.train_out='$out/p7/train.nc'" --set "prepare.val_out='$out/p7/val.nc'"
expect path-dataset-directory 1 "'$out/in': a directory, not a dataset file" \
  g --set "job.task='train'" --set "job.run_dir='$out/r1'" --set "data.train='$out/in'"
expect path-dataset-fifo 1 "'$out/fifo/data.nc': a FIFO (named pipe), not a dataset file" \
  g --set "job.task='train'" --set "job.run_dir='$out/r2'" --set "data.val='$out/fifo/data.nc'"
expect path-blend-member-fifo 1 "'$out/fifo/data.nc': a FIFO (named pipe), not a dataset file" \
  g --set "job.task='train'" --set "job.run_dir='$out/r3'" --set "data.train='$out/data/train.nc','$out/fifo/data.nc'"
expect path-prompt-fifo 1 "'$out/fifo/prompts.txt': a FIFO (named pipe), not a prompt file" \
  g --set "job.task='sample'" --set "job.run_dir='$out/r4'" --set "sample.prompt_file='$out/fifo/prompts.txt'"
mkdir -p "$out/p8/train.nc"
expect path-output-directory 1 "'$out/p8/train.nc' is a directory, not a dataset file" \
  g --set "prepare.train_out='$out/p8/train.nc'" --set "prepare.val_out='$out/p8/val.nc'"
nothing path-output "$out/p8/val.nc" "$out/r1/metrics.csv" "$out/r2/metrics.csv" "$out/r3/metrics.csv"

# ---- line: lines far longer than their files, and long lines -------------------------------------
# a JSON Lines record of 512 MiB in a zstd file of a few KiB, and a text line of 256 MiB gzipped: with
# buffer_mb = 64 a line may have 16 MiB; the record and the line are left out, named, and memory stays
# far below the line (it grew past the line's size before)
{ printf '{"text": "first"}\n{"text": "'; head -c 536870912 /dev/zero | tr '\0' a; printf '"}\n{"text": "last"}\n'; } \
  | zstd -q -1 > "$out/in/huge.jsonl.zst"
{ head -n 3 "$out/in/a.txt"; head -c 268435456 /dev/zero | tr '\0' b; printf '\n'; tail -n 3 "$out/in/a.txt"; } \
  | gzip -1 > "$out/in/huge.txt.gz"
good="$good $out/in/huge.jsonl.zst $out/in/huge.txt.gz"
snapshot > "$out/good.before"
peak_below() { # peak_below NAME MiB: the prepare report's peak resident memory is below MiB
  peak=$(sed -n 's/^prepare: peak resident memory .*(\([0-9]*\) bytes).*/\1/p' "$out/$1.out")
  check "$1: peak resident memory ${peak:-?} bytes, not below $2 MiB" [ "${peak:-999999999999}" -lt $(($2 * 1048576)) ]
}
expect line-zstd-record-skipped 0 "huge.jsonl.zst:2: a line of more than 16777216 bytes, the most &prepare buffer_mb = 64 allows" \
  g --set "prepare.input='$out/in/huge.jsonl.zst'" --set prepare.buffer_mb=64 --set prepare.val_fraction=0 \
    --set "prepare.train_out='$out/l1/train.nc'"
check "line-zstd-record-skipped: the records around it are not read: $(grep 'JSON Lines:' "$out/line-zstd-record-skipped.out")" \
  grep -q "prepare: JSON Lines: 3 records, 1 bad and skipped" "$out/line-zstd-record-skipped.out"
peak_below line-zstd-record-skipped 256
expect line-gzip-text-fatal 1 "huge.txt.gz:4: error: line too long: a line of more than 16777216 bytes" \
  g --set "prepare.input='$out/in/huge.txt.gz'" --set prepare.buffer_mb=64 --set "prepare.bad_records='fatal'" \
    --set "prepare.train_out='$out/l2/train.nc'" --set "prepare.val_out='$out/l2/val.nc'"
nothing line-gzip-text-fatal "$out/l2"
expect line-gzip-text-skipped 0 "prepare: 1 line of text longer than 16777216 bytes left out (bad_records = 'skip'); the first: $out/in/huge.txt.gz:4" \
  g --set "prepare.input='$out/in/huge.txt.gz'" --set prepare.buffer_mb=64 --set "prepare.documents='file'" \
    --set prepare.val_fraction=0 --set "prepare.train_out='$out/l3/train.nc'"
peak_below line-gzip-text-skipped 256
# plain text with two long lines (buffer_mb = 0.01: lines of 2621 bytes), each after a blank line, where
# the shares of 2 and 3 ranks would start: left out on 1, 2 and 3 ranks alike (the line after one is
# no cut point), the datasets those of the text without them
awk -v y="$(head -c 30000 /dev/zero | tr '\0' y)" -v z="$(head -c 15000 /dev/zero | tr '\0' z)" '
  { n += length($0) + 1 } n > 25000 && !ys { print ""; print y; ys = 1 } n > 30000 && !zs { print ""; print z; zs = 1 }
  NR % 40 == 0 { print "" } { print }' "$out/in/a.txt" > "$out/in/long.txt"
grep -v '^yyy\|^zzz' "$out/in/long.txt" > "$out/in/short.txt"
first=$(grep -n '^yyy' "$out/in/long.txt" | cut -d: -f1)
good="$good $out/in/long.txt"
snapshot > "$out/good.before"
g --set "prepare.input='$out/in/short.txt'" --set "prepare.documents='blank_line'" \
  --set "prepare.train_out='$out/short/train.nc'" --set "prepare.val_out='$out/short/val.nc'" > "$out/short.out" 2>&1 \
  || bad "the text without its long lines: $(tail -n 3 "$out/short.out")"
nlong=$(grep -c '^yyy\|^zzz' "$out/in/long.txt")
for np in 1 2 3; do
  expect line-plain-skipped-$np-ranks 0 "prepare: $nlong lines of text longer than 2621 bytes left out (bad_records = 'skip'); the first: $out/in/long.txt:$first:" \
    timeout $limit $MPIEXEC -n $np "$GREENLM" --set "prepare.input='$out/in/long.txt'" --set prepare.buffer_mb=0.01 \
      --set "prepare.documents='blank_line'" --set "prepare.train_out='$out/long$np/train.nc'" \
      --set "prepare.val_out='$out/long$np/val.nc'" "$deck"
  for s in train val; do
    "$NCMPIDIFF" -v tokens,doc_start "$out/short/$s.nc" "$out/long$np/$s.nc" > "$out/long$np-$s.diff" 2>&1
    rc=$?; check "long lines left out on $np ranks: the $s split is not the text's without them: $(head -n 3 "$out/long$np-$s.diff")" [ $rc -eq 0 ]
  done
done
expect line-plain-fatal 1 "long.txt:$first: error: line too long: a line of more than 2621 bytes" \
  g2 --set "prepare.input='$out/in/long.txt'" --set prepare.buffer_mb=0.01 --set "prepare.bad_records='fatal'" \
    --set "prepare.train_out='$out/l4/train.nc'" --set "prepare.val_out='$out/l4/val.nc'"
nothing line-plain-fatal "$out/l4"
expect line-tokenizer-reports 0 "tokenizer: $nlong lines of text longer than 2621 bytes left out" \
  g --set "job.task='tokenizer'" $(bpe l5) --set "tokenizer.corpus='$out/in/long.txt'" --set prepare.buffer_mb=0.01

# ---- out: an output that is an input, or another output -----------------------------------------
ln -s a.txt "$out/in/link.txt"
ln "$out/in/b.txt" "$out/in/hard.txt"
cd "$out" || exit 1
outs() { echo --set "prepare.train_out='$1'" --set "prepare.val_out='$2'"; }
expect out-train-is-input 1 "'./in/a.txt' is the input file '$out/in/a.txt' of &prepare input: writing it would destroy the input" \
  g $(outs ./in/a.txt o1/val.nc)
expect out-train-is-input-symlink 1 "'in/link.txt' is the input file '$out/in/a.txt'" g $(outs in/link.txt o2/val.nc)
expect out-val-is-input-hard-link 1 "'in/hard.txt' is the input file '$out/in/b.txt'" \
  g --set "prepare.input='$out/in/a.txt','$out/in/b.txt'" $(outs o3/train.nc in/hard.txt)
expect out-train-is-val 1 "&prepare val_out: 'o4/../o4/train.nc' is the same file as &prepare train_out 'o4/train.nc'" \
  g $(outs o4/train.nc o4/../o4/train.nc)
expect out-in-input-directory 1 "'in/train.nc' is in the input directory '$out/in' of &prepare input: the deck would read it as text" \
  g --set "prepare.input='$out/in'" $(outs in/train.nc o5/val.nc)
expect out-matched-by-pattern 1 "'in/x.txt' is matched by the input pattern '$out/in/*.txt' of &prepare input" \
  g --set "prepare.input='$out/in/*.txt'" $(outs in/x.txt o6/val.nc)
cp in/a.txt o7.spill-0 && good="$good $out/o7.spill-0" && snapshot > "$out/good.before"
expect out-spill-is-input 1 "its spill file 'o7.spill-0' is the input file '$out/o7.spill-0'" \
  g --set "prepare.input='$out/o7.spill-0'" $(outs o7 o7-val.nc)
expect out-train-is-tokenizer 1 "'bpe/encoder.json' is the tokenizer's file '$out/bpe/encoder.json' (&tokenizer dir)" \
  g $(bpe bpe) $(outs bpe/encoder.json o8/val.nc)
expect out-tokenizer-in-corpus 1 "&tokenizer dir: '$out/in/encoder.json' is in the input directory '$out/in' of &tokenizer corpus" \
  g --set "job.task='tokenizer','prepare'" $(bpe in) --set "tokenizer.corpus='$out/in'" $(outs o9/train.nc o9/val.nc)
nothing out "$out/o1" "$out/o2" "$out/o3" "$out/o4" "$out/o5" "$out/o6" "$out/o7" "$out/o8" "$out/o9" "$out/in/encoder.json"
cd - > /dev/null || exit 1

# ---- quiet: what used to pass without a word -----------------------------------------------------
gzip -n -c "$out/in/a.txt" > "$out/in/one.gz"
head -c 30000 "$out/in/a.txt" | gzip -n -c > "$out/in/two.gz"
tail -c +30001 "$out/in/a.txt" | gzip -n -c >> "$out/in/two.gz"
{ cat "$out/in/one.gz"; printf 'appended text\n'; } > "$out/in/garbage.gz"
{ cat "$out/in/one.gz"; head -c 512 /dev/zero; } > "$out/in/zeros.gz"
zstd -q -c "$out/in/a.txt" > "$out/in/one.zst"
{ cat "$out/in/one.zst"; printf 'appended text\n'; } > "$out/in/garbage.zst"
good="$good $out/in/two.gz $out/in/garbage.gz $out/in/zeros.gz $out/in/garbage.zst"
snapshot > "$out/good.before"
expect quiet-gzip-two-members 0 "prepare: 1 file, gzip" \
  g --set "prepare.input='$out/in/two.gz'" --set "prepare.train_out='$out/q1/train.nc'" --set "prepare.val_out='$out/q1/val.nc'"
for s in train val; do
  "$NCMPIDIFF" -v tokens,doc_start "$out/data/$s.nc" "$out/q1/$s.nc" > "$out/q1-$s.diff" 2>&1
  rc=$?; check "two gzip members: the $s split is not the plain text's: $(head -n 3 "$out/q1-$s.diff")" [ $rc -eq 0 ]
done
size=$(wc -c < "$out/in/one.gz")
expect quiet-gzip-trailing-garbage 1 "garbage.gz: error: trailing garbage: 14 bytes after the gzip data (from byte $size of $((size + 14))) do not start another gzip member" \
  g --set "prepare.input='$out/in/garbage.gz'" --set "prepare.train_out='$out/q2/train.nc'"
expect quiet-gzip-trailing-zeros 1 "zeros.gz: error: trailing garbage: 512 bytes after the gzip data (from byte $size of" \
  g --set "prepare.input='$out/in/zeros.gz'" --set "prepare.train_out='$out/q3/train.nc'"
size=$(wc -c < "$out/in/one.zst")
expect quiet-zstd-trailing-garbage 1 "garbage.zst: error: trailing garbage: 14 bytes after the zstd data (from byte $size of" \
  g --set "prepare.input='$out/in/garbage.zst'" --set "prepare.train_out='$out/q4/train.nc'"
nothing quiet-trailing "$out/q2" "$out/q3" "$out/q4"
train() { echo --set "job.task='train'" --set "job.run_dir='$out/$1'"; }
two="'$out/data/train.nc','$out/data/val.nc'"
expect quiet-weights-overflow 1 "&data train_weights: the weights sum to inf, beyond what a double holds" \
  g $(train q5) --set "data.train=$two" --set "data.train_weights=1e308,1e308"
expect quiet-weights-share-vanishes 1 "&data train_weights: weight 2 (1e-300) of 1 in all is a share of 1e-300: its dataset would never be drawn" \
  g $(train q6) --set "data.train=$two" --set "data.train_weights=1,1e-300"
expect quiet-val-weights-overflow 1 "&data val_weights: the weights sum to inf" \
  g $(train q7) --set "data.val=$two" --set "data.val_weights=1e308,1e308"
expect quiet-val-share-underflow 1 "&data val_weights: weight 2 (1e-100) of 1e+300 in all is a share of 0: its dataset would not count" \
  g $(train q8) --set "data.val=$two" --set "data.val_weights=1e300,1e-100"
ln -s train.nc "$out/data/alias.nc"
expect quiet-blend-with-itself 1 "&data train: '$out/data/train.nc' (entry 1) and '$out/data/./train.nc' (entry 2) are the same file: a dataset blended with itself" \
  g $(train q9) --set "data.train='$out/data/train.nc','$out/data/./train.nc'"
expect quiet-val-blend-with-itself 1 "&data val: '$out/data/train.nc' (entry 1) and '$out/data/alias.nc' (entry 2) are the same file" \
  g $(train q10) --set "data.val='$out/data/train.nc','$out/data/alias.nc'"
nothing quiet-weights "$out/q5" "$out/q6" "$out/q7" "$out/q8" "$out/q9/metrics.csv" "$out/q10/metrics.csv"

# ---- pair: encoder.json and vocab.bpe as one; no token longer than the reader takes ---------------
check "pair: the tokenizer task wrote no manifest" [ -s "$out/bpe/tokenizer.manifest" ]
# a crash between the renames: the new manifest and encoder.json (280 tokens) beside the old vocab.bpe
mkdir -p "$out/mixed1" "$out/mixed2" "$out/plain-pair"
cp "$out/bpe280/tokenizer.manifest" "$out/bpe280/encoder.json" "$out/mixed1/" && cp "$out/bpe/vocab.bpe" "$out/mixed1/"
expect pair-crash-between-renames 1 "mixed1/tokenizer.manifest': vocab.bpe is not the file this manifest lists" \
  g $(bpe mixed1) --set "prepare.train_out='$out/m1/train.nc'"
# a crash after the manifest, before the renames: the new manifest beside the old pair
cp "$out/bpe280/tokenizer.manifest" "$out/mixed2/" && cp "$out/bpe/encoder.json" "$out/bpe/vocab.bpe" "$out/mixed2/"
expect pair-crash-before-renames 1 "encoder.json and vocab.bpe are not the files this manifest lists" \
  g $(bpe mixed2) --set "prepare.train_out='$out/m2/train.nc'"
nothing pair-crash "$out/m1" "$out/m2"
cp "$out/bpe/encoder.json" "$out/bpe/vocab.bpe" "$out/plain-pair/" # GPT-2's files have no manifest
expect pair-without-manifest-loads 0 "tokenizer byte-level BPE (vocabulary 300" \
  g $(bpe plain-pair) --set "prepare.train_out='$out/m3/train.nc'" --set "prepare.val_out='$out/m3/val.nc'"
cp -r "$out/bpe" "$out/again"
expect pair-written-again 0 "tokenizer: wrote $out/again/encoder.json and $out/again/vocab.bpe: 280 tokens" \
  g --set "job.task='tokenizer','prepare'" $(bpe again) --set tokenizer.vocab_size=280 --set "tokenizer.corpus='$out/in/b.txt'" \
    --set "prepare.train_out='$out/m4/train.nc'" --set "prepare.val_out='$out/m4/val.nc'"
check "pair written again: the manifest is not the new pair's" cmp -s "$out/again/tokenizer.manifest" "$out/bpe280/tokenizer.manifest"
# words of 3000, 2500 and 1800 letters: merging them whole would learn tokens of up to 3000 bytes
awk 'BEGIN { for (k = 0; k < 3000; k++) a = a "a"; for (k = 0; k < 2500; k++) b = b "b"; for (k = 0; k < 1800; k++) c = c "c"
             for (i = 0; i < 30; i++) { print a; print b " " c } }' > "$out/in/words.txt"
expect pair-long-word 0 "tokenizer: wrote $out/words/encoder.json" \
  g --set "job.task='tokenizer','prepare'" $(bpe words) --set tokenizer.vocab_size=290 --set "prepare.input='$out/in/words.txt'" \
    --set "prepare.train_out='$out/m5/train.nc'" --set "prepare.val_out='$out/m5/val.nc'"
longest=$(tr ',' '\n' < "$out/words/encoder.json" | awk -F'"' '{ gsub(/\\u[0-9a-f][0-9a-f][0-9a-f][0-9a-f]/, "x", $2) }
  NF > 2 && length($2) > m { m = length($2) } END { print m + 0 }') # \u0120 (a space) is one byte
check "pair-long-word: the longest token has $longest bytes, not 1024" [ "$longest" -eq 1024 ]

cat "$out/table.txt"
finish
