/* cpu_storage: the CPU backend's ops at every storage type.
 *
 * The kernels (cpu_ops.c, cpu_matmul.c, cpu_attention.c) compute in fp32 on fp32 arrays. At fp32
 * storage the ops below hand them the backend's arrays directly. At bf16 or fp16 storage each op
 * stages its 16-bit operands: inputs are widened into fp32 buffers of the instance's workspace,
 * the kernel runs, and its outputs are rounded (to nearest even) back into storage. Accumulating
 * outputs ("+=") are widened first, so the sum is formed in fp32 and rounded once, as a GPU
 * kernel that reads, adds and stores a 16-bit value does. This makes the CPU the reference of the
 * 16-bit paths, not a fast implementation of them: it computes as fast as at fp32 and saves no
 * memory (the workspace holds the widened operands of the largest op). */
#include <string.h>

#include "cpu.h"
#include "base/lowrank_core.h"
#include "base/util.h"

/* ---- conversions ------------------------------------------------------------------------------- */

static inline uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* fp32 -> bf16, round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t to_bf16(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t h) { return from_bits((uint32_t)h << 16); }

/* fp32 -> fp16 (IEEE binary16), round to nearest even, with subnormals; beyond the largest half
 * (65504, and everything that rounds past it) +-inf; NaN stays NaN. */
static inline uint16_t to_fp16(float f) {
  uint32_t u = bits(f), sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u >= 0x47800000u) /* >= 65536, inf or NaN */
    return (uint16_t)(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (u < 0x38800000u) { /* below 2^-14: a subnormal half; adding 0.5 aligns its bits, rounding once */
    float r = from_bits(u) + 0.5f;
    return (uint16_t)(sign | (bits(r) - bits(0.5f)));
  }
  uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd; /* rebias the exponent (-112 << 23) and round; a carry reaches inf */
  return (uint16_t)(sign | (u >> 13));
}
static inline float from_fp16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return from_bits(sign | 0x7f800000u | (m << 13)); /* inf, NaN */
  if (e == 0) return (m ? (float)m * 0x1p-24f : 0.0f) * (sign ? -1.0f : 1.0f);
  return from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

void cpu_store(backend_dtype t, void *dst, const float *src, size_t n) {
  uint16_t *d = dst;
  if (t == BACKEND_FP32) memmove(dst, src, n * sizeof(float));
  else if (t == BACKEND_BF16)
    for (size_t i = 0; i < n; i++) d[i] = to_bf16(src[i]);
  else
    for (size_t i = 0; i < n; i++) d[i] = to_fp16(src[i]);
}

