/* test_gpu_parity: the CUDA backend against the CPU backend (the reference), op by op and for
 * whole training steps, in eight modes: the precisions fp32, tf32, bf16 and fp16 at fp32 storage,
 * then bf16 and fp16 storage (activations and the parameters' compute copy in 16 bits) against the
 * CPU at the same storage type, twice: with the libraries' paths (attention in cuDNN where built,
 * the GEMMs' epilogues in cuBLASLt), then with greenlm's own kernels (GREENLM_ATTENTION=kernels,
 * GREENLM_EPILOGUES=kernels).
 *
 * Every op of the backend table, forward and backward, runs on both backends on the same inputs
 * (rounded to the storage type where they are stored in it), for several shapes (row, key and
 * tile counts that are not multiples of the kernels' tiles; global and local attention, windows
 * shorter than a tile, several sequences; every head-size class of both families of attention
 * kernels). Accumulating outputs start from random values so "+=" is checked. The error of a
 * tensor is max |gpu - cpu| / max |cpu|; the bounds:
 *   elementwise, LayerNorm, embedding (whole and a vocabulary shard), softmax/cross-entropy (whole
 *     and vocabulary-parallel), AdamW: 1e-4 (fp32 math in every mode; only the order of sums and
 *     the exp differ)
 *   GEMMs: fp32 2e-5 (K up to 512), tf32 and fp16 inputs (10-bit mantissa) 5e-3, bf16 (7-bit) 3e-2;
 *     at 16-bit storage the inputs are the same 16-bit values on both sides: 2e-5; with gelu_new
 *     or its gradient after them (the MLP's fused pair) at least 1e-4
 *   attention (att_tol): 1e-4 on the fp32 kernels (fp32 and tf32 precision; other head sizes);
 *     the tensor-core kernels, which take bf16 and fp16 precision for head sizes 33..128 and round
 *     q, k, v, dO, P and dS, as the GEMMs: bf16 3e-2, fp16 5e-3, as does cuDNN (16-bit storage, head
 *     sizes that are multiples of 8). q and k are drawn with standard
 *     deviation hs^-1/4, so that q.k has variance 1 as in a trained model: with N(0,1) entries the
 *     softmax is all but one-hot, which hides a wrong mask and magnifies the rounding of bf16
 *   a result stored in 16 bits: at least 8e-3 (bf16) or 1e-3 (fp16), half an ulp either way
 *   the compressed exchange's encoder and decoder (quant_encode, quant_decode): bit for bit, for
 *     every level set, with and without error feedback (messages, values, residuals, decoded sums)
 * Then a tiny GPT-Neo (global and local layers) trains 4 steps on each backend from the same
 * initialisation and data in each mode (fp16 with dynamic loss scaling): losses within 1e-4
 * (fp32) or 3e-2 relative, parameters within 1e-3 (fp32) or 5e-2 of the largest.
 *
 * It needs a build configured --with-cuda and a GPU; otherwise it prints SKIP and exits 77. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "model/backend.h"
#include "deck/cfg.h"
#include "text/prepare.h"
#include "base/rng.h"
#include "testing.h"
#include "testdeck.h"
#include "testquant.h"
#include "trainer.h"
#include "base/util.h"

#ifdef GREENLM_HAVE_CUDA

static const backend *cpu, *gpu;
static rng_state R;
static const char *prec; /* the precision under test */
static int s16;          /* the storage type is bf16 or fp16 (both instances store it) */
static int cudnn_att;    /* attention at 16-bit storage goes to cuDNN (GREENLM_ATTENTION=auto, built with it) */

static float *frand(size_t n, double scale) {
  float *x = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&R));
  return x;
}
static int32_t *irand(size_t n, int below) {
  int32_t *x = malloc((n ? n : 1) * sizeof(int32_t));
  for (size_t i = 0; i < n; i++) x[i] = (int32_t)rng_below(&R, (uint64_t)below);
  return x;
}
/* A device copy of host memory. */
static void *up(const void *h, size_t bytes) {
  void *d = gpu->alloc(gpu, bytes);
  gpu->to_device(gpu, d, h, bytes);
  return d;
}

/* A tensor on both backends, from the same values: the CPU's copy c (host memory) and the GPU's g,
 * n elements in the storage type (typed: activations, weights' compute copies) or in fp32. */
typedef struct {
  void *c, *g;
  size_t n;
  int typed;
} pair;

static size_t esize(int typed) { return typed ? backend_dtype_size(cpu->storage) : sizeof(float); }

static pair from(const float *x, size_t n, int typed) {
  pair p = {.c = malloc(n * esize(typed) + 4), .n = n, .typed = typed};
  if (typed) cpu->to_storage(cpu, p.c, x, n); /* the CPU's memory is host memory */
  else memcpy(p.c, x, n * sizeof(float));
  p.g = up(p.c, n * esize(typed));
  return p;
}
static pair mk(size_t n, double scale, int typed) {
  float *x = frand(n, scale);
  pair p = from(x, n, typed);
  free(x);
  return p;
}
static float *widen(const void *h, size_t n, int typed) {
  float *x = malloc(n * sizeof(float) + 4);
  if (typed) cpu->to_fp32(cpu, x, h, n);
  else memcpy(x, h, n * sizeof(float));
  return x;
}
static void drop(pair *p) {
  free(p->c);
  gpu->free(gpu, p->g);
}

/* Half a unit in the last place of a 16-bit value, as a relative error: results stored in bf16 or
 * fp16 may round to neighbours on the two backends. */
static double tol16(void) {
  return cpu->storage == BACKEND_BF16 ? 8e-3 : cpu->storage == BACKEND_FP16 ? 1e-3 : 0.0;
}
/* Compare the GPU's copy of p with the CPU's: max |gpu - cpu| / max |cpu| <= tol (for a tensor in
 * the storage type, at least tol16()). */
static void check(const char *what, const pair *p, double tol) {
  if (p->typed && tol16() > tol) tol = tol16();
  void *h = malloc(p->n * esize(p->typed) + 4);
  gpu->to_host(gpu, h, p->g, p->n * esize(p->typed));
  float *a = widen(h, p->n, p->typed), *b = widen(p->c, p->n, p->typed);
  double e = t_rel_err(a, b, p->n);
  T_CHECK(e <= tol, "%s [%s, %s storage]: relative error %.3g > %.1e", what, prec, backend_dtype_name(cpu->storage), e,
          tol);
  printf("  %-44s %-4s %-4s rel err %.2e (bound %.0e)\n", what, prec, backend_dtype_name(cpu->storage), e, tol);
  free(h), free(a), free(b);
}

/* Workspaces are planned from the largest shapes an instance will be given (the CPU at 16-bit
 * storage widens its operands to fp32 in its own: cpu_stage_floats): each case plans its shapes on
 * both (prepare only grows them). */
static void plan(backend_shape sh) {
  cpu->prepare(cpu, &sh);
  gpu->prepare(gpu, &sh);
}

static double gemm_tol(void) {
  if (s16) return 2e-5; /* 16-bit inputs, exact products, fp32 sums: the order of the sums only */
  return !strcmp(prec, "fp32") ? 2e-5 : !strcmp(prec, "bf16") ? 3e-2 : 5e-3;
}
static const double TOL = 1e-4; /* fp32 math outside the GEMMs */
/* Attention of head size hs: the CUDA backend's tensor-core kernels (bf16 and fp16 precision, hs
 * 33..128) round their inputs, P and dS as the GEMMs do; the fp32 kernels take the rest; at 16-bit
 * storage cuDNN (where built, unless the mode asks for greenlm's kernels) takes head sizes that are
 * multiples of 8. */
