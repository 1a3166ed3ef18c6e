/* gpt: parameter layout, activation plan, forward and backward through the backend table. */
#include "model/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"

/* ---- shape ----------------------------------------------------------------------------------- */

void gpt_shape_from_cfg(gpt_shape *s, const cfg_model *m) {
  memset(s, 0, sizeof *s);
  s->arch = strcmp(m->arch, "gpt2") == 0 ? GPT_ARCH_GPT2 : GPT_ARCH_NEO;
  s->V = (int)m->vocab_size;
  s->maxT = (int)m->block_size;
  s->L = (int)m->n_layer;
  s->C = (int)m->n_embd;
  s->H = (int)m->n_head;
  s->F = (int)(m->n_inner ? m->n_inner : 4 * m->n_embd);
  s->eps = (float)m->layer_norm_epsilon;
  s->init_std = (float)m->init_std;
  s->window = util_calloc((size_t)s->L, sizeof *s->window, "layer windows");
  for (int l = 0; l < s->L; l++) {
    const char *kind = m->attention_types.v[l % m->attention_types.n];
    s->window[l] = strcmp(kind, "local") == 0 ? (int)m->window_size : 0;
  }
  s->qkv_bias = s->arch == GPT_ARCH_GPT2;
  s->attn_scale = s->arch == GPT_ARCH_GPT2 ? 1.0f / sqrtf((float)(s->C / s->H)) : 1.0f;
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
} tensor_list;

static void add_tensor(tensor_list *tl, int keep, const char *name, int rows, int cols, int decay, int layer,
                       gpt_init_kind init, float std) {
  int index = tl->index++;
  if (!keep) return;
  if (tl->n == tl->cap) {
    tl->cap = tl->cap ? 2 * tl->cap : 64;
    tl->v = util_realloc(tl->v, (size_t)tl->cap * sizeof *tl->v, "tensor list");
  }
  gpt_tensor *t = &tl->v[tl->n++];
  memset(t, 0, sizeof *t);
  util_strlcpy(t->name, name, sizeof t->name);
  t->rows = rows;
  t->cols = cols;
  t->numel = (size_t)rows * (size_t)cols;
  t->offset = tl->offset;
  t->decay = decay;
  t->layer = layer;
  t->index = index;
  t->init = init;
  t->init_std = std;
  tl->offset += t->numel;
}

/* The model's tensors in buffer order. Tensors outside [lo, hi) (and the embedding/head when not
 * held) are skipped but still numbered, so a tensor's index is the same in every layout. */
