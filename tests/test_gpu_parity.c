/* test_gpu_parity: the CUDA backend against the CPU backend (the reference), op by op and for
 * whole training steps.
 *
 * Every op of the backend table, forward and backward, runs on both backends on the same random
 * inputs, for several shapes (row, key and tile counts that are not multiples of the kernels'
 * tiles; global and local attention, windows shorter than a tile, several sequences; every
 * head-size class of both families of attention kernels), and at each GEMM precision.
 * Accumulating outputs start from random values so "+=" is checked. The error of a tensor is
 * max |gpu - cpu| / max |cpu|; the bounds:
 *   elementwise, LayerNorm, embedding, softmax/cross-entropy, AdamW: 1e-4 (fp32 math in every
 *     mode; only the order of sums and the exp differ)
 *   GEMMs: fp32 2e-5 (K up to 512), tf32 and fp16 inputs (10-bit mantissa) 5e-3, bf16 (7-bit) 3e-2
 *   attention (att_tol): 1e-4 on the fp32 kernels (fp32 and tf32 precision; other head sizes);
 *     the tensor-core kernels, which take bf16 and fp16 precision for head sizes 33..128 and round
 *     q, k, v, dO, P and dS, as the GEMMs: bf16 3e-2, fp16 5e-3. q and k are drawn with standard
 *     deviation hs^-1/4, so that q.k has variance 1 as in a trained model: with N(0,1) entries the
 *     softmax is all but one-hot, which hides a wrong mask and magnifies the rounding of bf16
 * Then a tiny GPT-Neo (global and local layers) trains 4 steps on each backend from the same
 * initialisation and data, at each precision (fp16 with dynamic loss scaling): losses within 1e-4
 * (fp32) or 3e-2 (tensor-core GEMMs) relative, parameters within 1e-3 (fp32) or 5e-2 of the
 * largest.
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
#include "trainer.h"
#include "base/util.h"

#ifdef GREENLM_HAVE_CUDA

static const backend *cpu, *gpu;
static rng_state R;
static const char *prec; /* the GEMM precision under test */

static float *frand(size_t n, double scale) {
  float *x = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&R));
  return x;
}
static float *fcopy(const float *x, size_t n) {
  float *y = malloc((n ? n : 1) * sizeof(float));
  memcpy(y, x, n * sizeof(float));
  return y;
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
/* Compare n floats of device memory d with the CPU result c. */
static void cmp(const char *what, const float *d, const float *c, size_t n, double tol) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  gpu->to_host(gpu, h, d, n * sizeof(float));
  double e = t_rel_err(h, c, n);
  T_CHECK(e <= tol, "%s [%s]: relative error %.3g > %.1e", what, prec, e, tol);
  printf("  %-44s %-4s rel err %.2e (bound %.0e)\n", what, prec, e, tol);
  free(h);
}

static double gemm_tol(void) {
  return !strcmp(prec, "fp32") ? 2e-5 : !strcmp(prec, "bf16") ? 3e-2 : 5e-3;
}
static const double TOL = 1e-4; /* fp32 math outside the GEMMs */
/* Attention of head size hs: the CUDA backend's tensor-core kernels (bf16 and fp16 precision, hs
 * 33..128) round their inputs, P and dS as the GEMMs do; the fp32 kernels take the rest. */
static double att_tol(int hs) {
  return hs <= 32 || hs > 128 || !strcmp(prec, "fp32") || !strcmp(prec, "tf32") ? TOL : gemm_tol();
}

/* ---- ops --------------------------------------------------------------------------------------- */