static double att_tol(int hs) {
  if (cudnn_att && hs % 8 == 0) return !strcmp(prec, "bf16") ? 3e-2 : 5e-3; /* cuDNN rounds P as the GEMMs do */
  if (hs <= 32 || hs > 128 || !strcmp(prec, "fp32") || !strcmp(prec, "tf32")) return TOL;
  return !strcmp(prec, "bf16") ? 3e-2 : 5e-3;
}

/* ---- ops --------------------------------------------------------------------------------------- */

/* Tokens (B,T) over a vocabulary of V; wte holds the rows [v0, v0 + nv) (0, V: the whole; else a
 * tensor rank's shard, which tokens on both sides miss); with_wpe 0: wpe and dwpe NULL. */
static void test_embed(int B, int T, int C, int V, int v0, int nv, int with_wpe) {
  char w[128];
  size_t N = (size_t)B * T;
  plan((backend_shape){.B = B, .T = T, .C = C, .V = nv});
  int32_t *tok = irand(N, V); /* repeated tokens: several rows into one */
  int32_t *gtok = up(tok, N * sizeof(int32_t));
  pair wte = mk((size_t)nv * C, 1, 1), wpe = mk((size_t)T * C, 1, 1), dout = mk(N * C, 1, 1), out = mk(N * C, 1, 1);
  pair dwte = mk((size_t)nv * C, 1, 0), dwpe = mk((size_t)T * C, 1, 0);
  cpu->embed_fwd(cpu, out.c, tok, wte.c, with_wpe ? wpe.c : NULL, B, T, C, v0, nv);
  gpu->embed_fwd(gpu, out.g, gtok, wte.g, with_wpe ? wpe.g : NULL, B, T, C, v0, nv);
  snprintf(w, sizeof w, "embed fwd B=%d T=%d C=%d V=%d rows %d..%d%s", B, T, C, V, v0, v0 + nv,
           with_wpe ? "" : " (no wpe)");
  check(w, &out, TOL);
  cpu->embed_bwd(cpu, dwte.c, with_wpe ? dwpe.c : NULL, dout.c, tok, B, T, C, v0, nv);
  gpu->embed_bwd(gpu, dwte.g, with_wpe ? dwpe.g : NULL, dout.g, gtok, B, T, C, v0, nv);
  check("  bwd dwte +=", &dwte, TOL);
  check(with_wpe ? "  bwd dwpe +=" : "  bwd dwpe (NULL: untouched)", &dwpe, with_wpe ? TOL : 0.0);
  /* no atomics: the backward from the same start gives the same bits every time */
  size_t bytes = (size_t)nv * C * sizeof(float);
  float *run[2] = {malloc(bytes), malloc(bytes)};
  for (int k = 0; k < 2; k++) {
    gpu->zero(gpu, dwte.g, bytes);
    gpu->embed_bwd(gpu, dwte.g, NULL, dout.g, gtok, B, T, C, v0, nv);
    gpu->to_host(gpu, run[k], dwte.g, bytes);
  }
  T_CHECK(memcmp(run[0], run[1], bytes) == 0, "embed bwd B=%d T=%d: two runs differ", B, T);
  free(run[0]), free(run[1]);
  free(tok), gpu->free(gpu, gtok);
  drop(&wte), drop(&wpe), drop(&dout), drop(&out), drop(&dwte), drop(&dwpe);
}

static void test_layernorm(int N, int C) {
  char w[96];
  size_t n = (size_t)N * C;
  plan((backend_shape){.B = 1, .T = N, .C = C});
  float *x = frand(n, 2);
  for (size_t i = 0; i < n; i++) x[i] += 0.5f; /* a mean to remove */
  pair inp = from(x, n, 1), lw = mk((size_t)C, 1, 1), lb = mk((size_t)C, 1, 1), dout = mk(n, 1, 1);
  pair out = mk(n, 1, 1), mean = mk((size_t)N, 1, 0), rstd = mk((size_t)N, 1, 0);
  pair dinp = mk(n, 1, 1), dw = mk((size_t)C, 1, 0), db = mk((size_t)C, 1, 0);
  cpu->layernorm_fwd(cpu, out.c, mean.c, rstd.c, inp.c, lw.c, lb.c, N, C, 1e-5f);
  gpu->layernorm_fwd(gpu, out.g, mean.g, rstd.g, inp.g, lw.g, lb.g, N, C, 1e-5f);
  snprintf(w, sizeof w, "layernorm fwd N=%d C=%d", N, C);
  check(w, &out, TOL);
  check("  mean", &mean, TOL);
  check("  rstd", &rstd, TOL);
  /* the backward on the CPU's statistics, on both (a difference in them is not the backward's) */
  gpu->to_device(gpu, mean.g, mean.c, (size_t)N * 4), gpu->to_device(gpu, rstd.g, rstd.c, (size_t)N * 4);
  cpu->layernorm_bwd(cpu, dinp.c, dw.c, db.c, dout.c, inp.c, lw.c, mean.c, rstd.c, N, C, 1);
  gpu->layernorm_bwd(gpu, dinp.g, dw.g, db.g, dout.g, inp.g, lw.g, mean.g, rstd.g, N, C, 1);
  snprintf(w, sizeof w, "layernorm bwd dinp += N=%d C=%d", N, C);
  check(w, &dinp, TOL);
  check("  dw +=", &dw, TOL);
  check("  db +=", &db, TOL);
  /* acc = 0 (a step's first backward pass): dw, db overwritten, whatever they held */
  cpu->layernorm_bwd(cpu, dinp.c, dw.c, db.c, dout.c, inp.c, lw.c, mean.c, rstd.c, N, C, 0);
  gpu->layernorm_bwd(gpu, dinp.g, dw.g, db.g, dout.g, inp.g, lw.g, mean.g, rstd.g, N, C, 0);
  check("  dw (acc = 0: overwritten)", &dw, TOL);
  check("  db (acc = 0: overwritten)", &db, TOL);
  /* the fused residual: res = dout + dinp (any two tensors), then the LayerNorm of the stored res */
  cpu->residual_layernorm_fwd(cpu, inp.c, out.c, mean.c, rstd.c, dout.c, dinp.c, lw.c, lb.c, N, C, 1e-5f);
  gpu->residual_layernorm_fwd(gpu, inp.g, out.g, mean.g, rstd.g, dout.g, dinp.g, lw.g, lb.g, N, C, 1e-5f);
  snprintf(w, sizeof w, "residual_layernorm fwd N=%d C=%d: res", N, C);
  check(w, &inp, TOL);
  check("  out", &out, TOL);
  check("  mean", &mean, TOL);
  check("  rstd", &rstd, TOL);
  free(x);
  drop(&inp), drop(&lw), drop(&lb), drop(&dout), drop(&out), drop(&mean), drop(&rstd), drop(&dinp), drop(&dw), drop(&db);
}

/* RMSNorm forward and backward (dinp +=, dw += and overwritten), the backward on the CPU's rstd */
static void test_rmsnorm(int N, int C) {
  char w[96];
  size_t n = (size_t)N * C;
  plan((backend_shape){.B = 1, .T = N, .C = C});
  pair inp = mk(n, 2, 1), lw = mk((size_t)C, 1, 1), dout = mk(n, 1, 1), out = mk(n, 1, 1), rstd = mk((size_t)N, 1, 0);
  pair dinp = mk(n, 1, 1), dw = mk((size_t)C, 1, 0);
  cpu->rmsnorm_fwd(cpu, out.c, rstd.c, inp.c, lw.c, N, C, 1e-6f);
  gpu->rmsnorm_fwd(gpu, out.g, rstd.g, inp.g, lw.g, N, C, 1e-6f);
  snprintf(w, sizeof w, "rmsnorm fwd N=%d C=%d", N, C);
  check(w, &out, TOL);
  check("  rstd", &rstd, TOL);
  gpu->to_device(gpu, rstd.g, rstd.c, (size_t)N * 4);
  cpu->rmsnorm_bwd(cpu, dinp.c, dw.c, dout.c, inp.c, lw.c, rstd.c, N, C, 1);
  gpu->rmsnorm_bwd(gpu, dinp.g, dw.g, dout.g, inp.g, lw.g, rstd.g, N, C, 1);
  snprintf(w, sizeof w, "rmsnorm bwd dinp += N=%d C=%d", N, C);
  check(w, &dinp, TOL);
  check("  dw +=", &dw, TOL);
  cpu->rmsnorm_bwd(cpu, dinp.c, dw.c, dout.c, inp.c, lw.c, rstd.c, N, C, 0);
  gpu->rmsnorm_bwd(gpu, dinp.g, dw.g, dout.g, inp.g, lw.g, rstd.g, N, C, 0);
  check("  dw (acc = 0: overwritten)", &dw, TOL);
  drop(&inp), drop(&lw), drop(&dout), drop(&out), drop(&rstd), drop(&dinp), drop(&dw);
}