static void build_tensors(const gpt_shape *s, int lo, int hi, int has_embed, int has_head, tensor_list *tl) {
  const int C = s->C, F = s->F;
  const float std = s->init_std;
  /* GPT-2 scales the residual projections' init by 1/sqrt(2L) (as Hugging Face's GPT2 does) */
  const float pstd = s->arch == GPT_ARCH_GPT2 ? std / sqrtf(2.0f * (float)s->L) : std;
  memset(tl, 0, sizeof *tl);
  add_tensor(tl, has_embed || has_head, "transformer.wte.weight", s->V, C, 1, -1, GPT_INIT_NORMAL, std);
  add_tensor(tl, has_embed, "transformer.wpe.weight", s->maxT, C, 1, -1, GPT_INIT_NORMAL, std);
  char n[96];
  for (int l = 0; l < s->L; l++) {
    int k = l >= lo && l < hi;
#define NAME(fmt) (snprintf(n, sizeof n, "transformer.h.%d." fmt, l), n)
    add_tensor(tl, k, NAME("ln_1.weight"), C, 1, 0, l, GPT_INIT_ONES, 0);
    add_tensor(tl, k, NAME("ln_1.bias"), C, 1, 0, l, GPT_INIT_ZEROS, 0);
    if (s->arch == GPT_ARCH_NEO) {
      add_tensor(tl, k, NAME("attn.attention.q_proj.weight"), C, C, 1, l, GPT_INIT_NORMAL, std);
      add_tensor(tl, k, NAME("attn.attention.k_proj.weight"), C, C, 1, l, GPT_INIT_NORMAL, std);
      add_tensor(tl, k, NAME("attn.attention.v_proj.weight"), C, C, 1, l, GPT_INIT_NORMAL, std);
      add_tensor(tl, k, NAME("attn.attention.out_proj.weight"), C, C, 1, l, GPT_INIT_NORMAL, std);
      add_tensor(tl, k, NAME("attn.attention.out_proj.bias"), C, 1, 0, l, GPT_INIT_ZEROS, 0);
    } else {
      add_tensor(tl, k, NAME("attn.c_attn.weight"), 3 * C, C, 1, l, GPT_INIT_NORMAL, std);
      add_tensor(tl, k, NAME("attn.c_attn.bias"), 3 * C, 1, 0, l, GPT_INIT_ZEROS, 0);
      add_tensor(tl, k, NAME("attn.c_proj.weight"), C, C, 1, l, GPT_INIT_NORMAL, pstd);
      add_tensor(tl, k, NAME("attn.c_proj.bias"), C, 1, 0, l, GPT_INIT_ZEROS, 0);
    }
    add_tensor(tl, k, NAME("ln_2.weight"), C, 1, 0, l, GPT_INIT_ONES, 0);
    add_tensor(tl, k, NAME("ln_2.bias"), C, 1, 0, l, GPT_INIT_ZEROS, 0);
    add_tensor(tl, k, NAME("mlp.c_fc.weight"), F, C, 1, l, GPT_INIT_NORMAL, std);
    add_tensor(tl, k, NAME("mlp.c_fc.bias"), F, 1, 0, l, GPT_INIT_ZEROS, 0);
    add_tensor(tl, k, NAME("mlp.c_proj.weight"), C, F, 1, l, GPT_INIT_NORMAL, pstd);
    add_tensor(tl, k, NAME("mlp.c_proj.bias"), C, 1, 0, l, GPT_INIT_ZEROS, 0);
#undef NAME
  }
  add_tensor(tl, has_head, "transformer.ln_f.weight", C, 1, 0, -1, GPT_INIT_ONES, 0);
  add_tensor(tl, has_head, "transformer.ln_f.bias", C, 1, 0, -1, GPT_INIT_ZEROS, 0);
}

size_t gpt_count_params(const gpt_shape *s) { return gpt_part_params(s, gpt_whole(s)); }

double gpt_flops_per_token(const gpt_shape *s, int T) {
  double n = (double)gpt_count_params(s) - (double)s->maxT * s->C; /* wpe does no arithmetic */
  return 6.0 * n + 12.0 * s->L * (double)s->C * T;
}

/* ---- activation arena ------------------------------------------------------------------------ */

/* Offsets (in floats) of the activation buffers. Per slot: the residual stream, the blocks'
 * activations and the head's; then, shared by all slots, the gradient buffers and scratch. */
typedef struct {
  size_t res;                                   /* (nl+1) x (N,C): block inputs/outputs */
  size_t blk, blk_stride;                       /* per-block area, one stride per block */
  size_t ln1, ln1_mean, ln1_rstd, qkv, att, lse; /* within a block area */
  size_t mid, ln2, ln2_mean, ln2_rstd, fc, gel;
  size_t lnf, lnf_mean, lnf_rstd, logits;       /* head (last stage) */
  size_t slot;                                  /* size of one slot */
  size_t dres, dsmall, dbig, scratch;           /* shared, after the slots */
  size_t total;
} act_layout;

static size_t take(size_t *cursor, size_t n) {
  size_t at = *cursor;
  *cursor += (n + 15) / 16 * 16; /* 64-byte aligned sub-buffers */
  return at;
}

