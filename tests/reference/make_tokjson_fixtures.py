#!/usr/bin/env python3
"""Write the tokenizer.json fixtures that tests/test_tokjson.c checks greenlm against.

Run on a developer machine (never in CI; the outputs are committed):

    pip install tokenizers
    python3 tests/reference/make_tokjson_fixtures.py

Two small byte-level BPE tokenizers are trained with Hugging Face's tokenizers on
tests/data/kjv-genesis.txt (plus a few lines of other scripts), each with the structure of a published
model's tokenizer.json:

  * tests/data/tokjson/neox/tokenizer.json: as GPT-NeoX-20B's (and Pythia's): normalizer NFC,
    pre_tokenizer ByteLevel (GPT-2's pattern), decoder ByteLevel, merges as "left right" strings,
    special <|endoftext|> (id 0) and <|padding|>, non-special added tokens for runs of 2 to 24 spaces.
  * tests/data/tokjson/llama3/tokenizer.json: as Llama 3's: no normalizer, pre_tokenizer Sequence of
    Split (Llama 3's pattern, Isolated) and ByteLevel(use_regex false), model.ignore_merges true (with
    a vocabulary token, " zzzq", that merges do not build, so that ignoring ignore_merges changes an
    encoding), merges as [left, right] arrays, special <|begin_of_text|> and <|end_of_text|> after the
    vocabulary, TemplateProcessing adding <|begin_of_text|>.

Each directory also has reference.jsonl: one line per text, {"text", "ids", "decoded"}, with the ids
of Tokenizer.encode(text, add_special_tokens=False) (greenlm adds no begin-of-text token) and
Tokenizer.decode(ids) of the committed file, reloaded.

tests/data/tokjson/refuse/*.json: tokenizers greenlm cannot reproduce (Unigram, WordPiece, Llama 2's
byte_fallback BPE with Metaspace, a Whitespace pre-tokenizer, a Lowercase normalizer, add_prefix_space);
expected.json names for each the text greenlm's error must contain (the field and its value).

tests/data/tokjson/nfc.jsonl: {"text", "nfc"} pairs, Python's unicodedata.normalize("NFC") of random
strings of letters, combining marks (in every order), precomposed letters, singletons, composition
exclusions, Hangul syllables and jamo, for greenlm's NFC (src/text/nfc.c).

At the scale of a published vocabulary (not committed: it needs GPT-2's files):

    python3 tests/reference/make_tokjson_fixtures.py --scale GPT2_DIR OUT

writes OUT/{gpt2,neox,llama3}/tokenizer.json from GPT-2's encoder.json and vocab.bpe in GPT2_DIR
(50,257 tokens, 50,000 merges; as is, with GPT-NeoX's NFC and runs of spaces, with Llama 3's Split
and ignore_merges), OUT/mixed.txt (about 1 MB of English with accents in both forms, CJK, Hangul,
digit runs, capitals, runs of spaces, emoji) and OUT/NAME.ids, the ids tokenizers gives for it.
`--compare OUT NAME DATASET` then checks the tokens of a greenlm dataset prepared from mixed.txt
(&prepare documents = 'file', val_fraction = 0) with OUT/NAME against NAME.ids.
"""
import json
import os
import random
import subprocess
import sys
import unicodedata

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(TOP, "tests", "data", "tokjson")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

EXTRA = [
    "Café crème, naïve résumé, Ångström, façade, Straße, smørrebrød, Ñandú.",
    "東京は日本の首都です。中文的句子。한국어 문장입니다.",
    "Numbers: 12345678, 3.14159, 2024-01-31, 1000000 and 42.",
    "DON'T SHOUT, YOU'LL SEE. I'm sure he's right; they're here, we've gone, it'd do.",
    "Emoji 😀 and 👍🏽 and symbols € £ ¥ © ™ ….",
]

