/* gpt: parameter layout, activation plan, forward and backward through the backend table. */
#include "model/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/progress.h"
#include "base/rng.h"
#include "base/util.h"

/* ---- shape ----------------------------------------------------------------------------------- */

void gpt_shape_from_cfg(gpt_shape *s, const cfg_model *m) {
  memset(s, 0, sizeof *s);
  const cfg_model_arch arch = cfg_model_arch_of(m);
  s->arch = arch == CFG_ARCH_GPT2 ? GPT_ARCH_GPT2 : arch == CFG_ARCH_GPT_NEOX ? GPT_ARCH_NEOX
             : arch == CFG_ARCH_LLAMA ? GPT_ARCH_LLAMA : GPT_ARCH_NEO;
  s->V = (int)m->vocab_size;
  s->maxT = (int)m->block_size;
  s->L = (int)m->n_layer;
  s->C = (int)m->n_embd;
  s->H = (int)m->n_head;
  s->Hkv = (int)cfg_kv_heads(m);
  s->F = (int)(m->n_inner ? m->n_inner : 4 * m->n_embd);
  s->eps = (float)m->layer_norm_epsilon;
  s->init_std = (float)m->init_std;
  s->window = util_calloc((size_t)s->L, sizeof *s->window, "layer windows");
  for (int l = 0; l < s->L; l++) {
    const char *kind = m->attention_types.v[l % m->attention_types.n];
    s->window[l] = strcmp(kind, "local") == 0 ? (int)m->window_size : 0;
  }
  const int neox = s->arch == GPT_ARCH_NEOX, llama = s->arch == GPT_ARCH_LLAMA, rotary = neox || llama;
  s->qkv_bias = s->arch == GPT_ARCH_GPT2 || (rotary && m->attention_bias);
  s->out_bias = !rotary || m->attention_bias;
  s->attn_scale = s->arch == GPT_ARCH_NEO ? 1.0f : 1.0f / sqrtf((float)(s->C / s->H));
  s->wpe = !rotary;
  s->rot = neox ? (int)cfg_rotary_dims(m) : llama ? s->C / s->H : 0;
  s->rope = (backend_rope){(float)m->rotary_emb_base, 0.0f, 0.0f, 0.0f, 0.0f};
  if (llama && cfg_model_rope_scaling_of(m) == CFG_ROPE_LLAMA3)
    s->rope = (backend_rope){(float)m->rotary_emb_base, (float)m->rope_factor, (float)m->rope_low_freq_factor,
                             (float)m->rope_high_freq_factor, (float)m->rope_original_positions};
  s->parallel = neox && m->use_parallel_residual;
  s->act = cfg_model_gelu_erf(m) ? BACKEND_GELU_ERF : BACKEND_GELU_TANH;
  s->tied = !cfg_model_untied(m);
  s->rms = s->swiglu = llama;
  s->mlp_unbiased = llama && !m->mlp_bias;
}

void gpt_shape_free(gpt_shape *s) {
  free(s->window);
  s->window = NULL;
}

/* ---- tensors --------------------------------------------------------------------------------- */

typedef struct {
  gpt_tensor *v;
  int n, cap, index;
  size_t offset;
  int tp, tp_rank; /* the part's tensor parallelism (tp >= 1) */
  int names;       /* the tensors get their names (counting alone needs none) */
} tensor_list;

/* A tensor of the whole model, (rows, cols), cut as `split` (groups: row groups, for GPT_SPLIT_ROWS). */
typedef struct {
  const char *name;
  int rows, cols;
  gpt_split split;
  int groups;
} tensor_spec;

static gpt_tensor *add_tensor(tensor_list *tl, int keep, tensor_spec ts, int decay, int layer, gpt_init_kind init,
                              float std) {
  int index = tl->index++;
  if (!keep) return NULL;
  if (tl->n == tl->cap) {
    tl->cap = tl->cap ? 2 * tl->cap : 64;
    tl->v = util_realloc(tl->v, (size_t)tl->cap * sizeof *tl->v, "tensor list");
  }
  gpt_tensor *t = &tl->v[tl->n++];
  memset(t, 0, sizeof *t);
  util_strlcpy(t->name, ts.name, sizeof t->name);
  t->grows = t->rows = ts.rows;
  t->gcols = t->cols = ts.cols;
  t->groups = 1;
  t->split = tl->tp > 1 ? ts.split : GPT_SPLIT_NONE;
  if (t->split == GPT_SPLIT_ROWS) {
    size_t per = (size_t)(ts.rows / ts.groups); /* rows of a group */
    t->groups = ts.groups;
    t->r0 = (int)util_piece(per, tl->tp, tl->tp_rank);
    t->rows = ts.groups * ((int)util_piece(per, tl->tp, tl->tp_rank + 1) - t->r0);
  } else if (t->split == GPT_SPLIT_COLS) {
    t->c0 = (int)util_piece((size_t)ts.cols, tl->tp, tl->tp_rank);
    t->cols = (int)util_piece((size_t)ts.cols, tl->tp, tl->tp_rank + 1) - t->c0;
  }
  t->numel = (size_t)t->rows * (size_t)t->cols;
  t->offset = tl->offset;
  t->decay = decay;
  t->layer = layer;
  t->index = index;
  t->init = init;
  t->init_std = std;
  tl->offset += t->numel;
  return t;
}

size_t gpt_tensor_global(const gpt_tensor *t, size_t e, size_t *run) {
  size_t g, n;
  if (t->split == GPT_SPLIT_ROWS) { /* groups of (rows / groups, cols) local elements */
    size_t per = (size_t)(t->rows / t->groups) * (size_t)t->cols, k = e / per, j = e % per;
    g = k * (size_t)(t->grows / t->groups) * (size_t)t->gcols + (size_t)t->r0 * (size_t)t->gcols + j;
    n = per - j;
  } else if (t->split == GPT_SPLIT_COLS) {
    size_t r = e / (size_t)t->cols, c = e % (size_t)t->cols;
    g = r * (size_t)t->gcols + (size_t)t->c0 + c;
    n = (size_t)t->cols - c;
  } else {
    g = e;
    n = t->numel - e;
  }
  if (run) *run = n;
  return g;
}

gpt_dims gpt_part_dims(const gpt_shape *s, gpt_part part) {
  int T = part.tp > 1 ? part.tp : 1, r = part.tp > 1 ? part.tp_rank : 0;
  gpt_dims d = {s->C / T, s->H / T, s->F / T, (int)util_piece((size_t)s->V, T, r), 0, 0, s->Hkv / T, 0};
  d.Wl = backend_qkv_width(d.Cl, d.Hl, d.Hkvl);
  d.nv = (int)util_piece((size_t)s->V, T, r + 1) - d.v0;
  d.ldv = (d.nv + GPT_LOGITS_ALIGN - 1) / GPT_LOGITS_ALIGN * GPT_LOGITS_ALIGN;
  return d;
}

