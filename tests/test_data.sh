#!/bin/sh
# test_data: the tokenizer and prepare tasks on 1, 2 and 3 ranks.
#   - the BPE vocabulary learned is the same file on every rank count;
#   - the token variables of the datasets are identical on every rank count (ncmpidiff), for
#     documents per file, per line, separated by lines, and one document cut across ranks;
#   - JSON Lines (a text field per record) and gzip/zstd-compressed inputs, told by their first bytes,
#     give the plain text's tokens on 1 to 3 ranks; bad records are skipped and counted, or fatal
#     with file and line; a cut-off gzip file is an error;
#   - a buffer smaller than a rank's tokens (spill files, rounds of writes) gives the same datasets;
#   - ncdump -h shows the datasets' attributes;
#   - a prepare into a place that cannot be written fails cleanly and leaves no file behind;
#   - a Hugging Face tokenizer.json directory (tests/data/tokjson/llama3) prepares data as it is, the
#     same tokens on 1 and 2 ranks, with the file's vocabulary size and end-of-text id.
. "$(dirname "$0")/lib.sh"
need_program ncmpidiff "${NCMPIDIFF:-}" "PnetCDF's tools: run/deps builds them; Debian: pnetcdf-bin"
fresh_out data corpus sep
src="$TOP_SRCDIR/tests/data/kjv-genesis.txt"
# five files of Genesis, and one file of documents separated by lines "@@@"
awk -v d="$out/corpus" '{ print > (d "/part" int((NR - 1) / 100) ".txt") }' "$src"
awk 'NR % 40 == 0 { print "@@@" } { print }' "$src" > "$out/sep/genesis.txt"

deck() { # deck NAME TASKS VOCAB INPUT DOCUMENTS VAL
  cat > "$out/$1.nml" <<EOD
&job task = $2 /
&tokenizer kind = 'bpe', dir = '$out/$1/tok', vocab_size = $3 /
&prepare input = $4, documents = '$5', separator = '@@@', val_fraction = $6,
  train_out = '$out/$1/train.nc', val_out = '$out/$1/val.nc' /
EOD
}

run_ranks() { # run_ranks NAME NP
  $MPIEXEC -n "$2" "$GREENLM" "$out/$1.nml" > "$out/$1.out" 2>&1
}

for case in "files:'$out/corpus/*.txt':file:0.2:2000" "lines:'$src':line:0.1:1000" \
            "sep:'$out/sep/genesis.txt':separator_line:0.1:1000" "whole:'$src':file:0:1000"; do
  IFS=: read -r name input docs val vocab <<EOC
$case
EOC
  for np in 1 2 3; do
    v=$vocab
    [ "$np" = 3 ] && v=300   # keep the oversubscribed 3-rank run short: fewer merge rounds
    deck "$name-$np" "'tokenizer', 'prepare'" "$v" "$input" "$docs" "$val"
    run_ranks "$name-$np" "$np"
    rc=$?; check "$name on $np ranks failed: $(tail -n 5 "$out/$name-$np.out")" [ $rc -eq 0 ]
  done
  for f in encoder.json vocab.bpe; do
    check "$name: $f differs between 1 and 2 ranks" cmp -s "$out/$name-1/tok/$f" "$out/$name-2/tok/$f"
  done
  # the 3-rank run learned a smaller vocabulary: prepare again with the 1-rank one to compare tokens
  deck "$name-3b" "'prepare'" 300 "$input" "$docs" "$val"
  sed -i "s|dir = '$out/$name-3b/tok'|dir = '$out/$name-1/tok'|" "$out/$name-3b.nml"
  run_ranks "$name-3b" 3
  rc=$?; check "$name: prepare on 3 ranks failed: $(tail -n 5 "$out/$name-3b.out")" [ $rc -eq 0 ]
  splits=train
  [ "$val" != 0 ] && splits="train val"
  for s in $splits; do
    for other in "$name-2" "$name-3b"; do
      "$NCMPIDIFF" -q -v tokens,doc_start "$out/$name-1/$s.nc" "$out/$other/$s.nc" > "$out/$other-$s.diff" 2>&1
      rc=$?; check "$name: $s tokens differ between 1 rank and $other: $(head -n 5 "$out/$other-$s.diff")" [ $rc -eq 0 ]
    done
  done
done

