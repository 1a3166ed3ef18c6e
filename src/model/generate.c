/* generate: batched generation with a per-layer KV cache, and the recomputing reference. */
#include "model/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

const char *gen_end_name(gen_end e) {
  static const char *const names[] = {"running", "n_tokens", "<|endoftext|>", "stopped", "block_size reached"};
  return names[e];
}

/* ---- the plan ---------------------------------------------------------------------------------- */

/* Byte offsets in the activation buffer: a pass of R rows, then the head's `batch` rows. */
typedef struct {
  size_t x, ln, mean, rstd, qkv, att, tmp, mid, fc, gel; /* (R,C) S; mean, rstd (R) F; qkv (R,3C); fc, gel (R,F) */
  size_t hx, hln, hmean, hrstd, logits, wide;            /* (batch,C) S; (batch) F; logits (batch,V) S, wide F */
  size_t total;
} pass_layout;

static size_t take(size_t *cursor, size_t n, size_t size) {
  size_t at = *cursor;
  *cursor += (n * size + 63) / 64 * 64;
  return at;
}

static int pass_rows(int batch, int max_len) {
  int chunk = max_len < GEN_CHUNK ? max_len : GEN_CHUNK;
  return batch > chunk ? batch : chunk;
}

static pass_layout plan_pass(const gpt_shape *s, const backend *be, int batch, int R) {
  const size_t es = backend_dtype_size(be->storage), f4 = sizeof(float), C = (size_t)s->C, F = (size_t)s->F;
  pass_layout a;
  size_t cur = 0;
  a.x = take(&cur, R * C, es);
  a.ln = take(&cur, R * C, es);
  a.mean = take(&cur, (size_t)R, f4);
  a.rstd = take(&cur, (size_t)R, f4);
  a.qkv = take(&cur, R * (size_t)backend_qkv_width(s->C, s->H, s->Hkv), es);
  a.att = take(&cur, R * C, es);
  a.tmp = take(&cur, R * C, es);
  a.mid = take(&cur, R * C, es);
  a.fc = take(&cur, R * F * (s->swiglu ? 2 : 1), es); /* SwiGLU: [gate | up] */
  a.gel = take(&cur, R * F, es);
  a.hx = take(&cur, batch * C, es);
  a.hln = take(&cur, batch * C, es);
  a.hmean = take(&cur, (size_t)batch, f4);
  a.hrstd = take(&cur, (size_t)batch, f4);
  a.logits = take(&cur, (size_t)batch * s->V, es);
  a.wide = be->storage == BACKEND_FP32 ? 0 : take(&cur, (size_t)batch * s->V, f4);
  a.total = cur;
  return a;
}

/* Rows of layer l's ring: a global layer every position up to max_len; a local one its window plus
 * the rows a pass adds before they are attended to. */
static int ring_rows(const gpt_shape *s, int l, int max_len) {
  int chunk = max_len < GEN_CHUNK ? max_len : GEN_CHUNK, w = s->window[l];
  return w > 0 && w + chunk - 1 < max_len ? w + chunk - 1 : max_len;
}

/* Bytes of the caches; with kv_at (L) the offset of each layer's keys (its values follow): rows of Hkv heads. */
static size_t plan_cache(const gpt_shape *s, const backend *be, int batch, int max_len, size_t *kv_at, int *kv_rows) {
  size_t cur = 0, row = (size_t)(s->C / s->H * s->Hkv) * backend_dtype_size(be->storage);
  *kv_rows = 0;
  for (int l = 0; l < s->L; l++) {
    int r = ring_rows(s, l, max_len);
    size_t at = take(&cur, 2 * (size_t)batch * r, row);
    if (kv_at) kv_at[l] = at;
    if (batch * r > *kv_rows) *kv_rows = batch * r;
  }
  return cur;
}

/* The ops' largest shapes in a pass of R rows (SwiGLU's fc: [gate | up]) */
static backend_shape pass_shape(const gpt_shape *s, int R, int kv_rows) {
  return (backend_shape){.B = 1, .T = R, .C = s->C, .H = s->H, .Hkv = s->Hkv, .F = s->F * (s->swiglu ? 2 : 1),
                         .V = s->V, .kv_rows = kv_rows};
}

