#!/usr/bin/env python3
"""Write the Hugging Face model directories and fixtures that tests/test_hf.c checks greenlm against,
and check a directory greenlm's export wrote against them.

Run on a developer machine (never in CI; the outputs are committed):

    pip install torch transformers safetensors
    python3 tests/reference/make_hf_fixtures.py                    # write the fixtures (a few seconds)
    python3 tests/reference/make_hf_fixtures.py --pairs            # lm-eval-pairs.json alone
    python3 tests/reference/make_hf_fixtures.py --check DIR [DIR...] # check greenlm exports

Writing: a tiny byte-level BPE tokenizer (the 256 byte tokens in GPT-2's order, a few merges,
<|endoftext|> last) and two tiny random models with every parameter perturbed (biases and LayerNorm
parameters not 0 and 1), saved with save_pretrained (safetensors):

  * tests/reference/hf-neo/          GPTNeoForCausalLM, layers global + local, window 4 < T = 16
  * tests/reference/hf-gpt2/         GPT2LMHeadModel
  * tests/reference/hf-gpt2-sharded/ the same GPT-2 model in shards (max_shard_size 50 kB) + index
  * tests/reference/hf-neox/, hf-neox-published/  GPTNeoXForCausalLM as transformers 5 saves it and as Pythia is
    published
  * tests/reference/hf-llama/        LlamaForCausalLM with grouped-query attention (2 key/value heads of 4)
  * tests/reference/hf-llama3/       the same shape with Llama 3.1's scaled rotary embedding (rope_type llama3)
  * tests/reference/hf-{neo,gpt2}.json: B x T input ids, the logits transformers computes (B,T,V),
    a few texts with their encodings by GPT2Tokenizer, and (context, continuation) pairs scored as
    lm-evaluation-harness does (lm_eval_pair: its encoding of a pair; the sum of the continuation
    tokens' log-probabilities, and whether greedy decoding reproduces them; the last pair's
    continuation is the model's own greedy token, so that its flag is true).
  * tests/reference/lm-eval-pairs.json: pairs whose lm-eval encoding differs from encoding context
    and continuation apart (the tokenizer merges across the boundary, white space that Python's
    str.rstrip takes off the context, <|endoftext|> in the text, an empty context), scored by the
    hf-gpt2 model as saved; and, when GPT-2's own vocabulary is there ($GREENLM_GPT2_DIR, default
    ../shared/data/gpt2 beside the checkout), the lm-eval encodings of pairs by GPT2Tokenizer with it.
    `make_hf_fixtures.py --pairs` writes this file alone, from the committed hf-gpt2 directory.

Checking (--check): each DIR is a directory greenlm's hf_export wrote from one of the fixture models
(tests/test_hf.c leaves them in tests/out/hf/export-{neo,gpt2,gpt2-bf16...}); transformers loads it
(AutoModelForCausalLM, AutoTokenizer), and its logits on the fixture's input ids must equal the
fixture's to 1e-5 (relative to the largest logit; fp32 exports only), and its tokenizer must encode
the fixture's texts to the fixture's ids. Exit status 1 on any difference.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2Tokenizer, GPTNeoConfig,
                          GPTNeoForCausalLM, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
MAXT, L, C, H, WINDOW = 64, 2, 32, 4, 4
B, T = 2, 16
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "c")]
TEXTS = ["the cat sat on the mat", "Hello, world!\n", "  spaced   out  ", "<|endoftext|>in the end", "naïve café"]
PAIRS = [("The cat", " sat"), ("the other", " one"), ("in", " there"), ("A long time ago", " in a galaxy"),
         ("on and", " on"), ("caterpillar ", "eats"), ("", "x"), ("Hello", ", world")]
# lm-eval-pairs.json, with the tiny tokenizer: its merges (he, in, er, ...) join across the boundary,
# white space of all kinds ends contexts, <|endoftext|> stands in the text
BOUNDARY_PAIRS = [("oth", "er"), ("i", "n the end"), ("the h", "e"), ("the oth", "er one"), ("Answer:\r\n", "yes"),
                  ("Answer:\t \n", "no"), ("caf\u00e9\u00a0", "au lait"), ("end\u3000", "the"), ("line\x0c", "in"),
                  ("", "<|endoftext|>the end"), ("a<|endoftext|>", " in"), ("", " in the"), ("the cat  ", "sat on")]
# with GPT-2's vocabulary: words cut inside, digits, a contraction, white space moved
GPT2_PAIRS = [("The quick brown fo", "x jumps"), ("Hel", "lo world"), ("12", "34 apples"), ("don", "'t stop"),
              ("Question: why?\nAnswer:", " because"), ("Answer:\r\n", "Yes"), ("naïve caf", "é au lait"),
              ("trailing space ", "here"), ("", "<|endoftext|>Once"), ("", "Once upon")]


def bytes_to_unicode():
    """GPT-2's byte -> character map (the same as transformers' and greenlm's tok_byte_to_char)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tokenizer_files(d):
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return len(vocab)