# a buffer of 0.01 MiB (1024 tokens, the least): every rank spills its tokens and writes them in
# rounds of 512; the datasets are the same
for np in 1 2; do
  deck "spill-$np" "'prepare'" 300 "'$src'" line 0.1
  sed -i "s|dir = '$out/spill-$np/tok'|dir = '$out/lines-1/tok'|" "$out/spill-$np.nml"
  $MPIEXEC -n "$np" "$GREENLM" --set prepare.buffer_mb=0.01 "$out/spill-$np.nml" > "$out/spill-$np.out" 2>&1
  rc=$?; check "prepare with a 0.01 MiB buffer on $np ranks failed: $(tail -n 5 "$out/spill-$np.out")" [ $rc -eq 0 ]
  for s in train val; do
    "$NCMPIDIFF" -q -v tokens,doc_start "$out/lines-1/$s.nc" "$out/spill-$np/$s.nc" > "$out/spill-$np-$s.diff" 2>&1
    rc=$?; check "a 0.01 MiB buffer on $np ranks: $s tokens differ: $(head -n 5 "$out/spill-$np-$s.diff")" [ $rc -eq 0 ]
  done
  check "spill files left behind: $(ls "$out/spill-$np")" [ -z "$(ls "$out/spill-$np" | grep spill)" ]
done

# the 3-rank vocabulary of 300 equals the first merges of the 1-rank one
head -n 44 "$out/lines-1/tok/vocab.bpe" > "$out/head1"   # the version line and 300 - 257 merges
head -n 44 "$out/lines-3/tok/vocab.bpe" > "$out/head3"
check "the 3-rank vocabulary's merges are not the 1-rank vocabulary's first ones" cmp -s "$out/head1" "$out/head3"

if [ -n "${NCDUMP:-}" ] && [ -x "$NCDUMP" ]; then
  "$NCDUMP" -h "$out/files-1/val.nc" > "$out/ncdump.txt" 2>&1
  for a in tokenizer_hash vocab_size eot_id source_files source_bytes token_count document_count 'ushort tokens(token)'; do
    check "ncdump -h shows no $a" grep -q "$a" "$out/ncdump.txt"
  done
else
  echo "ncdump not found: attribute listing not checked"
fi

# JSON Lines and compressed inputs: the sep corpus's documents as JSON Lines records in three files
# (gzip, zstd, plain) give the separator-line text's tokens exactly, on 1, 2 and 3 ranks; the same
# text gzip- and zstd-compressed under names that do not say so is read by its first bytes
mkdir -p "$out/jsonl"
awk -v d="$out/jsonl" 'function flush() { if (doc != "") print "{\"text\": \"" doc "\", \"id\": " n++ "}" > (d "/part" int(n / 4) ".jsonl"); doc = "" }
  $0 == "@@@" { flush(); next } { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); doc = doc $0 "\\n" } END { flush() }' "$out/sep/genesis.txt"
have_zstd=0
command -v zstd > /dev/null && have_zstd=1
gzip -n "$out/jsonl/part0.jsonl"
[ $have_zstd = 1 ] && zstd -q --rm "$out/jsonl/part1.jsonl"
gzip -n -c "$out/sep/genesis.txt" > "$out/sep-gz.txt"
[ $have_zstd = 1 ] && zstd -q -c "$out/sep/genesis.txt" > "$out/sep-zst.txt"
for case in "jsonl:'$out/jsonl/*':file:1 2 3" "gz:'$out/sep-gz.txt':separator_line:2" "zst:'$out/sep-zst.txt':separator_line:2"; do
  IFS=: read -r name input docs ranks <<EOC
$case
EOC
  [ "$name" = zst ] && [ $have_zstd = 0 ] && { echo "zstd not found: zstd input not checked"; continue; }
  for np in $ranks; do
    deck "$name-$np" "'prepare'" 300 "$input" "$docs" 0.1
    sed -i "s|dir = '$out/$name-$np/tok'|dir = '$out/sep-1/tok'|" "$out/$name-$np.nml"
    run_ranks "$name-$np" "$np"
    rc=$?; check "$name input on $np ranks failed: $(tail -n 5 "$out/$name-$np.out")" [ $rc -eq 0 ]
    for s in train val; do
      "$NCMPIDIFF" -q -v tokens,doc_start "$out/sep-1/$s.nc" "$out/$name-$np/$s.nc" > "$out/$name-$np-$s.diff" 2>&1
      rc=$?; check "$name input on $np ranks: $s tokens differ from the separator-line text's: $(head -n 5 "$out/$name-$np-$s.diff")" [ $rc -eq 0 ]
    done
  done
done
check "the JSON Lines report does not name the kinds: $(grep 'prepare: ' "$out/jsonl-3.out" | head -n 2)" \
  grep -q "prepare: 4 files, plain 2, gzip 1, zstd 1, JSON Lines; whole files per rank" "$out/jsonl-3.out"

# bad records: counted, the first named, skipped; with bad_records = 'fatal' each reported with its
# file and line and nothing written
printf '%s\n' '{"text": "In the beginning"}' 'not json' '[1, 2]' '{"title": "x"}' '{"text": 5}' \
  '{"text": "and the earth"}' > "$out/bad.jsonl"