/* SwiGLU on gu (N,2F): h (N,F), then dgu (N,2F) from dh */
static void test_swiglu(int N, int F) {
  char w[96];
  const size_t nh = (size_t)N * F;
  plan((backend_shape){.B = 1, .T = N, .C = F, .F = F});
  pair gu = mk(2 * nh, 2, 1), h = mk(nh, 1, 1), dh = mk(nh, 1, 1), dgu = mk(2 * nh, 1, 1);
  cpu->swiglu_fwd(cpu, h.c, gu.c, N, F);
  gpu->swiglu_fwd(gpu, h.g, gu.g, N, F);
  snprintf(w, sizeof w, "swiglu fwd N=%d F=%d", N, F);
  check(w, &h, TOL);
  cpu->swiglu_bwd(cpu, dgu.c, dh.c, gu.c, N, F);
  gpu->swiglu_bwd(gpu, dgu.g, dh.g, gu.g, N, F);
  check("  bwd dgu", &dgu, TOL);
  drop(&gu), drop(&h), drop(&dh), drop(&dgu);
}

/* out and dout in rows ld >= M apart (ld > M: the LM head's padded rows; the pad, the same random
 * values on both sides, must stay as it is) */
static void test_matmul(int N, int K, int M, int ld, int with_bias, int with_dinp) {
  char w[96];
  plan((backend_shape){.B = 1, .T = N, .C = K, .V = M});
  pair inp = mk((size_t)N * K, 1, 1), wt = mk((size_t)M * K, 0.5, 1), bias = mk((size_t)M, 1, 1);
  pair dout = mk((size_t)N * ld, 1, 1), out = mk((size_t)N * ld, 1, 1), dinp = mk((size_t)N * K, 1, 1);
  pair dw = mk((size_t)M * K, 1, 0), db = mk((size_t)M, 1, 0);
  cpu->matmul_fwd(cpu, out.c, inp.c, wt.c, with_bias ? bias.c : NULL, N, K, M, ld);
  gpu->matmul_fwd(gpu, out.g, inp.g, wt.g, with_bias ? bias.g : NULL, N, K, M, ld);
  snprintf(w, sizeof w, "matmul fwd N=%d K=%d M=%d%s%s", N, K, M, with_bias ? " +bias" : "", ld > M ? " (rows padded)" : "");
  check(w, &out, gemm_tol());
  cpu->matmul_bwd(cpu, with_dinp ? dinp.c : NULL, dw.c, with_bias ? db.c : NULL, dout.c, inp.c, wt.c, N, K, M, ld, 1);
  gpu->matmul_bwd(gpu, with_dinp ? dinp.g : NULL, dw.g, with_bias ? db.g : NULL, dout.g, inp.g, wt.g, N, K, M, ld, 1);
  snprintf(w, sizeof w, "matmul bwd N=%d K=%d M=%d: dinp%s", N, K, M, with_dinp ? "" : " (NULL: untouched)");
  check(w, &dinp, with_dinp ? gemm_tol() : 0.0);
  check("  dw +=", &dw, gemm_tol());
  check(with_bias ? "  dbias +=" : "  dbias (NULL: untouched)", &db, with_bias ? TOL : 0.0);
  cpu->matmul_bwd(cpu, NULL, dw.c, with_bias ? db.c : NULL, dout.c, inp.c, wt.c, N, K, M, ld, 0);
  gpu->matmul_bwd(gpu, NULL, dw.g, with_bias ? db.g : NULL, dout.g, inp.g, wt.g, N, K, M, ld, 0);
  check("  dw (acc = 0: overwritten)", &dw, gemm_tol());
  if (with_bias) check("  dbias (acc = 0: overwritten)", &db, TOL);
  drop(&inp), drop(&wt), drop(&bias), drop(&dout), drop(&out), drop(&dinp), drop(&dw), drop(&db);
}

/* The MLP's fused pair: the first layer (N,K) -> (N,F) with gelu (act: backend_act), then the backward of a
 * second (N,F) -> (N,M) through it, on the same inputs on both sides. At 16-bit storage cuBLASLt's epilogues take
 * gelu_new with F a multiple of 8 (unless the mode asks for greenlm's kernels), the kernels the rest. */
static void test_mlp(int N, int K, int F, int M, int with_bias, int act) {
  char w[128];
  const size_t nh = (size_t)N * F;
  const double tol = gemm_tol() > TOL ? gemm_tol() : TOL;
  plan((backend_shape){.B = 1, .T = N, .C = K, .F = F, .V = M});
  pair inp = mk((size_t)N * K, 1, 1), w1 = mk((size_t)F * K, 0.5, 1), b1 = mk((size_t)F, 1, 1), pre = mk(nh, 1, 1);
  pair out = mk(nh, 1, 1);
  cpu->matmul_gelu_fwd(cpu, out.c, pre.c, inp.c, w1.c, with_bias ? b1.c : NULL, N, K, F, act);
  gpu->matmul_gelu_fwd(gpu, out.g, pre.g, inp.g, w1.g, with_bias ? b1.g : NULL, N, K, F, act);
  snprintf(w, sizeof w, "matmul_gelu fwd N=%d K=%d F=%d%s%s: pre", N, K, F, with_bias ? " +bias" : "",
           act == BACKEND_GELU_ERF ? " (erf)" : "");
  check(w, &pre, gemm_tol());
  check(act == BACKEND_GELU_ERF ? "  out = gelu(pre)" : "  out = gelu_new(pre)", &out, tol);
  pair dout = mk((size_t)N * M, 1, 1), w2 = mk((size_t)M * F, 0.5, 1), h = mk(nh, 1, 1), pre2 = mk(nh, 2, 1);
  pair dpre = mk(nh, 1, 1), dw = mk((size_t)M * F, 1, 0), db = mk((size_t)M, 1, 0);
  cpu->matmul_dgelu_bwd(cpu, dpre.c, dw.c, with_bias ? db.c : NULL, dout.c, h.c, pre2.c, w2.c, N, F, M, 1, act);
  gpu->matmul_dgelu_bwd(gpu, dpre.g, dw.g, with_bias ? db.g : NULL, dout.g, h.g, pre2.g, w2.g, N, F, M, 1, act);
  snprintf(w, sizeof w, "matmul_dgelu bwd N=%d F=%d M=%d: dpre", N, F, M);
  check(w, &dpre, tol);
  check("  dw +=", &dw, gemm_tol());
  check(with_bias ? "  dbias +=" : "  dbias (NULL: untouched)", &db, with_bias ? TOL : 0.0);
  cpu->matmul_dgelu_bwd(cpu, dpre.c, dw.c, with_bias ? db.c : NULL, dout.c, h.c, pre2.c, w2.c, N, F, M, 0, act);
  gpu->matmul_dgelu_bwd(gpu, dpre.g, dw.g, with_bias ? db.g : NULL, dout.g, h.g, pre2.g, w2.g, N, F, M, 0, act);
  check("  dw (acc = 0: overwritten)", &dw, gemm_tol());
  if (with_bias) check("  dbias (acc = 0: overwritten)", &db, TOL);
  drop(&inp), drop(&w1), drop(&b1), drop(&pre), drop(&out), drop(&dout), drop(&w2), drop(&h), drop(&pre2), drop(&dpre);
  drop(&dw), drop(&db);
}

