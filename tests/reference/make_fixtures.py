#!/usr/bin/env python3
"""Write the reference fixtures that tests/test_reference.c checks greenlm against.

Run on a developer machine (never in CI; the fixtures are committed):

    pip install torch transformers numpy scipy
    python3 tests/reference/make_fixtures.py [NAME...]    # all fixtures, or the named ones

For each fixture it builds a tiny random Hugging Face model (GPTNeoForCausalLM with global
and local layers; GPT2LMHeadModel; GPTNeoXForCausalLM in three configurations:
  gpt-neox-a  partial rotary (rotary_pct 0.5), parallel residual, biases, gelu (erf), untied head;
  gpt-neox-b  full rotary, sequential residual, no attention biases, gelu_new, untied head;
  gpt-neox-c  rotary_pct 0.25 with rotary_emb_base 500000 (as Hugging Face's older keys), parallel
              residual, biases, gelu, tied head; LlamaForCausalLM in two:
  llama-a     no biases, rope_theta 10000, rms_norm_eps 1e-6, intermediate_size 88, untied head;
  llama-b     attention_bias and mlp_bias, rope_theta 500000, rms_norm_eps 1e-5, tied head;
  llama-c     grouped-query attention, 2 key/value heads of 8, attention_bias, untied head;
  llama-d     1 key/value head of 4 (multi-query), no biases, untied head;
  llama-e     4 key/value heads of 8, mlp_bias, rope_theta 500000, tied head;
  llama-f     Llama 3's scaled rotary embedding (rope_type llama3, factor 8, original context 16: of a head's
              four pairs one blends, three turn 8 times slower), 2 key/value heads of 8), perturbs every
              parameter (so biases and LayerNorm parameters
are not trivially 0 and 1), and writes a NetCDF file with:

  * the config (attributes) and the inputs/targets of one batch,
  * every parameter under its Hugging Face name, in greenlm's layout (weights (out, in); GPT-2's
    Conv1D weights are transposed to that layout; GPT-NeoX's query_key_value rows, per head q|k|v in
    Hugging Face's layout, are regrouped as all heads' q, then k, then v),
  * the logits, the mean cross-entropy loss, and the gradient of that loss for every parameter
    (variables "grad:<name>"),
  * three AdamW steps (torch.optim.AdamW with global-norm clipping, weight decay on matrices and
    embeddings only) on three further batches: their losses and the parameters afterwards
    ("step3.<name>").
"""
import os
import sys

import numpy as np
import scipy.io
import torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, GPTNeoConfig, GPTNeoForCausalLM, GPTNeoXConfig,
                          GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))

V, MAXT, L, C, H, WINDOW = 67, 24, 2, 32, 4, 5
# the GPT-NeoX fixtures: name -> (rotary_pct, rotary_emb_base, parallel, attention_bias, hidden_act, tied, C, H)
NEOX = {"gpt-neox-a": (0.5, 10000.0, True, True, "gelu", False, 32, 4),
        "gpt-neox-b": (1.0, 10000.0, False, False, "gelu_new", False, 32, 4),
        "gpt-neox-c": (0.25, 500000.0, True, True, "gelu", True, 64, 4)}
# the Llama fixtures: name -> (attention_bias, mlp_bias, tied, rope_theta, rms_norm_eps, C, H, intermediate_size,
# num_key_value_heads)
LLAMA = {"llama-a": (False, False, False, 10000.0, 1e-6, 32, 4, 88, 4),
         "llama-b": (True, True, True, 500000.0, 1e-5, 64, 4, 96, 4),
         "llama-c": (True, False, False, 10000.0, 1e-6, 64, 8, 80, 2),
         "llama-d": (False, False, False, 10000.0, 1e-5, 32, 4, 64, 1),
         "llama-e": (False, True, True, 500000.0, 1e-6, 64, 8, 72, 4),
         "llama-f": (False, False, False, 500000.0, 1e-5, 64, 8, 80, 2)}
# Llama 3's rope scaling of a fixture (the others have none)
LLAMA3_ROPE = {"llama-f": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16}}
B, T = 2, 16
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-5, 0.1, 0.5