TEXTS = [
    "Hello world",
    "In the beginning God created the heaven and the earth.",
    "caf\u00e9 and cafe\u0301",
    unicodedata.normalize("NFD", "naïve résumé Ångström façade"),
    "naïve résumé Ångström façade",
    "\u212b \u2126 \u0958 \u1e9b\u0323",
    "a\u0307\u0323 a\u0323\u0307 q\u0307\u0323 \u1e0b\u0323",
    "한국어 " + unicodedata.normalize("NFD", "한국어"),
    "東京は日本の首都です。中文",
    "12345678 3.14159 year 2024: 1000000",
    "DON'T YOU'LL I'M He's they'RE We'Ve",
    "a  b   c    d",
    "x" + " " * 30 + "y",
    "\t\tindented\n    four spaces\n        eight",
    "end   ",
    "line1\nline2\r\n\r\nline3\n\n\n",
    "Emoji 😀 👍🏽 a\u00a0b a\u3000b",
    "Mixed: ÀÉÎ ñ ç ß ø 中 ا ب 🙂",
    " zzzq zzzq zzzqz",
    "<|endoftext|> is plain text here",
    "",
]


def corpus():
    with open(os.path.join(TOP, "tests", "data", "kjv-genesis.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines + EXTRA * 20


def trainer(vocab_size, special):
    return trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def neox():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus(), trainer(700, ["<|endoftext|>", "<|padding|>"]))
    tok.add_tokens([AddedToken(" " * k, normalized=True, special=False) for k in range(24, 1, -1)])
    d = json.loads(tok.to_str())
    d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    return d


def llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainer(700, []))
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    vocab["Ġzzzq"] = len(vocab)  # a whole word that no merge builds
    d["model"]["ignore_merges"] = True
    d["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in d["model"]["merges"]]
    n = len(vocab)
    d["added_tokens"] = [
        {"id": n + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True} for i, c in enumerate(["<|begin_of_text|>", "<|end_of_text|>"])]
    d["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", n)]).__getstate__())
    return d


def write_case(name, d):
    path = os.path.join(OUT, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, indent=1)
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "reference.jsonl"), "w", encoding="utf-8") as f:
        for t in TEXTS:
            ids = tok.encode(t, add_special_tokens=False).ids
            f.write(json.dumps({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)},
                               ensure_ascii=False) + "\n")
    return tok


def check_ignore_merges(d):
    """The fixture must be able to fail: without ignore_merges, " zzzq" encodes differently."""
    with_im = Tokenizer.from_str(json.dumps(d)).encode(" zzzq", add_special_tokens=False).ids
    d2 = json.loads(json.dumps(d))
    d2["model"]["ignore_merges"] = False
    without = Tokenizer.from_str(json.dumps(d2)).encode(" zzzq", add_special_tokens=False).ids
    assert len(with_im) == 1 and with_im != without, (with_im, without)


