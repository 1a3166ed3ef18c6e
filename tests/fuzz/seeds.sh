#!/bin/sh
# seeds.sh: make the seed inputs of the fuzz targets in tests/fuzz/corpus/ with greenlm itself
# (a BPE vocabulary, a token dataset, a checkpoint of the checkpoint target's tiny model and its
# bf16 export, --set lines) and from the test fixtures (Hugging Face models, benchmark files). The
# deck target's seeds are the decks of input/ and tests/decks/, the machine target's the machine
# files of input/machines/, used where they are.
# The text target's files: an option byte, then text or JSON Lines (gzip makes the compressed ones).
#
#   tests/fuzz/seeds.sh BUILD_DIR      (BUILD_DIR/src/greenlm is run)
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
greenlm="$1/src/greenlm"
corpus="$top/tests/fuzz/corpus"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { mpiexec -n 1 "$greenlm" "$@" > "$work/log" 2>&1 || { tail -n 20 "$work/log"; exit 1; }; }

# --set: one override per line
mkdir -p "$corpus/set"
printf 'training.lr=1e-3\nmodel.n_layer=3\n' > "$corpus/set/lr-layers"
printf "job.task=prepare,train\njob.run_dir=runs/x\nmodel.attention_types=global,local,global\n" > "$corpus/set/lists"
printf "job.name='a/b'\ntraining.max_steps=10\nsystem.precision=fp32\n" > "$corpus/set/quoted"

# a BPE vocabulary of 300 tokens: encoder.json, a NUL byte, vocab.bpe
head -c 30000 "$top/tests/data/kjv-genesis.txt" > "$work/text.txt"
cat > "$work/bpe.nml" <<EOD
&job task = 'tokenizer' /
&tokenizer kind = 'bpe', dir = '$work/bpe', vocab_size = 300, corpus = '$work/text.txt' /
EOD
run "$work/bpe.nml"
mkdir -p "$corpus/tokenizer"
{ cat "$work/bpe/encoder.json"; printf '\000'; cat "$work/bpe/vocab.bpe"; } > "$corpus/tokenizer/bpe-300"

# a token dataset of a few thousand tokens (bytes tokenizer)
head -c 3000 "$top/tests/data/kjv-genesis.txt" > "$work/small.txt"
cat > "$work/data.nml" <<EOD
&job task = 'prepare' /
&prepare input = '$work/small.txt', documents = 'line', train_out = '$work/train.nc', val_out = '$work/val.nc' /
EOD
run "$work/data.nml"
mkdir -p "$corpus/dataset"
cp "$work/train.nc" "$corpus/dataset/small-train.nc"
cp "$work/val.nc" "$corpus/dataset/small-val.nc"

# a checkpoint of the checkpoint target's model, trained on the same text (fuzz_checkpoint.c)
i=0
while [ $i -lt 40 ]; do echo "line $i of the text the tiny model of the checkpoint fuzzer reads"; i=$((i + 1)); done > "$work/ck.txt"
cat > "$work/ck.nml" <<EOD
&job task = 'prepare', 'train', seed = 3, run_dir = '$work/run' /
&prepare input = '$work/ck.txt', documents = 'line', train_out = '$work/ck-train.nc', val_out = '$work/ck-val.nc' /
&model vocab_size = 256, block_size = 8, n_layer = 1, n_embd = 8, n_head = 2, window_size = 4 /
&training seq_len = 8, micro_batch_size = 1, max_steps = 2, eval_batches = 1 /
&checkpoint every_steps = 1 /
&sample n_tokens = 0 /
&system peak_gflops = 1 /
EOD
run "$work/ck.nml"
mkdir -p "$corpus/checkpoint"
cp "$work/run/checkpoints/ckpt-00000002.nc" "$corpus/checkpoint/tiny-step2.nc"