/* The rotary embedding on qkv (N,C+2Ckv) in place, at the rows' r % T or at given positions, and back. */
static void test_rope(int N, int T, int C, int H, int Hkv, int rot, backend_rope rope, int given) {
  char w[128];
  const size_t n3 = (size_t)N * (C + 2 * (C / H) * Hkv);
  plan((backend_shape){.B = 1, .T = N, .C = C, .H = H});
  pair qkv = mk(n3, 1, 1);
  int32_t *pos = malloc((size_t)N * sizeof(int32_t));
  for (int r = 0; r < N; r++) pos[r] = (int32_t)rng_below(&R, 4096);
  int32_t *gpos = up(pos, (size_t)N * sizeof(int32_t));
  cpu->rope(cpu, qkv.c, given ? pos : NULL, N, T, C, H, Hkv, rot, &rope, 1);
  gpu->rope(gpu, qkv.g, given ? gpos : NULL, N, T, C, H, Hkv, rot, &rope, 1);
  snprintf(w, sizeof w, "rope N=%d C=%d H=%d Hkv=%d rot %d theta %g%s%s", N, C, H, Hkv, rot, rope.theta,
           rope.factor > 0 ? " llama3 scaling" : "", given ? " at given positions" : "");
  check(w, &qkv, TOL);
  cpu->rope(cpu, qkv.c, given ? pos : NULL, N, T, C, H, Hkv, rot, &rope, -1);
  gpu->rope(gpu, qkv.g, given ? gpos : NULL, N, T, C, H, Hkv, rot, &rope, -1);
  check("  and back (sign -1)", &qkv, TOL);
  free(pos), gpu->free(gpu, gpos);
  drop(&qkv);
}

/* qkv (B,T,W) = [q (C) | k (Ckv) | v (Ckv)], W = C + 2 Ckv: H query heads, Hkv key/value heads */
static void test_attention(int B, int T, int C, int H, int Hkv, int window, float scale) {
  char w[128];
  const int W = C + 2 * (C / H) * Hkv;
  size_t n3 = (size_t)B * T * W, n = (size_t)B * T * C, nl = (size_t)B * H * T;
  plan((backend_shape){.B = B, .T = T, .C = C, .H = H, .Hkv = Hkv});
  float *x = frand(n3, 1);
  const float qk = (float)pow(C / H, -0.25); /* q, k: q.k of variance 1 */
  for (size_t r = 0; r < (size_t)B * T; r++)
    for (int k = 0; k < W - (W - C) / 2; k++) x[r * W + k] *= qk;
  const double tol = att_tol(C / H);
  pair qkv = from(x, n3, 1), dout = mk(n, 1, 1), out = mk(n, 1, 1), lse = mk(nl, 1, 0), dqkv = mk(n3, 1, 1);
  void *scratch = malloc(cpu->attention_scratch(cpu, T) + 64);
  void *gscratch = gpu->alloc(gpu, gpu->attention_scratch(gpu, T));
  cpu->attention_fwd(cpu, out.c, lse.c, qkv.c, scratch, B, T, C, H, Hkv, window, scale);
  gpu->attention_fwd(gpu, out.g, lse.g, qkv.g, gscratch, B, T, C, H, Hkv, window, scale);
  snprintf(w, sizeof w, "attention%s fwd B=%d T=%d C=%d H=%d Hkv=%d (hs %d) %s%d", cudnn_att ? " (cuDNN)" : "", B, T,
           C, H, Hkv, C / H, window > 0 ? "local " : "global", window > 0 ? window : T);
  check(w, &out, tol);
  check("  lse", &lse, tol);
  /* the backward from the CPU's forward results on both */
  gpu->to_device(gpu, out.g, out.c, n * esize(1)), gpu->to_device(gpu, lse.g, lse.c, nl * 4);
  cpu->attention_bwd(cpu, dqkv.c, dout.c, out.c, lse.c, qkv.c, scratch, B, T, C, H, Hkv, window, scale);
  gpu->attention_bwd(gpu, dqkv.g, dout.g, out.g, lse.g, qkv.g, gscratch, B, T, C, H, Hkv, window, scale);
  check("  bwd dqkv (overwritten)", &dqkv, tol);
  free(x), free(scratch), gpu->free(gpu, gscratch);
  drop(&qkv), drop(&dout), drop(&out), drop(&lse), drop(&dqkv);
}

/* The KV cache: N rows of 3 sequences (consecutive positions from a random start, so no two rows
 * share a ring row), stored, then attended to over caches filled with random keys and values. */
static void test_kv_cache(int N, int C, int H, int Hkv, int ring, int window, float scale) {
  enum { NSEQ = 3 };
  char w[128];
  const int Ckv = C / H * Hkv, W = C + 2 * Ckv;
  const size_t nk = (size_t)NSEQ * ring * Ckv, n3 = (size_t)N * W;
  plan((backend_shape){.B = 1, .T = N, .C = C, .H = H, .Hkv = Hkv, .kv_rows = NSEQ * ring});
  const float qk = (float)pow(C / H, -0.25);
  float *x = frand(n3, 1);
  for (size_t i = 0; i < n3; i++) x[i] *= i % (size_t)W < (size_t)(C + Ckv) ? qk : 1.0f;
  pair qkv = from(x, n3, 1), kc = mk(nk, qk, 1), vc = mk(nk, 1, 1), out = mk((size_t)N * C, 1, 1);
  int32_t *seq = malloc((size_t)N * sizeof(int32_t)), *pos = malloc((size_t)N * sizeof(int32_t)), start[NSEQ];
  const int span = (N + NSEQ - 1) / NSEQ, most = window > 0 ? 3 * ring : ring; /* global: every position held */
  for (int q = 0; q < NSEQ; q++) start[q] = (int)rng_below(&R, (uint64_t)(most - span + 1));
  for (int r = 0; r < N; r++) seq[r] = r % NSEQ, pos[r] = start[r % NSEQ] + r / NSEQ;
  int32_t *gseq = up(seq, (size_t)N * sizeof(int32_t)), *gpos = up(pos, (size_t)N * sizeof(int32_t));
  cpu->kv_store(cpu, kc.c, vc.c, qkv.c, seq, pos, N, C, Ckv, ring);
  gpu->kv_store(gpu, kc.g, vc.g, qkv.g, gseq, gpos, N, C, Ckv, ring);
  snprintf(w, sizeof w, "kv_store N=%d C=%d Ckv=%d ring %d", N, C, Ckv, ring);
  check(w, &kc, 0.0);
  check("  values", &vc, 0.0);
  cpu->attention_cached(cpu, out.c, qkv.c, kc.c, vc.c, seq, pos, N, C, H, Hkv, ring, window, scale);
  gpu->attention_cached(gpu, out.g, qkv.g, kc.g, vc.g, gseq, gpos, N, C, H, Hkv, ring, window, scale);
  snprintf(w, sizeof w, "attention_cached N=%d C=%d H=%d Hkv=%d (hs %d) ring %d %s%d", N, C, H, Hkv, C / H, ring,
           window > 0 ? "local " : "global", window > 0 ? window : ring);
  check(w, &out, TOL); /* fp32 kernels in every mode */
  free(x), free(seq), free(pos), gpu->free(gpu, gseq), gpu->free(gpu, gpos);
  drop(&qkv), drop(&kc), drop(&vc), drop(&out);
}