static act_layout plan_acts(const gpt_shape *s, const backend *be, int B, int T, gpt_part p) {
  act_layout a;
  memset(&a, 0, sizeof a);
  const size_t N = (size_t)B * T, C = (size_t)s->C, F = (size_t)s->F;
  const int nl = p.hi - p.lo;
  size_t cur = 0;
  a.res = take(&cur, (size_t)(nl + 1) * N * C);
  size_t b = 0;
  a.ln1 = take(&b, N * C);
  a.ln1_mean = take(&b, N);
  a.ln1_rstd = take(&b, N);
  a.qkv = take(&b, N * 3 * C);
  a.att = take(&b, N * C);
  a.lse = take(&b, (size_t)B * s->H * T);
  a.mid = take(&b, N * C);
  a.ln2 = take(&b, N * C);
  a.ln2_mean = take(&b, N);
  a.ln2_rstd = take(&b, N);
  a.fc = take(&b, N * F);
  a.gel = take(&b, N * F);
  a.blk_stride = b;
  if (!p.recompute) a.blk = take(&cur, (size_t)nl * b); /* per block and slot; else shared, below */
  if (p.has_head) {
    a.lnf = take(&cur, N * C);
    a.lnf_mean = take(&cur, N);
    a.lnf_rstd = take(&cur, N);
    a.logits = take(&cur, N * (size_t)s->V);
  }
  a.slot = cur;
  cur *= (size_t)p.nslots;
  if (p.recompute) a.blk = take(&cur, b); /* one block's inner activations, rebuilt as needed */
  a.dres = take(&cur, N * C);
  a.dsmall = take(&cur, N * C);
  a.dbig = take(&cur, N * (F > 3 * C ? F : 3 * C));
  a.scratch = take(&cur, (be->attention_scratch(T) + sizeof(float) - 1) / sizeof(float));
  a.total = cur;
  return a;
}

gpt_part gpt_whole(const gpt_shape *s) { return (gpt_part){0, s->L, 1, 1, 1, 0}; }

gpt_tensor *gpt_list_tensors(const gpt_shape *s, gpt_part part, int *n) {
  tensor_list tl;
  build_tensors(s, part.lo, part.hi, part.has_embed, part.has_head, &tl);
  *n = tl.n;
  return tl.v;
}

size_t gpt_part_params(const gpt_shape *s, gpt_part part) {
  tensor_list tl;
  build_tensors(s, part.lo, part.hi, part.has_embed, part.has_head, &tl);
  free(tl.v);
  return tl.offset;
}

gpt_memory gpt_plan_memory(const gpt_shape *s, const backend *be, int B, int T, gpt_part part) {
  act_layout a = plan_acts(s, be, B, T, part);
  gpt_memory m;
  m.params = gpt_part_params(s, part) * sizeof(float);
  m.grads = m.params;
  m.acts = a.total * sizeof(float);
  /* tokens and targets per slot, losses */
  m.io = (size_t)B * T * (2 * sizeof(int32_t) * (size_t)part.nslots + sizeof(float));
  m.total = m.params + m.grads + m.acts + m.io;
  return m;
}

/* ---- init ------------------------------------------------------------------------------------ */

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
  tensor_list tl;
  build_tensors(s, part.lo, part.hi, part.has_embed, part.has_head, &tl);
  m->tensors = tl.v;
  m->ntensors = tl.n;
  m->nparams = tl.offset;
  m->mem = gpt_plan_memory(s, be, B, T, part);
  act_layout a = plan_acts(s, be, B, T, part);

  size_t pb = m->nparams * sizeof(float), nio = (size_t)part.nslots * B * T;
  m->params = be->alloc(pb);
  m->grads = be->alloc(pb);
  m->acts = be->alloc(a.total * sizeof(float));
  m->tokens = be->alloc(nio * sizeof(int32_t));
  m->targets = be->alloc(nio * sizeof(int32_t));
  m->losses = be->alloc((size_t)B * T * sizeof(float));
  m->losses_host = util_malloc((size_t)B * T * sizeof(float), "losses");

  /* initialise on the host, tensor by tensor, then upload */
  float *host = util_malloc(pb ? pb : 1, "parameter staging");
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    float *p = host + t->offset;
    rng_state r;
    rng_seed(&r, seed, RNG_INIT, (uint64_t)t->index);
    for (size_t j = 0; j < t->numel; j++)
      p[j] = t->init == GPT_INIT_ONES ? 1.0f : t->init == GPT_INIT_ZEROS ? 0.0f : (float)(t->init_std * rng_normal(&r));
  }
  be->to_device(m->params, host, pb);
  free(host);
}