def build(arch, V, eot):
    if arch in ("neox", "llama", "llama3"):
        if arch == "neox":  # Pythia's form: partial rotary, parallel residual, biases, gelu, an untied head
            cfg = GPTNeoXConfig(vocab_size=V, max_position_embeddings=MAXT, hidden_size=C, num_hidden_layers=L,
                                num_attention_heads=H, intermediate_size=4 * C, hidden_act="gelu", rotary_pct=0.5,
                                rotary_emb_base=10000.0, use_parallel_residual=True, attention_bias=True,
                                attention_dropout=0.0, hidden_dropout=0.0, classifier_dropout=0.0, layer_norm_eps=1e-5,
                                initializer_range=0.02, tie_word_embeddings=False, bos_token_id=eot, eos_token_id=eot)
            model = GPTNeoXForCausalLM(cfg)
        else:  # Llama 3's form: grouped-query attention (2 key/value heads of 4), no biases, an untied head; llama3
            # also with Llama 3.1's scaled rotary embedding (an original context of 16: one pair blends, three slow)
            scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 16} if arch == "llama3" else None
            cfg = LlamaConfig(vocab_size=V, max_position_embeddings=MAXT, hidden_size=C, num_hidden_layers=L,
                              num_attention_heads=H, num_key_value_heads=2, intermediate_size=96, hidden_act="silu",
                              rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=scaling, attention_bias=False,
                              mlp_bias=False,
                              attention_dropout=0.0, initializer_range=0.02, tie_word_embeddings=False,
                              bos_token_id=eot, eos_token_id=eot, pad_token_id=None)
            model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n and n.endswith("weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.add_(0.05 * torch.randn_like(p))
        return model.eval()
    common = dict(vocab_size=V, layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True,
                  bos_token_id=eot, eos_token_id=eot, activation_function="gelu_new")
    if arch == "neo":
        cfg = GPTNeoConfig(max_position_embeddings=MAXT, hidden_size=C, num_layers=L, num_heads=H, window_size=WINDOW,
                           attention_types=[[["global", "local"], L // 2]], intermediate_size=None, resid_dropout=0.0,
                           embed_dropout=0.0, attention_dropout=0.0, **common)
        model = GPTNeoForCausalLM(cfg)
    else:
        cfg = GPT2Config(n_positions=MAXT, n_embd=C, n_layer=L, n_head=H, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         **common)
        model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".ln_" in n and n.endswith("weight") or n.startswith("transformer.ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def lm_eval_pair(tok, context, continuation):
    """lm-evaluation-harness's (context ids, continuation ids) of a pair for a causal model
    (lm_eval/api/model.py: LM.loglikelihood and _encode_pair, HFLM.tok_encode with its defaults)."""
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id  # HFLM.prefix_token_id
    if context == "":
        cont = tok.encode(continuation, add_special_tokens=False)
        return ([prefix], cont) if prefix != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx):]


def score(model, tok, context, continuation):
    """lm-evaluation-harness's loglikelihood of continuation given context, and whether greedy decoding
    gives every continuation token (HFLM._loglikelihood_tokens)."""
    ctx, cont = lm_eval_pair(tok, context, continuation)
    whole = (ctx + cont)[-(MAXT + 1):]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([whole[:-1]])).logits[0].double(), -1)
    rows = logp[len(whole) - 1 - len(cont):]
    ll = sum(rows[i, c].item() for i, c in enumerate(cont))
    greedy = all(rows[i].argmax().item() == c for i, c in enumerate(cont))
    return ctx, cont, ll, greedy