printf '{"text": "bad \377 byte"}\n' >> "$out/bad.jsonl"
deck bad "'prepare'" 300 "'$out/bad.jsonl', '$out/jsonl/part2.jsonl'" file 0.1
sed -i "s|dir = '$out/bad/tok'|dir = '$out/sep-1/tok'|" "$out/bad.nml"
run_ranks bad 1
rc=$?; check "bad records skipped: the run failed: $(tail -n 5 "$out/bad.out")" [ $rc -eq 0 ]
check "bad records: no count and first one: $(grep 'JSON Lines:' "$out/bad.out")" \
  grep -q "records, 5 bad and skipped (bad_records = 'skip'); the first: $out/bad.jsonl:2: not JSON" "$out/bad.out"
$MPIEXEC -n 2 "$GREENLM" --set "prepare.bad_records='fatal'" --set "prepare.train_out='$out/bad-fatal/train.nc'" \
  --set "prepare.val_out='$out/bad-fatal/val.nc'" "$out/bad.nml" > "$out/bad-fatal.out" 2>&1
check "bad records with bad_records = 'fatal' succeeded" [ $? -ne 0 ]
for w in "bad.jsonl:2: error: bad JSON Lines record: not JSON" "bad.jsonl:3: error: bad JSON Lines record: not a JSON object" \
         "bad.jsonl:4: error: bad JSON Lines record: no field 'text'" "bad.jsonl:5: error: bad JSON Lines record: the field 'text' is not a string" \
         "bad.jsonl:7: error: bad JSON Lines record: invalid UTF-8"; do
  check "fatal bad records: no '$w'" grep -q "$w" "$out/bad-fatal.out"
done
check "fatal bad records: a dataset was written" [ ! -e "$out/bad-fatal" ]
head -c 2000 "$out/jsonl/part0.jsonl.gz" > "$out/cut.jsonl.gz"
$MPIEXEC -n 1 "$GREENLM" --set "prepare.input='$out/cut.jsonl.gz'" --set "prepare.train_out='$out/cut/train.nc'" \
  --set "prepare.val_out='$out/cut/val.nc'" "$out/bad.nml" > "$out/cut.out" 2>&1
check "a cut-off gzip file was read without complaint" [ $? -ne 0 ]
check "cut-off gzip: no error naming it: $(tail -n 3 "$out/cut.out")" grep -q "cut.jsonl.gz: error: the gzip data is cut off: the file ends inside a gzip member" "$out/cut.out"

# a directory with only a tokenizer.json (Llama 3's structure): read natively, no conversion step
for np in 1 2; do
  deck "tokjson-$np" "'prepare'" 300 "'$src'" line 0.1
  sed -i "s|dir = '$out/tokjson-$np/tok'|dir = '$TOP_SRCDIR/tests/data/tokjson/llama3'|" "$out/tokjson-$np.nml"
  run_ranks "tokjson-$np" "$np"
  rc=$?; check "prepare with tokenizer.json on $np ranks failed: $(tail -n 5 "$out/tokjson-$np.out")" [ $rc -eq 0 ]
done
check "prepare does not name tokenizer.json: $(grep 'tokenizer' "$out/tokjson-1.out" | tail -n 1)" \
  grep -q "tokenizer byte-level BPE (vocabulary 703, 444 merges) from .*llama3/tokenizer.json" "$out/tokjson-1.out"
for s in train val; do
  "$NCMPIDIFF" -q -v tokens,doc_start "$out/tokjson-1/$s.nc" "$out/tokjson-2/$s.nc" > "$out/tokjson-$s.diff" 2>&1
  rc=$?; check "tokenizer.json: $s tokens differ between 1 and 2 ranks: $(head -n 5 "$out/tokjson-$s.diff")" [ $rc -eq 0 ]
done
if [ -n "${NCDUMP:-}" ] && [ -x "$NCDUMP" ]; then
  "$NCDUMP" -h "$out/tokjson-1/train.nc" > "$out/tokjson-ncdump.txt" 2>&1
  for a in "vocab_size = 703" "eot_id = 702"; do
    check "tokenizer.json dataset: no '$a' in ncdump -h" grep -q "$a" "$out/tokjson-ncdump.txt"
  done
fi

# an output that cannot be written (its directory is a file): a clear error, nothing half-written
echo "not a directory" > "$out/blocker"
deck blocked "'prepare'" 300 "'$src'" line 0.1
sed -i "s|dir = '$out/blocked/tok'|dir = '$out/lines-1/tok'|; s|train_out = '$out/blocked/train.nc'|train_out = '$out/blocker/train.nc'|" \
  "$out/blocked.nml"
run_ranks blocked 2
check "prepare into an unwritable place succeeded" [ $? -ne 0 ]
check "no error naming train_out: $(cat "$out/blocked.out")" grep -q "prepare train_out" "$out/blocked.out"
check "a file was left behind: $(ls "$out/blocked" 2>&1)" [ ! -e "$out/blocked" ]
finish