/* Hugging Face's names of an architecture's tensors outside the blocks, the blocks' prefix, and the names of a
 * block's tensors in buffer order (GPT-Neo's and Llama's q, k and v are three tensors, stacked as the others' qkv,
 * their biases q_b, k_b, v_b too; Llama's gate (fc) and up are two, stacked likewise). */
typedef struct {
  const char *wte, *wpe, *lnf_w, *lnf_b, *head, *block;
  const char *ln1_w, *ln1_b, *q, *k, *v, *qkv_w, *qkv_b, *out_w, *out_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *proj_w,
      *proj_b, *q_b, *k_b, *v_b, *up_w, *up_b;
} arch_names;

static const arch_names *names_of(gpt_arch arch) {
  static const arch_names neo = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                 "transformer.ln_f.bias", "lm_head.weight", "transformer.h.%d.", "ln_1.weight",
                                 "ln_1.bias", "attn.attention.q_proj.weight", "attn.attention.k_proj.weight",
                                 "attn.attention.v_proj.weight", NULL, NULL, "attn.attention.out_proj.weight",
                                 "attn.attention.out_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
                                 "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
                                  NULL, NULL, NULL, NULL, NULL};
  static const arch_names gpt2 = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                  "transformer.ln_f.bias", "lm_head.weight", "transformer.h.%d.", "ln_1.weight",
                                  "ln_1.bias", NULL, NULL, NULL, "attn.c_attn.weight", "attn.c_attn.bias",
                                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
                                  NULL, NULL, NULL, NULL, NULL};
  static const arch_names neox = {"gpt_neox.embed_in.weight", NULL, "gpt_neox.final_layer_norm.weight",
                                  "gpt_neox.final_layer_norm.bias", "embed_out.weight", "gpt_neox.layers.%d.",
                                  "input_layernorm.weight", "input_layernorm.bias", NULL, NULL, NULL,
                                  "attention.query_key_value.weight", "attention.query_key_value.bias",
                                  "attention.dense.weight", "attention.dense.bias", "post_attention_layernorm.weight",
                                  "post_attention_layernorm.bias", "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias",
                                  "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias",
                                  NULL, NULL, NULL, NULL, NULL};
  static const arch_names llama = {"model.embed_tokens.weight", NULL, "model.norm.weight", NULL, "lm_head.weight",
                                   "model.layers.%d.", "input_layernorm.weight", NULL, "self_attn.q_proj.weight",
                                   "self_attn.k_proj.weight", "self_attn.v_proj.weight", NULL, NULL,
                                   "self_attn.o_proj.weight", "self_attn.o_proj.bias", "post_attention_layernorm.weight",
                                   NULL, "mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.down_proj.weight",
                                   "mlp.down_proj.bias", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                   "self_attn.v_proj.bias", "mlp.up_proj.weight", "mlp.up_proj.bias"};
  return arch == GPT_ARCH_GPT2 ? &gpt2 : arch == GPT_ARCH_NEOX ? &neox : arch == GPT_ARCH_LLAMA ? &llama : &neo;
}

/* Block l's tensors (k: the part holds it; else they are only numbered). */
static void add_block(const gpt_shape *s, tensor_list *tl, int l, int k) {
  const int C = s->C, F = s->F;
  const float std = s->init_std;
  /* GPT-2 scales the residual projections' init by 1/sqrt(2L) (as Hugging Face's GPT2 does) */
  const float pstd = s->arch == GPT_ARCH_GPT2 ? std / sqrtf(2.0f * (float)s->L) : std;
  const gpt_split R = GPT_SPLIT_ROWS, K = GPT_SPLIT_COLS, W = GPT_SPLIT_NONE;
  const arch_names *a = names_of(s->arch);
  char n[96], pre[48];
  snprintf(pre, sizeof pre, a->block, l);
#define SPEC(name, rows, cols, split, groups) \
  ((tensor_spec){k && tl->names ? (snprintf(n, sizeof n, "%s%s", pre, name), n) : "", rows, cols, split, groups})
  add_tensor(tl, k, SPEC(a->ln1_w, C, 1, W, 1), 0, l, GPT_INIT_ONES, 0);
  if (!s->rms) add_tensor(tl, k, SPEC(a->ln1_b, C, 1, W, 1), 0, l, GPT_INIT_ZEROS, 0);
  if (a->q) { /* GPT-Neo, Llama: q, k and v apart, each split by heads (k and v: Ckv rows of Hkv heads) */
    const int Ckv = C / s->H * s->Hkv;
    add_tensor(tl, k, SPEC(a->q, C, C, R, 1), 1, l, GPT_INIT_NORMAL, std);
    add_tensor(tl, k, SPEC(a->k, Ckv, C, R, 1), 1, l, GPT_INIT_NORMAL, std);
    add_tensor(tl, k, SPEC(a->v, Ckv, C, R, 1), 1, l, GPT_INIT_NORMAL, std);
    for (int i = 0; i < 3 && s->qkv_bias; i++)
      add_tensor(tl, k, SPEC(i == 0 ? a->q_b : i == 1 ? a->k_b : a->v_b, i ? Ckv : C, 1, R, 1), 0, l, GPT_INIT_ZEROS, 0);
  } else { /* q, k and v stacked: 3 row groups, each split by heads */
    add_tensor(tl, k, SPEC(a->qkv_w, 3 * C, C, R, 3), 1, l, GPT_INIT_NORMAL, std);
    if (s->qkv_bias) add_tensor(tl, k, SPEC(a->qkv_b, 3 * C, 1, R, 3), 0, l, GPT_INIT_ZEROS, 0);
  }
  add_tensor(tl, k, SPEC(a->out_w, C, C, K, 1), 1, l, GPT_INIT_NORMAL, pstd);
  if (s->out_bias) add_tensor(tl, k, SPEC(a->out_b, C, 1, W, 1), 0, l, GPT_INIT_ZEROS, 0);
  add_tensor(tl, k, SPEC(a->ln2_w, C, 1, W, 1), 0, l, GPT_INIT_ONES, 0);
  if (!s->rms) add_tensor(tl, k, SPEC(a->ln2_b, C, 1, W, 1), 0, l, GPT_INIT_ZEROS, 0);
  /* SwiGLU's gate and up, each split by units: a rank's rows of both make its [gate | up] */
  add_tensor(tl, k, SPEC(a->fc_w, F, C, R, 1), 1, l, GPT_INIT_NORMAL, std);
  if (s->swiglu) add_tensor(tl, k, SPEC(a->up_w, F, C, R, 1), 1, l, GPT_INIT_NORMAL, std);
  if (!s->mlp_unbiased) add_tensor(tl, k, SPEC(a->fc_b, F, 1, R, 1), 0, l, GPT_INIT_ZEROS, 0);
  if (!s->mlp_unbiased && s->swiglu) add_tensor(tl, k, SPEC(a->up_b, F, 1, R, 1), 0, l, GPT_INIT_ZEROS, 0);
  add_tensor(tl, k, SPEC(a->proj_w, C, F, K, 1), 1, l, GPT_INIT_NORMAL, pstd);
  if (!s->mlp_unbiased) add_tensor(tl, k, SPEC(a->proj_b, C, 1, W, 1), 0, l, GPT_INIT_ZEROS, 0);
#undef SPEC
}