static void test_elementwise(size_t n) {
  char w[96];
  plan((backend_shape){.B = 1, .T = (int)n, .C = 1});
  pair x = mk(n, 2, 1), y = mk(n, 1, 1), o = mk(n, 1, 1);
  cpu->residual_fwd(cpu, o.c, x.c, y.c, n);
  gpu->residual_fwd(gpu, o.g, x.g, y.g, n);
  snprintf(w, sizeof w, "residual n=%zu", n);
  check(w, &o, TOL);
  cpu->accumulate(cpu, y.c, x.c, n);
  gpu->accumulate(gpu, y.g, x.g, n);
  check("  accumulate +=", &y, TOL);
  /* one element in: not 16-byte aligned, so element by element (the rest moves 16 bytes at a time) */
  const size_t es = esize(1);
  cpu->accumulate(cpu, (char *)y.c + es, (char *)x.c + es, n - 1);
  gpu->accumulate(gpu, (char *)y.g + es, (char *)x.g + es, n - 1);
  check("  accumulate +=, unaligned", &y, TOL);
  pair f = mk(n, 1, 0);
  for (int square = 0; square < 2; square++) { /* added to what the accumulator (device memory) holds */
    double s1 = 0.25, s2 = 0.25, *acc = (double *)gpu->alloc(gpu, sizeof(double));
    gpu->to_device(gpu, acc, &s2, sizeof s2);
    cpu->reduce_sum(cpu, &s1, f.c, n, square), gpu->reduce_sum(gpu, acc, f.g, n, square);
    gpu->to_host(gpu, &s2, acc, sizeof s2);
    gpu->free(gpu, acc);
    T_CHECK(fabs(s1 - s2) <= 1e-6 * fabs(s1), "reduce_sum%s n=%zu: gpu %.12g vs cpu %.12g", square ? " of squares" : "",
            n, s2, s1);
    printf("  %-44s %-4s rel err %.2e (bound 1e-06)\n", square ? "reduce_sum of squares (double, +=)" :
           "reduce_sum (double, +=)", prec, fabs(s1 - s2) / fabs(s1));
  }
  drop(&x), drop(&y), drop(&o), drop(&f);
}

/* logits in rows ld >= V apart (the pad compared too: untouched on both sides) */
static void test_xent(int N, int V, int ld) {
  char w[96];
  size_t n = (size_t)N * ld;
  plan((backend_shape){.B = 1, .T = N, .V = V});
  int32_t *tgt = irand((size_t)N, V); /* targets below V */
  int32_t *gtgt = up(tgt, (size_t)N * sizeof(int32_t));
  float *x = frand(n, 3);
  pair logits = from(x, n, 1), logits2 = from(x, n, 1), losses = mk((size_t)N, 1, 0);
  float dscale = 1.0f / (float)N;
  cpu->xent_fwd_bwd(cpu, losses.c, logits.c, tgt, N, V, ld, dscale);
  gpu->xent_fwd_bwd(gpu, losses.g, logits.g, gtgt, N, V, ld, dscale);
  snprintf(w, sizeof w, "softmax+xent N=%d V=%d (rows %d apart): losses", N, V, ld);
  check(w, &losses, TOL);
  check("  dlogits (dscale 1/N)", &logits, TOL);
  cpu->xent_fwd_bwd(cpu, losses.c, logits2.c, tgt, N, V, ld, 0.0f);
  gpu->xent_fwd_bwd(gpu, losses.g, logits2.g, gtgt, N, V, ld, 0.0f);
  check("  losses, forward only (dscale 0)", &losses, TOL);
  free(x), free(tgt), gpu->free(gpu, gtgt);
  drop(&logits), drop(&logits2), drop(&losses);
}

/* The vocabulary-parallel cross-entropy over logits (N,V) split into two shards at column `split`
 * (targets fall in either): xent_part of each shard, then xent_grad of each from the rows'
 * log-sum-exp over the whole vocabulary, combined from the CPU's parts (on both backends). */
static void test_xent_shards(int N, int V, int split) {
  char w[128];
  const int v0[2] = {0, split}, nv[2] = {split, V - split};
  plan((backend_shape){.B = 1, .T = N, .V = V});
  int32_t *tgt = irand((size_t)N, V); /* targets below V */
  int32_t *gtgt = up(tgt, (size_t)N * sizeof(int32_t));
  float *x = frand((size_t)N * V, 3), *lse = malloc((size_t)N * sizeof(float));
  pair logits[2], part[2];
  const int ld[2] = {nv[0], nv[1] + 9}; /* the second shard's rows padded (random pad, left as it is) */
  for (int k = 0; k < 2; k++) {
    float *xs = frand((size_t)N * ld[k], 3);
    for (int i = 0; i < N; i++) memcpy(xs + (size_t)i * ld[k], x + (size_t)i * V + v0[k], (size_t)nv[k] * sizeof(float));
    logits[k] = from(xs, (size_t)N * ld[k], 1), part[k] = mk(2 * (size_t)N, 1, 0);
    free(xs);
    cpu->xent_part(cpu, part[k].c, logits[k].c, tgt, N, nv[k], v0[k], ld[k]);
    gpu->xent_part(gpu, part[k].g, logits[k].g, gtgt, N, nv[k], v0[k], ld[k]);
    snprintf(w, sizeof w, "xent_part N=%d V=%d columns %d..%d", N, V, v0[k], v0[k] + nv[k]);
    check(w, &part[k], TOL);
  }
  const float *p0 = part[0].c, *p1 = part[1].c;
  for (int i = 0; i < N; i++) {
    float m = fmaxf(p0[2 * i], p1[2 * i]);
    lse[i] = m + logf(expf(p0[2 * i] - m) + expf(p1[2 * i] - m));
  }
  pair glse = from(lse, (size_t)N, 0);
  const float dscale = 1.0f / (float)N;
  for (int k = 0; k < 2; k++) {
    cpu->xent_grad(cpu, logits[k].c, glse.c, tgt, N, nv[k], v0[k], ld[k], dscale);
    gpu->xent_grad(gpu, logits[k].g, glse.g, gtgt, N, nv[k], v0[k], ld[k], dscale);
    snprintf(w, sizeof w, "  xent_grad columns %d..%d (dscale 1/N)", v0[k], v0[k] + nv[k]);
    check(w, &logits[k], TOL);
    drop(&logits[k]), drop(&part[k]);
  }
  free(x), free(lse), free(tgt), gpu->free(gpu, gtgt);
  drop(&glse);
}

static void test_adamw(size_t n) {
  float *vh = frand(n, 0.1);
  for (size_t i = 0; i < n; i++) vh[i] = vh[i] * vh[i];
  pair p = mk(n, 1, 0), g = mk(n, 1, 0), m = mk(n, 0.1, 0), v = from(vh, n, 0), pc = mk(n, 1, 1);
  backend_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .loss_scale = 2.0, .step = 7};
  cpu->adamw(cpu, p.c, s16 ? pc.c : NULL, g.c, m.c, v.c, n, &a);
  gpu->adamw(gpu, p.g, s16 ? pc.g : NULL, g.g, m.g, v.g, n, &a);
  check("adamw: parameters", &p, TOL);
  check("  first moments", &m, TOL);
  check("  second moments", &v, TOL);
  if (s16) check("  the compute copy", &pc, TOL);
  /* the step's sums in device memory: clipped to a third of the norm, then a non-finite step that changes nothing */
  double sums[3][2] = {{1.0, 0.0}, {1.0, INFINITY}, {NAN, 1.0}}, *dsums = (double *)gpu->alloc(gpu, sizeof sums[0]);
  cpu->reduce_sum(cpu, &sums[0][1], g.c, n, 1);
  a.grad_clip = sqrt(sums[0][1]) / a.loss_scale / 3.0;
  float *before = malloc(n * sizeof(float)), *after = malloc(n * sizeof(float));
  for (int k = 0; k < 3; k++) {
    gpu->to_device(gpu, dsums, sums[k], sizeof sums[k]);
    gpu->to_host(gpu, before, p.g, n * sizeof(float));
    a.sums = sums[k];
    cpu->adamw(cpu, p.c, s16 ? pc.c : NULL, g.c, m.c, v.c, n, &a);
    a.sums = dsums;
    gpu->adamw(gpu, p.g, s16 ? pc.g : NULL, g.g, m.g, v.g, n, &a);
    gpu->to_host(gpu, after, p.g, n * sizeof(float));
    T_CHECK(!memcmp(before, after, n * sizeof(float)) == (k > 0), "adamw with sums {%g, %g}: the parameters %s",
            sums[k][0], sums[k][1], k ? "changed" : "did not change");
    check(k ? "  then skipped (a sum not finite): parameters" : "adamw clipped by the sums in device memory", &p, TOL);
    check("  first moments", &m, TOL);
    if (s16) check("  the compute copy", &pc, TOL);
  }
  free(before), free(after);
  gpu->free(gpu, dsums);
  free(vh);
  drop(&p), drop(&g), drop(&m), drop(&v), drop(&pc);
}