static void test_embed(int B, int T, int C, int V) {
  char w[96];
  size_t N = (size_t)B * T;
  int32_t *tok = irand(N, V); /* repeated tokens: the backward's atomics collide */
  float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)T * C, 1), *dout = frand(N * C, 1);
  float *out = frand(N * C, 1), *dwte = frand((size_t)V * C, 1), *dwpe = frand((size_t)T * C, 1);
  int32_t *gtok = up(tok, N * sizeof(int32_t));
  float *gwte = up(wte, (size_t)V * C * 4), *gwpe = up(wpe, (size_t)T * C * 4), *gdout = up(dout, N * C * 4);
  float *gout = up(out, N * C * 4), *gdwte = up(dwte, (size_t)V * C * 4), *gdwpe = up(dwpe, (size_t)T * C * 4);
  cpu->embed_fwd(cpu, out, tok, wte, wpe, B, T, C);
  gpu->embed_fwd(gpu, gout, gtok, gwte, gwpe, B, T, C);
  snprintf(w, sizeof w, "embed fwd B=%d T=%d C=%d V=%d", B, T, C, V);
  cmp(w, gout, out, N * C, TOL);
  cpu->embed_bwd(cpu, dwte, dwpe, dout, tok, B, T, C);
  gpu->embed_bwd(gpu, gdwte, gdwpe, gdout, gtok, B, T, C);
  snprintf(w, sizeof w, "embed bwd dwte += B=%d T=%d C=%d V=%d", B, T, C, V);
  cmp(w, gdwte, dwte, (size_t)V * C, TOL);
  snprintf(w, sizeof w, "embed bwd dwpe += B=%d T=%d C=%d", B, T, C);
  cmp(w, gdwpe, dwpe, (size_t)T * C, TOL);
  free(tok), free(wte), free(wpe), free(dout), free(out), free(dwte), free(dwpe);
  gpu->free(gpu, gtok), gpu->free(gpu, gwte), gpu->free(gpu, gwpe), gpu->free(gpu, gdout), gpu->free(gpu, gout), gpu->free(gpu, gdwte);
  gpu->free(gpu, gdwpe);
}

static void test_layernorm(int N, int C) {
  char w[96];
  size_t n = (size_t)N * C;
  float *inp = frand(n, 2), *lw = frand((size_t)C, 1), *lb = frand((size_t)C, 1), *dout = frand(n, 1);
  for (size_t i = 0; i < n; i++) inp[i] += 0.5f; /* a mean to remove */
  float *out = frand(n, 1), *mean = frand((size_t)N, 1), *rstd = frand((size_t)N, 1);
  float *dinp = frand(n, 1), *dw = frand((size_t)C, 1), *db = frand((size_t)C, 1);
  float *ginp = up(inp, n * 4), *gw = up(lw, (size_t)C * 4), *gb = up(lb, (size_t)C * 4), *gdout = up(dout, n * 4);
  float *gout = up(out, n * 4), *gmean = up(mean, (size_t)N * 4), *grstd = up(rstd, (size_t)N * 4);
  float *gdinp = up(dinp, n * 4), *gdw = up(dw, (size_t)C * 4), *gdb = up(db, (size_t)C * 4);
  cpu->layernorm_fwd(cpu, out, mean, rstd, inp, lw, lb, N, C, 1e-5f);
  gpu->layernorm_fwd(gpu, gout, gmean, grstd, ginp, gw, gb, N, C, 1e-5f);
  snprintf(w, sizeof w, "layernorm fwd N=%d C=%d", N, C);
  cmp(w, gout, out, n, TOL);
  cmp("  mean", gmean, mean, (size_t)N, TOL);
  cmp("  rstd", grstd, rstd, (size_t)N, TOL);
  cpu->layernorm_bwd(cpu, dinp, dw, db, dout, inp, lw, mean, rstd, N, C);
  gpu->layernorm_bwd(gpu, gdinp, gdw, gdb, gdout, ginp, gw, gmean, grstd, N, C);
  snprintf(w, sizeof w, "layernorm bwd dinp += N=%d C=%d", N, C);
  cmp(w, gdinp, dinp, n, TOL);
  cmp("  dw +=", gdw, dw, (size_t)C, TOL);
  cmp("  db +=", gdb, db, (size_t)C, TOL);
  free(inp), free(lw), free(lb), free(dout), free(out), free(mean), free(rstd), free(dinp), free(dw), free(db);
  gpu->free(gpu, ginp), gpu->free(gpu, gw), gpu->free(gpu, gb), gpu->free(gpu, gdout), gpu->free(gpu, gout), gpu->free(gpu, gmean);
  gpu->free(gpu, grstd), gpu->free(gpu, gdinp), gpu->free(gpu, gdw), gpu->free(gpu, gdb);
}