gen_memory gen_plan_memory(const gpt_shape *s, const backend *be, int batch, int max_len, gen_mode mode) {
  gen_memory m = {0};
  if (mode == GEN_RECOMPUTE) return m;
  int R = pass_rows(batch, max_len), kv_rows;
  m.cache = plan_cache(s, be, batch, max_len, NULL, &kv_rows);
  m.acts = plan_pass(s, be, batch, R).total;
  m.io = 3 * (size_t)R * sizeof(int32_t);
  backend_shape sh = pass_shape(s, R, kv_rows);
  m.work = be->workspace_bytes(be, &sh);
  m.total = m.cache + m.acts + m.io + m.work;
  return m;
}

/* ---- open, close ------------------------------------------------------------------------------- */

void gen_open(gen *g, gpt_model *m, int batch, int max_len, const cfg_sample *c, uint64_t seed, gen_mode mode) {
  const gpt_shape *s = &m->s;
  const backend *be = m->be;
  UTIL_CHECK(m->layer_lo == 0 && m->layer_hi == s->L && m->has_embed && m->has_head, NULL,
             "internal: generation needs the whole model on this rank");
  UTIL_CHECK(batch >= 1 && max_len >= 2 && max_len <= s->maxT, NULL, "internal: generation of batch %d, max_len %d",
             batch, max_len);
  UTIL_CHECK(mode == GEN_CACHE || (!m->inference && m->B >= batch && m->T >= max_len), NULL,
             "internal: recomputation needs an activation arena of (%d,%d)", batch, max_len);
  memset(g, 0, sizeof *g);
  g->m = m, g->mode = mode, g->batch = batch, g->max_len = max_len, g->c = c, g->seed = seed;
  g->rows = mode == GEN_CACHE ? pass_rows(batch, max_len) : batch;
  g->mem = gen_plan_memory(s, be, batch, max_len, mode);
  g->ring = util_calloc((size_t)s->L, sizeof *g->ring, "cache rings");
  g->kv_at = util_calloc((size_t)s->L, sizeof *g->kv_at, "cache offsets");
  if (mode == GEN_CACHE) {
    int kv_rows;
    plan_cache(s, be, batch, max_len, g->kv_at, &kv_rows);
    for (int l = 0; l < s->L; l++) g->ring[l] = ring_rows(s, l, max_len);
    backend_shape sh = pass_shape(s, g->rows, kv_rows);
    be->prepare(be, &sh);
    g->kv = be->alloc(be, g->mem.cache);
    g->acts = be->alloc(be, g->mem.acts);
    g->io = be->alloc(be, g->mem.io);
  }
  size_t R = (size_t)(g->rows > batch ? g->rows : batch) * (mode == GEN_CACHE ? 1 : (size_t)max_len);
  g->tok_h = util_calloc(R, sizeof(int32_t), "pass tokens");
  g->seq_h = util_calloc(R, sizeof(int32_t), "pass sequences");
  g->pos_h = util_calloc(R, sizeof(int32_t), "pass positions");
  g->heads = util_calloc((size_t)batch, sizeof(int32_t), "head rows");
  g->who = util_calloc((size_t)batch, sizeof(int32_t), "head prompts");
  g->logits_h = util_malloc((size_t)batch * s->V * sizeof(float), "generation logits");
  g->seqs = util_calloc((size_t)batch, sizeof *g->seqs, "generated sequences");
  for (int i = 0; i < batch; i++) g->seqs[i].tokens = util_malloc((size_t)max_len * sizeof(int32_t), "sequence");
  g->samplers = util_calloc((size_t)batch, sizeof *g->samplers, "samplers");
}

void gen_close(gen *g) {
  const backend *be = g->m->be;
  be->free(be, g->kv);
  be->free(be, g->acts);
  be->free(be, g->io);
  for (int i = 0; i < g->batch; i++) free(g->seqs[i].tokens);
  free(g->seqs), free(g->samplers), free(g->ring), free(g->kv_at), free(g->tok_h), free(g->seq_h), free(g->pos_h);
  free(g->heads), free(g->who), free(g->logits_h);
  memset(g, 0, sizeof *g);
}