def build(arch):
    if arch in LLAMA:
        abias, mbias, tied, theta, eps, c, h, inner, kv = LLAMA[arch]
        cfg = LlamaConfig(vocab_size=V, max_position_embeddings=MAXT, hidden_size=c, num_hidden_layers=L,
                          num_attention_heads=h, num_key_value_heads=kv, intermediate_size=inner, hidden_act="silu",
                          rms_norm_eps=eps, rope_theta=theta, rope_scaling=LLAMA3_ROPE.get(arch), attention_bias=abias,
                          mlp_bias=mbias,
                          attention_dropout=0.0, initializer_range=0.02, tie_word_embeddings=tied, bos_token_id=0,
                          eos_token_id=0, pad_token_id=None)
        return LlamaForCausalLM(cfg).eval()
    if arch in NEOX:
        pct, base, par, bias, act, tied, c, h = NEOX[arch]
        cfg = GPTNeoXConfig(vocab_size=V, max_position_embeddings=MAXT, hidden_size=c, num_hidden_layers=L,
                            num_attention_heads=h, intermediate_size=4 * c, hidden_act=act, rotary_pct=pct,
                            rotary_emb_base=base, use_parallel_residual=par, attention_bias=bias,
                            attention_dropout=0.0, hidden_dropout=0.0, classifier_dropout=0.0, layer_norm_eps=1e-5,
                            initializer_range=0.02, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0)
        return GPTNeoXForCausalLM(cfg).eval()
    if arch == "gpt-neo":
        cfg = GPTNeoConfig(vocab_size=V, max_position_embeddings=MAXT, hidden_size=C, num_layers=L,
                           attention_types=[[["global", "local"], L // 2]], num_heads=H, window_size=WINDOW,
                           intermediate_size=None, activation_function="gelu_new", resid_dropout=0.0,
                           embed_dropout=0.0, attention_dropout=0.0, classifier_dropout=0.0,
                           layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True,
                           bos_token_id=0, eos_token_id=0)
        model = GPTNeoForCausalLM(cfg)
    else:
        cfg = GPT2Config(vocab_size=V, n_positions=MAXT, n_embd=C, n_layer=L, n_head=H,
                         activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True,
                           bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    model.eval()  # no dropout anyway; eval keeps it explicit
    return model


def params(model):
    """Named parameters without the tied lm_head duplicate (named_parameters leaves out a tied one, Llama's); GPT-NeoX's untied head under the name published
    models give it, embed_out (transformers 5 renames it lm_head on loading)."""
    neox, llama = isinstance(model, GPTNeoXForCausalLM), isinstance(model, LlamaForCausalLM)
    return [(n.replace("lm_head.", "embed_out.") if neox else n, p) for n, p in model.named_parameters()
            if neox or llama or not n.startswith("lm_head")]


def to_greenlm(arch, name, t):
    """greenlm layout: (out, in) weights; GPT-2's Conv1D stores (in, out); GPT-NeoX's query_key_value
    rows are (head, q|k|v, head size), greenlm's (q|k|v, head, head size)."""
    a = t.detach().cpu().numpy().astype(np.float32)
    if arch == "gpt2" and a.ndim == 2 and (".attn." in name or ".mlp." in name):
        a = a.T
    if arch in NEOX and "query_key_value" in name:
        h = NEOX[arch][7]
        a = a.reshape((h, 3, -1) + a.shape[1:]).swapaxes(0, 1).reshape(a.shape)
    return np.ascontiguousarray(a)


def loss_of(model, x, y):
    logits = model(input_ids=x).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def main():
    names = sys.argv[1:] or ["gpt-neo", "gpt2"] + list(NEOX) + list(LLAMA)
    torch.manual_seed(2024)  # gpt-neo, then gpt2 draw from one stream (as their committed files were written)
    np.random.seed(2024)
    for arch in names:
        if arch in NEOX:  # each GPT-NeoX fixture from its own seed
            torch.manual_seed(2024 + list(NEOX).index(arch))
        if arch in LLAMA:  # and each Llama one
            torch.manual_seed(2124 + list(LLAMA).index(arch))
        model = build(arch)
        with torch.no_grad():
            for n, p in params(model):
                p.add_(0.05 * torch.randn_like(p))
        tok = torch.randint(0, V, (4, B, T + 1))
        x, y = tok[0, :, :T].contiguous(), tok[0, :, 1:].contiguous()

        path = os.path.join(HERE, f"{arch}.nc")
        f = scipy.io.netcdf_file(path, "w", version=2)
        f.arch = "gpt-neox" if arch in NEOX else "llama" if arch in LLAMA else arch
        f.vocab_size, f.block_size, f.n_layer, f.n_embd, f.n_head = V, MAXT, L, C, H
        f.window_size = WINDOW
        f.attention_types = "global,local" if arch == "gpt-neo" else "global"
        if arch in NEOX:  # the &model keys of the configuration
            pct, base, par, bias, act, tied, f.n_embd, f.n_head = NEOX[arch]
            f.rotary_pct, f.rotary_emb_base, f.use_parallel_residual, f.attention_bias = pct, base, int(par), int(bias)
            f.activation, f.head = act, "tied" if tied else "untied"
        if arch in LLAMA:
            abias, mbias, tied, f.rotary_emb_base, f.layer_norm_epsilon, f.n_embd, f.n_head, f.n_inner, f.n_kv_head = \
                LLAMA[arch]
            f.attention_bias, f.mlp_bias, f.head = int(abias), int(mbias), "tied" if tied else "untied"
            sc = LLAMA3_ROPE.get(arch)
            f.rope_scaling = "llama3" if sc else "none"
            if sc:
                f.rope_factor, f.rope_low_freq_factor = sc["factor"], sc["low_freq_factor"]
                f.rope_high_freq_factor, f.rope_original_positions = sc["high_freq_factor"], \
                    sc["original_max_position_embeddings"]
        f.batch, f.seq_len = B, T
        f.lr, f.beta1, f.beta2, f.adam_eps, f.weight_decay, f.grad_clip = LR, BETAS[0], BETAS[1], EPS, WD, CLIP
        f.generator = f"tests/reference/make_fixtures.py, torch {torch.__version__}, transformers {transformers.__version__}"
        f.createDimension("b", B)
        f.createDimension("t", T)
        f.createDimension("v", V)
        f.createDimension("s", 3)
        f.createDimension("one", 1)

        def put(name, arr, dims, typ):
            var = f.createVariable(name, typ, dims)
            var[...] = arr

        def dims_of(a):
            names = []
            for n in a.shape:
                d = f"d{n}"
                if d not in f.dimensions:
                    f.createDimension(d, n)
                names.append(d)
            return tuple(names)

        put("input_ids", x.numpy().astype(np.int32), ("b", "t"), "i")
        put("targets", y.numpy().astype(np.int32), ("b", "t"), "i")
        for n, p in params(model):
            a = to_greenlm(arch, n, p)
            put(n, a, dims_of(a), "f")

        logits, loss = loss_of(model, x, y)
        loss.backward()
        put("logits", logits.detach().numpy().astype(np.float32), ("b", "t", "v"), "f")
        put("loss", np.array([loss.item()]), ("one",), "d")
        for n, p in params(model):
            a = to_greenlm(arch, n, p.grad)
            put("grad." + n, a, dims_of(a), "f")

        # three AdamW steps with clipping on batches 1..3
        decay = [p for n, p in params(model) if p.dim() == 2]
        no_decay = [p for n, p in params(model) if p.dim() != 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=LR, betas=BETAS, eps=EPS)
        losses = []
        for s in range(3):
            opt.zero_grad()
            xs, ys = tok[s + 1, :, :T].contiguous(), tok[s + 1, :, 1:].contiguous()
            _, l = loss_of(model, xs, ys)
            l.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            losses.append(l.item())
        put("adam_inputs", tok[1:, :, :T].numpy().astype(np.int32), ("s", "b", "t"), "i")
        put("adam_targets", tok[1:, :, 1:].numpy().astype(np.int32), ("s", "b", "t"), "i")
        put("adam_losses", np.array(losses), ("s",), "d")
        for n, p in params(model):
            a = to_greenlm(arch, n, p)
            put("step3." + n, a, dims_of(a), "f")
        f.close()
        print(f"wrote {path} ({os.path.getsize(path)} bytes), loss {loss.item():.6f}, adam losses {losses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