static void test_matmul(int N, int K, int M, int with_bias, int with_dinp) {
  char w[96];
  float *inp = frand((size_t)N * K, 1), *wt = frand((size_t)M * K, 0.5), *bias = frand((size_t)M, 1);
  float *dout = frand((size_t)N * M, 1), *out = frand((size_t)N * M, 1), *dinp = frand((size_t)N * K, 1);
  float *dw = frand((size_t)M * K, 1), *db = frand((size_t)M, 1);
  float *ginp = up(inp, (size_t)N * K * 4), *gwt = up(wt, (size_t)M * K * 4), *gbias = up(bias, (size_t)M * 4);
  float *gdout = up(dout, (size_t)N * M * 4), *gout = up(out, (size_t)N * M * 4), *gdinp = up(dinp, (size_t)N * K * 4);
  float *gdw = up(dw, (size_t)M * K * 4), *gdb = up(db, (size_t)M * 4);
  cpu->matmul_fwd(cpu, out, inp, wt, with_bias ? bias : NULL, N, K, M);
  gpu->matmul_fwd(gpu, gout, ginp, gwt, with_bias ? gbias : NULL, N, K, M);
  snprintf(w, sizeof w, "matmul fwd N=%d K=%d M=%d%s", N, K, M, with_bias ? " +bias" : "");
  cmp(w, gout, out, (size_t)N * M, gemm_tol());
  cpu->matmul_bwd(cpu, with_dinp ? dinp : NULL, dw, with_bias ? db : NULL, dout, inp, wt, N, K, M);
  gpu->matmul_bwd(gpu, with_dinp ? gdinp : NULL, gdw, with_bias ? gdb : NULL, gdout, ginp, gwt, N, K, M);
  snprintf(w, sizeof w, "matmul bwd N=%d K=%d M=%d: dinp%s", N, K, M, with_dinp ? "" : " (NULL: untouched)");
  cmp(w, gdinp, dinp, (size_t)N * K, with_dinp ? gemm_tol() : 0.0);
  cmp("  dw +=", gdw, dw, (size_t)M * K, gemm_tol());
  cmp(with_bias ? "  dbias +=" : "  dbias (NULL: untouched)", gdb, db, (size_t)M, with_bias ? TOL : 0.0);
  free(inp), free(wt), free(bias), free(dout), free(out), free(dinp), free(dw), free(db);
  gpu->free(gpu, ginp), gpu->free(gpu, gwt), gpu->free(gpu, gbias), gpu->free(gpu, gdout), gpu->free(gpu, gout), gpu->free(gpu, gdinp);
  gpu->free(gpu, gdw), gpu->free(gpu, gdb);
}

static void test_attention(int B, int T, int C, int H, int window, float scale) {
  char w[128];
  size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, nl = (size_t)B * H * T;
  float *qkv = frand(n3, 1), *dout = frand(n, 1), *out = frand(n, 1), *lse = frand(nl, 1), *dqkv = frand(n3, 1);
  const float qk = (float)pow(C / H, -0.25); /* q, k: q.k of variance 1 */
  for (size_t r = 0; r < (size_t)B * T; r++)
    for (int x = 0; x < 2 * C; x++) qkv[r * 3 * C + x] *= qk;
  const double tol = att_tol(C / H);
  float *gqkv = up(qkv, n3 * 4), *gdout = up(dout, n * 4), *gout = up(out, n * 4), *glse = up(lse, nl * 4);
  float *gdqkv = up(dqkv, n3 * 4);
  float *scratch = malloc(cpu->attention_scratch(cpu, T) + 64);
  float *gscratch = gpu->alloc(gpu, gpu->attention_scratch(gpu, T));
  cpu->attention_fwd(cpu, out, lse, qkv, scratch, B, T, C, H, window, scale);
  gpu->attention_fwd(gpu, gout, glse, gqkv, gscratch, B, T, C, H, window, scale);
  snprintf(w, sizeof w, "attention fwd B=%d T=%d C=%d H=%d (hs %d) %s%d", B, T, C, H, C / H,
           window > 0 ? "local " : "global", window > 0 ? window : T);
  cmp(w, gout, out, n, tol);
  cmp("  lse", glse, lse, nl, tol);
  cpu->attention_bwd(cpu, dqkv, dout, out, lse, qkv, scratch, B, T, C, H, window, scale);
  gpu->attention_bwd(gpu, gdqkv, gdout, gout, glse, gqkv, gscratch, B, T, C, H, window, scale);
  cmp("  bwd dqkv (overwritten)", gdqkv, dqkv, n3, tol);
  free(qkv), free(dout), free(out), free(lse), free(dqkv), free(scratch);
  gpu->free(gpu, gqkv), gpu->free(gpu, gdout), gpu->free(gpu, gout), gpu->free(gpu, glse), gpu->free(gpu, gdqkv), gpu->free(gpu, gscratch);
}