/* ---- a pass through the model (GEN_CACHE) ------------------------------------------------------- */

/* Block l on the pass's n rows: x (n,C) in, x out; the rows' k and v join the layer's cache before
 * the attention reads it. The order of block_forward in gpt.c, with attention_cached. */
static void pass_block(gen *g, const pass_layout *a, int l, int n) {
  const gpt_model *m = g->m;
  const backend *be = m->be;
  const gpt_shape *s = &m->s;
  const int C = s->C, F = s->F, Ckv = C / s->H * s->Hkv, W = backend_qkv_width(C, s->H, s->Hkv);
  char *A = g->acts, *kc = (char *)g->kv + g->kv_at[l];
  char *vc = kc + (size_t)g->batch * g->ring[l] * Ckv * backend_dtype_size(be->storage);
  const int32_t *seq = g->io + g->rows, *pos = g->io + 2 * (size_t)g->rows;
  float *mean = (float *)(A + a->mean), *rstd = (float *)(A + a->rstd);
  gpt_block_ptrs p;
  gpt_block_compute(m, l, &p);
  gpt_norm_fwd(s, be, A + a->ln, mean, rstd, A + a->x, p.ln1_w, p.ln1_b, n);
  be->matmul_fwd(be, A + a->qkv, A + a->ln, p.qkv_w, p.qkv_b, n, C, W, W); /* (n,W) */
  if (s->rot) be->rope(be, A + a->qkv, pos, n, n, C, s->H, s->Hkv, s->rot, &s->rope, 1); /* at the rows' positions */
  be->kv_store(be, kc, vc, A + a->qkv, seq, pos, n, C, Ckv, g->ring[l]);
  be->attention_cached(be, A + a->att, A + a->qkv, kc, vc, seq, pos, n, C, s->H, s->Hkv, g->ring[l], s->window[l],
                       s->attn_scale); /* (n,C) */
  be->matmul_fwd(be, A + a->tmp, A + a->att, p.out_w, p.out_b, n, C, C, C);
  if (s->parallel) { /* the MLP sees x too */
    gpt_norm_fwd(s, be, A + a->ln, mean, rstd, A + a->x, p.ln2_w, p.ln2_b, n);
    be->residual_fwd(be, A + a->mid, A + a->x, A + a->tmp, (size_t)n * C);
  } else {
    gpt_residual_norm_fwd(s, be, A + a->mid, A + a->ln, mean, rstd, A + a->x, A + a->tmp, p.ln2_w, p.ln2_b, n);
  }
  gpt_mlp_in_fwd(s, be, A + a->gel, A + a->fc, A + a->ln, p.fc_w, p.fc_b, n, F); /* fc (n,F; SwiGLU 2F), gel (n,F) */
  be->matmul_fwd(be, A + a->tmp, A + a->gel, p.proj_w, p.proj_b, n, F, C, C);
  be->residual_fwd(be, A + a->x, A + a->mid, A + a->tmp, (size_t)n * C);
}

/* x (n,C) = wte[tok] + wpe[pos], one embed_fwd per run of consecutive positions of a sequence (wte alone with
 * rotary embeddings). */
static void pass_embed(gen *g, const pass_layout *a, int n) {
  const gpt_model *m = g->m;
  const backend *be = m->be;
  const size_t row = (size_t)m->s.C * backend_dtype_size(be->storage);
  const char *wte = m->w.ends.wte, *wpe = m->w.ends.wpe;
  for (int r0 = 0, r1; r0 < n; r0 = r1) {
    for (r1 = r0 + 1; r1 < n && g->seq_h[r1] == g->seq_h[r0] && g->pos_h[r1] == g->pos_h[r1 - 1] + 1; r1++) {}
    be->embed_fwd(be, (char *)g->acts + a->x + (size_t)r0 * row, g->io + r0, wte,
                  wpe ? wpe + (size_t)g->pos_h[r0] * row : NULL, 1, r1 - r0, m->s.C, 0, m->s.V);
  }
}