static void test_memory(void) {
  size_t n = 1000;
  float *h = frand(n, 1), *back = malloc(n * 4);
  float *a = gpu->alloc(gpu, n * 4), *b = gpu->alloc(gpu, n * 4);
  gpu->to_host(gpu, back, a, n * 4);
  int zero = 1;
  for (size_t i = 0; i < n; i++) zero &= back[i] == 0.0f;
  T_CHECK(zero, "alloc is not zero-filled");
  gpu->to_device(gpu, a, h, n * 4);
  gpu->copy(gpu, b, a, n * 4);
  gpu->to_host(gpu, back, b, n * 4);
  T_CHECK(memcmp(back, h, n * 4) == 0, "to_device / copy / to_host do not round-trip");
  /* the storage conversions: rounded as the CPU rounds, and back */
  pair x = from(h, n, 0), st = mk(n, 1, 1), wide = mk(n, 1, 0);
  cpu->to_storage(cpu, st.c, x.c, n), gpu->to_storage(gpu, st.g, x.g, n);
  check("to_storage", &st, 0.0);
  cpu->to_fp32(cpu, wide.c, st.c, n), gpu->to_fp32(gpu, wide.g, st.g, n);
  check("to_fp32", &wide, 0.0);
  drop(&x), drop(&st), drop(&wide);
  gpu->zero(gpu, b, n * 4);
  gpu->to_host(gpu, back, b, n * 4);
  T_CHECK(back[0] == 0.0f && back[n - 1] == 0.0f, "zero left data");
  gpu->sync(gpu);
  free(h), free(back);
  gpu->free(gpu, a), gpu->free(gpu, b);
}

/* The compressed exchange's ops on both backends from the same values: every byte of the messages and
 * every bit of the values, residuals and decoded sums the same (quant_core.h is the arithmetic of both). */
static void test_quant(void) {
  for (int k = 0; k < TQ_NSCHEMES; k++) {
    quant_scheme q;
    quant_seg seg[TQ_NSEG];
    size_t n, bytes;
    const char *name = tq_case(k, &q, seg, &n, &bytes);
    void *dseg = up(seg, sizeof seg);
    uint8_t *mc = malloc(bytes), *mg = malloc(bytes), *dmsg = gpu->alloc(gpu, bytes);
    float *back = malloc(n * sizeof *back);
    for (int fb = 0; fb < 2; fb++) {
      pair v = mk(n, 1.0, 0), e = mk(n, 0.1, 0), out = mk(n, 1.0, 0);
      cpu->quant_encode(cpu, mc, v.c, fb ? e.c : NULL, seg, TQ_NSEG, &q, 7 + (uint64_t)k);
      gpu->quant_encode(gpu, dmsg, v.g, fb ? e.g : NULL, dseg, TQ_NSEG, &q, 7 + (uint64_t)k);
      gpu->to_host(gpu, mg, dmsg, bytes);
      T_CHECK(memcmp(mc, mg, bytes) == 0, "quant_encode %s%s: the messages differ", name, fb ? " with feedback" : "");
      gpu->to_host(gpu, back, v.g, n * sizeof *back);
      T_CHECK(memcmp(back, v.c, n * sizeof *back) == 0, "quant_encode %s: the values differ", name);
      gpu->to_host(gpu, back, e.g, n * sizeof *back);
      T_CHECK(memcmp(back, e.c, n * sizeof *back) == 0, "quant_encode %s: the residuals differ", name);
      cpu->quant_decode(cpu, out.c, mc, 0, seg, TQ_NSEG, &q, fb); /* fb: added to random values */
      gpu->quant_decode(gpu, out.g, dmsg, 0, dseg, TQ_NSEG, &q, fb);
      gpu->to_host(gpu, back, out.g, n * sizeof *back);
      T_CHECK(memcmp(back, out.c, n * sizeof *back) == 0, "quant_decode %s (%s): the values differ", name, fb ? "add" : "set");
      drop(&v), drop(&e), drop(&out);
    }
    printf("  %-44s %-4s bitwise equal (messages of %zu bytes)\n", name, prec, bytes);
    free(mc), free(mg), free(back);
    gpu->free(gpu, dmsg), gpu->free(gpu, dseg);
  }
}

/* PowerSGD's factors on both backends from the same values: every bit the same (lowrank_core.h is the
 * arithmetic of both), on a matrix taller than the lanes of the column sums and on a wide one. */
static void test_lowrank(void) {
  static const size_t shapes[][2] = {{300, 37}, {64, 2500}};
  const int r = 4;
  for (int s = 0; s < 2; s++) {
    const size_t n = shapes[s][0], m = shapes[s][1];
    pair M = mk(n * m, 1.0, 0), ef = mk(n * m, 0.1, 0), Q = mk(m * (size_t)r, 1.0, 0), P = mk(n * (size_t)r, 1.0, 0);
    cpu->lowrank_left(cpu, P.c, M.c, ef.c, Q.c, n, m, r), gpu->lowrank_left(gpu, P.g, M.g, ef.g, Q.g, n, m, r);
    check("lowrank_left", &P, 0.0);
    check("lowrank_left (M + ef)", &M, 0.0);
    cpu->lowrank_orth(cpu, P.c, n, r), gpu->lowrank_orth(gpu, P.g, n, r);
    check("lowrank_orth", &P, 0.0);
    cpu->lowrank_right(cpu, Q.c, M.c, P.c, n, m, r), gpu->lowrank_right(gpu, Q.g, M.g, P.g, n, m, r);
    check("lowrank_right", &Q, 0.0);
    cpu->lowrank_expand(cpu, ef.c, P.c, Q.c, n, m, r, 1), gpu->lowrank_expand(gpu, ef.g, P.g, Q.g, n, m, r, 1);
    check("lowrank_expand (sub)", &ef, 0.0);
    cpu->lowrank_expand(cpu, M.c, P.c, Q.c, n, m, r, 0), gpu->lowrank_expand(gpu, M.g, P.g, Q.g, n, m, r, 0);
    check("lowrank_expand", &M, 0.0);
    drop(&M), drop(&ef), drop(&Q), drop(&P);
  }
}