static void test_elementwise(size_t n) {
  char w[96];
  float *x = frand(n, 2), *y = frand(n, 1), *d = frand(n, 1), *o = frand(n, 1);
  float *gx = up(x, n * 4), *gy = up(y, n * 4), *gd = up(d, n * 4), *go = up(o, n * 4);
  cpu->gelu_fwd(cpu, o, x, n);
  gpu->gelu_fwd(gpu, go, gx, n);
  snprintf(w, sizeof w, "gelu_new fwd n=%zu", n);
  cmp(w, go, o, n, TOL);
  cpu->gelu_bwd(cpu, d, d, x, n); /* in place, as the model calls it */
  gpu->gelu_bwd(gpu, gd, gd, gx, n);
  cmp("  gelu_new bwd (dinp aliases dout)", gd, d, n, TOL);
  cpu->residual_fwd(cpu, o, x, y, n);
  gpu->residual_fwd(gpu, go, gx, gy, n);
  cmp("  residual", go, o, n, TOL);
  cpu->accumulate(cpu, y, x, n);
  gpu->accumulate(gpu, gy, gx, n);
  cmp("  accumulate +=", gy, y, n, TOL);
  double s1, s2;
  cpu->sumsq(cpu, &s1, x, n), gpu->sumsq(gpu, &s2, gx, n);
  T_CHECK(fabs(s1 - s2) <= 1e-6 * s1, "sumsq n=%zu: gpu %.12g vs cpu %.12g", n, s2, s1);
  printf("  %-44s %-4s rel err %.2e (bound 1e-06)\n", "sumsq (double, on the host)", prec, fabs(s1 - s2) / s1);
  free(x), free(y), free(d), free(o);
  gpu->free(gpu, gx), gpu->free(gpu, gy), gpu->free(gpu, gd), gpu->free(gpu, go);
}

static void test_xent(int N, int V) {
  char w[96];
  size_t n = (size_t)N * V;
  float *logits = frand(n, 3), *losses = frand((size_t)N, 1);
  int32_t *tgt = irand((size_t)N, V);
  float *l2 = fcopy(logits, n), *glog = up(logits, n * 4), *glog2 = up(logits, n * 4), *gloss = up(losses, (size_t)N * 4);
  int32_t *gtgt = up(tgt, (size_t)N * sizeof(int32_t));
  float dscale = 1.0f / (float)N;
  cpu->xent_fwd_bwd(cpu, losses, logits, tgt, N, V, dscale);
  gpu->xent_fwd_bwd(gpu, gloss, glog, gtgt, N, V, dscale);
  snprintf(w, sizeof w, "softmax+xent N=%d V=%d: losses", N, V);
  cmp(w, gloss, losses, (size_t)N, TOL);
  cmp("  dlogits (dscale 1/N)", glog, logits, n, TOL);
  cpu->xent_fwd_bwd(cpu, losses, l2, tgt, N, V, 0.0f);
  gpu->xent_fwd_bwd(gpu, gloss, glog2, gtgt, N, V, 0.0f);
  cmp("  losses, forward only (dscale 0)", gloss, losses, (size_t)N, TOL);
  free(logits), free(losses), free(tgt), free(l2);
  gpu->free(gpu, glog), gpu->free(gpu, glog2), gpu->free(gpu, gloss), gpu->free(gpu, gtgt);
}