/* logits_h (nh,V) = the head on rows heads[0..nh) of x. */
static void pass_head(gen *g, const pass_layout *a, int nh) {
  const gpt_model *m = g->m;
  const backend *be = m->be;
  const int C = m->s.C, V = m->s.V;
  const size_t row = (size_t)C * backend_dtype_size(be->storage), nv = (size_t)nh * V;
  char *A = g->acts;
  for (int h = 0; h < nh; h++) be->copy(be, A + a->hx + h * row, A + a->x + (size_t)g->heads[h] * row, row);
  gpt_norm_fwd(&m->s, be, A + a->hln, (float *)(A + a->hmean), (float *)(A + a->hrstd), A + a->hx, m->w.ends.lnf_w,
               m->w.ends.lnf_b, nh);
  be->matmul_fwd(be, A + a->logits, A + a->hln, m->w.ends.head, NULL, nh, C, V, V); /* (nh,V) */
  if (be->storage == BACKEND_FP32) {
    be->to_host(be, g->logits_h, A + a->logits, nv * sizeof(float));
    return;
  }
  be->to_fp32(be, (float *)(A + a->wide), A + a->logits, nv);
  be->to_host(be, g->logits_h, A + a->wide, nv * sizeof(float));
}

/* The pass's n rows (tok_h, seq_h, pos_h) through the model, filling the caches; the logits of the
 * nh rows heads[] into logits_h. */
static void pass(gen *g, int n, int nh) {
  const gpt_model *m = g->m;
  const backend *be = m->be;
  const size_t R = (size_t)g->rows, b = (size_t)n * sizeof(int32_t);
  pass_layout a = plan_pass(&m->s, be, g->batch, g->rows);
  be->to_device(be, g->io, g->tok_h, b);
  be->to_device(be, g->io + R, g->seq_h, b);
  be->to_device(be, g->io + 2 * R, g->pos_h, b);
  pass_embed(g, &a, n);
  for (int l = 0; l < m->s.L; l++) pass_block(g, &a, l, n);
  pass_head(g, &a, nh);
}

/* ---- the recomputing reference ------------------------------------------------------------------ */

/* The whole sequences heads-listed (who[0..nh)) through gpt_forward, each in a row of (nh, T) with
 * T the longest (shorter ones padded at the end: causal attention keeps padding out of earlier
 * rows); the logits of each one's last position into logits_h. */
static void recompute(gen *g, int nh) {
  gpt_model *m = g->m;
  int T = 0;
  for (int h = 0; h < nh; h++) T = g->seqs[g->who[h]].len > T ? g->seqs[g->who[h]].len : T;
  memset(g->tok_h, 0, (size_t)nh * T * sizeof(int32_t));
  for (int h = 0; h < nh; h++) {
    const gen_seq *q = &g->seqs[g->who[h]];
    memcpy(g->tok_h + (size_t)h * T, q->tokens, (size_t)q->len * sizeof(int32_t));
  }
  gpt_set_batch(m, 0, g->tok_h, NULL, nh, T);
  gpt_forward(m, 0, nh, T);
  for (int h = 0; h < nh; h++)
    gpt_logits_row(m, 0, (size_t)h * T + (size_t)g->seqs[g->who[h]].len - 1, g->logits_h + (size_t)h * m->s.V);
}

/* ---- the loop ---------------------------------------------------------------------------------- */

/* Draw prompt p's next token from logits, keep it and decide whether its sequence goes on. */
static void emit(gen *g, int p, const float *logits, int n_tokens, const gen_hooks *h) {
  gen_seq *q = &g->seqs[p];
  if (h && h->on_logits) h->on_logits(h->ctx, p, logits);
  int32_t t = sample_next(&g->samplers[p], logits, q->tokens, (size_t)q->len);
  q->tokens[q->len++] = t;
  q->n_new++;
  if (h && h->on_token && h->on_token(h->ctx, p, t)) q->end = GEN_END_STOP;
  else if (h && h->eot >= 0 && g->c->stop_eot && t == h->eot) q->end = GEN_END_EOT;
  else if (q->n_new >= n_tokens) q->end = GEN_END_LENGTH;
  else if (q->len >= g->max_len) q->end = GEN_END_FULL;
}