/* Which case covers each op of the list; a new op without one fails the test. */
static const char *const covered_by[BACKEND_NOPS] = {
    [BACKEND_OP_embed_fwd] = "test_embed",         [BACKEND_OP_embed_bwd] = "test_embed",
    [BACKEND_OP_layernorm_fwd] = "test_layernorm", [BACKEND_OP_layernorm_bwd] = "test_layernorm",
    [BACKEND_OP_residual_layernorm_fwd] = "test_layernorm",
    [BACKEND_OP_matmul_fwd] = "test_matmul",       [BACKEND_OP_matmul_bwd] = "test_matmul",
    [BACKEND_OP_attention_fwd] = "test_attention", [BACKEND_OP_attention_bwd] = "test_attention",
    [BACKEND_OP_matmul_gelu_fwd] = "test_mlp",     [BACKEND_OP_matmul_dgelu_bwd] = "test_mlp",
    [BACKEND_OP_rope] = "test_rope",
    [BACKEND_OP_rmsnorm_fwd] = "test_rmsnorm",     [BACKEND_OP_rmsnorm_bwd] = "test_rmsnorm",
    [BACKEND_OP_swiglu_fwd] = "test_swiglu",       [BACKEND_OP_swiglu_bwd] = "test_swiglu",
    [BACKEND_OP_residual_fwd] = "test_elementwise", [BACKEND_OP_accumulate] = "test_elementwise",
    [BACKEND_OP_reduce_sum] = "test_elementwise",       [BACKEND_OP_xent_fwd_bwd] = "test_xent",
    [BACKEND_OP_xent_part] = "test_xent_shards",   [BACKEND_OP_xent_grad] = "test_xent_shards",
    [BACKEND_OP_adamw] = "test_adamw",             [BACKEND_OP_to_storage] = "test_memory",
    [BACKEND_OP_to_fp32] = "test_memory",          [BACKEND_OP_kv_store] = "test_kv_cache",
    [BACKEND_OP_attention_cached] = "test_kv_cache", [BACKEND_OP_quant_encode] = "test_quant",
    [BACKEND_OP_quant_decode] = "test_quant",     [BACKEND_OP_lowrank_left] = "test_lowrank",
    [BACKEND_OP_lowrank_right] = "test_lowrank",  [BACKEND_OP_lowrank_orth] = "test_lowrank",
    [BACKEND_OP_lowrank_expand] = "test_lowrank",
};

static void test_ops(void) {
  for (int i = 0; i < BACKEND_NOPS; i++) T_CHECK(covered_by[i] != NULL, "op %s has no parity case", backend_op_names[i]);
  printf("== ops, precision %s ==\n", prec);
  test_embed(2, 17, 24, 50, 0, 50, 1);
  test_embed(3, 64, 96, 300, 0, 300, 1);
  test_embed(3, 40, 64, 300, 97, 120, 0); /* a shard: tokens below, inside and above it */
  test_layernorm(37, 96);
  test_layernorm(130, 768);
  test_layernorm(5, 5000); /* beyond the shared-memory path of the backward */
  test_layernorm(9, 100);  /* at 16-bit storage C not a multiple of 8: one element per lane access */
  test_layernorm(4100, 256); /* dw, db over 65 chunks of rows, the last of 4 */
  test_rmsnorm(37, 96);
  test_rmsnorm(9, 100);      /* C not a multiple of 8 */
  test_rmsnorm(4100, 512);   /* dw over 65 chunks of rows */
  test_swiglu(64, 344);
  test_swiglu(33, 101);      /* F odd: the up half unaligned */
  test_matmul(7, 13, 5, 5, 1, 1);
  test_matmul(64, 96, 200, 200, 1, 1);
  test_matmul(130, 257, 67, 67, 0, 0);
  test_matmul(256, 512, 384, 384, 1, 1);
  test_matmul(64, 96, 201, 256, 1, 1); /* the LM head's rows, padded to a multiple of 128 */
  test_mlp(64, 96, 384, 96, 1, BACKEND_GELU_TANH);
  test_mlp(37, 40, 104, 24, 0, BACKEND_GELU_TANH);   /* no bias */
  test_mlp(33, 40, 100, 24, 1, BACKEND_GELU_TANH);   /* F not a multiple of 8: greenlm's kernels at every storage */
  test_mlp(256, 768, 3072, 768, 1, BACKEND_GELU_TANH); /* GPT-Neo 125M's MLP */
  test_mlp(64, 96, 384, 96, 1, BACKEND_GELU_ERF);    /* GPT-NeoX's gelu: a GEMM, then greenlm's kernel */
  const backend_rope base = {10000.0f, 0, 0, 0, 0}, llama3 = {500000.0f, 8.0f, 1.0f, 4.0f, 8192.0f};
  test_rope(130, 65, 256, 4, 4, 16, base, 0);   /* Pythia's rotary_pct 0.25 of hs 64 */
  test_rope(77, 77, 384, 3, 3, 128, base, 0);   /* every dim of hs 128 */
  test_rope(50, 1, 128, 2, 2, 64, llama3, 1);   /* generation: given positions up to 4095, Llama 3.1's scaling */
  test_rope(64, 32, 512, 8, 2, 64, llama3, 0);  /* grouped-query attention: 2 key heads of 8 */
  test_elementwise(1000003);
  test_xent(5, 50257, 50257);
  test_xent(5, 50257, 50304); /* GPT-2's vocabulary in rows padded to a multiple of 128 */
  test_xent(33, 1000, 1000);
  test_xent_shards(5, 50257, 25129); /* an uneven split of GPT-2's vocabulary */
  test_xent_shards(33, 1000, 333);
  test_adamw(100003);
  if (strcmp(prec, "fp32") == 0) test_quant(), test_lowrank(); /* fp32 gradients whatever the precision: once */
  if (strcmp(prec, "fp32") == 0 || s16) test_memory(); /* no GEMM inside: once per storage type */
  /* attention in every mode: the tensor-core kernels (64-row blocks, 64-key tiles) take hs 33..128
   * at bf16 and fp16, the fp32 kernels (16-row blocks, 32-key tiles) the rest */
  test_attention(2, 37, 64, 4, 4, 0, 1.0f);     /* hs 16 (fp32 kernels), GPT-Neo's unscaled scores */
  test_attention(1, 100, 128, 2, 2, 0, 0.125f); /* hs 64, GPT-2's 1/sqrt(hs) */
  test_attention(2, 77, 96, 3, 3, 16, 1.0f);    /* hs 32 (fp32 kernels), local window */
  test_attention(1, 300, 256, 2, 2, 64, 1.0f);  /* hs 128, local window over several tiles */
  test_attention(2, 129, 256, 2, 2, 0, 1.0f);   /* hs 128, global */
  test_attention(1, 50, 512, 2, 2, 0, 0.0625f); /* hs 256 (fp32 kernels) */
  test_attention(2, 33, 40, 2, 2, 1, 1.0f);     /* hs 20 (fp32 kernels), window 1: each query sees itself */
  test_attention(1, 1, 64, 2, 2, 0, 1.0f);      /* one token, hs 32 (fp32 kernels) */
  test_attention(3, 150, 128, 2, 2, 24, 1.0f);  /* hs 64, window 24: shorter than a tile */
  test_attention(2, 211, 256, 2, 2, 100, 1.0f); /* hs 128, window 100 */
  test_attention(1, 65, 128, 2, 2, 1, 1.0f);    /* hs 64, window 1 */
  test_attention(2, 1, 512, 4, 4, 0, 1.0f);     /* one token, hs 128 */
  test_attention(2, 90, 96, 2, 2, 20, 1.0f);    /* hs 48, zero-padded to 64 */
  test_attention(1, 200, 192, 2, 2, 0, 1.0f);   /* hs 96, zero-padded to 128 */
  test_attention(1, 520, 128, 2, 2, 0, 0.125f); /* hs 64, global over 9 key tiles */
  /* grouped-query attention (Llama): a key/value head serves H/Hkv query heads */
  test_attention(2, 100, 512, 8, 2, 0, 0.125f);  /* hs 64, 4 query heads a group */
  test_attention(1, 77, 256, 8, 1, 0, 0.25f);    /* hs 32 (fp32 kernels), one key/value head */
  test_attention(1, 150, 512, 4, 2, 0, 0.0884f); /* hs 128 */
  /* the KV cache of generation: one warp per (row, head), head sizes up to 256 */
  test_kv_cache(5, 64, 4, 4, 40, 0, 1.0f);      /* hs 16, global */
  test_kv_cache(7, 128, 2, 2, 71, 8, 0.125f);   /* hs 64, local ring of window + 63 rows */
  test_kv_cache(3, 512, 2, 2, 20, 0, 1.0f);     /* hs 256 */
  test_kv_cache(64, 96, 3, 3, 100, 16, 1.0f);   /* hs 32, a prefill pass of 64 rows */
  test_kv_cache(1, 768, 12, 12, 300, 0, 1.0f);  /* GPT-Neo 125M's heads, one decoded row */
  test_kv_cache(9, 512, 8, 2, 40, 0, 0.125f);   /* grouped-query attention: 2 key/value heads of 8 */
}