/* The model's tensors in buffer order (named when `names`). Tensors outside [lo, hi) (and the
 * embedding/head when not held) are skipped but still numbered, so a tensor's index is the same in
 * every layout; the blocks outside are only counted, so a stage's list costs its own tensors. */
static void build_tensors(const gpt_shape *s, gpt_part part, tensor_list *tl, int names) {
  const int C = s->C;
  const float std = s->init_std;
  const gpt_split R = GPT_SPLIT_ROWS, W = GPT_SPLIT_NONE;
  const arch_names *a = names_of(s->arch);
  memset(tl, 0, sizeof *tl);
  tl->tp = part.tp > 1 ? part.tp : 1;
  tl->tp_rank = part.tp > 1 ? part.tp_rank : 0;
  tl->names = names;
  gpt_tensor *wte = add_tensor(tl, part.has_embed || (s->tied && part.has_head), (tensor_spec){a->wte, s->V, C, R, 1},
                               1, GPT_HOOK_EMBED, GPT_INIT_NORMAL, std);
  if (wte) wte->tied = s->tied;
  if (s->wpe)
    add_tensor(tl, part.has_embed, (tensor_spec){a->wpe, s->maxT, C, W, 1}, 1, GPT_HOOK_EMBED, GPT_INIT_NORMAL, std);
  for (int l = 0, per_block = 0, first; l < s->L; l++, per_block = tl->index - first) {
    int k = l >= part.lo && l < part.hi;
    first = tl->index;
    if (!k && per_block) { /* a block outside the part: its tensors numbered, as the first block's */
      tl->index += per_block;
      continue;
    }
    add_block(s, tl, l, k);
  }
  const int head = GPT_HOOK_HEAD;
  add_tensor(tl, part.has_head, (tensor_spec){a->lnf_w, C, 1, W, 1}, 0, head, GPT_INIT_ONES, 0);
  if (!s->rms) add_tensor(tl, part.has_head, (tensor_spec){a->lnf_b, C, 1, W, 1}, 0, head, GPT_INIT_ZEROS, 0);
  if (!s->tied) add_tensor(tl, part.has_head, (tensor_spec){a->head, s->V, C, R, 1}, 1, head, GPT_INIT_NORMAL, std);
}

size_t gpt_count_params(const gpt_shape *s) { return gpt_part_params(s, gpt_whole(s)); }

double gpt_flops_per_token(const gpt_shape *s, int T) {
  /* lookups do no arithmetic: wpe, and the token embedding when the head is not its matrix */
  double n = (double)gpt_count_params(s) - (s->wpe ? (double)s->maxT * s->C : 0.0) - (s->tied ? 0.0 : (double)s->V * s->C);
  return 6.0 * n + 12.0 * s->L * (double)s->C * T;
}

/* ---- activation arena ------------------------------------------------------------------------ */

/* Byte offsets of the activation buffers. Per slot: the residual stream, the blocks' activations
 * and the head's; then, shared by all slots, the gradient buffers and scratch. Activations and
 * their gradients are in the storage type (es bytes an element); LayerNorm statistics and the
 * attention's log-sum-exp in fp32. */
typedef struct {
  size_t res;                                   /* (nl+1) x (N,C): block inputs/outputs */
  size_t blk, blk_stride;                       /* per-block area, one stride per block */
  size_t ln1, ln1_mean, ln1_rstd, qkv, att, lse; /* within a block area */
  size_t mid, ln2, ln2_mean, ln2_rstd, fc, gel;
  size_t lnf, lnf_mean, lnf_rstd, logits;       /* head (last stage) */
  size_t slot;                                  /* size of one slot */
  size_t dres, dsmall, dbig, scratch, row;      /* shared, after the slots */
  size_t dpar;                                  /* the parallel residual: the MLP's input gradient (N,C) */
  size_t dh;                                    /* SwiGLU: the gradient of its output (N,Fl) */
  size_t tpw, xpart, xlse;                      /* tensor parallelism: fp32 sums, the loss's parts and lse */
  size_t total;
} act_layout;

/* n elements of `size` bytes at the cursor, 64-byte aligned. */
static size_t take(size_t *cursor, size_t n, size_t size) {
  size_t at = *cursor;
  *cursor += (n * size + 63) / 64 * 64;
  return at;
}

static act_layout plan_acts(const gpt_shape *s, const backend *be, int B, int T, gpt_part p) {
  act_layout a;
  memset(&a, 0, sizeof a);
  const gpt_dims d = gpt_part_dims(s, p);
  const int tp = p.tp > 1;
  const size_t N = (size_t)B * T, C = (size_t)s->C, F = (size_t)d.Fl, Cl = (size_t)d.Cl, Wl = (size_t)d.Wl,
               es = backend_dtype_size(be->storage), f4 = sizeof(float);
  const int nl = p.hi - p.lo;
  size_t cur = 0;
  a.res = take(&cur, (size_t)(nl + 1) * N * C, es);
  size_t b = 0;
  a.ln1 = take(&b, N * C, es);
  a.ln1_mean = take(&b, N, f4);
  a.ln1_rstd = take(&b, N, f4);
  a.qkv = take(&b, N * Wl, es);
  a.att = take(&b, N * Cl, es);
  a.lse = take(&b, (size_t)B * d.Hl * T, f4);
  a.mid = take(&b, N * C, es);
  a.ln2 = take(&b, N * C, es);
  a.ln2_mean = take(&b, N, f4);
  a.ln2_rstd = take(&b, N, f4);
  a.fc = take(&b, N * F * (s->swiglu ? 2 : 1), es); /* SwiGLU: [gate | up] */
  a.gel = take(&b, N * F, es);
  a.blk_stride = b;
  if (!p.recompute) a.blk = take(&cur, (size_t)nl * b, 1); /* per block and slot; else shared, below */
  if (p.has_head) {
    a.lnf = take(&cur, N * C, es);
    a.lnf_mean = take(&cur, N, f4);
    a.lnf_rstd = take(&cur, N, f4);
    a.logits = take(&cur, N * (size_t)d.ldv, es); /* (N,nv), rows ldv apart */
  }
  a.slot = cur;
  cur *= (size_t)p.nslots;
  if (p.recompute) a.blk = take(&cur, b, 1); /* one block's inner activations, rebuilt as needed */
  a.dres = take(&cur, N * C, es);
  a.dsmall = take(&cur, N * C, es);
  const size_t units = s->swiglu ? 2 * F : F;
  a.dbig = take(&cur, N * (units > Wl ? units : Wl), es);
  if (s->parallel) a.dpar = take(&cur, N * C, es);
  if (s->swiglu) a.dh = take(&cur, N * F, es);
  a.scratch = take(&cur, be->attention_scratch(be, T), 1);
  /* one row of logits in fp32 for sampling, when they are stored in another type or sharded */
  if (p.has_head && (be->storage != BACKEND_FP32 || tp))
    a.row = take(&cur, tp ? (size_t)(s->V + p.tp - 1) / (size_t)p.tp : (size_t)d.nv, f4); /* padded to the longest shard */
  if (tp && be->storage != BACKEND_FP32) a.tpw = take(&cur, N * C, f4); /* sums in fp32 */
  if (tp && p.has_head) {
    a.xpart = take(&cur, 2 * N, f4);
    a.xlse = take(&cur, N, f4);
  }
  a.total = cur;
  return a;
}