void cpu_load(backend_dtype t, float *dst, const void *src, size_t n) {
  const uint16_t *s = src;
  if (t == BACKEND_FP32) memmove(dst, src, n * sizeof(float));
  else if (t == BACKEND_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = from_bf16(s[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = from_fp16(s[i]);
}

/* ---- staging ----------------------------------------------------------------------------------- */

enum { STAGE_MAX = 6, STAGE_ALIGN = 16 /* floats: 64-byte aligned buffers for OpenBLAS */ };

typedef struct {
  const backend *be;
  cpu_ctx *c;
  size_t used; /* floats of the workspace taken */
  int nout;
  struct {
    void *dst;
    float *tmp;
    size_t rows, cols, ld; /* dst's rows are ld elements apart; tmp is dense */
  } out[STAGE_MAX];
} stage;

static stage stage_begin(const backend *be) { return (stage){.be = be, .c = be->ctx}; }

static float *take(stage *s, size_t n) {
  size_t at = s->used;
  s->used += (n + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
  UTIL_CHECK(s->used <= s->c->work_floats, NULL,
             "internal: the CPU backend's workspace (%zu floats) is smaller than an op needs (%zu); prepare was "
             "given smaller shapes",
             s->c->work_floats, s->used);
  return s->c->work + at;
}

/* Row r of a matrix p whose rows are ld elements apart, in the storage type. */
static void *row_of(const stage *s, const void *p, size_t r, size_t ld) {
  return (char *)p + r * ld * backend_dtype_size(s->be->storage);
}

/* An input matrix (rows, cols; rows ld apart) as dense fp32 (NULL stays NULL; at fp32 storage, p
 * itself, rows still ld apart: stage_ld says which). */
static const float *in_rows(stage *s, const void *p, size_t rows, size_t cols, size_t ld) {
  if (!p || s->be->storage == BACKEND_FP32) return p;
  float *t = take(s, rows * cols);
  for (size_t r = 0; r < rows; r++) cpu_load(s->be->storage, t + r * cols, row_of(s, p, r, ld), cols);
  return t;
}

/* An input of n elements as fp32. */
static const float *in(stage *s, const void *p, size_t n) { return in_rows(s, p, 1, n, n); }

/* An output matrix (rows, cols; rows ld apart) as dense fp32, written back by stage_end; widened
 * first when it accumulates. */
static float *out_rows(stage *s, void *p, size_t rows, size_t cols, size_t ld, int accumulates) {
  if (!p || s->be->storage == BACKEND_FP32) return p;
  float *t = take(s, rows * cols);
  if (accumulates)
    for (size_t r = 0; r < rows; r++) cpu_load(s->be->storage, t + r * cols, row_of(s, p, r, ld), cols);
  s->out[s->nout].dst = p, s->out[s->nout].tmp = t;
  s->out[s->nout].rows = rows, s->out[s->nout].cols = cols, s->out[s->nout].ld = ld;
  s->nout++;
  return t;
}

/* An output of n elements as fp32. */
static float *out(stage *s, void *p, size_t n, int accumulates) { return out_rows(s, p, 1, n, n, accumulates); }

/* The row stride the kernels see: the caller's at fp32 storage, dense (cols) when staged. */
static int stage_ld(const stage *s, int cols, int ld) { return s->be->storage == BACKEND_FP32 ? ld : cols; }

static void stage_end(stage *s) {
  for (int i = 0; i < s->nout; i++)
    for (size_t r = 0; r < s->out[i].rows; r++)
      cpu_store(s->be->storage, row_of(s, s->out[i].dst, r, s->out[i].ld), s->out[i].tmp + r * s->out[i].cols,
                s->out[i].cols);
}

size_t cpu_stage_floats(backend_dtype t, const backend_shape *sh) {
  if (t == BACKEND_FP32) return 0;
  size_t N = (size_t)sh->B * sh->T, C = (size_t)sh->C, F = (size_t)sh->F, V = (size_t)sh->V;
  size_t need[] = {
      3 * N * C + C,                   /* layernorm: dinp, dout, inp, w */
      N * V + N * C + V * C + V,       /* matmul_fwd, the LM head: out, inp, w (bias) */
      N * C + N * V + N * C + V * C,   /* matmul_bwd, the LM head: dinp, dout, inp, w */
      2 * N * F + N * C + F * C + F,   /* matmul_gelu_fwd: out, pre, inp, w (bias) */
      3 * N * F + N * C + F * C,       /* matmul_dgelu_bwd: dpre, dout, inp, pre, w */
      8 * N * C,                       /* attention_bwd: dqkv, dout, out, qkv */
      3 * N * C,                       /* residual */
      4 * N * C + 2 * (size_t)sh->kv_rows * C, /* attention_cached: qkv, out, the caches */
  };
  size_t most = 0;
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) most = need[i] > most ? need[i] : most;
  return most + STAGE_MAX * STAGE_ALIGN;
}

/* ---- the ops ----------------------------------------------------------------------------------- */

#define SZ(n) ((size_t)(n))

void cpu_op_embed_fwd(const backend *be, void *o, const int32_t *tok, const void *wte, const void *wpe, int B, int T,
                      int C, int v0, int nv) {
  if (be->storage == BACKEND_FP32) {
    cpu_embed_fwd(o, tok, wte, wpe, B, T, C, v0, nv);
    return;
  }
  stage s = stage_begin(be); /* row by row: only the rows the tokens pick are widened */
  const size_t es = backend_dtype_size(be->storage);
  float *x = take(&s, SZ(C)), *p = take(&s, SZ(C));
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int r = tok[b * T + t] - v0;
      if (r >= 0 && r < nv) cpu_load(be->storage, x, (const char *)wte + SZ(r) * C * es, SZ(C));
      else memset(x, 0, SZ(C) * sizeof(float));
      if (wpe) {
        cpu_load(be->storage, p, (const char *)wpe + SZ(t) * C * es, SZ(C));
        cpu_residual_fwd(x, x, p, SZ(C));
      }
      cpu_store(be->storage, (char *)o + (SZ(b) * T + t) * C * es, x, SZ(C));
    }
}

void cpu_op_embed_bwd(const backend *be, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B, int T,
                      int C, int v0, int nv) {
  stage s = stage_begin(be);
  cpu_embed_bwd(dwte, dwpe, in(&s, dout, SZ(B) * T * C), tok, B, T, C, v0, nv);
}

void cpu_op_layernorm_fwd(const backend *be, void *o, float *mean, float *rstd, const void *inp, const void *w,
                          const void *b, int N, int C, float eps) {
  stage s = stage_begin(be);
  float *y = out(&s, o, SZ(N) * C, 0);
  const float *x = in(&s, inp, SZ(N) * C), *wf = in(&s, w, SZ(C)), *bf = in(&s, b, SZ(C));
  cpu_layernorm_fwd(y, mean, rstd, x, wf, bf, N, C, eps);
  stage_end(&s);
}

void cpu_op_residual_layernorm_fwd(const backend *be, void *res, void *o, float *mean, float *rstd, const void *a,
                                   const void *b, const void *w, const void *bias, int N, int C, float eps) {
  cpu_op_residual_fwd(be, res, a, b, SZ(N) * C);
  cpu_op_layernorm_fwd(be, o, mean, rstd, res, w, bias, N, C, eps);
}

/* acc = 0: the parameters' gradients a (na) and b (nb, b may be NULL) are overwritten: zeroed before the sums */
static void fresh(int acc, float *a, size_t na, float *b, size_t nb) {
  if (acc) return;
  memset(a, 0, na * sizeof *a);
  if (b) memset(b, 0, nb * sizeof *b);
}

void cpu_op_layernorm_bwd(const backend *be, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                          const void *w, const float *mean, const float *rstd, int N, int C, int acc) {
  fresh(acc, dw, SZ(C), db, SZ(C));
  stage s = stage_begin(be);
  float *dx = out(&s, dinp, SZ(N) * C, 1);
  const float *d = in(&s, dout, SZ(N) * C), *x = in(&s, inp, SZ(N) * C), *wf = in(&s, w, SZ(C));
  cpu_layernorm_bwd(dx, dw, db, d, x, wf, mean, rstd, N, C);
  stage_end(&s);
}

/* At 16-bit storage the normalized row is rounded before its product with the weight (Hugging Face's order). */
void cpu_op_rmsnorm_fwd(const backend *be, void *o, float *rstd, const void *inp, const void *w, int N, int C,
                        float eps) {
  stage s = stage_begin(be);
  float *y = out(&s, o, SZ(N) * C, 0);
  const float *x = in(&s, inp, SZ(N) * C), *wf = in(&s, w, SZ(C));
  const int wide = be->storage == BACKEND_FP32;
  cpu_rmsnorm_fwd(y, rstd, x, wide ? wf : NULL, N, C, eps);
  if (!wide) {
    cpu_store(be->storage, o, y, SZ(N) * C), cpu_load(be->storage, y, o, SZ(N) * C);
    cpu_mul_rows(y, wf, N, C);
  }
  stage_end(&s);
}

void cpu_op_rmsnorm_bwd(const backend *be, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                        const float *rstd, int N, int C, int acc) {
  fresh(acc, dw, SZ(C), NULL, 0);
  stage s = stage_begin(be);
  float *dx = out(&s, dinp, SZ(N) * C, 1);
  const float *d = in(&s, dout, SZ(N) * C), *x = in(&s, inp, SZ(N) * C), *wf = in(&s, w, SZ(C));
  cpu_layernorm_bwd(dx, dw, NULL, d, x, wf, NULL, rstd, N, C);
  stage_end(&s);
}

void cpu_op_swiglu_fwd(const backend *be, void *h, const void *gu, int N, int F) {
  stage s = stage_begin(be);
  float *y = out(&s, h, SZ(N) * F, 0);
  cpu_swiglu_fwd(y, in(&s, gu, SZ(N) * 2 * F), N, F);
  stage_end(&s);
}

void cpu_op_swiglu_bwd(const backend *be, void *dgu, const void *dh, const void *gu, int N, int F) {
  stage s = stage_begin(be);
  float *dx = out(&s, dgu, SZ(N) * 2 * F, 0);
  const float *d = in(&s, dh, SZ(N) * F), *x = in(&s, gu, SZ(N) * 2 * F);
  cpu_swiglu_bwd(dx, d, x, N, F);
  stage_end(&s);
}

void cpu_op_matmul_fwd(const backend *be, void *o, const void *inp, const void *w, const void *bias, int N, int K,
                       int M, int ldo) {
  stage s = stage_begin(be);
  float *y = out_rows(&s, o, SZ(N), SZ(M), SZ(ldo), 0);
  const float *x = in(&s, inp, SZ(N) * K), *wf = in(&s, w, SZ(M) * K), *bf = in(&s, bias, SZ(M));
  cpu_matmul_fwd(y, x, wf, bf, N, K, M, stage_ld(&s, M, ldo));
  stage_end(&s);
}

void cpu_op_matmul_bwd(const backend *be, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                       const void *w, int N, int K, int M, int ldo, int acc) {
  fresh(acc, dw, SZ(M) * K, dbias, SZ(M));
  stage s = stage_begin(be);
  float *dx = out(&s, dinp, SZ(N) * K, 0);
  const float *d = in_rows(&s, dout, SZ(N), SZ(M), SZ(ldo)), *x = in(&s, inp, SZ(N) * K), *wf = in(&s, w, SZ(M) * K);
  cpu_matmul_bwd(dx, dw, dbias, d, x, wf, N, K, M, stage_ld(&s, M, ldo));
  stage_end(&s);
}

void cpu_op_attention_fwd(const backend *be, void *o, float *lse, const void *qkv, void *scratch, int B, int T, int C,
                          int H, int Hkv, int window, float scale) {
  stage s = stage_begin(be);
  float *y = out(&s, o, SZ(B) * T * C, 0);
  const size_t W = SZ(backend_qkv_width(C, H, Hkv)); /* a qkv row */
  cpu_attention_fwd(y, lse, in(&s, qkv, SZ(B) * T * W), scratch, B, T, C, H, Hkv, window, scale);
  stage_end(&s);
}

void cpu_op_attention_bwd(const backend *be, void *dqkv, const void *dout, const void *o, const float *lse,
                          const void *qkv, void *scratch, int B, int T, int C, int H, int Hkv, int window,
                          float scale) {
  stage s = stage_begin(be);
  const size_t n = SZ(B) * T * C, nqkv = SZ(B) * T * SZ(backend_qkv_width(C, H, Hkv));
  float *dx = out(&s, dqkv, nqkv, 0);
  const float *d = in(&s, dout, n), *y = in(&s, o, n), *x = in(&s, qkv, nqkv);
  cpu_attention_bwd(dx, d, y, lse, x, scratch, B, T, C, H, Hkv, window, scale);
  stage_end(&s);
}

/* The activation is applied to the fp32 products before either output is rounded, as a GEMM
 * epilogue does. */
void cpu_op_matmul_gelu_fwd(const backend *be, void *o, void *pre, const void *inp, const void *w, const void *bias,
                            int N, int K, int M, int act) {
  stage s = stage_begin(be);
  float *y = out(&s, o, SZ(N) * M, 0), *p = out(&s, pre, SZ(N) * M, 0);
  const float *x = in(&s, inp, SZ(N) * K), *wf = in(&s, w, SZ(M) * K), *bf = in(&s, bias, SZ(M));
  cpu_matmul_fwd(p, x, wf, bf, N, K, M, M);
  cpu_gelu_fwd(y, p, SZ(N) * M, act);
  stage_end(&s);
}

void cpu_op_matmul_dgelu_bwd(const backend *be, void *dpre, float *dw, float *dbias, const void *dout, const void *inp,
                             const void *pre, const void *w, int N, int K, int M, int acc, int act) {
  fresh(acc, dw, SZ(M) * K, dbias, SZ(M));
  stage s = stage_begin(be);
  float *dx = out(&s, dpre, SZ(N) * K, 0);
  const float *d = in(&s, dout, SZ(N) * M), *x = in(&s, inp, SZ(N) * K), *p = in(&s, pre, SZ(N) * K);
  const float *wf = in(&s, w, SZ(M) * K);
  cpu_matmul_bwd(dx, dw, dbias, d, x, wf, N, K, M, M);
  cpu_gelu_bwd(dx, dx, p, SZ(N) * K, act);
  stage_end(&s);
}

void cpu_op_rope(const backend *be, void *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot,
                 const backend_rope *rope, int sign) {
  stage s = stage_begin(be);
  float *x = out(&s, qkv, SZ(N) * SZ(backend_qkv_width(C, H, Hkv)), 1);
  cpu_rope(x, pos, N, T, C, H, Hkv, rot, rope, sign);
  stage_end(&s);
}

void cpu_op_residual_fwd(const backend *be, void *o, const void *a, const void *b, size_t n) {
  stage s = stage_begin(be);
  float *y = out(&s, o, n, 0);
  const float *af = in(&s, a, n), *bf = in(&s, b, n);
  cpu_residual_fwd(y, af, bf, n);
  stage_end(&s);
}

void cpu_op_accumulate(const backend *be, void *dst, const void *src, size_t n) {
  stage s = stage_begin(be);
  float *d = out(&s, dst, n, 1);
  cpu_accumulate(d, in(&s, src, n), n);
  stage_end(&s);
}

void cpu_op_xent_fwd_bwd(const backend *be, float *losses, void *logits, const int32_t *targets, int N, int V, int ld,
                         float dscale) {
  stage s = stage_begin(be);
  float *x = out_rows(&s, logits, SZ(N), SZ(V), SZ(ld), 1);
  cpu_xent_fwd_bwd(losses, x, targets, N, V, stage_ld(&s, V, ld), dscale);
  stage_end(&s);
}

void cpu_op_xent_part(const backend *be, float *part, const void *logits, const int32_t *targets, int N, int nv, int v0,
                      int ld) {
  stage s = stage_begin(be);
  cpu_xent_part(part, in_rows(&s, logits, SZ(N), SZ(nv), SZ(ld)), targets, N, nv, v0, stage_ld(&s, nv, ld));
}

void cpu_op_xent_grad(const backend *be, void *logits, const float *lse, const int32_t *targets, int N, int nv, int v0,
                      int ld, float dscale) {
  stage s = stage_begin(be);
  float *x = out_rows(&s, logits, SZ(N), SZ(nv), SZ(ld), 1);
  cpu_xent_grad(x, lse, targets, N, nv, v0, stage_ld(&s, nv, ld), dscale);
  stage_end(&s);
}

void cpu_op_adamw(const backend *be, float *p, void *pc, const float *g, float *m, float *v, size_t n,
                  const backend_adamw_args *a) {
  if (cpu_adamw(p, g, m, v, n, a) && pc) cpu_store(be->storage, pc, p, n);
}

void cpu_op_reduce_sum(const backend *be, double *acc, const float *x, size_t n, int square) {
  (void)be;
  *acc += square ? cpu_sumsq(x, n) : cpu_dsum(x, n);
}

void cpu_op_to_storage(const backend *be, void *dst, const float *src, size_t n) { cpu_store(be->storage, dst, src, n); }

void cpu_op_to_fp32(const backend *be, float *dst, const void *src, size_t n) { cpu_load(be->storage, dst, src, n); }

void cpu_op_kv_store(const backend *be, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos,
                     int N, int C, int Ckv, int ring) {
  cpu_kv_store(backend_dtype_size(be->storage), kc, vc, qkv, seq, pos, N, C, Ckv, ring);
}

void cpu_op_attention_cached(const backend *be, void *o, const void *qkv, const void *kc, const void *vc,
                             const int32_t *seq, const int32_t *pos, int N, int C, int H, int Hkv, int ring,
                             int window, float scale) {
  int nseq = 0; /* the sequences whose caches are widened: up to the largest one named */
  for (int r = 0; r < N; r++) nseq = seq[r] + 1 > nseq ? seq[r] + 1 : nseq;
  stage s = stage_begin(be);
  const size_t Ckv = SZ(C / H) * Hkv, kv = SZ(nseq) * ring * Ckv;
  float *y = out(&s, o, SZ(N) * C, 0);
  const float *x = in(&s, qkv, SZ(N) * SZ(backend_qkv_width(C, H, Hkv))), *k = in(&s, kc, kv), *v = in(&s, vc, kv);
  cpu_attention_cached(y, x, k, v, seq, pos, N, C, H, Hkv, ring, window, scale);
  stage_end(&s);
}

void cpu_op_quant_encode(const backend *be, uint8_t *msg, float *v, float *ef, const quant_seg *seg, int nseg,
                         const quant_scheme *q, uint64_t key) {
  (void)be;
  quant_encode_segs(q, seg, nseg, v, ef, key, msg);
}

void cpu_op_quant_decode(const backend *be, float *out, const uint8_t *msg, size_t base, const quant_seg *seg, int nseg,
                         const quant_scheme *q, int add) {
  (void)be;
  quant_decode_segs(q, seg, nseg, msg, base, out, add);
}

/* PowerSGD's factors in lowrank_core.h's orders (right's rows outside, each Q[j,k] still summed in row order). */
void cpu_op_lowrank_left(const backend *be, float *P, float *M, float *ef, const float *Q, size_t n, size_t m, int r) {
  (void)be;
  if (ef)
    for (size_t i = 0; i < n * m; i++) M[i] += ef[i];
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < r; k++) P[i * SZ(r) + SZ(k)] = lr_left(M, Q, m, r, i, k);
}

void cpu_op_lowrank_right(const backend *be, float *Q, const float *M, const float *P, size_t n, size_t m, int r) {
  (void)be;
  memset(Q, 0, m * SZ(r) * sizeof *Q);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < m; j++)
      for (int k = 0; k < r; k++) Q[j * SZ(r) + SZ(k)] = Q[j * SZ(r) + SZ(k)] + M[i * m + j] * P[i * SZ(r) + SZ(k)];
}