def scored(model, tok, pairs):
    """The fixture entries of pairs scored by model."""
    out = []
    for c, k in pairs:
        ctx, cont, ll, greedy = score(model, tok, c, k)
        out.append({"context": c, "continuation": k, "context_ids": ctx, "continuation_ids": cont,
                    "loglikelihood": ll, "greedy": greedy})
    return out


def separate(tok, context, continuation):
    """The encoding of a pair with context and continuation tokenized apart (no longer lm-eval's)."""
    n = len(context) - len(context.rstrip())
    context, continuation = context[:len(context) - n], context[len(context) - n:] + continuation
    ctx = tok.encode(context) if context else [tok.eos_token_id]
    return ctx, tok.encode(continuation)


def gpt2_dir():
    d = os.environ.get("GREENLM_GPT2_DIR") or os.path.join(HERE, "..", "..", "..", "shared", "data", "gpt2")
    return d if os.path.exists(os.path.join(d, "encoder.json")) else None


def write_pairs():
    """lm-eval-pairs.json from the saved hf-gpt2 model and tokenizer (its weights are not rewritten)."""
    d = os.path.join(HERE, "hf-gpt2")
    tok = GPT2Tokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))
    model = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float32).eval()
    fx = {"generator": f"tests/reference/make_hf_fixtures.py, torch {torch.__version__}, "
                       f"transformers {transformers.__version__}",
          "model": "hf-gpt2", "pairs": scored(model, tok, BOUNDARY_PAIRS), "gpt2_pairs": []}
    g = None
    if gpt2_dir():
        g = GPT2Tokenizer(os.path.join(gpt2_dir(), "encoder.json"), os.path.join(gpt2_dir(), "vocab.bpe"))
        for c, k in GPT2_PAIRS:
            ctx, cont = lm_eval_pair(g, c, k)
            fx["gpt2_pairs"].append({"context": c, "continuation": k, "context_ids": ctx, "continuation_ids": cont})
    else:
        print("no GPT-2 vocabulary (set GREENLM_GPT2_DIR): lm-eval-pairs.json without gpt2_pairs")
    for name, t, key in [("tiny", tok, "pairs"), ("GPT-2", g, "gpt2_pairs")]:
        differ = sum(separate(t, p["context"], p["continuation"]) != (p["context_ids"], p["continuation_ids"])
                     for p in fx[key]) if t else 0
        print(f"{name}: {differ} of {len(fx[key])} pairs encode otherwise with context and continuation apart")
    with open(os.path.join(HERE, "lm-eval-pairs.json"), "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False, indent=1)
        f.write("\n")


def greedy_pair(model, tok, context):
    """(context, the model's greedy next token as text): a pair whose greedy flag is true. The walk stops at the
    end-of-text token (its text is not the special token greenlm encodes) and tries the next context."""
    for start in (context, "on the mat", "in the end", "spaced out", "the", "a", "cafe", "Hello"):
        ids = tok.encode(start)
        for _ in range(8):  # the first greedy token that re-encodes to itself
            with torch.no_grad():
                nxt = model(torch.tensor([ids])).logits[0, -1].argmax().item()
            if nxt == tok.eos_token_id or tok.encode(tok.decode(ids)) != ids:  # eot, or bytes that are not UTF-8
                break
            text = tok.decode([nxt])
            if tok.encode(text) == [nxt]:
                return tok.decode(ids), text
            ids.append(nxt)
    raise SystemExit("no greedy continuation re-encodes to itself: change the seed")


def save(model, d, **kw):
    try:
        model.save_pretrained(d, safe_serialization=True, **kw)
    except TypeError:  # transformers >= 5 always writes safetensors
        model.save_pretrained(d, **kw)


def write(arch):
    d = os.path.join(HERE, f"hf-{arch}")
    V = write_tokenizer_files(d)
    tok = GPT2Tokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))
    model = build(arch, V, tok.eos_token_id)
    save(model, d)
    tok.save_pretrained(d)
    if arch == "gpt2":
        sd = os.path.join(HERE, "hf-gpt2-sharded")
        save(model, sd, max_shard_size="50KB")
        tok.save_pretrained(sd)
    if arch == "neox":
        write_published(d, os.path.join(HERE, "hf-neox-published"))
    x = torch.randint(0, V, (B, T))
    with torch.no_grad():
        logits = model(x).logits
    fx = {
        "generator": f"tests/reference/make_hf_fixtures.py, torch {torch.__version__}, transformers {transformers.__version__}",
        "B": B, "T": T, "V": V, "eot": tok.eos_token_id,
        "input_ids": x.tolist(),
        "logits": [float(f"{v:.9g}") for v in logits.reshape(-1).tolist()],
        "encodings": [{"text": t, "ids": tok.encode(t)} for t in TEXTS],
        "pairs": scored(model, tok, PAIRS + [greedy_pair(model, tok, "the cat")]),
    }
    with open(os.path.join(HERE, f"hf-{arch}.json"), "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False)
        f.write("\n")


def write_published(d, out):
    """The GPT-NeoX directory d as published Pythia models have it (older transformers): the head named embed_out,
    the rotary embedding in rotary_pct and rotary_emb_base instead of rope_parameters."""
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(d):
        if f not in ("model.safetensors", "config.json"):
            with open(os.path.join(d, f), "rb") as src, open(os.path.join(out, f), "wb") as dst:
                dst.write(src.read())
    w = load_file(os.path.join(d, "model.safetensors"))
    save_file({k.replace("lm_head.", "embed_out."): v for k, v in w.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(d, "config.json")))
    rope = cfg.pop("rope_parameters", None) or {}
    cfg["rotary_pct"] = rope.get("partial_rotary_factor", 0.25)
    cfg["rotary_emb_base"] = rope.get("rope_theta", 10000.0)
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def check(d):
    """transformers' logits and encodings of a greenlm export against the fixture of its architecture."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    llama3 = rope.get("rope_type", rope.get("type")) == "llama3"
    name = {"gpt_neo": "hf-neo.json", "gpt2": "hf-gpt2.json", "gpt_neox": "hf-neox.json",
            "llama": "hf-llama3.json" if llama3 else "hf-llama.json"}[cfg["model_type"]]
    fx = json.load(open(os.path.join(HERE, name)))
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(fx["input_ids"])).logits.reshape(-1)
    ref = torch.tensor(fx["logits"])
    err = ((logits - ref).abs().max() / ref.abs().max()).item()
    tol = 1e-5 if cfg.get("torch_dtype", "float32") == "float32" else 2e-2
    ok = err < tol
    print(f"{d}: logits relative error {err:.2e} (tolerance {tol:g})")
    tok = AutoTokenizer.from_pretrained(d)
    for e in fx["encodings"]:
        got = tok.encode(e["text"])
        if len(tok) == 256:  # a 'bytes' export: one token per byte, ids = byte values
            want = list(e["text"].encode("utf-8"))
        else:
            want = e["ids"]
        if got != want:
            print(f"{d}: {e['text']!r} encodes to {got}, expected {want}")
            ok = False
    return ok


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if all([check(d) for d in sys.argv[2:]]) else 1)
    if len(sys.argv) > 1 and sys.argv[1] == "--pairs":
        write_pairs()
        return
    archs = sys.argv[1:] or ["neo", "gpt2", "neox", "llama", "llama3"]
    torch.manual_seed(2026)  # neo, then gpt2 from one stream, as their committed files were written
    for arch in archs:
        if arch in ("neox", "llama", "llama3"):
            torch.manual_seed({"neox": 2027, "llama": 2028, "llama3": 2029}[arch])
        write(arch)
    if "gpt2" in archs:
        write_pairs()


if __name__ == "__main__":
    main()