gpt_part gpt_whole(const gpt_shape *s) { return (gpt_part){0, s->L, 1, 1, 1, 0, 0, 1, 0}; }

gpt_tensor *gpt_list_tensors(const gpt_shape *s, gpt_part part, int *n) {
  tensor_list tl;
  build_tensors(s, part, &tl, 1);
  *n = tl.n;
  return tl.v;
}

size_t gpt_part_params(const gpt_shape *s, gpt_part part) {
  tensor_list tl;
  build_tensors(s, part, &tl, 0);
  free(tl.v);
  return tl.offset;
}

/* The ops' largest shapes: the residual stream's C, the shards' heads, MLP width (SwiGLU's [gate | up]: 2 Fl, whose
 * ops then fit the staging planned for an MLP of that width) and vocabulary. */
static backend_shape op_shape(const gpt_shape *s, int B, int T, gpt_part part) {
  gpt_dims d = gpt_part_dims(s, part);
  return (backend_shape){.B = B, .T = T, .C = s->C, .H = d.Hl, .Hkv = d.Hkvl, .F = d.Fl * (s->swiglu ? 2 : 1), .V = d.nv};
}

/* The losses (B*T floats) and after them, 8-byte aligned, the step's two sums: one allocation */
static size_t loss_offset(int B, int T) { return ((size_t)B * T * sizeof(float) + 7) / 8 * 8; }
static size_t loss_bytes(int B, int T) { return loss_offset(B, T) + 2 * sizeof(double); }

gpt_memory gpt_plan_memory(const gpt_shape *s, const backend *be, int B, int T, gpt_part part) {
  act_layout a = plan_acts(s, be, B, T, part);
  backend_shape sh = op_shape(s, B, T, part);
  gpt_memory m;
  size_t n = gpt_part_params(s, part);
  m.params = n * sizeof(float);
  m.compute = be->storage == BACKEND_FP32 ? 0 : n * backend_dtype_size(be->storage);
  m.grads = part.inference ? 0 : m.params;
  m.acts = part.inference ? 0 : a.total;
  /* tokens and targets per slot, losses and the step's sums */
  m.io = part.inference ? 0 : (size_t)B * T * 2 * sizeof(int32_t) * (size_t)part.nslots + loss_bytes(B, T);
  m.work = part.inference ? 0 : be->workspace_bytes(be, &sh);
  m.total = m.params + m.compute + m.grads + m.acts + m.io + m.work;
  return m;
}

/* ---- tensors in a buffer --------------------------------------------------------------------- */