void gpt_free(gpt_model *m) {
  const backend *be = m->be;
  be->free(m->params);
  be->free(m->grads);
  be->free(m->acts);
  be->free(m->tokens);
  be->free(m->targets);
  be->free(m->losses);
  free(m->losses_host);
  free(m->tensors);
  free(m->s.window);
  memset(m, 0, sizeof *m);
}

const gpt_tensor *gpt_find_tensor(const gpt_model *m, const char *name) {
  for (int i = 0; i < m->ntensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
  return NULL;
}

static float *tensor_ptr(const gpt_model *m, float *buf, const char *name) {
  const gpt_tensor *t = gpt_find_tensor(m, name);
  UTIL_CHECK(t, NULL, "internal: tensor %s is not held by this rank", name);
  return buf + t->offset;
}

void gpt_block(const gpt_model *m, float *buf, int l, gpt_block_ptrs *p) {
  /* the tensors of a block are consecutive in the buffer, in build_tensors() order */
  char n[96];
  snprintf(n, sizeof n, "transformer.h.%d.ln_1.weight", l);
  float *q = tensor_ptr(m, buf, n);
  const size_t C = (size_t)m->s.C, F = (size_t)m->s.F;
  memset(p, 0, sizeof *p);
  p->ln1_w = q, q += C;
  p->ln1_b = q, q += C;
  p->qkv_w = q, q += 3 * C * C;
  if (m->s.qkv_bias) p->qkv_b = q, q += 3 * C;
  p->out_w = q, q += C * C;
  p->out_b = q, q += C;
  p->ln2_w = q, q += C;
  p->ln2_b = q, q += C;
  p->fc_w = q, q += F * C;
  p->fc_b = q, q += F;
  p->proj_w = q, q += C * F;
  p->proj_b = q;
}

/* ---- forward / backward ---------------------------------------------------------------------- */

typedef struct {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse, *mid, *ln2, *ln2_mean, *ln2_rstd, *fc, *gel;
} block_acts;

static act_layout layout(const gpt_model *m) {
  gpt_part p = {m->layer_lo, m->layer_hi, m->has_embed, m->has_head, m->nslots, m->recompute};
  return plan_acts(&m->s, m->be, m->B, m->T, p);
}

static float *slot_base(const gpt_model *m, const act_layout *a, int slot) {
  UTIL_CHECK(slot >= 0 && slot < m->nslots, NULL, "internal: slot %d of %d", slot, m->nslots);
  return m->acts + (size_t)slot * a->slot;
}

static void block_acts_of(const gpt_model *m, const act_layout *a, int slot, int l, block_acts *ba) {
  float *base = m->recompute ? m->acts + a->blk : slot_base(m, a, slot) + a->blk + (size_t)(l - m->layer_lo) * a->blk_stride;
  ba->ln1 = base + a->ln1;
  ba->ln1_mean = base + a->ln1_mean;
  ba->ln1_rstd = base + a->ln1_rstd;
  ba->qkv = base + a->qkv;
  ba->att = base + a->att;
  ba->lse = base + a->lse;
  ba->mid = base + a->mid;
  ba->ln2 = base + a->ln2;
  ba->ln2_mean = base + a->ln2_mean;
  ba->ln2_rstd = base + a->ln2_rstd;
  ba->fc = base + a->fc;
  ba->gel = base + a->gel;
}

/* Residual stream entering local block i (i = 0..nl), (N,C) for the current micro-batch. */
static float *res_at(const gpt_model *m, const act_layout *a, int slot, int i, size_t N) {
  return slot_base(m, a, slot) + a->res + (size_t)i * N * (size_t)m->s.C;
}

float *gpt_input(const gpt_model *m, int slot, int B, int T) {
  act_layout a = layout(m);
  return res_at(m, &a, slot, 0, (size_t)B * T);
}

float *gpt_output(const gpt_model *m, int slot, int B, int T) {
  act_layout a = layout(m);
  return res_at(m, &a, slot, m->layer_hi - m->layer_lo, (size_t)B * T);
}

float *gpt_grad_output(const gpt_model *m) {
  act_layout a = layout(m);
  return m->acts + a.dres;
}

float *gpt_grad_input(const gpt_model *m) { return gpt_grad_output(m); /* the same buffer, after the pass */ }

void gpt_set_batch(gpt_model *m, int slot, const int32_t *tokens, const int32_t *targets, int B, int T) {
  UTIL_CHECK(B <= m->B && T <= m->T, NULL, "internal: batch (%d,%d) exceeds the planned (%d,%d)", B, T, m->B, m->T);
  size_t at = (size_t)slot * m->B * m->T, n = (size_t)B * T * sizeof(int32_t);
  if (tokens) m->be->to_device(m->tokens + at, tokens, n);
  if (targets) m->be->to_device(m->targets + at, targets, n);
}

/* Block l's forward pass from its input x (N,C) into its inner activations ba, and its output
 * into y (N,C) unless y is NULL (the recomputation in the backward pass, which needs only ba). */
static void block_forward(gpt_model *m, const act_layout *a, int l, const block_acts *ba, const float *x, float *y, int B,
                          int T) {
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, F = s->F, N = B * T;
  float *tmp = m->acts + a->dsmall, *scratch = m->acts + a->scratch;
  gpt_block_ptrs p;
  gpt_block(m, m->params, l, &p);
  be->layernorm_fwd(ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p.ln1_w, p.ln1_b, N, C, s->eps);
  be->matmul_fwd(ba->qkv, ba->ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);                                   /* (N,3C) */
  be->attention_fwd(ba->att, ba->lse, ba->qkv, scratch, B, T, C, s->H, s->window[l], s->attn_scale); /* (N,C) */
  be->matmul_fwd(tmp, ba->att, p.out_w, p.out_b, N, C, C);
  be->residual_fwd(ba->mid, x, tmp, (size_t)N * C);
  be->layernorm_fwd(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->mid, p.ln2_w, p.ln2_b, N, C, s->eps);
  be->matmul_fwd(ba->fc, ba->ln2, p.fc_w, p.fc_b, N, C, F); /* (N,F) */
  be->gelu_fwd(ba->gel, ba->fc, (size_t)N * F);
  if (!y) return; /* the rest of the block keeps nothing the backward pass reads */
  be->matmul_fwd(tmp, ba->gel, p.proj_w, p.proj_b, N, F, C);
  be->residual_fwd(y, ba->mid, tmp, (size_t)N * C);
}

void gpt_forward(gpt_model *m, int slot, int B, int T) {
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, N = B * T;
  act_layout a = layout(m);
  if (m->has_embed)
    be->embed_fwd(res_at(m, &a, slot, 0, (size_t)N), m->tokens + (size_t)slot * m->B * m->T,
                  tensor_ptr(m, m->params, "transformer.wte.weight"), tensor_ptr(m, m->params, "transformer.wpe.weight"),
                  B, T, C);
  for (int l = m->layer_lo; l < m->layer_hi; l++) {
    block_acts ba;
    block_acts_of(m, &a, slot, l, &ba);
    block_forward(m, &a, l, &ba, res_at(m, &a, slot, l - m->layer_lo, (size_t)N),
                  res_at(m, &a, slot, l - m->layer_lo + 1, (size_t)N), B, T);
  }
  if (m->has_head) {
    float *x = res_at(m, &a, slot, m->layer_hi - m->layer_lo, (size_t)N), *base = slot_base(m, &a, slot);
    be->layernorm_fwd(base + a.lnf, base + a.lnf_mean, base + a.lnf_rstd, x,
                      tensor_ptr(m, m->params, "transformer.ln_f.weight"),
                      tensor_ptr(m, m->params, "transformer.ln_f.bias"), N, C, s->eps);
    be->matmul_fwd(base + a.logits, base + a.lnf, tensor_ptr(m, m->params, "transformer.wte.weight"), NULL, N, C,
                   s->V); /* (N,V) */
  }
}

float *gpt_logits(const gpt_model *m, int slot) {
  act_layout a = layout(m);
  return slot_base(m, &a, slot) + a.logits;
}

double gpt_loss(gpt_model *m, int slot, int B, int T, float dscale) {
  const int N = B * T;
  m->be->xent_fwd_bwd(m->losses, gpt_logits(m, slot), m->targets + (size_t)slot * m->B * m->T, N, m->s.V, dscale);
  m->be->to_host(m->losses_host, m->losses, (size_t)N * sizeof(float));
  double sum = 0.0;
  for (int i = 0; i < N; i++) sum += m->losses_host[i];
  return sum;
}

void gpt_backward(gpt_model *m, int slot, int B, int T, gpt_hook hook, void *ctx) {
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, F = s->F, N = B * T;
  act_layout a = layout(m);
  float *dres = m->acts + a.dres, *dsmall = m->acts + a.dsmall, *dbig = m->acts + a.dbig;
  float *scratch = m->acts + a.scratch;
  if (m->has_head) {
    float *x = res_at(m, &a, slot, m->layer_hi - m->layer_lo, (size_t)N), *base = slot_base(m, &a, slot);
    /* dlnf (N,C) = dlogits @ wte; dwte += dlogits^T lnf */
    be->matmul_bwd(dsmall, tensor_ptr(m, m->grads, "transformer.wte.weight"), NULL, base + a.logits, base + a.lnf,
                   tensor_ptr(m, m->params, "transformer.wte.weight"), N, C, s->V);
    be->zero(dres, (size_t)N * C * sizeof(float));
    be->layernorm_bwd(dres, tensor_ptr(m, m->grads, "transformer.ln_f.weight"),
                      tensor_ptr(m, m->grads, "transformer.ln_f.bias"), dsmall, x,
                      tensor_ptr(m, m->params, "transformer.ln_f.weight"), base + a.lnf_mean, base + a.lnf_rstd, N, C);
    if (hook) hook(ctx, GPT_HOOK_HEAD);
  }
  /* without the head, dres holds the gradient received from the next stage */
  for (int l = m->layer_hi - 1; l >= m->layer_lo; l--) {
    gpt_block_ptrs p, g;
    block_acts ba;
    gpt_block(m, m->params, l, &p);
    gpt_block(m, m->grads, l, &g);
    block_acts_of(m, &a, slot, l, &ba);
    float *x = res_at(m, &a, slot, l - m->layer_lo, (size_t)N);
    if (m->recompute) block_forward(m, &a, l, &ba, x, NULL, B, T); /* the inner activations again */
    /* MLP: dres is d(block output) */
    be->matmul_bwd(dbig, g.proj_w, g.proj_b, dres, ba.gel, p.proj_w, N, F, C); /* dgel (N,F) */
    be->gelu_bwd(dbig, dbig, ba.fc, (size_t)N * F);                          /* dfc (N,F) */
    be->matmul_bwd(dsmall, g.fc_w, g.fc_b, dbig, ba.ln2, p.fc_w, N, C, F);    /* dln2 (N,C) */
    be->layernorm_bwd(dres, g.ln2_w, g.ln2_b, dsmall, ba.mid, p.ln2_w, ba.ln2_mean, ba.ln2_rstd, N, C);
    /* attention: dres is now d(mid) */
    be->matmul_bwd(dsmall, g.out_w, g.out_b, dres, ba.att, p.out_w, N, C, C); /* datt (N,C) */
    be->attention_bwd(dbig, dsmall, ba.att, ba.lse, ba.qkv, scratch, B, T, C, s->H, s->window[l],
                      s->attn_scale);                                          /* dqkv (N,3C) */
    be->matmul_bwd(dsmall, g.qkv_w, g.qkv_b, dbig, ba.ln1, p.qkv_w, N, C, 3 * C); /* dln1 (N,C) */
    be->layernorm_bwd(dres, g.ln1_w, g.ln1_b, dsmall, x, p.ln1_w, ba.ln1_mean, ba.ln1_rstd, N, C);
    if (hook) hook(ctx, l);
  }
  if (m->has_embed) {
    be->embed_bwd(tensor_ptr(m, m->grads, "transformer.wte.weight"), tensor_ptr(m, m->grads, "transformer.wpe.weight"),
                  dres, m->tokens + (size_t)slot * m->B * m->T, B, T, C);
    if (hook) hook(ctx, GPT_HOOK_EMBED);
  }
}

void gpt_zero_grad(gpt_model *m) { m->be->zero(m->grads, m->nparams * sizeof(float)); }