# Hugging Face models: config.json, a NUL byte, model.safetensors (the fixtures, and the tiny
# checkpoint above exported in bf16)
run --set "job.task='export'" --set "export.dir='$work/hf'" --set "export.dtype='bf16'" "$work/ck.nml"
mkdir -p "$corpus/hf"
hf_seed() { { cat "$1/config.json"; printf '\000'; cat "$1/model.safetensors"; } > "$corpus/hf/$2"; }
hf_seed "$top/tests/reference/hf-neo" neo-f32
hf_seed "$top/tests/reference/hf-gpt2" gpt2-f32
hf_seed "$work/hf" tiny-neo-bf16

# benchmark files: the kind's index (lambada 0, hellaswag 1, piqa 2, arc 3, winogrande 4, mc 5; plus
# 8 for one few-shot example each), then the file
mkdir -p "$corpus/bench"
k=0
for kind in lambada hellaswag piqa arc winogrande mc; do
  { printf "\\$(printf %03o $k)"; cat "$top/tests/data/bench-$kind.jsonl"; } > "$corpus/bench/$kind"
  { printf "\\$(printf %03o $((k + 8)))"; cat "$top/tests/data/bench-$kind.jsonl"; } > "$corpus/bench/$kind-fewshot"
  k=$((k + 1))
done
{ printf '\003'; cat "$top/tests/data/bench-arc-hf.jsonl"; } > "$corpus/bench/arc-hf"
# the text input path: an option byte (fuzz_text.c), a byte that cuts two gzip members, the payload
mkdir -p "$corpus/text"
seed() { # seed NAME OPTION(octal) PAYLOAD-FILE
  { printf "\\$2\\200"; cat "$3"; } > "$corpus/text/$1"
}
head -c 4000 "$top/tests/data/kjv-genesis.txt" > "$work/gen.txt"
awk 'NR % 7 == 0 { print "@@@" } NR % 5 == 0 { print "" } { print }' "$work/gen.txt" > "$work/docs.txt"
{ head -n 3 "$work/gen.txt"; head -c 1500 /dev/zero | tr '\0' y; echo; tail -n 3 "$work/gen.txt"; } > "$work/long.txt"
head -n 20 "$work/gen.txt" | awk '{ gsub(/"/, "\\\""); print "{\"text\": \"" $0 "\", \"n\": " NR "}" }' > "$work/recs.jsonl"
{ head -n 4 "$work/recs.jsonl"; printf 'not json\n{"title": 1}\n{"text": "x"'; head -c 1200 /dev/zero | tr '\0' z
  printf '"}\n[1]\n{"text": 7}\n'; tail -n 2 "$work/recs.jsonl"; } > "$work/bad.jsonl"
gzip -n -c "$work/gen.txt" > "$work/gen.gz"
{ cat "$work/gen.gz"; printf 'trailing'; } > "$work/garbage.gz"
seed plain-file 000 "$work/gen.txt"               # plain text, one document per file (the share path)
seed docs-blank-lines 020 "$work/docs.txt"        # blank_line documents
seed docs-separator 030 "$work/docs.txt"          # '@@@' separator lines
seed long-line-skip 000 "$work/long.txt"          # a line of 1500 bytes: left out
seed long-line-gzip-fatal 041 "$work/long.txt"    # the same gzipped, bad_records = 'fatal'
seed two-members-lines 013 "$work/gen.txt"        # gzip in two members, a document per line
seed zstd-file 002 "$work/gen.txt"                # zstd
seed zstd-garbage 102 "$work/gen.txt"             # zstd, then bytes that are no frame
seed jsonl-gzip 005 "$work/recs.jsonl"            # JSON Lines, gzipped
seed jsonl-bad-zstd 006 "$work/bad.jsonl"         # bad records and one too long, zstd
seed jsonl-bad-fatal 044 "$work/bad.jsonl"        # the same as it is, bad_records = 'fatal'
seed gzip-file-garbage 000 "$work/garbage.gz"     # a gzip file itself, with trailing bytes
ls -l "$corpus"/*