static void test_adamw(size_t n) {
  float *p = frand(n, 1), *g = frand(n, 1), *m = frand(n, 0.1), *v = frand(n, 0.1);
  for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
  float *gp = up(p, n * 4), *gg = up(g, n * 4), *gm = up(m, n * 4), *gv = up(v, n * 4);
  backend_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .grad_scale = 0.5f, .step = 7};
  cpu->adamw(cpu, p, NULL, g, m, v, n, &a);
  gpu->adamw(gpu, gp, NULL, gg, gm, gv, n, &a);
  cmp("adamw: parameters", gp, p, n, TOL);
  cmp("  first moments", gm, m, n, TOL);
  cmp("  second moments", gv, v, n, TOL);
  free(p), free(g), free(m), free(v);
  gpu->free(gpu, gp), gpu->free(gpu, gg), gpu->free(gpu, gm), gpu->free(gpu, gv);
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
  gpu->to_fp32(gpu, b, a, n); /* the storage conversions, both ways (the identity at fp32 storage) */
  gpu->to_storage(gpu, a, b, n);
  gpu->to_host(gpu, back, a, n * 4);
  T_CHECK(memcmp(back, h, n * 4) == 0, "to_fp32 / to_storage do not round-trip");
  gpu->zero(gpu, b, n * 4);
  gpu->to_host(gpu, back, b, n * 4);
  T_CHECK(back[0] == 0.0f && back[n - 1] == 0.0f, "zero left data");
  gpu->sync(gpu);
  free(h), free(back);
  gpu->free(gpu, a), gpu->free(gpu, b);
}

/* Which case covers each op of the list; a new op without one fails the test. */
static const char *const covered_by[BACKEND_NOPS] = {
    [BACKEND_OP_embed_fwd] = "test_embed",         [BACKEND_OP_embed_bwd] = "test_embed",
    [BACKEND_OP_layernorm_fwd] = "test_layernorm", [BACKEND_OP_layernorm_bwd] = "test_layernorm",
    [BACKEND_OP_matmul_fwd] = "test_matmul",       [BACKEND_OP_matmul_bwd] = "test_matmul",
    [BACKEND_OP_attention_fwd] = "test_attention", [BACKEND_OP_attention_bwd] = "test_attention",
    [BACKEND_OP_gelu_fwd] = "test_elementwise",    [BACKEND_OP_gelu_bwd] = "test_elementwise",
    [BACKEND_OP_residual_fwd] = "test_elementwise", [BACKEND_OP_accumulate] = "test_elementwise",
    [BACKEND_OP_sumsq] = "test_elementwise",       [BACKEND_OP_xent_fwd_bwd] = "test_xent",
    [BACKEND_OP_adamw] = "test_adamw",             [BACKEND_OP_to_storage] = "test_memory",
    [BACKEND_OP_to_fp32] = "test_memory",
};