/* The first token of every prompt: the prompts in passes of up to `rows` rows, at most GEN_CHUNK of
 * a sequence per pass (the local layers' rings hold a window plus that many). */
static void prefill(gen *g, int n, int n_tokens, const gen_hooks *h) {
  const int chunk = g->max_len < GEN_CHUNK ? g->max_len : GEN_CHUNK;
  int i = 0, at = 0; /* the next prompt position to feed */
  while (i < n) {
    int rows = 0, nh = 0;
    while (i < n && rows < g->rows) {
      const gen_seq *q = &g->seqs[i];
      int k = q->len - at;
      k = k < chunk ? k : chunk;
      k = k < g->rows - rows ? k : g->rows - rows;
      for (int j = 0; j < k; j++, rows++) g->tok_h[rows] = q->tokens[at + j], g->seq_h[rows] = i, g->pos_h[rows] = at + j;
      at += k;
      if (at < q->len) break; /* this sequence goes on in the next pass */
      g->heads[nh] = rows - 1, g->who[nh++] = i++, at = 0;
    }
    pass(g, rows, nh);
    for (int j = 0; j < nh; j++) emit(g, g->who[j], g->logits_h + (size_t)j * g->m->s.V, n_tokens, h);
  }
}

/* One token more for every running sequence; returns how many ran. */
static int decode_step(gen *g, int n, int n_tokens, const gen_hooks *h) {
  int nh = 0;
  for (int i = 0; i < n; i++) {
    const gen_seq *q = &g->seqs[i];
    if (q->end != GEN_RUNNING) continue;
    g->tok_h[nh] = q->tokens[q->len - 1], g->seq_h[nh] = i, g->pos_h[nh] = q->len - 1;
    g->heads[nh] = nh, g->who[nh] = i, nh++;
  }
  if (nh == 0) return 0;
  if (g->mode == GEN_CACHE) pass(g, nh, nh);
  else recompute(g, nh);
  for (int j = 0; j < nh; j++) emit(g, g->who[j], g->logits_h + (size_t)j * g->m->s.V, n_tokens, h);
  return nh;
}

void gen_run(gen *g, const int32_t *const *prompts, const int *lens, int n, int first, int n_tokens,
             const gen_hooks *h) {
  UTIL_CHECK(n >= 1 && n <= g->batch, NULL, "internal: %d prompts for a generator of %d", n, g->batch);
  memset(&g->timing, 0, sizeof g->timing);
  for (int i = 0; i < n; i++) {
    UTIL_CHECK(lens[i] >= 1, NULL, "internal: prompt %d is empty", i);
    gen_seq *q = &g->seqs[i];
    int keep = lens[i] < g->max_len ? lens[i] : g->max_len - 1;
    memcpy(q->tokens, prompts[i] + (lens[i] - keep), (size_t)keep * sizeof(int32_t));
    q->len = q->n_prompt = keep, q->n_new = 0;
    q->end = n_tokens > 0 ? GEN_RUNNING : GEN_END_LENGTH;
    g->timing.prefill_tokens += keep;
    sample_init(&g->samplers[i], g->c, g->m->s.V, g->seed, (uint64_t)(first + i));
  }
  double t0 = util_now();
  if (n_tokens > 0) {
    if (g->mode == GEN_CACHE) prefill(g, n, n_tokens, h);
    else {
      for (int i = 0; i < n; i++) g->who[i] = i;
      recompute(g, n);
      for (int i = 0; i < n; i++) emit(g, i, g->logits_h + (size_t)i * g->m->s.V, n_tokens, h);
    }
  }
  double t1 = util_now();
  int ran;
  while ((ran = decode_step(g, n, n_tokens, h)) > 0) g->timing.decode_tokens += ran;
  g->timing.prefill_s = t1 - t0;
  g->timing.decode_s = util_now() - t1;
  g->timing.decode_tps = g->timing.decode_s > 0 ? (double)g->timing.decode_tokens / g->timing.decode_s : 0.0;
  for (int i = 0; i < n; i++) sample_free(&g->samplers[i]);
}