def refusals(llama):
    """Tokenizers greenlm refuses, and the text its error must contain."""
    os.makedirs(os.path.join(OUT, "refuse"), exist_ok=True)
    cases = {}
    t = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0))
    cases["unigram"] = (json.loads(t.to_str()), 'model.type = "Unigram"')
    t = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    cases["wordpiece"] = (json.loads(t.to_str()), 'model.type = "WordPiece"')
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "▁": 4, "a": 5, "▁a": 6}
    t = Tokenizer(models.BPE(vocab, [("▁", "a")], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    cases["llama2-byte-fallback"] = (json.loads(t.to_str()), "model.byte_fallback = true")
    d = json.loads(json.dumps(llama))
    d["pre_tokenizer"] = json.loads(pre_tokenizers.Whitespace().__getstate__())
    cases["whitespace-pre-tokenizer"] = (d, 'pre_tokenizer.type = "Whitespace"')
    d = json.loads(json.dumps(llama))
    d["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace().__getstate__())
    cases["metaspace"] = (d, 'pre_tokenizer.type = "Metaspace"')
    d = json.loads(json.dumps(llama))
    d["normalizer"] = json.loads(normalizers.Lowercase().__getstate__())
    cases["lowercase"] = (d, 'normalizer.type = "Lowercase"')
    d = json.loads(json.dumps(llama))
    d["pre_tokenizer"] = json.loads(pre_tokenizers.ByteLevel(add_prefix_space=True).__getstate__())
    cases["add-prefix-space"] = (d, "pre_tokenizer.add_prefix_space = true")
    expected = {}
    for name, (d, want) in cases.items():
        Tokenizer.from_str(json.dumps(d))  # a file tokenizers itself loads
        with open(os.path.join(OUT, "refuse", name + ".json"), "w", encoding="utf-8") as f:
            json.dump(d, f, ensure_ascii=False)
        expected[name] = want
    with open(os.path.join(OUT, "refuse", "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, sort_keys=True)


def nfc_cases():
    rnd = random.Random(7)
    pool = ("aeiouAEIOUqxzy ÅåéÉñçøß\u212b\u2126\u0958\u0344\u1e9b\u1e0b\u01d5\u1f82한국\u1100\u1161\u11a8\uac00"
            "\u0300\u0301\u0307\u0308\u0323\u0327\u0328\u031b\u0345\u05b0\u0e48\u302a\u3099\u309a"
            "\u304b\u30cf\u0915\u093c\u0b47\u0b3e\u0cc6\u0cd5\U0001d15e\U0001d165\U0001d16e 中")
    with open(os.path.join(OUT, "nfc.jsonl"), "w", encoding="utf-8") as f:
        for k in range(300):
            t = "".join(rnd.choice(pool) for _ in range(rnd.randint(1, 12)))
            if k % 3 == 0:
                t = unicodedata.normalize("NFD", t)
            f.write(json.dumps({"text": t, "nfc": unicodedata.normalize("NFC", t)}, ensure_ascii=False) + "\n")


def scale(gpt2_dir, out):
    base = Tokenizer(models.BPE.from_file(os.path.join(gpt2_dir, "encoder.json"), os.path.join(gpt2_dir, "vocab.bpe")))
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    base.decoder = decoders.ByteLevel()
    base.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    d = json.loads(base.to_str())
    variants = {"gpt2": d}
    v = json.loads(json.dumps(d))
    v["normalizer"] = {"type": "NFC"}
    n = len(v["model"]["vocab"])
    v["added_tokens"] += [{"id": n + i, "content": " " * k, "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": True, "special": False} for i, k in enumerate(range(24, 1, -1))]
    variants["neox"] = v
    v = json.loads(json.dumps(d))
    v["model"]["ignore_merges"] = True
    v["pre_tokenizer"] = json.loads(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]).__getstate__())
    variants["llama3"] = v
    rnd = random.Random(5)
    words = " ".join(corpus()).split(" ")
    extra = [t for t in TEXTS if t and "<|" not in t] + ["\u00a0", "\u3000", "    ", "\t\t", "\n\n"]
    parts, size = [], 0
    while size < 1000000:
        w = rnd.choice(words) if rnd.random() < 0.8 else rnd.choice(extra)
        parts.append(w + rnd.choice([" ", " ", " ", "  ", "\n", ""]))
        size += len(parts[-1])
    text = "".join(parts)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mixed.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    for name, v in variants.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(v, f, ensure_ascii=False)
        ids = Tokenizer.from_str(json.dumps(v)).encode(text, add_special_tokens=False).ids
        with open(os.path.join(out, name + ".ids"), "w") as f:
            f.write(" ".join(map(str, ids)))
        print("%s: %d ids" % (name, len(ids)))


def compare(out, name, dataset):
    dump = subprocess.run(["ncdump", "-v", "tokens", dataset], capture_output=True, text=True, check=True).stdout
    s = dump[dump.index("tokens =", dump.index("data:")) + 8:]
    got = [int(x) for x in s[:s.index(";")].split(",")][:-1]  # the end-of-text token after the document
    with open(os.path.join(out, name + ".ids")) as f:
        want = [int(x) for x in f.read().split()]
    diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    ok = got == want
    print("%s: %d ids, tokenizers %d: %s" % (name, len(got), len(want), "equal" if ok else "first difference at %s" % diff))
    return ok


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--scale":
        return scale(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 5 and sys.argv[1] == "--compare":
        sys.exit(0 if compare(*sys.argv[2:]) else 1)
    nfc_cases()
    write_case("neox", neox())
    d = llama3()
    check_ignore_merges(d)
    write_case("llama3", d)
    refusals(d)


if __name__ == "__main__":
    main()