/* ---- whole training steps ---------------------------------------------------------------------- */

enum { STEPS = 4 };

static cfg_config *deck(const char *dir, const char *backend, const char *precision) {
  char text[8192];
  const char *top = getenv("TOP_SRCDIR");
  snprintf(text, sizeof text,
           "&job task = 'prepare', 'train', seed = 11, run_dir = '%s/run' /\n"
           "&prepare input = '%s/tests/data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,\n"
           "  train_out = '%s/train.nc', val_out = '%s/val.nc' /\n"
           "&model vocab_size = 256, block_size = 64, n_layer = 2, n_embd = 64, n_head = 4,\n"
           "  attention_types = 'global', 'local', window_size = 16 /\n"
           "&training seq_len = 64, micro_batch_size = 3, global_batch_size = 6, max_steps = %d,\n"
           "  lr = 1e-3, min_lr = 1e-4, warmup_steps = 2, grad_clip = 1.0, eval_batches = 2 /\n"
           "&system backend = '%s', precision = '%s' /\n",
           dir, top ? top : ".", dir, dir, STEPS, backend, precision);
  return t_load_deck(text, "parity.nml", 1);
}

static float *train(const cfg_config *c, const backend *be, double *loss, size_t *n) {
  err_list e = {0};
  trainer *t = trainer_open(c, be, MPI_COMM_SELF, &e);
  err_print(&e, 10);
  err_free(&e);
  T_CHECK(t != NULL, "trainer_open on %s failed", be->name);
  if (!t) return NULL;
  for (int s = 0; s < STEPS; s++) {
    trainer_step_info info;
    T_CHECK(trainer_step(t, s, &info) == 0, "%s: step %d diverged", be->name, s);
    loss[s] = info.loss;
  }
  float *p = trainer_gather_params(t, n);
  trainer_close(t);
  return p;
}

/* The modes: the four precisions at fp32 storage, then bf16 and fp16 storage. The CUDA backend
 * runs fp32 storage until this program has passed at 16-bit storage on a GPU, so those rounds set
 * the instance's storage themselves; the CPU instance stores the same type. The 16-bit storage
 * modes run twice: with the libraries (attention in cuDNN where built, the epilogues in cuBLASLt),
 * then with greenlm's kernels. */
static const struct {
  const char *precision;
  backend_dtype storage;
  const char *paths; /* GREENLM_ATTENTION and GREENLM_EPILOGUES */
} modes[] = {{"fp32", BACKEND_FP32, "auto"}, {"tf32", BACKEND_FP32, "auto"},    {"bf16", BACKEND_FP32, "auto"},
             {"fp16", BACKEND_FP32, "auto"}, {"bf16", BACKEND_BF16, "auto"},    {"fp16", BACKEND_FP16, "auto"},
             {"bf16", BACKEND_BF16, "kernels"}, {"fp16", BACKEND_FP16, "kernels"}};
enum { NMODES = sizeof modes / sizeof modes[0] };

/* Open both instances of mode k (the GPU's closed by the caller). */
static void open_mode(int k, const backend **cpu16) {
  prec = modes[k].precision;
  s16 = modes[k].storage != BACKEND_FP32;
  setenv("GREENLM_ATTENTION", modes[k].paths, 1);
  setenv("GREENLM_EPILOGUES", modes[k].paths, 1);
#ifdef GREENLM_HAVE_CUDNN
  cudnn_att = s16 && !strcmp(modes[k].paths, "auto");
#endif
  backend *g = backend_kind_cuda.open(0, prec);
  g->storage = modes[k].storage;
  gpu = g;
  cpu = s16 ? *cpu16 : backend_cpu();
}

static void test_training(const char *dir, const backend *cpu16[]) {
  err_list perr = {0};
  cfg_config *c = deck(dir, "cpu", "fp32");
  T_CHECK(prepare_run(c, MPI_COMM_SELF, &perr) == 0, "prepare failed");
  err_print(&perr, 10);
  err_free(&perr);
  free(c);
  for (int k = 0; k < NMODES; k++) {
    open_mode(k, &cpu16[modes[k].storage]);
    /* the CPU reference at the same storage type (fp32 for the fp32-storage modes) */
    c = deck(dir, "cpu", s16 ? prec : "fp32");
    double lc[STEPS], lg[STEPS], worst = 0;
    size_t nc, ng;
    float *pc = train(c, cpu, lc, &nc);
    free(c);
    c = deck(dir, "cuda", prec);
    float *pg = train(c, gpu, lg, &ng);
    for (int s = 0; s < STEPS; s++)
      if (fabs(lg[s] - lc[s]) / lc[s] > worst) worst = fabs(lg[s] - lc[s]) / lc[s];
    double pe = pc && pg && nc == ng ? t_rel_err(pg, pc, nc) : INFINITY;
    int fp32 = k == 0;
    printf("training %d steps, %s, %s storage, paths %s: losses %.5f..%.5f (cpu %.5f..%.5f), loss rel err %.2e, "
           "parameters %.2e\n",
           STEPS, prec, backend_dtype_name(gpu->storage), modes[k].paths, lg[0], lg[STEPS - 1], lc[0], lc[STEPS - 1],
           worst, pe);
    T_CHECK(worst <= (fp32 ? 1e-4 : 3e-2), "training [%s, %s storage]: a step's loss differs by %.3g relative", prec,
            backend_dtype_name(gpu->storage), worst);
    T_CHECK(pe <= (fp32 ? 1e-3 : 5e-2), "training [%s, %s storage]: parameters differ by %.3g", prec,
            backend_dtype_name(gpu->storage), pe);
    free(pg), free(pc), free(c);
    backend_close(gpu);
  }
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  char why[256];
  int n = backend_kind_cuda.devices(why, sizeof why);
  if (n == 0) {
    printf("SKIP: no usable GPU (%s): the parity test needs one\n", why);
    MPI_Finalize();
    return 77;
  }
  const char *out = getenv("TEST_OUT");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/gpu_parity", out ? out : "tests/out");
  util_mkdir_p(dir);
  rng_seed(&R, 2024, 0, 0);
  const backend *cpu16[3] = {NULL, backend_kind_cpu.open(-1, "bf16"), backend_kind_cpu.open(-1, "fp16")};
  for (int k = 0; k < NMODES; k++) {
    open_mode(k, &cpu16[modes[k].storage]);
    char desc[512];
    printf("GPU, mode %d: %s\n", k, gpu->describe(gpu, desc, sizeof desc));
    test_ops();
    backend_close(gpu);
  }
  test_training(dir, cpu16);
  backend_close(cpu16[1]), backend_close(cpu16[2]);
  int rc = t_done("test_gpu_parity");
  MPI_Finalize();
  return rc;
}

#else /* a build without CUDA */

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  printf("SKIP: this build has no CUDA backend (configure --with-cuda)\n");
  MPI_Finalize();
  return 77;
}

#endif