static void test_ops(void) {
  for (int i = 0; i < BACKEND_NOPS; i++) T_CHECK(covered_by[i] != NULL, "op %s has no parity case", backend_op_names[i]);
  printf("== ops, precision %s ==\n", prec);
  test_embed(2, 17, 24, 50);
  test_embed(3, 64, 96, 300);
  test_layernorm(37, 96);
  test_layernorm(130, 768);
  test_layernorm(5, 5000); /* beyond the shared-memory path of the backward */
  test_matmul(7, 13, 5, 1, 1);
  test_matmul(64, 96, 200, 1, 1);
  test_matmul(130, 257, 67, 0, 0);
  test_matmul(256, 512, 384, 1, 1);
  test_elementwise(1000003);
  test_xent(5, 50257);
  test_xent(33, 1000);
  test_adamw(100003);
  if (strcmp(prec, "fp32") == 0) test_memory(); /* no GEMM inside: once is enough */
  /* attention in every mode: the tensor-core kernels (64-row blocks, 64-key tiles) take hs 33..128
   * at bf16 and fp16, the fp32 kernels (16-row blocks, 32-key tiles) the rest */
  test_attention(2, 37, 64, 4, 0, 1.0f);     /* hs 16 (fp32 kernels), GPT-Neo's unscaled scores */
  test_attention(1, 100, 128, 2, 0, 0.125f); /* hs 64, GPT-2's 1/sqrt(hs) */
  test_attention(2, 77, 96, 3, 16, 1.0f);    /* hs 32 (fp32 kernels), local window */
  test_attention(1, 300, 256, 2, 64, 1.0f);  /* hs 128, local window over several tiles */
  test_attention(2, 129, 256, 2, 0, 1.0f);   /* hs 128, global */
  test_attention(1, 50, 512, 2, 0, 0.0625f); /* hs 256 (fp32 kernels) */
  test_attention(2, 33, 40, 2, 1, 1.0f);     /* hs 20 (fp32 kernels), window 1: each query sees itself */
  test_attention(1, 1, 64, 2, 0, 1.0f);      /* one token, hs 32 (fp32 kernels) */
  test_attention(3, 150, 128, 2, 24, 1.0f);  /* hs 64, window 24: shorter than a tile */
  test_attention(2, 211, 256, 2, 100, 1.0f); /* hs 128, window 100 */
  test_attention(1, 65, 128, 2, 1, 1.0f);    /* hs 64, window 1 */
  test_attention(2, 1, 512, 4, 0, 1.0f);     /* one token, hs 128 */
  test_attention(2, 90, 96, 2, 20, 1.0f);    /* hs 48, zero-padded to 64 */
  test_attention(1, 200, 192, 2, 0, 1.0f);   /* hs 96, zero-padded to 128 */
  test_attention(1, 520, 128, 2, 0, 0.125f); /* hs 64, global over 9 key tiles */
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

static void test_training(const char *dir) {
  cfg_config *c = deck(dir, "cpu", "fp32");
  err_list perr = {0};
  T_CHECK(prepare_run(c, MPI_COMM_SELF, &perr) == 0, "prepare failed");
  err_print(&perr, 10);
  err_free(&perr);
  double lc[STEPS];
  size_t nc, ng;
  float *pc = train(c, cpu, lc, &nc);
  free(c);
  static const char *precs[] = {"fp32", "tf32", "bf16", "fp16"}; /* fp16 with loss scaling */
  for (int k = 0; k < 4; k++) {
    prec = precs[k];
    gpu = backend_kind_cuda.open(0, prec);
    c = deck(dir, "cuda", prec);
    double lg[STEPS], worst = 0;
    float *pg = train(c, gpu, lg, &ng);
    for (int s = 0; s < STEPS; s++)
      if (fabs(lg[s] - lc[s]) / lc[s] > worst) worst = fabs(lg[s] - lc[s]) / lc[s];
    double pe = pc && pg && nc == ng ? t_rel_err(pg, pc, nc) : INFINITY;
    int fp32 = k == 0;
    printf("training %d steps, %s: losses %.5f..%.5f (cpu %.5f..%.5f), loss rel err %.2e, parameters %.2e\n", STEPS,
           prec, lg[0], lg[STEPS - 1], lc[0], lc[STEPS - 1], worst, pe);
    T_CHECK(worst <= (fp32 ? 1e-4 : 3e-2), "training [%s]: a step's loss differs by %.3g relative", prec, worst);
    T_CHECK(pe <= (fp32 ? 1e-3 : 5e-2), "training [%s]: parameters differ by %.3g", prec, pe);
    free(pg), free(c);
    backend_close(gpu);
  }
  free(pc);
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
  cpu = backend_cpu();
  rng_seed(&R, 2024, 0, 0);
  static const char *precs[] = {"fp32", "tf32", "bf16", "fp16"};
  for (int k = 0; k < 4; k++) {
    prec = precs[k];
    gpu = backend_kind_cuda.open(0, prec);
    char desc[512];
    if (k == 0) printf("GPU: %s\n", gpu->describe(gpu, desc, sizeof desc));
    test_ops();
    backend_close(gpu);
  }
  test_training(dir);
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