const gpt_tensor *gpt_find_tensor(const gpt_model *m, const char *name) {
  for (int i = 0; i < m->ntensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
  return NULL;
}

void *gpt_param(const gpt_model *m, const char *name) {
  const gpt_tensor *t = gpt_find_tensor(m, name);
  UTIL_CHECK(t, NULL, "internal: tensor %s is not held by this rank", name);
  return (char *)m->cparams + t->offset * backend_dtype_size(m->be->storage);
}

/* Offset (elements) of block l's first tensor, its first LayerNorm's weight: the blocks' tensors are consecutive, in
 * build_tensors() order. */
static size_t block_offset(const gpt_model *m, int l) {
  for (int i = 0; i < m->ntensors; i++)
    if (m->tensors[i].layer == l) return m->tensors[i].offset;
  UTIL_FATAL(NULL, "internal: block %d is not held by this rank", l);
}

/* Block l's tensors in a buffer of `es`-byte elements, from the block's offset `at` (elements). */
static void block_at(const gpt_model *m, void *buf, size_t es, size_t at, gpt_block_ptrs *p) {
  char *q = (char *)buf + at * es;
  /* bytes of C elements; the shards' Cl and F elements (tensor parallelism) */
  const size_t C = (size_t)m->s.C * es, Cl = (size_t)m->d.Cl, Wl = (size_t)m->d.Wl, F = (size_t)m->d.Fl;
  memset(p, 0, sizeof *p);
  const size_t units = m->s.swiglu ? 2 * F : F; /* rows of fc: SwiGLU's gate and up */
  p->ln1_w = q, q += C;
  if (!m->s.rms) p->ln1_b = q, q += C;
  p->qkv_w = q, q += Wl * C;          /* (Wl, C): q, k, v */
  if (m->s.qkv_bias) p->qkv_b = q, q += Wl * es;
  p->out_w = q, q += C * Cl;          /* (C, Cl) */
  if (m->s.out_bias) p->out_b = q, q += C;
  p->ln2_w = q, q += C;
  if (!m->s.rms) p->ln2_b = q, q += C;
  p->fc_w = q, q += units * C;        /* (Fl or 2Fl, C) */
  if (!m->s.mlp_unbiased) p->fc_b = q, q += units * es;
  p->proj_w = q, q += C * F;          /* (C, Fl) */
  if (!m->s.mlp_unbiased) p->proj_b = q;
}

/* The tensor of that name in buf, or NULL when the part does not hold it. */
static void *end_at(const gpt_model *m, void *buf, size_t es, const char *name) {
  const gpt_tensor *t = gpt_find_tensor(m, name);
  return t ? (char *)buf + t->offset * es : NULL;
}

/* A parameter-layout buffer's tensors, once (gpt_init): the blocks' and the ends'. */
static void fill_ptrs(const gpt_model *m, void *buf, size_t es, gpt_ptrs *p) {
  const int nl = m->layer_hi - m->layer_lo;
  p->blk = util_calloc(nl > 0 ? (size_t)nl : 1, sizeof *p->blk, "block pointers");
  for (int l = m->layer_lo; l < m->layer_hi; l++) block_at(m, buf, es, block_offset(m, l), &p->blk[l - m->layer_lo]);
  const arch_names *a = names_of(m->s.arch);
  p->ends.wte = end_at(m, buf, es, a->wte);
  p->ends.wpe = m->s.wpe ? end_at(m, buf, es, a->wpe) : NULL;
  p->ends.lnf_w = end_at(m, buf, es, a->lnf_w);
  p->ends.lnf_b = a->lnf_b ? end_at(m, buf, es, a->lnf_b) : NULL;
  p->ends.head = m->s.tied ? p->ends.wte : end_at(m, buf, es, a->head);
}

void gpt_block(const gpt_model *m, float *buf, int l, gpt_block_ptrs *p) {
  block_at(m, buf, sizeof(float), block_offset(m, l), p);
}

void gpt_block_compute(const gpt_model *m, int l, gpt_block_ptrs *p) {
  UTIL_CHECK(l >= m->layer_lo && l < m->layer_hi, NULL, "internal: block %d is not held by this rank", l);
  *p = m->w.blk[l - m->layer_lo];
}

/* ---- init ------------------------------------------------------------------------------------ */

/* A tensor's initial values (host memory, its part): the whole tensor's stream (seed, RNG_INIT, index) in
 * row-major order, of which the part keeps its own elements, so every layout starts from the same model. */
static void init_tensor(const gpt_tensor *t, float *p, uint64_t seed) {
  if (t->init != GPT_INIT_NORMAL) {
    for (size_t j = 0; j < t->numel; j++) p[j] = t->init == GPT_INIT_ONES ? 1.0f : 0.0f;
    return;
  }
  rng_state r;
  rng_seed(&r, seed, RNG_INIT, (uint64_t)t->index);
  size_t drawn = 0; /* elements of the whole tensor drawn so far */
  for (size_t e = 0, run; e < t->numel; e += run) {
    size_t g = gpt_tensor_global(t, e, &run);
    for (; drawn < g; drawn++) rng_normal(&r); /* other ranks' elements */
    for (size_t j = 0; j < run; j++, drawn++) p[e + j] = (float)(t->init_std * rng_normal(&r));
  }
}

void gpt_init(gpt_model *m, const gpt_shape *s, const backend *be, int B, int T, gpt_part part, uint64_t seed) {
  memset(m, 0, sizeof *m);
  m->s = *s;
  m->s.window = util_malloc((size_t)s->L * sizeof(int), "layer windows");
  memcpy(m->s.window, s->window, (size_t)s->L * sizeof(int));
  m->be = be;
  m->B = B;
  m->T = T;
  m->layer_lo = part.lo;
  m->layer_hi = part.hi;
  m->has_embed = part.has_embed;
  m->has_head = part.has_head;
  m->nslots = part.nslots;
  m->recompute = part.recompute;
  m->inference = part.inference;
  m->tp = part.tp > 1 ? part.tp : 1;
  m->tp_rank = part.tp > 1 ? part.tp_rank : 0;
  m->d = gpt_part_dims(s, part);
  tensor_list tl;
  build_tensors(s, part, &tl, 1);
  m->tensors = tl.v;
  m->ntensors = tl.n;
  m->nparams = tl.offset;
  m->mem = gpt_plan_memory(s, be, B, T, part);
  size_t pb = m->nparams * sizeof(float), nio = (size_t)part.nslots * B * T;
  m->params = be->alloc(be, pb);
  m->cparams = m->mem.compute ? be->alloc(be, m->mem.compute) : m->params;
  if (!part.inference) {
    backend_shape sh = op_shape(s, B, T, part);
    be->prepare(be, &sh);
    m->grads = be->alloc(be, pb);
    m->acts = be->alloc(be, m->mem.acts);
    m->tokens = be->alloc(be, nio * sizeof(int32_t));
    m->targets = be->alloc(be, nio * sizeof(int32_t));
    m->losses = be->alloc(be, loss_bytes(B, T));
    m->sums = (double *)((char *)m->losses + loss_offset(B, T));
    m->losses_host = be->host_alloc(be, (size_t)B * T * sizeof(float)); /* pinned on a GPU */
    if (m->tp > 1) {
      size_t most = (size_t)(s->V + m->tp - 1) / (size_t)m->tp + 1, N2 = 2 * (size_t)B * T;
      m->tp_host = util_malloc((size_t)m->tp * (most > N2 ? most : N2) * sizeof(float), "tensor-parallel gather");
    }
  }

  fill_ptrs(m, m->cparams, backend_dtype_size(be->storage), &m->w);
  if (m->grads) fill_ptrs(m, m->grads, sizeof(float), &m->g);
  float *host = util_malloc(pb ? pb : 1, "parameter staging");
  for (int i = 0; i < m->ntensors; i++) init_tensor(&m->tensors[i], host + m->tensors[i].offset, seed);
  be->to_device(be, m->params, host, pb);
  free(host);
  gpt_params_changed(m, 0, m->nparams);
}

void gpt_free(gpt_model *m) {
  const backend *be = m->be;
  be->free(be, m->params);
  if (m->cparams != m->params) be->free(be, m->cparams);
  be->free(be, m->grads);
  be->free(be, m->acts);
  be->free(be, m->tokens);
  be->free(be, m->targets);
  be->free(be, m->losses);
  if (m->losses_host) be->host_free(be, m->losses_host);
  free(m->tp_host);
  free(m->w.blk);
  free(m->g.blk);
  free(m->tensors);
  free(m->s.window);
  memset(m, 0, sizeof *m);
}

gpt_part gpt_model_part(const gpt_model *m) {
  return (gpt_part){m->layer_lo, m->layer_hi, m->has_embed, m->has_head, m->nslots, m->recompute, m->inference, m->tp,
                    m->tp_rank};
}

void gpt_set_tp_comm(gpt_model *m, const gpt_tp_comm *c) { m->tpc = *c; }

int gpt_tensor_owned(const gpt_model *m, const gpt_tensor *t) { return t->split != GPT_SPLIT_NONE || m->tp_rank == 0; }

void *gpt_compute_params(const gpt_model *m, size_t at) {
  if (m->cparams == m->params) return NULL;
  return (char *)m->cparams + at * backend_dtype_size(m->be->storage);
}

void gpt_params_changed(gpt_model *m, size_t lo, size_t hi) {
  if (hi > lo && m->cparams != m->params) m->be->to_storage(m->be, gpt_compute_params(m, lo), m->params + lo, hi - lo);
}

/* ---- forward / backward ---------------------------------------------------------------------- */

typedef struct {
  void *ln1, *qkv, *att, *mid, *ln2, *fc, *gel; /* the storage type */
  float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
} block_acts;

static act_layout layout(const gpt_model *m) {
  UTIL_CHECK(!m->inference, NULL, "internal: a model opened for inference has no activations");
  return plan_acts(&m->s, m->be, m->B, m->T, gpt_model_part(m));
}

static char *arena(const gpt_model *m, size_t at) { return (char *)m->acts + at; }

static char *slot_base(const gpt_model *m, const act_layout *a, int slot) {
  UTIL_CHECK(slot >= 0 && slot < m->nslots, NULL, "internal: slot %d of %d", slot, m->nslots);
  return arena(m, (size_t)slot * a->slot);
}

static void block_acts_of(const gpt_model *m, const act_layout *a, int slot, int l, block_acts *ba) {
  char *base = m->recompute ? arena(m, a->blk) : slot_base(m, a, slot) + a->blk + (size_t)(l - m->layer_lo) * a->blk_stride;
  ba->ln1 = base + a->ln1;
  ba->ln1_mean = (float *)(base + a->ln1_mean);
  ba->ln1_rstd = (float *)(base + a->ln1_rstd);
  ba->qkv = base + a->qkv;
  ba->att = base + a->att;
  ba->lse = (float *)(base + a->lse);
  ba->mid = base + a->mid;
  ba->ln2 = base + a->ln2;
  ba->ln2_mean = (float *)(base + a->ln2_mean);
  ba->ln2_rstd = (float *)(base + a->ln2_rstd);
  ba->fc = base + a->fc;
  ba->gel = base + a->gel;
}

/* Residual stream entering local block i (i = 0..nl), (N,C) for the current micro-batch. */
static void *res_at(const gpt_model *m, const act_layout *a, int slot, int i, size_t N) {
  return slot_base(m, a, slot) + a->res + (size_t)i * N * (size_t)m->s.C * backend_dtype_size(m->be->storage);
}

void *gpt_input(const gpt_model *m, int slot, int B, int T) {
  act_layout a = layout(m);
  return res_at(m, &a, slot, 0, (size_t)B * T);
}

void *gpt_output(const gpt_model *m, int slot, int B, int T) {
  act_layout a = layout(m);
  return res_at(m, &a, slot, m->layer_hi - m->layer_lo, (size_t)B * T);
}

void *gpt_grad_output(const gpt_model *m) {
  act_layout a = layout(m);
  return arena(m, a.dres);
}

void *gpt_grad_input(const gpt_model *m) { return gpt_grad_output(m); /* the same buffer, after the pass */ }

void gpt_set_batch(gpt_model *m, int slot, const int32_t *tokens, const int32_t *targets, int B, int T) {
  UTIL_CHECK(!m->inference && B <= m->B && T <= m->T, NULL, "internal: batch (%d,%d) exceeds the planned (%d,%d)%s", B,
             T, m->B, m->T, m->inference ? " (an inference model plans none)" : "");
  size_t at = (size_t)slot * m->B * m->T, n = (size_t)B * T * sizeof(int32_t);
  if (tokens) m->be->to_device_async(m->be, m->tokens + at, tokens, n);
  if (targets) m->be->to_device_async(m->be, m->targets + at, targets, n);
}

/* Tensor parallelism: buf S (n) := its sum over the tensor ranks, taken in fp32 (Megatron's g in the
 * forward pass after a row-parallel layer, f in the backward pass before a column-parallel layer's input
 * gradient leaves it). Nothing without tensor parallelism. */
static void tp_sum(gpt_model *m, const act_layout *a, void *buf, size_t n) {
  if (m->tp == 1) return;
  const backend *be = m->be;
  UTIL_CHECK(m->tpc.sum, NULL, "internal: a tensor-parallel model without its group's collectives");
  if (be->storage == BACKEND_FP32) {
    m->tpc.sum(m->tpc.ctx, buf, n);
    return;
  }
  float *w = (float *)arena(m, a->tpw);
  be->to_fp32(be, w, buf, n);
  m->tpc.sum(m->tpc.ctx, w, n);
  be->to_storage(be, buf, w, n);
}

void gpt_norm_fwd(const gpt_shape *s, const backend *be, void *out, float *mean, float *rstd, const void *x,
                  const void *w, const void *b, int n) {
  if (s->rms) be->rmsnorm_fwd(be, out, rstd, x, w, n, s->C, s->eps);
  else be->layernorm_fwd(be, out, mean, rstd, x, w, b, n, s->C, s->eps);
}

void gpt_residual_norm_fwd(const gpt_shape *s, const backend *be, void *res, void *out, float *mean, float *rstd,
                           const void *a, const void *b, const void *w, const void *bias, int n) {
  if (!s->rms) {
    be->residual_layernorm_fwd(be, res, out, mean, rstd, a, b, w, bias, n, s->C, s->eps);
    return;
  }
  be->residual_fwd(be, res, a, b, (size_t)n * s->C);
  be->rmsnorm_fwd(be, out, rstd, res, w, n, s->C, s->eps);
}

void gpt_mlp_in_fwd(const gpt_shape *s, const backend *be, void *gel, void *fc, const void *ln, const void *w,
                    const void *b, int n, int F) {
  if (!s->swiglu) {
    be->matmul_gelu_fwd(be, gel, fc, ln, w, b, n, s->C, F, s->act);
    return;
  }
  be->matmul_fwd(be, fc, ln, w, b, n, s->C, 2 * F, 2 * F); /* [gate | up] (n,2F) */
  be->swiglu_fwd(be, gel, fc, n, F);
}

/* The norm's backward: dinp (N,C) +=, dw, db (db NULL with RMSNorm) */
static void norm_bwd(const gpt_model *m, void *dinp, float *dw, float *db, const void *dout, const void *x,
                     const void *w, const float *mean, const float *rstd, int N, int acc) {
  const backend *be = m->be;
  if (m->s.rms) be->rmsnorm_bwd(be, dinp, dw, dout, x, w, rstd, N, m->s.C, acc);
  else be->layernorm_bwd(be, dinp, dw, db, dout, x, w, mean, rstd, N, m->s.C, acc);
}

/* The MLP's output layer and activation backward: dfc (N,Fl; SwiGLU (N,2Fl)) from dout (N,C), proj's gradients */
static void mlp_out_bwd(gpt_model *m, const act_layout *a, const block_acts *ba, void *dfc, const void *dout,
                        const gpt_block_ptrs *p, const gpt_block_ptrs *g, int N, int acc) {
  const backend *be = m->be;
  const int C = m->s.C, F = m->d.Fl;
  if (!m->s.swiglu) {
    be->matmul_dgelu_bwd(be, dfc, g->proj_w, g->proj_b, dout, ba->gel, ba->fc, p->proj_w, N, F, C, acc, m->s.act);
    return;
  }
  void *dh = arena(m, a->dh); /* (N,Fl) */
  be->matmul_bwd(be, dh, g->proj_w, g->proj_b, dout, ba->gel, p->proj_w, N, F, C, C, acc);
  be->swiglu_bwd(be, dfc, dh, ba->fc, N, F);
}

/* Block l's forward pass from its input x (N,C) into its inner activations ba, and its output
 * into y (N,C) unless y is NULL (the recomputation in the backward pass, which needs only ba).
 * With tensor parallelism the rank holds Hl of the heads (Cl = C/T channels of q, k, v) and Fl of the
 * MLP's units; the row-parallel projections' partial outputs are summed over the tensor ranks, their
 * biases added by tensor rank 0 only. With rotary embeddings ba->qkv keeps q and k rotated (what the
 * attention saw). With the parallel residual ln_2 normalises x, and mid = x + attention. */
static void block_forward(gpt_model *m, const act_layout *a, int l, const block_acts *ba, const void *x, void *y, int B,
                          int T) {
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, Cl = m->d.Cl, F = m->d.Fl, N = B * T, first = m->tp_rank == 0;
  void *tmp = arena(m, a->dsmall), *scratch = arena(m, a->scratch);
  const gpt_block_ptrs p = m->w.blk[l - m->layer_lo];
  gpt_norm_fwd(s, be, ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p.ln1_w, p.ln1_b, N);
  const int H = m->d.Hl, Hkv = m->d.Hkvl, Wl = m->d.Wl;
  be->matmul_fwd(be, ba->qkv, ba->ln1, p.qkv_w, p.qkv_b, N, C, Wl, Wl); /* (N,Wl) */
  if (s->rot) be->rope(be, ba->qkv, NULL, N, T, Cl, H, Hkv, s->rot, &s->rope, 1);
  be->attention_fwd(be, ba->att, ba->lse, ba->qkv, scratch, B, T, Cl, H, Hkv, s->window[l], s->attn_scale); /* (N,Cl) */
  be->matmul_fwd(be, tmp, ba->att, p.out_w, first ? p.out_b : NULL, N, Cl, C, C);                         /* (N,C) */
  tp_sum(m, a, tmp, (size_t)N * C);
  if (s->parallel) {
    gpt_norm_fwd(s, be, ba->ln2, ba->ln2_mean, ba->ln2_rstd, x, p.ln2_w, p.ln2_b, N);
    if (y) be->residual_fwd(be, ba->mid, x, tmp, (size_t)N * C);
  } else {
    gpt_residual_norm_fwd(s, be, ba->mid, ba->ln2, ba->ln2_mean, ba->ln2_rstd, x, tmp, p.ln2_w, p.ln2_b, N);
  }
  gpt_mlp_in_fwd(s, be, ba->gel, ba->fc, ba->ln2, p.fc_w, p.fc_b, N, F); /* fc (N,Fl; SwiGLU 2Fl), gel (N,Fl) */
  if (!y) return; /* the rest of the block keeps nothing the backward pass reads */
  be->matmul_fwd(be, tmp, ba->gel, p.proj_w, first ? p.proj_b : NULL, N, F, C, C);
  tp_sum(m, a, tmp, (size_t)N * C);
  be->residual_fwd(be, y, ba->mid, tmp, (size_t)N * C);
}

void gpt_forward(gpt_model *m, int slot, int B, int T) {
  progress_mark();
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, N = B * T;
  const gpt_ends_ptrs *w = &m->w.ends;
  act_layout a = layout(m);
  if (m->has_embed) { /* a vocabulary shard's rows, summed over the tensor ranks; wpe added once */
    void *x0 = res_at(m, &a, slot, 0, (size_t)N);
    be->embed_fwd(be, x0, m->tokens + (size_t)slot * m->B * m->T, w->wte, m->tp_rank == 0 ? w->wpe : NULL, B, T, C,
                  m->d.v0, m->d.nv);
    tp_sum(m, &a, x0, (size_t)N * C);
  }
  for (int l = m->layer_lo; l < m->layer_hi; l++) {
    block_acts ba;
    block_acts_of(m, &a, slot, l, &ba);
    block_forward(m, &a, l, &ba, res_at(m, &a, slot, l - m->layer_lo, (size_t)N),
                  res_at(m, &a, slot, l - m->layer_lo + 1, (size_t)N), B, T);
  }
  if (m->has_head) {
    void *x = res_at(m, &a, slot, m->layer_hi - m->layer_lo, (size_t)N);
    char *base = slot_base(m, &a, slot);
    gpt_norm_fwd(s, be, base + a.lnf, (float *)(base + a.lnf_mean), (float *)(base + a.lnf_rstd), x, w->lnf_w,
                 w->lnf_b, N);
    be->matmul_fwd(be, base + a.logits, base + a.lnf, w->head, NULL, N, C, m->d.nv,
                   m->d.ldv); /* (N,nv; rows ldv apart): the shard's columns of the vocabulary */
  }
}

void *gpt_logits(const gpt_model *m, int slot) {
  act_layout a = layout(m);
  return slot_base(m, &a, slot) + a.logits;
}

void gpt_logits_row(const gpt_model *m, int slot, size_t row, float *host) {
  const backend *be = m->be;
  const size_t nv = (size_t)m->d.nv;
  const char *src = (const char *)gpt_logits(m, slot) + row * (size_t)m->d.ldv * backend_dtype_size(be->storage);
  if (be->storage == BACKEND_FP32 && m->tp == 1) {
    be->to_host(be, host, src, nv * sizeof(float));
    return;
  }
  act_layout a = layout(m);
  float *wide = (float *)arena(m, a.row);
  if (be->storage == BACKEND_FP32) be->copy(be, wide, src, nv * sizeof(float));
  else be->to_fp32(be, wide, src, nv);
  if (m->tp == 1) {
    be->to_host(be, host, wide, nv * sizeof(float));
    return;
  }
  /* the shards' rows, each padded to the longest, gathered and laid end to end */
  const int most = (m->s.V + m->tp - 1) / m->tp;
  m->tpc.gather(m->tpc.ctx, m->tp_host, wide, (size_t)most);
  for (int r = 0, v0 = 0; r < m->tp; r++) {
    gpt_part pr = gpt_model_part(m);
    pr.tp_rank = r;
    gpt_dims d = gpt_part_dims(&m->s, pr);
    memcpy(host + v0, m->tp_host + (size_t)r * most, (size_t)d.nv * sizeof(float));
    v0 += d.nv;
  }
}

/* The vocabulary-parallel cross-entropy: each tensor rank's part (log-sum-exp of its columns, the target's
 * logit where it holds it) gathered, combined into each row's loss in the same order on every rank, and
 * the rows' log-sum-exp handed back for the gradient of the shard's logits. */
static void loss_parallel(gpt_model *m, int slot, int N, float dscale) {
  const backend *be = m->be;
  act_layout a = layout(m);
  float *part = (float *)arena(m, a.xpart), *lse = (float *)arena(m, a.xlse), *all = m->tp_host;
  void *logits = gpt_logits(m, slot);
  const int32_t *targets = m->targets + (size_t)slot * m->B * m->T;
  be->xent_part(be, part, logits, targets, N, m->d.nv, m->d.v0, m->d.ldv);
  m->tpc.gather(m->tpc.ctx, all, part, 2 * (size_t)N); /* (tp, N, 2) */
  float *lse_h = m->losses_host; /* the rows' log-sum-exp first, then their losses */
  for (int i = 0; i < N; i++) {
    double mx = -INFINITY, sum = 0.0, z = 0.0;
    for (int r = 0; r < m->tp; r++) mx = fmax(mx, all[((size_t)r * N + i) * 2]);
    for (int r = 0; r < m->tp; r++) sum += exp(all[((size_t)r * N + i) * 2] - mx), z += all[((size_t)r * N + i) * 2 + 1];
    lse_h[i] = (float)(mx + log(sum));
    all[i] = (float)(mx + log(sum) - z); /* row i's loss; the parts of row i are read by now */
  }
  if (dscale != 0.0f) {
    be->to_device(be, lse, lse_h, (size_t)N * sizeof(float));
    be->xent_grad(be, logits, lse, targets, N, m->d.nv, m->d.v0, m->d.ldv, dscale);
  }
  be->to_device(be, m->losses, all, (size_t)N * sizeof(float));
}

void gpt_loss(gpt_model *m, int slot, int B, int T, float dscale) {
  const int N = B * T;
  if (m->tp > 1)
    loss_parallel(m, slot, N, dscale);
  else
    m->be->xent_fwd_bwd(m->be, m->losses, gpt_logits(m, slot), m->targets + (size_t)slot * m->B * m->T, N, m->s.V,
                        m->d.ldv, dscale);
  m->be->reduce_sum(m->be, m->sums, m->losses, (size_t)N, 0);
}

const float *gpt_token_losses(gpt_model *m, int N) {
  m->be->to_host(m->be, m->losses_host, m->losses, (size_t)N * sizeof(float));
  return m->losses_host;
}

void gpt_sums_clear(gpt_model *m) { m->be->zero(m->be, m->sums, 2 * sizeof(double)); }

void gpt_sums_read(const gpt_model *m, double out[2]) { m->be->to_host(m->be, out, m->sums, 2 * sizeof(double)); }

/* The head's backward pass: from the logits' gradient into dres (N,C), the head's gradients. */
static void head_backward(gpt_model *m, const act_layout *a, int slot, int N, int acc) {
  const backend *be = m->be;
  const int C = m->s.C;
  void *x = res_at(m, a, slot, m->layer_hi - m->layer_lo, (size_t)N), *dres = arena(m, a->dres),
       *dsmall = arena(m, a->dsmall);
  char *base = slot_base(m, a, slot);
  const gpt_ends_ptrs *w = &m->w.ends, *g = &m->g.ends;
  /* dlnf (N,C) = dlogits @ head; dhead += dlogits^T lnf (the shard's vocabulary rows; dlnf summed over them) */
  be->matmul_bwd(be, dsmall, g->head, NULL, base + a->logits, base + a->lnf, w->head, N, C, m->d.nv, m->d.ldv, acc);
  tp_sum(m, a, dsmall, (size_t)N * C);
  be->zero(be, dres, (size_t)N * C * backend_dtype_size(be->storage));
  norm_bwd(m, dres, g->lnf_w, g->lnf_b, dsmall, x, w->lnf_w, (float *)(base + a->lnf_mean),
           (float *)(base + a->lnf_rstd), N, acc);
}

/* Block l's backward pass: dres holds d(block output) (the same on every tensor rank, so are the replicated biases'
 * gradients) and becomes d(x). Sequential: the MLP's LayerNorm gradient joins dres, which is then d(mid), before the
 * attention's. Parallel: both branches start from d(output); the MLP's input gradient waits in dpar meanwhile. */
static void block_backward(gpt_model *m, const act_layout *a, int l, const block_acts *ba, const void *x, int B, int T,
                           int acc) {
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, Cl = m->d.Cl, F = m->d.Fl, N = B * T;
  void *dres = arena(m, a->dres), *dsmall = arena(m, a->dsmall), *dbig = arena(m, a->dbig),
       *scratch = arena(m, a->scratch), *dln2 = s->parallel ? arena(m, a->dpar) : dsmall;
  const gpt_block_ptrs p = m->w.blk[l - m->layer_lo], g = m->g.blk[l - m->layer_lo];
  const int units = s->swiglu ? 2 * F : F;
  mlp_out_bwd(m, a, ba, dbig, dres, &p, &g, N, acc); /* dfc (N,units) */
  be->matmul_bwd(be, dln2, g.fc_w, g.fc_b, dbig, ba->ln2, p.fc_w, N, C, units, units, acc); /* dln2 (N,C), partial */
  tp_sum(m, a, dln2, (size_t)N * C);
  if (!s->parallel) /* dres := d(mid) */
    norm_bwd(m, dres, g.ln2_w, g.ln2_b, dln2, ba->mid, p.ln2_w, ba->ln2_mean, ba->ln2_rstd, N, acc);
  be->matmul_bwd(be, dsmall, g.out_w, g.out_b, dres, ba->att, p.out_w, N, Cl, C, C, acc); /* datt (N,Cl) */
  const int H = m->d.Hl, Hkv = m->d.Hkvl, Wl = m->d.Wl;
  be->attention_bwd(be, dbig, dsmall, ba->att, ba->lse, ba->qkv, scratch, B, T, Cl, H, Hkv, s->window[l],
                    s->attn_scale); /* dqkv (N,Wl), of the rotated q and k */
  if (s->rot) be->rope(be, dbig, NULL, N, T, Cl, H, Hkv, s->rot, &s->rope, -1);
  be->matmul_bwd(be, dsmall, g.qkv_w, g.qkv_b, dbig, ba->ln1, p.qkv_w, N, C, Wl, Wl, acc); /* dln1, partial */
  tp_sum(m, a, dsmall, (size_t)N * C);
  if (s->parallel) /* d(output) + the MLP's part */
    norm_bwd(m, dres, g.ln2_w, g.ln2_b, dln2, x, p.ln2_w, ba->ln2_mean, ba->ln2_rstd, N, acc);
  norm_bwd(m, dres, g.ln1_w, g.ln1_b, dsmall, x, p.ln1_w, ba->ln1_mean, ba->ln1_rstd, N, acc);
}

void gpt_backward(gpt_model *m, int slot, int B, int T, gpt_hook hook, void *ctx) {
  progress_mark();
  const backend *be = m->be;
  const int C = m->s.C, N = B * T;
  act_layout a = layout(m);
  void *dres = arena(m, a.dres);
  const int acc = !m->grads_unset; /* the first pass after gpt_zero_grad writes, later ones add */
  m->grads_unset = 0;
  if (m->has_head) {
    head_backward(m, &a, slot, N, acc);
    if (hook) hook(ctx, GPT_HOOK_HEAD);
  }
  /* without the head, dres holds the gradient received from the next stage */
  for (int l = m->layer_hi - 1; l >= m->layer_lo; l--) {
    block_acts ba;
    block_acts_of(m, &a, slot, l, &ba);
    void *x = res_at(m, &a, slot, l - m->layer_lo, (size_t)N);
    if (m->recompute) block_forward(m, &a, l, &ba, x, NULL, B, T); /* the inner activations again */
    block_backward(m, &a, l, &ba, x, B, T, acc);
    if (hook) hook(ctx, l);
  }
  if (m->has_embed) {
    be->embed_bwd(be, m->g.ends.wte, m->g.ends.wpe, dres, m->tokens + (size_t)slot * m->B * m->T, B, T, C, m->d.v0,
                  m->d.nv);
    if (hook) hook(ctx, GPT_HOOK_EMBED);
  }
}

/* The gradients no op overwrites, zeroed: the embedding's, which embed_bwd adds row by row (wte's only where no
 * tied head on this rank writes it first). */
void gpt_zero_grad(gpt_model *m) {
  if (!m->grads) return;
  m->grads_unset = 1;
  if (!m->has_embed) return;
  const size_t row = (size_t)m->s.C * sizeof(float);
  if (m->g.ends.wpe) m->be->zero(m->be, m->g.ends.wpe, (size_t)m->s.maxT * row); /* (maxT, C) */
  if (!m->has_head || !m->s.tied) m->be->zero(m->be, m->g.ends.wte, (size_t)m->d.nv * row); /* (nv, C): the shard's rows */
}