/* The dot product of columns a and b of P (n,r): the lanes, then halved pairwise. */
static float lane_dot(const float *P, size_t n, int r, int a, int b) {
  float lane[LR_LANES];
  for (int t = 0; t < LR_LANES; t++) lane[t] = lr_lane(P, n, r, a, b, t);
  for (int h = LR_LANES / 2; h > 0; h /= 2)
    for (int t = 0; t < h; t++) lane[t] = lane[t] + lane[t + h];
  return lane[0];
}

void cpu_op_lowrank_orth(const backend *be, float *P, size_t n, int r) {
  (void)be;
  for (int a = 0; a < r; a++) {
    const float sumsq = lane_dot(P, n, r, a, a);
    for (size_t i = 0; i < n; i++) P[i * SZ(r) + SZ(a)] = lr_unit(P[i * SZ(r) + SZ(a)], sumsq);
    for (int b = a + 1; b < r; b++) {
      const float d = lane_dot(P, n, r, a, b);
      for (size_t i = 0; i < n; i++) P[i * SZ(r) + SZ(b)] = P[i * SZ(r) + SZ(b)] - d * P[i * SZ(r) + SZ(a)];
    }
  }
}

void cpu_op_lowrank_expand(const backend *be, float *M, const float *P, const float *Q, size_t n, size_t m, int r,
                           int sub) {
  (void)be;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < m; j++) {
      const float y = lr_expand(P, Q, r, i, j);
      M[i * m + j] = sub ? M[i * m + j] - y : y;
    }
}
