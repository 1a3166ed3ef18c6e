#!/bin/sh
# test_data: the tokenizer and prepare tasks on 1, 2 and 3 ranks.
#   - the BPE vocabulary learned is the same file on every rank count;
#   - the token variables of the datasets are identical on every rank count (ncmpidiff), for
#     documents per file, per line, separated by lines, and one document cut across ranks;
#   - ncdump -h shows the datasets' attributes;
#   - a prepare into a place that cannot be written fails cleanly and leaves no file behind.
. "$(dirname "$0")/lib.sh"
out="$TEST_OUT/data"
rm -rf "$out"
mkdir -p "$out/corpus" "$out/sep"
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
    check "$name on $np ranks failed: $(tail -n 5 "$out/$name-$np.out")" [ $? -eq 0 ]
  done
  for f in encoder.json vocab.bpe; do
    check "$name: $f differs between 1 and 2 ranks" cmp -s "$out/$name-1/tok/$f" "$out/$name-2/tok/$f"
  done
  # the 3-rank run learned a smaller vocabulary: prepare again with the 1-rank one to compare tokens
  deck "$name-3b" "'prepare'" 300 "$input" "$docs" "$val"
  sed -i "s|dir = '$out/$name-3b/tok'|dir = '$out/$name-1/tok'|" "$out/$name-3b.nml"
  run_ranks "$name-3b" 3
  check "$name: prepare on 3 ranks failed: $(tail -n 5 "$out/$name-3b.out")" [ $? -eq 0 ]
  splits=train
  [ "$val" != 0 ] && splits="train val"
  for s in $splits; do
    for other in "$name-2" "$name-3b"; do
      "$NCMPIDIFF" -q -v tokens,doc_start "$out/$name-1/$s.nc" "$out/$other/$s.nc" > "$out/$other-$s.diff" 2>&1
      check "$name: $s tokens differ between 1 rank and $other: $(head -n 5 "$out/$other-$s.diff")" [ $? -eq 0 ]
    done
  done
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
