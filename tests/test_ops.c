/* test_ops: every op of the CPU backend, forward and backward, against finite differences.
 *
 * For each op a plain double-precision reference of the forward pass is written here,
 * independently of the float kernels. The test checks
 *   1. the float forward against the double reference (relative error < 2e-5), and
 *   2. the float backward against central finite differences of the double reference:
 *      for a random projection w, L(x) = sum_i w_i * f(x)_i, and dL/dx_j from the op's backward
 *      (fed dout = w) must match (L(x + h e_j) - L(x - h e_j)) / 2h, h = 1e-6 (relative error
 *      < 1e-4 over the tensor).
 * Large tensors are probed at 300 random coordinates.
 *
 * Then the 16-bit storage types: the conversions (every bf16 and fp16 value round trips; rounding
 * is to nearest even, with fp16's subnormals, overflow to infinity and NaN), and every op at bf16
 * and fp16 storage against the same op at fp32 on the same (representable) inputs: the 16-bit
 * output must be exactly the fp32 output rounded once, and fp32 outputs (statistics, parameter
 * gradients) exactly equal. Every op of backend.h's list must be covered (op_tests). The KV-cache
 * ops (inference only, no backward) are checked against the double reference of causal attention
 * over whole sequences, fed to the cache in passes. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "base/fpenv.h"
#include "base/rng.h"
#include "testing.h"
#include "testquant.h"
#include "base/util.h"

static const backend *be;
static rng_state R;

static float *frand(size_t n, double scale) {
  float *x = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_normal(&R));
  return x;
}
static double *dcopy(const float *x, size_t n) {
  double *d = malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}
static float *fzeros(size_t n) { return calloc(n, sizeof(float)); }
static float *fcopy(const float *x, size_t n) { return memcpy(malloc(n * sizeof(float)), x, n * sizeof(float)); }

/* ---- the finite-difference driver -------------------------------------------------------------- */

/* Reference loss: sum(w * f(inputs)) in double; ctx holds the double inputs. */
typedef double (*ref_loss)(void *ctx);

/* Compare the analytic gradient g (float, n) of L with respect to x (double, n, inside ctx) with
 * central differences. */
static void check_grad(const char *what, ref_loss L, void *ctx, double *x, const float *g, size_t n) {
  const double h = 1e-6;
  size_t probes = n <= 600 ? n : 300;
  double num = 0.0, den = 0.0;
  for (size_t k = 0; k < probes; k++) {
    size_t j = probes == n ? k : (size_t)rng_below(&R, n);
    double x0 = x[j];
    x[j] = x0 + h;
    double lp = L(ctx);
    x[j] = x0 - h;
    double lm = L(ctx);
    x[j] = x0;
    double fd = (lp - lm) / (2 * h);
    double d = fabs(fd - g[j]);
    if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
    if (fabs(fd) > den) den = fabs(fd);
  }
  double rel = den > 0 ? num / den : num;
  T_CHECK(rel < 1e-4, "%s: gradient relative error %.3g against finite differences", what, rel);
  printf("  %-34s grad rel err %.2e (%zu probes)\n", what, rel, probes);
}

static void check_fwd(const char *what, const float *y, const double *ref, size_t n) {
  double rel = t_rel_err_d(y, ref, n);
  T_CHECK(rel < 2e-5, "%s: forward relative error %.3g against the double reference", what, rel);
  printf("  %-34s fwd  rel err %.2e\n", what, rel);
}

static double wsum(const double *w, const double *y, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += w[i] * y[i];
  return s;
}

/* ---- embedding --------------------------------------------------------------------------------- */

typedef struct {
  int B, T, C, V;
  int32_t *tok;
  double *wte, *wpe, *w, *y;
} emb_ctx;

static void emb_ref(emb_ctx *c) {
  for (int b = 0; b < c->B; b++)
    for (int t = 0; t < c->T; t++)
      for (int k = 0; k < c->C; k++)
        c->y[((size_t)b * c->T + t) * c->C + k] = c->wte[(size_t)c->tok[b * c->T + t] * c->C + k] + c->wpe[(size_t)t * c->C + k];
}
static double emb_loss(void *p) {
  emb_ctx *c = p;
  emb_ref(c);
  return wsum(c->w, c->y, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void) {
  emb_ctx c = {.B = 2, .T = 5, .C = 6, .V = 7};
  size_t n = (size_t)c.B * c.T * c.C;
  c.tok = malloc((size_t)c.B * c.T * sizeof(int32_t));
  for (int i = 0; i < c.B * c.T; i++) c.tok[i] = (int32_t)rng_below(&R, (uint64_t)c.V);
  float *wte = frand((size_t)c.V * c.C, 1), *wpe = frand((size_t)c.T * c.C, 1), *w = frand(n, 1), *y = fzeros(n);
  c.wte = dcopy(wte, (size_t)c.V * c.C);
  c.wpe = dcopy(wpe, (size_t)c.T * c.C);
  c.w = dcopy(w, n);
  c.y = malloc(n * sizeof(double));
  be->embed_fwd(be, y, c.tok, wte, wpe, c.B, c.T, c.C, 0, c.V);
  emb_ref(&c);
  check_fwd("embedding", y, c.y, n);
  float *dwte = fzeros((size_t)c.V * c.C), *dwpe = fzeros((size_t)c.T * c.C);
  be->embed_bwd(be, dwte, dwpe, w, c.tok, c.B, c.T, c.C, 0, c.V);
  check_grad("embedding d/dwte", emb_loss, &c, c.wte, dwte, (size_t)c.V * c.C);
  check_grad("embedding d/dwpe", emb_loss, &c, c.wpe, dwpe, (size_t)c.T * c.C);
  /* vocabulary shards [0, 4) and [4, 7) (tensor parallelism): their outputs, the position embedding
   * added by the first only, sum to the whole's; their row gradients are the whole's rows */
  float *ys = fzeros(n), *y2 = fzeros(n), *dws = fzeros((size_t)c.V * c.C), *dps = fzeros((size_t)c.T * c.C);
  be->embed_fwd(be, ys, c.tok, wte, wpe, c.B, c.T, c.C, 0, 4);
  be->embed_fwd(be, y2, c.tok, wte + 4 * c.C, NULL, c.B, c.T, c.C, 4, 3);
  be->accumulate(be, ys, y2, n);
  check_fwd("embedding, two vocabulary shards", ys, c.y, n);
  be->embed_bwd(be, dws, dps, w, c.tok, c.B, c.T, c.C, 0, 4);
  be->embed_bwd(be, dws + 4 * c.C, NULL, w, c.tok, c.B, c.T, c.C, 4, 3);
  T_CHECK(memcmp(dws, dwte, (size_t)c.V * c.C * sizeof(float)) == 0 && memcmp(dps, dwpe, (size_t)c.T * c.C * sizeof(float)) == 0,
          "embedding: the shards' gradients differ from the whole's");
  free(ys), free(y2), free(dws), free(dps);
  free(c.tok), free(wte), free(wpe), free(w), free(y), free(c.wte), free(c.wpe), free(c.w), free(c.y), free(dwte),
      free(dwpe);
}

/* ---- LayerNorm --------------------------------------------------------------------------------- */

typedef struct {
  int N, C;
  double eps;
  double *x, *g, *b, *w, *y;
} ln_ctx;

static void ln_ref(ln_ctx *c) {
  for (int i = 0; i < c->N; i++) {
    const double *x = c->x + (size_t)i * c->C;
    double m = 0, v = 0;
    for (int k = 0; k < c->C; k++) m += x[k];
    m /= c->C;
    for (int k = 0; k < c->C; k++) v += (x[k] - m) * (x[k] - m);
    v /= c->C;
    for (int k = 0; k < c->C; k++) c->y[(size_t)i * c->C + k] = (x[k] - m) / sqrt(v + c->eps) * c->g[k] + c->b[k];
  }
}
static double ln_loss(void *p) {
  ln_ctx *c = p;
  ln_ref(c);
  return wsum(c->w, c->y, (size_t)c->N * c->C);
}

static void test_layernorm(void) {
  ln_ctx c = {.N = 6, .C = 37, .eps = 1e-5};
  size_t n = (size_t)c.N * c.C;
  float *x = frand(n, 2), *g = frand((size_t)c.C, 1), *b = frand((size_t)c.C, 1), *w = frand(n, 1);
  for (size_t i = 0; i < n; i++) x[i] += 0.5f; /* a nonzero mean */
  float *y = fzeros(n), *mean = fzeros((size_t)c.N), *rstd = fzeros((size_t)c.N);
  c.x = dcopy(x, n), c.g = dcopy(g, (size_t)c.C), c.b = dcopy(b, (size_t)c.C), c.w = dcopy(w, n);
  c.y = malloc(n * sizeof(double));
  be->layernorm_fwd(be, y, mean, rstd, x, g, b, c.N, c.C, (float)c.eps);
  ln_ref(&c);
  check_fwd("layernorm", y, c.y, n);
  float *dx = fzeros(n), *dg = fzeros((size_t)c.C), *db = fzeros((size_t)c.C);
  be->layernorm_bwd(be, dx, dg, db, w, x, g, mean, rstd, c.N, c.C, 1);
  check_grad("layernorm d/dinp", ln_loss, &c, c.x, dx, n);
  check_grad("layernorm d/dweight", ln_loss, &c, c.g, dg, (size_t)c.C);
  check_grad("layernorm d/dbias", ln_loss, &c, c.b, db, (size_t)c.C);
  float *dgo = frand((size_t)c.C, 1), *dbo = frand((size_t)c.C, 1); /* acc = 0: overwritten, whatever they held */
  be->layernorm_bwd(be, dx, dgo, dbo, w, x, g, mean, rstd, c.N, c.C, 0);
  T_CHECK(!memcmp(dgo, dg, (size_t)c.C * sizeof *dg) && !memcmp(dbo, db, (size_t)c.C * sizeof *db),
          "layernorm_bwd with acc = 0 does not overwrite dweight and dbias");
  free(dgo), free(dbo);
  free(x), free(g), free(b), free(w), free(y), free(mean), free(rstd), free(dx), free(dg), free(db);
  free(c.x), free(c.g), free(c.b), free(c.w), free(c.y);
}

/* ---- RMSNorm (Llama): out = x / sqrt(mean(x^2) + eps) * g; rstd saved ------------------------------ */

static void rms_ref(ln_ctx *c) {
  for (int i = 0; i < c->N; i++) {
    const double *x = c->x + (size_t)i * c->C;
    double v = 0;
    for (int k = 0; k < c->C; k++) v += x[k] * x[k];
    v /= c->C;
    for (int k = 0; k < c->C; k++) c->y[(size_t)i * c->C + k] = x[k] / sqrt(v + c->eps) * c->g[k];
  }
}
static double rms_loss(void *p) {
  ln_ctx *c = p;
  rms_ref(c);
  return wsum(c->w, c->y, (size_t)c->N * c->C);
}

static void test_rmsnorm(void) {
  ln_ctx c = {.N = 6, .C = 37, .eps = 1e-6};
  size_t n = (size_t)c.N * c.C;
  float *x = frand(n, 2), *g = frand((size_t)c.C, 1), *w = frand(n, 1);
  float *y = fzeros(n), *rstd = fzeros((size_t)c.N), *dx = fzeros(n), *dg = fzeros((size_t)c.C);
  c.x = dcopy(x, n), c.g = dcopy(g, (size_t)c.C), c.w = dcopy(w, n), c.y = malloc(n * sizeof(double));
  be->rmsnorm_fwd(be, y, rstd, x, g, c.N, c.C, (float)c.eps);
  rms_ref(&c);
  check_fwd("rmsnorm", y, c.y, n);
  be->rmsnorm_bwd(be, dx, dg, w, x, g, rstd, c.N, c.C, 1);
  check_grad("rmsnorm d/dinp", rms_loss, &c, c.x, dx, n);
  check_grad("rmsnorm d/dweight", rms_loss, &c, c.g, dg, (size_t)c.C);
  float *dgo = frand((size_t)c.C, 1); /* acc = 0: overwritten, whatever it held */
  be->rmsnorm_bwd(be, dx, dgo, w, x, g, rstd, c.N, c.C, 0);
  T_CHECK(!memcmp(dgo, dg, (size_t)c.C * sizeof *dg), "rmsnorm_bwd with acc = 0 does not overwrite dweight");
  free(dgo), free(x), free(g), free(w), free(y), free(rstd), free(dx), free(dg);
  free(c.x), free(c.g), free(c.w), free(c.y);
}

/* ---- SwiGLU: h = silu(g) * u from rows [g | u] ---------------------------------------------------- */

typedef struct {
  int N, F;
  double *gu, *w, *y;
} swiglu_ctx;

static double swiglu_loss(void *p) {
  swiglu_ctx *c = p;
  for (int i = 0; i < c->N; i++)
    for (int j = 0; j < c->F; j++) {
      const double g = c->gu[(size_t)i * 2 * c->F + j], u = c->gu[(size_t)i * 2 * c->F + c->F + j];
      c->y[(size_t)i * c->F + j] = g / (1.0 + exp(-g)) * u;
    }
  return wsum(c->w, c->y, (size_t)c->N * c->F);
}

static void test_swiglu(void) {
  swiglu_ctx c = {.N = 5, .F = 23};
  const size_t n = (size_t)c.N * c.F;
  float *gu = frand(2 * n, 3), *w = frand(n, 1), *h = fzeros(n), *dgu = frand(2 * n, 1); /* dgu overwritten */
  c.gu = dcopy(gu, 2 * n), c.w = dcopy(w, n), c.y = malloc(n * sizeof(double));
  be->swiglu_fwd(be, h, gu, c.N, c.F);
  swiglu_loss(&c);
  check_fwd("swiglu", h, c.y, n);
  be->swiglu_bwd(be, dgu, w, gu, c.N, c.F);
  check_grad("swiglu d/d[gate|up]", swiglu_loss, &c, c.gu, dgu, 2 * n);
  free(gu), free(w), free(h), free(dgu), free(c.gu), free(c.w), free(c.y);
}

/* residual_layernorm_fwd: res = a + b and out = LayerNorm(res), the two ops' results bit for bit;
 * its gradient is layernorm_bwd's dinp, for a and b alike (the model adds it to the residual stream) */
typedef struct {
  ln_ctx ln;
  double *a, *b;
} rln_ctx;

static double rln_loss(void *p) {
  rln_ctx *c = p;
  for (size_t i = 0; i < (size_t)c->ln.N * c->ln.C; i++) c->ln.x[i] = c->a[i] + c->b[i];
  return ln_loss(&c->ln);
}

static void test_residual_layernorm(void) {
  rln_ctx c = {.ln = {.N = 5, .C = 29, .eps = 1e-5}};
  const int N = c.ln.N, C = c.ln.C;
  size_t n = (size_t)N * C;
  float *a = frand(n, 1), *b = frand(n, 1), *g = frand(C, 1), *bb = frand(C, 1), *w = frand(n, 1);
  float *res = fzeros(n), *y = fzeros(n), *mean = fzeros(N), *rstd = fzeros(N);
  float *res2 = fzeros(n), *y2 = fzeros(n), *mean2 = fzeros(N), *rstd2 = fzeros(N), *dres = fzeros(n);
  be->residual_layernorm_fwd(be, res, y, mean, rstd, a, b, g, bb, N, C, 1e-5f);
  be->residual_fwd(be, res2, a, b, n);
  be->layernorm_fwd(be, y2, mean2, rstd2, res2, g, bb, N, C, 1e-5f);
  T_CHECK(!memcmp(res, res2, n * 4) && !memcmp(y, y2, n * 4) && !memcmp(mean, mean2, N * 4) && !memcmp(rstd, rstd2, N * 4),
          "residual_layernorm_fwd differs from residual_fwd then layernorm_fwd");
  c.a = dcopy(a, n), c.b = dcopy(b, n), c.ln.x = malloc(n * sizeof(double)), c.ln.y = malloc(n * sizeof(double));
  c.ln.g = dcopy(g, C), c.ln.b = dcopy(bb, C), c.ln.w = dcopy(w, n);
  float *dg = fzeros(C), *db = fzeros(C);
  be->layernorm_bwd(be, dres, dg, db, w, res, g, mean, rstd, N, C, 1);
  check_grad("residual_layernorm d/da", rln_loss, &c, c.a, dres, n);
  check_grad("residual_layernorm d/db", rln_loss, &c, c.b, dres, n);
  free(a), free(b), free(g), free(bb), free(w), free(res), free(y), free(mean), free(rstd), free(res2), free(y2),
      free(mean2), free(rstd2), free(dres), free(dg), free(db);
  free(c.a), free(c.b), free(c.ln.x), free(c.ln.y), free(c.ln.g), free(c.ln.b), free(c.ln.w);
}

/* ---- matmul ------------------------------------------------------------------------------------ */

typedef struct {
  int N, K, M;
  double *x, *W, *bias, *w, *y;
} mm_ctx;

static void mm_ref(mm_ctx *c) {
  for (int i = 0; i < c->N; i++)
    for (int j = 0; j < c->M; j++) {
      double s = c->bias ? c->bias[j] : 0.0;
      for (int k = 0; k < c->K; k++) s += c->x[(size_t)i * c->K + k] * c->W[(size_t)j * c->K + k];
      c->y[(size_t)i * c->M + j] = s;
    }
}
static double mm_loss(void *p) {
  mm_ctx *c = p;
  mm_ref(c);
  return wsum(c->w, c->y, (size_t)c->N * c->M);
}

static void test_matmul(int with_bias) {
  mm_ctx c = {.N = 9, .K = 13, .M = 11};
  size_t nx = (size_t)c.N * c.K, nW = (size_t)c.M * c.K, ny = (size_t)c.N * c.M;
  float *x = frand(nx, 1), *W = frand(nW, 1), *bias = frand((size_t)c.M, 1), *w = frand(ny, 1), *y = fzeros(ny);
  c.x = dcopy(x, nx), c.W = dcopy(W, nW), c.bias = with_bias ? dcopy(bias, (size_t)c.M) : NULL, c.w = dcopy(w, ny);
  c.y = malloc(ny * sizeof(double));
  be->matmul_fwd(be, y, x, W, with_bias ? bias : NULL, c.N, c.K, c.M, c.M);
  mm_ref(&c);
  check_fwd(with_bias ? "matmul+bias" : "matmul", y, c.y, ny);
  float *dx = fzeros(nx), *dW = fzeros(nW), *db = fzeros((size_t)c.M);
  be->matmul_bwd(be, dx, dW, with_bias ? db : NULL, w, x, W, c.N, c.K, c.M, c.M, 1);
  check_grad(with_bias ? "matmul+bias d/dinp" : "matmul d/dinp", mm_loss, &c, c.x, dx, nx);
  check_grad(with_bias ? "matmul+bias d/dweight" : "matmul d/dweight", mm_loss, &c, c.W, dW, nW);
  if (with_bias) check_grad("matmul+bias d/dbias", mm_loss, &c, c.bias, db, (size_t)c.M);
  float *dWo = frand(nW, 1), *dbo = frand((size_t)c.M, 1); /* acc = 0: overwritten, whatever they held */
  be->matmul_bwd(be, NULL, dWo, with_bias ? dbo : NULL, w, x, W, c.N, c.K, c.M, c.M, 0);
  T_CHECK(!memcmp(dWo, dW, nW * sizeof *dW) && (!with_bias || !memcmp(dbo, db, (size_t)c.M * sizeof *db)),
          "matmul_bwd with acc = 0 does not overwrite dweight and dbias");
  free(dWo), free(dbo);
  /* dweight and dbias accumulate: a second backward doubles them */
  be->matmul_bwd(be, NULL, dW, with_bias ? db : NULL, w, x, W, c.N, c.K, c.M, c.M, 1);
  float *dW1 = fzeros(nW);
  be->matmul_bwd(be, dx, dW1, NULL, w, x, W, c.N, c.K, c.M, c.M, 1);
  double err = 0;
  for (size_t i = 0; i < nW; i++) err = fmax(err, fabs(dW[i] - 2 * dW1[i]));
  T_CHECK(err < 1e-5, "matmul dweight does not accumulate (+=): max err %g", err);
  free(x), free(W), free(bias), free(w), free(y), free(dx), free(dW), free(dW1), free(db);
  free(c.x), free(c.W), free(c.bias), free(c.w), free(c.y);
}

/* ---- attention --------------------------------------------------------------------------------- */

/* qkv (B,T,W) = [q (C) | k (Ckv) | v (Ckv)], W = C + 2 Ckv, Ckv = Hkv hs: query head h reads key/value head
 * h / (H/Hkv) */
typedef struct {
  int B, T, C, H, Hkv, window;
  double scale;
  double *qkv, *w, *y, *lse;
} att_ctx;

static int att_width(int C, int H, int Hkv) { return C + 2 * (C / H) * Hkv; }

static void att_ref(att_ctx *c) {
  const int hs = c->C / c->H, C3 = att_width(c->C, c->H, c->Hkv), Ckv = hs * c->Hkv;
  double *s = malloc((size_t)c->T * sizeof(double));
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++)
      for (int i = 0; i < c->T; i++) {
        const double *q = c->qkv + ((size_t)b * c->T + i) * C3 + h * hs;
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          int visible = c->window <= 0 || i - j < c->window;
          const double *k = c->qkv + ((size_t)b * c->T + j) * C3 + c->C + h / (c->H / c->Hkv) * hs;
          double d = 0;
          for (int e = 0; e < hs; e++) d += q[e] * k[e];
          s[j] = visible ? c->scale * d : -INFINITY;
          if (s[j] > mx) mx = s[j];
        }
        double sum = 0;
        for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
        c->lse[((size_t)b * c->H + h) * c->T + i] = mx + log(sum);
        double *o = c->y + ((size_t)b * c->T + i) * c->C + h * hs;
        for (int e = 0; e < hs; e++) o[e] = 0;
        for (int j = 0; j <= i; j++) {
          double p = exp(s[j] - mx) / sum;
          const double *v = c->qkv + ((size_t)b * c->T + j) * C3 + c->C + Ckv + h / (c->H / c->Hkv) * hs;
          for (int e = 0; e < hs; e++) o[e] += p * v[e];
        }
      }
  free(s);
}
static double att_loss(void *p) {
  att_ctx *c = p;
  att_ref(c);
  return wsum(c->w, c->y, (size_t)c->B * c->T * c->C);
}

static void test_attention(int T, int H, int Hkv, int window, double scale, const char *what) {
  att_ctx c = {.B = 2, .T = T, .C = 4 * H, .H = H, .Hkv = Hkv, .window = window, .scale = scale};
  size_t nq = (size_t)c.B * T * att_width(c.C, H, Hkv), ny = (size_t)c.B * T * c.C, nl = (size_t)c.B * c.H * T;
  float *qkv = frand(nq, 1), *w = frand(ny, 1), *y = fzeros(ny), *lse = fzeros(nl);
  float *scratch = be->alloc(be, be->attention_scratch(be, T));
  c.qkv = dcopy(qkv, nq), c.w = dcopy(w, ny);
  c.y = malloc(ny * sizeof(double)), c.lse = malloc(nl * sizeof(double));
  be->attention_fwd(be, y, lse, qkv, scratch, c.B, T, c.C, c.H, Hkv, window, (float)scale);
  att_ref(&c);
  char name[80];
  snprintf(name, sizeof name, "attention %s", what);
  check_fwd(name, y, c.y, ny);
  snprintf(name, sizeof name, "attention %s lse", what);
  check_fwd(name, lse, c.lse, nl);
  float *dqkv = fzeros(nq);
  be->attention_bwd(be, dqkv, w, y, lse, qkv, scratch, c.B, T, c.C, c.H, Hkv, window, (float)scale);
  snprintf(name, sizeof name, "attention %s d/dqkv", what);
  check_grad(name, att_loss, &c, c.qkv, dqkv, nq);
  be->free(be, scratch);
  free(qkv), free(w), free(y), free(lse), free(dqkv), free(c.qkv), free(c.w), free(c.y), free(c.lse);
}

/* ---- the KV cache ------------------------------------------------------------------------------ */

/* Three sequences of different lengths fed in passes of up to `chunk` rows of each (the sequences'
 * rows interleaved in a pass): kv_store, then attention_cached; every row's output against the
 * double reference of causal attention over its whole sequence (att_ref), and the ring's rows
 * against the keys and values they hold. ring = window + chunk - 1 for a local layer. */
static void test_kv_cache(int Hkv, int window, double scale, const char *what) {
  enum { NS = 3, C = 12, H = 6, CHUNK = 4 };
  const int len[NS] = {9, 20, 33}, maxlen = 33, ring = window > 0 ? window + CHUNK - 1 : maxlen;
  const int Ckv = C / H * Hkv, W = att_width(C, H, Hkv);
  float *qkv[NS], *out[NS];
  float *kc = fzeros((size_t)NS * ring * Ckv), *vc = fzeros((size_t)NS * ring * Ckv);
  float *pq = fzeros((size_t)NS * CHUNK * W), *po = fzeros((size_t)NS * CHUNK * C);
  int32_t seq[NS * CHUNK], pos[NS * CHUNK];
  for (int q = 0; q < NS; q++) qkv[q] = frand((size_t)len[q] * W, 1), out[q] = fzeros((size_t)len[q] * C);
  for (int at = 0; at < maxlen; at += CHUNK) {
    int n = 0;
    for (int q = 0; q < NS; q++)
      for (int p = at; p < at + CHUNK && p < len[q]; p++, n++) {
        seq[n] = q, pos[n] = p;
        memcpy(pq + (size_t)n * W, qkv[q] + (size_t)p * W, (size_t)W * sizeof(float));
      }
    be->kv_store(be, kc, vc, pq, seq, pos, n, C, Ckv, ring);
    be->attention_cached(be, po, pq, kc, vc, seq, pos, n, C, H, Hkv, ring, window, (float)scale);
    for (int r = 0; r < n; r++) memcpy(out[seq[r]] + (size_t)pos[r] * C, po + (size_t)r * C, C * sizeof(float));
  }
  char name[80];
  for (int q = 0; q < NS; q++) {
    att_ctx c = {.B = 1, .T = len[q], .C = C, .H = H, .Hkv = Hkv, .window = window, .scale = scale};
    c.qkv = dcopy(qkv[q], (size_t)len[q] * W);
    c.y = malloc((size_t)len[q] * C * sizeof(double)), c.lse = malloc((size_t)H * len[q] * sizeof(double));
    att_ref(&c);
    snprintf(name, sizeof name, "attention_cached %s seq %d", what, q);
    check_fwd(name, out[q], c.y, (size_t)len[q] * C);
    int bad = 0; /* the ring holds the last positions' k and v */
    for (int p = len[q] > ring ? len[q] - ring : 0; p < len[q]; p++) {
      size_t at = ((size_t)q * ring + (size_t)(p % ring)) * Ckv;
      bad += memcmp(kc + at, qkv[q] + (size_t)p * W + C, (size_t)Ckv * sizeof(float)) != 0;
      bad += memcmp(vc + at, qkv[q] + (size_t)p * W + C + Ckv, (size_t)Ckv * sizeof(float)) != 0;
    }
    T_CHECK(bad == 0, "kv_store %s seq %d: %d ring rows differ from the keys and values stored", what, q, bad);
    free(c.qkv), free(c.y), free(c.lse), free(qkv[q]), free(out[q]);
  }
  free(kc), free(vc), free(pq), free(po);
}

static void test_kv_cache_all(void) {
  test_kv_cache(6, 0, 1.0, "global");
  test_kv_cache(6, 0, 0.5, "global scaled");
  test_kv_cache(6, 5, 1.0, "local w=5");
  test_kv_cache(6, 1, 1.0, "local w=1");
  test_kv_cache(2, 0, 0.5, "GQA 6/2");
  test_kv_cache(1, 5, 1.0, "GQA 6/1 local w=5");
}

/* ---- the MLP: matmul_gelu_fwd, then matmul_dgelu_bwd through gelu (both forms) --------------------- */

/* y (N,M) = gelu(x (N,K) @ W1 (F,K)^T + b1 (F)) @ W2 (M,F)^T + b2 (M) */
typedef struct {
  int N, K, F, M, act;
  double *x, *W1, *b1, *W2, *b2, *w, *pre, *h, *y;
} mlp_ctx;

static double gelu_d(double x, int act) {
  if (act == BACKEND_GELU_ERF) return 0.5 * x * (1 + erf(x / sqrt(2.0)));
  return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

/* out (n,m) = in (n,k) @ W (m,k)^T + b (m) in double */
static void linear_d(double *out, const double *in, const double *W, const double *b, int n, int k, int m) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m; j++) {
      double s = b[j];
      for (int q = 0; q < k; q++) s += in[(size_t)i * k + q] * W[(size_t)j * k + q];
      out[(size_t)i * m + j] = s;
    }
}
static void mlp_ref(mlp_ctx *c) {
  linear_d(c->pre, c->x, c->W1, c->b1, c->N, c->K, c->F);
  for (size_t i = 0; i < (size_t)c->N * c->F; i++) c->h[i] = gelu_d(c->pre[i], c->act);
  linear_d(c->y, c->h, c->W2, c->b2, c->N, c->F, c->M);
}
static double mlp_loss(void *p) {
  mlp_ctx *c = p;
  mlp_ref(c);
  return wsum(c->w, c->y, (size_t)c->N * c->M);
}

static void test_mlp_act(int act) {
  mlp_ctx c = {.N = 9, .K = 13, .F = 12, .M = 7, .act = act};
  size_t nx = (size_t)c.N * c.K, n1 = (size_t)c.F * c.K, nh = (size_t)c.N * c.F, n2 = (size_t)c.M * c.F;
  size_t ny = (size_t)c.N * c.M;
  float *x = frand(nx, 1), *W1 = frand(n1, 1), *b1 = frand(c.F, 1), *W2 = frand(n2, 0.5), *b2 = frand(c.M, 1);
  float *w = frand(ny, 1), *pre = fzeros(nh), *h = fzeros(nh), *y = fzeros(ny);
  b1[0] = 40.0f, b1[1] = -40.0f; /* the flat tails of gelu_new */
  c.x = dcopy(x, nx), c.W1 = dcopy(W1, n1), c.b1 = dcopy(b1, c.F), c.W2 = dcopy(W2, n2), c.b2 = dcopy(b2, c.M);
  c.w = dcopy(w, ny), c.pre = malloc(nh * sizeof(double)), c.h = malloc(nh * sizeof(double));
  c.y = malloc(ny * sizeof(double));
  be->matmul_gelu_fwd(be, h, pre, x, W1, b1, c.N, c.K, c.F, act);
  be->matmul_fwd(be, y, h, W2, b2, c.N, c.F, c.M, c.M);
  mlp_ref(&c);
  check_fwd("matmul_gelu_fwd pre", pre, c.pre, nh);
  check_fwd(act ? "matmul_gelu_fwd out (gelu erf)" : "matmul_gelu_fwd out (gelu_new)", h, c.h, nh);
  check_fwd("mlp", y, c.y, ny);
  float *dpre = fzeros(nh), *dx = fzeros(nx), *dW1 = fzeros(n1), *db1 = fzeros(c.F), *dW2 = fzeros(n2), *db2 = fzeros(c.M);
  be->matmul_dgelu_bwd(be, dpre, dW2, db2, w, h, pre, W2, c.N, c.F, c.M, 1, act);
  be->matmul_bwd(be, dx, dW1, db1, dpre, x, W1, c.N, c.K, c.F, c.F, 1);
  check_grad("mlp d/dinp", mlp_loss, &c, c.x, dx, nx);
  check_grad("mlp d/dfc_weight", mlp_loss, &c, c.W1, dW1, n1);
  check_grad("mlp d/dfc_bias", mlp_loss, &c, c.b1, db1, (size_t)c.F);
  check_grad("mlp d/dproj_weight (dgelu_bwd)", mlp_loss, &c, c.W2, dW2, n2);
  check_grad("mlp d/dproj_bias (dgelu_bwd)", mlp_loss, &c, c.b2, db2, (size_t)c.M);
  float *dpo = fzeros(nh), *dWo = frand(n2, 1), *dbo = frand(c.M, 1); /* acc = 0: overwritten, whatever they held */
  be->matmul_dgelu_bwd(be, dpo, dWo, dbo, w, h, pre, W2, c.N, c.F, c.M, 0, act);
  T_CHECK(!memcmp(dWo, dW2, n2 * sizeof *dW2) && !memcmp(dbo, db2, (size_t)c.M * sizeof *db2),
          "matmul_dgelu_bwd with acc = 0 does not overwrite dweight and dbias");
  free(dpo), free(dWo), free(dbo);
  /* dw and dbias accumulate, dpre is overwritten: a second backward doubles the first two only */
  float *dpre2 = frand(nh, 1), *dW2b = fzeros(n2), *db2b = fzeros(c.M);
  memcpy(dW2b, dW2, n2 * sizeof(float)), memcpy(db2b, db2, c.M * sizeof(float));
  be->matmul_dgelu_bwd(be, dpre2, dW2b, db2b, w, h, pre, W2, c.N, c.F, c.M, 1, act);
  double err = 0;
  for (size_t i = 0; i < n2; i++) err = fmax(err, fabs(dW2b[i] - 2 * dW2[i]));
  for (int i = 0; i < c.M; i++) err = fmax(err, fabs(db2b[i] - 2 * db2[i]));
  for (size_t i = 0; i < nh; i++) err = fmax(err, fabs(dpre2[i] - dpre[i]));
  T_CHECK(err < 1e-5, "matmul_dgelu_bwd: dw, dbias do not accumulate or dpre is not overwritten: max err %g", err);
  be->matmul_dgelu_bwd(be, dpre2, dW2b, NULL, w, h, pre, W2, c.N, c.F, c.M, 1, act); /* dbias NULL: skipped */
  free(x), free(W1), free(b1), free(W2), free(b2), free(w), free(pre), free(h), free(y), free(dpre), free(dx), free(dW1),
      free(db1), free(dW2), free(db2), free(dpre2), free(dW2b), free(db2b);
  free(c.x), free(c.W1), free(c.b1), free(c.W2), free(c.b2), free(c.w), free(c.pre), free(c.h), free(c.y);
}

static void test_mlp(void) {
  test_mlp_act(BACKEND_GELU_TANH);
  test_mlp_act(BACKEND_GELU_ERF);
}

/* ---- rotary embedding: rope forward, and back (sign -1) as its gradient --------------------------- */

/* y (N,W) = qkv (as att_ctx's) with pairs (i, i + rot/2) of each head of q and k rotated by p * theta^(-2i/rot), all
 * in double */
typedef struct {
  int N, T, C, H, Hkv, rot;
  backend_rope rope;
  const int32_t *pos;
  double *x, *w, *y;
} rope_ctx;

/* Pair i's frequency in double, as transformers' formulas (Llama 3's _compute_llama3_parameters with a factor). */
static double inv_freq_d(const backend_rope *r, int i, int rot) {
  const double inv = pow(r->theta, -2.0 * i / rot), pi2 = 2 * 3.14159265358979323846;
  if (r->factor <= 0) return inv;
  const double wavelen = pi2 / inv, lo = r->orig / r->low_freq, hi = r->orig / r->high_freq;
  if (wavelen > lo) return inv / r->factor;
  if (wavelen < hi) return inv;
  const double smooth = (r->orig / wavelen - r->low_freq) / (r->high_freq - r->low_freq);
  return (1 - smooth) * inv / r->factor + smooth * inv;
}

static void rope_ref(rope_ctx *c) {
  const int hs = c->C / c->H, half = c->rot / 2, W = att_width(c->C, c->H, c->Hkv);
  memcpy(c->y, c->x, (size_t)c->N * W * sizeof(double));
  for (int r = 0; r < c->N; r++)
    for (int part = 0; part < 2; part++)
      for (int h = 0; h < (part ? c->Hkv : c->H); h++)
        for (int i = 0; i < half; i++) {
          const size_t at = (size_t)r * W + (size_t)part * c->C + (size_t)h * hs + i;
          const double p = c->pos ? c->pos[r] : r % c->T, a = p * inv_freq_d(&c->rope, i, c->rot);
          c->y[at] = c->x[at] * cos(a) - c->x[at + half] * sin(a);
          c->y[at + half] = c->x[at + half] * cos(a) + c->x[at] * sin(a);
        }
}
static double rope_loss(void *p) {
  rope_ctx *c = p;
  rope_ref(c);
  return wsum(c->w, c->y, (size_t)c->N * att_width(c->C, c->H, c->Hkv));
}

static void test_rope_scaled(int T, int C, int H, int Hkv, int rot, backend_rope rope, const int32_t *pos, int N,
                             const char *what) {
  rope_ctx c = {.N = N, .T = T, .C = C, .H = H, .Hkv = Hkv, .rot = rot, .rope = rope, .pos = pos};
  const size_t n = (size_t)N * att_width(C, H, Hkv);
  float *x = frand(n, 1), *w = frand(n, 1), *y = fcopy(x, n), *d = fcopy(w, n);
  c.x = dcopy(x, n), c.w = dcopy(w, n), c.y = malloc(n * sizeof(double));
  be->rope(be, y, pos, N, T, C, H, Hkv, rot, &rope, 1);
  rope_ref(&c);
  char name[64];
  snprintf(name, sizeof name, "rope %s", what);
  check_fwd(name, y, c.y, n);
  be->rope(be, d, pos, N, T, C, H, Hkv, rot, &rope, -1); /* the gradient: the opposite rotation of dout */
  check_grad(name, rope_loss, &c, c.x, d, n);
  be->rope(be, y, pos, N, T, C, H, Hkv, rot, &rope, -1); /* and back */
  T_CHECK(t_rel_err(y, x, n) < 1e-6, "rope %s: rotating back does not return the input (rel err %g)", what,
          t_rel_err(y, x, n));
  free(x), free(w), free(y), free(d), free(c.x), free(c.w), free(c.y);
}

static void test_rope_case(int T, int C, int H, int Hkv, int rot, double theta, const int32_t *pos, int N,
                           const char *what) {
  test_rope_scaled(T, C, H, Hkv, rot, (backend_rope){(float)theta, 0, 0, 0, 0}, pos, N, what);
}

static void test_rope(void) {
  static const int32_t pos[6] = {0, 7, 3, 1000, 2, 2};
  /* Llama 3's scaling with an original context of 16: of hs 8's four pairs at theta 5e5 (wavelengths 6.3, 167,
   * 4443, 118000) the first blends (between 16/4 and 16/1), the others turn 8 times slower */
  test_rope_scaled(6, 32, 4, 2, 8, (backend_rope){500000.0f, 8.0f, 1.0f, 4.0f, 16.0f}, NULL, 12, "llama3 scaling, GQA 4/2");
  test_rope_scaled(1, 16, 2, 2, 8, (backend_rope){10000.0f, 8.0f, 1.0f, 4.0f, 64.0f}, pos, 6,
                   "llama3 scaling, given positions");
  test_rope_case(5, 24, 3, 3, 8, 10000.0, NULL, 10, "rot 8 of 8, two sequences");
  test_rope_case(7, 24, 2, 2, 4, 10000.0, NULL, 7, "rot 4 of 12 (partial)");
  test_rope_case(6, 16, 2, 2, 8, 500000.0, NULL, 6, "rot 8 of 8, theta 5e5");
  test_rope_case(1, 8, 2, 2, 2, 10000.0, pos, 6, "given positions up to 1000");
  test_rope_case(4, 8, 2, 2, 0, 10000.0, NULL, 4, "rot 0 (nothing turns)");
  test_rope_case(5, 32, 4, 1, 8, 10000.0, NULL, 10, "GQA 4/1");
  test_rope_case(3, 32, 4, 2, 8, 10000.0, pos, 6, "GQA 4/2, given positions");
}

/* ---- residual ---------------------------------------------------------------------------------- */

typedef struct {
  size_t n;
  double *a, *b, *w, *y;
} res_ctx;

static double res_loss(void *p) {
  res_ctx *c = p;
  for (size_t i = 0; i < c->n; i++) c->y[i] = c->a[i] + c->b[i];
  return wsum(c->w, c->y, c->n);
}

static void test_residual(void) {
  res_ctx c = {.n = 50};
  float *a = frand(c.n, 1), *b = frand(c.n, 1), *w = frand(c.n, 1), *y = fzeros(c.n);
  c.a = dcopy(a, c.n), c.b = dcopy(b, c.n), c.w = dcopy(w, c.n), c.y = malloc(c.n * sizeof(double));
  be->residual_fwd(be, y, a, b, c.n);
  res_loss(&c);
  check_fwd("residual", y, c.y, c.n);
  /* backward: both inputs receive dout, accumulated */
  float *da = fzeros(c.n), *db = fzeros(c.n);
  be->accumulate(be, da, w, c.n);
  be->accumulate(be, db, w, c.n);
  check_grad("residual d/da", res_loss, &c, c.a, da, c.n);
  check_grad("residual d/db", res_loss, &c, c.b, db, c.n);
  free(a), free(b), free(w), free(y), free(da), free(db), free(c.a), free(c.b), free(c.w), free(c.y);
}

/* ---- softmax + cross-entropy ------------------------------------------------------------------- */

typedef struct {
  int N, V;
  int32_t *tgt;
  double dscale;
  double *x;
  double *loss;
} xent_ctx;

static double xent_total(void *p) {
  xent_ctx *c = p;
  double total = 0;
  for (int i = 0; i < c->N; i++) {
    const double *x = c->x + (size_t)i * c->V;
    double mx = -INFINITY, s = 0;
    for (int v = 0; v < c->V; v++) mx = fmax(mx, x[v]);
    for (int v = 0; v < c->V; v++) s += exp(x[v] - mx);
    c->loss[i] = mx + log(s) - x[c->tgt[i]];
    total += c->dscale * c->loss[i];
  }
  return total;
}

/* The vocabulary-parallel cross-entropy: 3 uneven shards' parts combined into each row's loss, and
 * each shard's gradient from the combined log-sum-exp, against the double reference. */
static void test_xent_shards(xent_ctx *c, const float *x) {
  enum { S = 3 };
  const int v0[S + 1] = {0, 400, 401, c->V};
  const size_t n = (size_t)c->N * c->V;
  float *part = fzeros((size_t)S * c->N * 2), *loss = fzeros((size_t)c->N), *lse = fzeros((size_t)c->N);
  float *g = malloc(n * sizeof(float)), *sh = malloc(n * sizeof(float));
  for (int k = 0; k < S; k++) { /* shard k's columns, contiguous */
    int nv = v0[k + 1] - v0[k];
    for (int i = 0; i < c->N; i++) memcpy(sh + (size_t)i * nv, x + (size_t)i * c->V + v0[k], (size_t)nv * sizeof(float));
    be->xent_part(be, part + (size_t)k * c->N * 2, sh, c->tgt, c->N, nv, v0[k], nv);
  }
  for (int i = 0; i < c->N; i++) {
    double mx = -INFINITY, s = 0, z = 0;
    for (int k = 0; k < S; k++) mx = fmax(mx, part[((size_t)k * c->N + i) * 2]);
    for (int k = 0; k < S; k++) s += exp(part[((size_t)k * c->N + i) * 2] - mx), z += part[((size_t)k * c->N + i) * 2 + 1];
    lse[i] = (float)(mx + log(s));
    loss[i] = (float)(mx + log(s) - z);
  }
  xent_total(c);
  check_fwd("cross-entropy, 3 vocabulary shards", loss, c->loss, (size_t)c->N);
  for (int k = 0; k < S; k++) {
    int nv = v0[k + 1] - v0[k];
    for (int i = 0; i < c->N; i++) memcpy(sh + (size_t)i * nv, x + (size_t)i * c->V + v0[k], (size_t)nv * sizeof(float));
    be->xent_grad(be, sh, lse, c->tgt, c->N, nv, v0[k], nv, (float)c->dscale);
    for (int i = 0; i < c->N; i++) memcpy(g + (size_t)i * c->V + v0[k], sh + (size_t)i * nv, (size_t)nv * sizeof(float));
  }
  check_grad("cross-entropy shards d/dlogits", xent_total, c, c->x, g, n);
  free(part), free(loss), free(lse), free(g), free(sh);
}

static void test_xent(void) {
  xent_ctx c = {.N = 5, .V = 1003, .dscale = 0.37};
  size_t n = (size_t)c.N * c.V;
  float *x = frand(n, 3), *l = fzeros((size_t)c.N);
  c.tgt = malloc((size_t)c.N * sizeof(int32_t));
  for (int i = 0; i < c.N; i++) c.tgt[i] = (int32_t)rng_below(&R, (uint64_t)c.V);
  x[7] = 40.0f; /* a dominant logit */
  c.x = dcopy(x, n), c.loss = malloc((size_t)c.N * sizeof(double));
  float *xg = malloc(n * sizeof(float));
  memcpy(xg, x, n * sizeof(float));
  be->xent_fwd_bwd(be, l, xg, c.tgt, c.N, c.V, c.V, (float)c.dscale);
  xent_total(&c);
  check_fwd("softmax+cross-entropy loss", l, c.loss, (size_t)c.N);
  check_grad("softmax+cross-entropy d/dlogits", xent_total, &c, c.x, xg, n);
  /* dscale = 0: losses only */
  float *l0 = fzeros((size_t)c.N);
  memcpy(xg, x, n * sizeof(float));
  be->xent_fwd_bwd(be, l0, xg, c.tgt, c.N, c.V, c.V, 0.0f);
  check_fwd("cross-entropy loss (no grad)", l0, c.loss, (size_t)c.N);
  test_xent_shards(&c, x);
  free(x), free(l), free(l0), free(xg), free(c.tgt), free(c.x), free(c.loss);
}

/* ---- AdamW and the sums against a double reference ---------------------------------------------- */

/* n AdamW updates in double from p, m, v (host copies), gradients times gs */
static void adamw_reference(double *pd, double *md, double *vd, const float *g, size_t n, double gs, int step) {
  double b1 = 0.9, b2 = 0.95, lr = 1e-2, bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
  for (size_t i = 0; i < n; i++) {
    double gi = gs * g[i];
    pd[i] *= 1 - lr * 0.1;
    md[i] = b1 * md[i] + (1 - b1) * gi;
    vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
    pd[i] -= lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + 1e-8);
  }
}

/* AdamW with the step's sums: the factor backend_adamw_factor gives (clipping by the norm with the loss scale
 * divided out), and nothing written when a sum is not finite. */
static void test_adamw_sums(const float *g, size_t n) {
  float *p = frand(n, 1), *m = frand(n, 0.1), *v = frand(n, 0.1);
  for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  double *pd = dcopy(p, n), *md = dcopy(m, n), *vd = dcopy(v, n), sums[2] = {3.0, 0.0};
  be->reduce_sum(be, &sums[1], g, n, 1);
  const double norm = sqrt(sums[1]) / 4.0; /* the loss scale 4 divided out */
  backend_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .loss_scale = 4.0, .grad_clip = 0.5 * norm, .sums = sums, .step = 2};
  const double want = (float)(0.5 * norm / (norm + 1e-6) / 4.0);
  T_CHECK(backend_adamw_factor(&a) == want, "adamw factor %.9g, want %.9g (clip to half the norm)",
          backend_adamw_factor(&a), want);
  be->adamw(be, p, NULL, g, m, v, n, &a);
  adamw_reference(pd, md, vd, g, n, want, 2);
  check_fwd("adamw clipped by the sums' norm", p, pd, n);
  float *p0 = fcopy(p, n), *m0 = fcopy(m, n);
  for (int k = 0; k < 2; k++) {
    double bad[2] = {k ? 1.0 : NAN, k ? INFINITY : 1.0};
    a.sums = bad;
    T_CHECK(backend_adamw_factor(&a) == -1.0f, "adamw factor with sums {%g, %g}: %g, want -1", bad[0], bad[1],
            backend_adamw_factor(&a));
    be->adamw(be, p, NULL, g, m, v, n, &a);
    T_CHECK(!memcmp(p, p0, n * sizeof *p) && !memcmp(m, m0, n * sizeof *m), "adamw with sums {%g, %g} changed the "
            "parameters or moments", bad[0], bad[1]);
  }
  free(p), free(m), free(v), free(p0), free(m0), free(pd), free(md), free(vd);
}

static void test_adamw(void) {
  size_t n = 257;
  float *p = frand(n, 1), *g = frand(n, 1), *m = frand(n, 0.1), *v = frand(n, 0.1);
  for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  double *pd = dcopy(p, n), *md = dcopy(m, n), *vd = dcopy(v, n);
  backend_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .loss_scale = 2.0, .step = 3};
  be->adamw(be, p, NULL, g, m, v, n, &a);
  adamw_reference(pd, md, vd, g, n, 0.5, 3);
  check_fwd("adamw parameters", p, pd, n);
  check_fwd("adamw first moment", m, md, n);
  check_fwd("adamw second moment", v, vd, n);
  test_adamw_sums(g, n);
  free(p), free(g), free(m), free(v), free(pd), free(md), free(vd);
}

/* reduce_sum adds the sum (of squares) in double to what its accumulator holds */
static void test_reduce_sum(void) {
  size_t big = 100003;
  float *x = frand(big, 1);
  double s = 0, ss = 0;
  for (size_t i = 0; i < big; i++) s += x[i], ss += (double)x[i] * x[i];
  double acc[2] = {1.5, 2.5};
  be->reduce_sum(be, &acc[0], x, big, 0), be->reduce_sum(be, &acc[1], x, big, 1);
  T_CHECK(fabs(acc[0] - 1.5 - s) <= 1e-9 * ss && fabs(acc[1] - 2.5 - ss) / ss < 1e-6,
          "reduce_sum: %.10g and %.10g, want %.10g and %.10g", acc[0], acc[1], 1.5 + s, 2.5 + ss);
  be->reduce_sum(be, &acc[0], x, 0, 0);
  T_CHECK(acc[0] - 1.5 == s || fabs(acc[0] - 1.5 - s) <= 1e-9 * ss, "reduce_sum of nothing changed the sum");
  free(x);
}

/* ---- the compressed exchange's ops against the quantizer bucket by bucket ---------------------- */

/* The reference message of v under q (tq_segments' layout), each segment by itself; with ef, the
 * feedback of quant.h: v += ef, the contracted message, ef = v - Q(v). */
static void quant_reference(const quant_scheme *q, const quant_seg *seg, float *v, float *ef, uint64_t key, uint8_t *msg) {
  for (int s = 0; s < TQ_NSEG; s++) {
    const quant_seg *g = &seg[s];
    float *x = v + g->at;
    if (!g->quantized) {
      memcpy(msg + g->off, x, g->n * sizeof(float));
      continue;
    }
    if (!ef) {
      quant_encode(q, x, g->n, rng_hash(key, g->id), msg + g->off);
      continue;
    }
    for (size_t i = 0; i < g->n; i++) x[i] += ef[g->at + i];
    quant_encode_contract(q, x, g->n, rng_hash(key, g->id), msg + g->off);
    quant_decode(q, msg + g->off, g->n, ef + g->at, 0);
    for (size_t i = 0; i < g->n; i++) ef[g->at + i] = x[i] - ef[g->at + i];
  }
}

/* quant_encode and quant_decode bit for bit the quantizer's own encode and decode of each segment:
 * messages, the residual of error feedback (raw segments untouched), decoding, adding, and a part of
 * the message decoded from its own offset (base). */
static void test_quant_ops(void) {
  for (int k = 0; k < TQ_NSCHEMES; k++) {
    quant_scheme q;
    quant_seg seg[TQ_NSEG];
    size_t n, bytes;
    const char *name = tq_case(k, &q, seg, &n, &bytes);
    float *v = frand(n, 1), *w = malloc(n * sizeof *w), *e = frand(n, 0.1), *f = malloc(n * sizeof *f);
    float *out = frand(n, 1), *ref = malloc(n * sizeof *ref);
    uint8_t *msg = malloc(bytes), *want = malloc(bytes);
    for (size_t i = 0; i < n; i += 11) v[i] = 0.0f;
    for (int fb = 0; fb < 2; fb++) {
      memcpy(w, v, n * sizeof *w), memcpy(f, e, n * sizeof *f);
      be->quant_encode(be, msg, v, fb ? e : NULL, seg, TQ_NSEG, &q, 99 + (uint64_t)k);
      quant_reference(&q, seg, w, fb ? f : NULL, 99 + (uint64_t)k, want);
      T_CHECK(memcmp(msg, want, bytes) == 0, "quant_encode %s%s: the message differs", name, fb ? " with feedback" : "");
      T_CHECK(memcmp(v, w, n * sizeof *v) == 0 && memcmp(e, f, n * sizeof *e) == 0,
              "quant_encode %s%s: the values or the residual differ", name, fb ? " with feedback" : "");
      T_CHECK(!fb || e[seg[1].at] == f[seg[1].at], "quant_encode %s: a raw segment's residual changed", name);
    }
    for (int add = 0; add < 2; add++) {
      memcpy(ref, out, n * sizeof *ref);
      be->quant_decode(be, out, msg, 0, seg, TQ_NSEG, &q, add);
      for (int s = 0; s < TQ_NSEG; s++) {
        float *y = w; /* scratch: the segment's values by itself */
        if (seg[s].quantized) quant_decode(&q, msg + seg[s].off, seg[s].n, y, 0);
        else memcpy(y, msg + seg[s].off, seg[s].n * sizeof(float));
        for (size_t i = 0; i < seg[s].n; i++) ref[seg[s].at + i] = add ? ref[seg[s].at + i] + y[i] : y[i];
      }
      T_CHECK(memcmp(out, ref, n * sizeof *out) == 0, "quant_decode %s (%s): the values differ", name, add ? "add" : "set");
    }
    memcpy(ref, out, n * sizeof *ref);
    be->quant_decode(be, out, msg + seg[2].off, seg[2].off, seg + 2, TQ_NSEG - 2, &q, 1); /* a part, from its offset */
    be->quant_decode(be, ref, msg, 0, seg + 2, TQ_NSEG - 2, &q, 1);
    T_CHECK(memcmp(out, ref, n * sizeof *out) == 0, "quant_decode %s: a part decoded from its offset differs", name);
    free(v), free(w), free(e), free(f), free(out), free(ref), free(msg), free(want);
  }
}

/* ---- the storage types --------------------------------------------------------------------------- */

static const backend *b16; /* a CPU instance at bf16 or fp16 storage */

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static void test_conversions(void) {
  const backend *bf = backend_kind_cpu.open(-1, "bf16"), *hf = backend_kind_cpu.open(-1, "fp16");
  uint16_t *all = malloc(65536 * sizeof(uint16_t)), *back = malloc(65536 * sizeof(uint16_t));
  float *wide = malloc(65536 * sizeof(float));
  for (int k = 0; k < 2; k++) {
    const backend *b = k ? hf : bf;
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    b->to_fp32(b, wide, all, 65536);
    b->to_storage(b, back, wide, 65536);
    long bad = 0;
    for (uint32_t i = 0; i < 65536; i++) bad += wide[i] == wide[i] && back[i] != all[i]; /* NaNs: any NaN back */
    T_CHECK(bad == 0, "%s: %ld values do not round trip", b->precision, bad);
  }
  /* rounding: ties to even, the largest values, subnormals, overflow, NaN */
  static const struct {
    float x;
    uint16_t bf16, fp16;
  } cases[] = {{1.0f, 0x3f80, 0x3c00},          {1.0f + 0x1p-8f, 0x3f80, 0x3c04},  {1.0f + 0x3p-8f, 0x3f82, 0x3c0c},
               {1.0f + 0x1p-11f, 0x3f80, 0x3c00}, {1.0f + 0x3p-11f, 0x3f80, 0x3c02}, {-2.5f, 0xc020, 0xc100},
               {65504.0f, 0x4780, 0x7bff},       {65519.0f, 0x4780, 0x7bff},       {65520.0f, 0x4780, 0x7c00},
               {0x1p-24f, 0x3380, 0x0001},       {0x1p-25f, 0x3300, 0x0000},       {0x3p-25f, 0x33c0, 0x0002},
               {0x1p-14f, 0x3880, 0x0400},       {1e30f, 0x714a, 0x7c00},          {-INFINITY, 0xff80, 0xfc00}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t h[2];
    bf->to_storage(bf, &h[0], &cases[i].x, 1);
    hf->to_storage(hf, &h[1], &cases[i].x, 1);
    T_CHECK(h[0] == cases[i].bf16 && h[1] == cases[i].fp16, "%a: bf16 0x%04x (want 0x%04x), fp16 0x%04x (want 0x%04x)",
            (double)cases[i].x, h[0], cases[i].bf16, h[1], cases[i].fp16);
  }
  float nan = NAN, r;
  uint16_t h;
  hf->to_storage(hf, &h, &nan, 1);
  hf->to_fp32(hf, &r, &h, 1);
  T_CHECK(r != r, "fp16: NaN became %g", (double)r);
  bf->to_storage(bf, &h, &nan, 1);
  bf->to_fp32(bf, &r, &h, 1);
  T_CHECK(r != r, "bf16: NaN became %g", (double)r);
  printf("  %-34s all 65536 values of each round trip; %zu rounding cases\n", "bf16 and fp16 conversions",
         sizeof cases / sizeof cases[0]);
  backend_close(bf), backend_close(hf);
  free(all), free(back), free(wide);
}

/* n random values representable in b16's type (fp32), and their 16-bit copy. */
static float *rand16(size_t n, double scale, void **h) {
  float *x = frand(n, scale);
  *h = malloc(n * 2);
  b16->to_storage(b16, *h, x, n);
  b16->to_fp32(b16, x, *h, n);
  return x;
}

/* The 16-bit output h must be the fp32 output y rounded once. */
static void same16(const char *what, const void *h, const float *y, size_t n) {
  uint16_t *r = malloc(n * 2);
  b16->to_storage(b16, r, y, n);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += r[i] != ((const uint16_t *)h)[i];
  T_CHECK(bad == 0, "%s at %s: %zu of %zu values are not the fp32 result rounded", what, b16->precision, bad, n);
  free(r);
}
static void same32(const char *what, const float *a, const float *b, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += fbits(a[i]) != fbits(b[i]);
  T_CHECK(bad == 0, "%s at %s: %zu of %zu fp32 values differ", what, b16->precision, bad, n);
}

/* The MLP's pair on x (N,K), W (M,K), B (M), then dout g (N,K) through W2 (K,M): each output of
 * matmul_gelu_fwd and matmul_dgelu_bwd is the fp32 result rounded once, the gradients as at fp32. */
static void storage_mlp(int N, int K, int M, const float *x, const void *xh, const float *W, const void *Wh,
                        const float *B, const void *Bh, const float *g, const void *gh) {
  const size_t nh = (size_t)N * M, nw = (size_t)K * M;
  void *W2h;
  float *W2 = rand16(nw, 0.3, &W2h), *pre = fzeros(nh), *gel = fzeros(nh), *dpre = fzeros(nh);
  float *dW = fzeros(nw), *dB = fzeros(K), *dW16 = fzeros(nw), *dB16 = fzeros(K);
  uint16_t *pre16 = malloc(nh * 2), *gel16 = malloc(nh * 2), *dpre16 = malloc(nh * 2);
  for (int act = 0; act < 2; act++) {
    be->matmul_gelu_fwd(be, gel, pre, x, W, B, N, K, M, act);
    b16->matmul_gelu_fwd(b16, gel16, pre16, xh, Wh, Bh, N, K, M, act);
    same16("matmul_gelu_fwd out", gel16, gel, nh), same16("matmul_gelu_fwd pre", pre16, pre, nh);
    b16->to_fp32(b16, pre, pre16, nh), b16->to_fp32(b16, gel, gel16, nh); /* the backward reads the stored values */
    be->matmul_dgelu_bwd(be, dpre, dW, dB, g, gel, pre, W2, N, M, K, 0, act);
    b16->matmul_dgelu_bwd(b16, dpre16, dW16, dB16, gh, gel16, pre16, W2h, N, M, K, 0, act);
    same16("matmul_dgelu_bwd dpre", dpre16, dpre, nh), same32("matmul_dgelu_bwd dw", dW, dW16, nw);
    same32("matmul_dgelu_bwd dbias", dB, dB16, K);
  }
  free(W2), free(W2h), free(pre), free(gel), free(dpre), free(dW), free(dB), free(dW16), free(dB16), free(pre16),
      free(gel16), free(dpre16);
}

static void storage_norm_and_linear(void) {
  const int N = 7, C = 24, M = 40;
  void *xh, *wh, *bh, *dh, *gh;
  float *x = rand16((size_t)N * C, 1, &xh), *w = rand16(C, 1, &wh), *b = rand16(C, 1, &bh), *d = rand16((size_t)N * C, 1, &dh);
  float *y = fzeros((size_t)N * C), *mean = fzeros(N), *rstd = fzeros(N), *m16 = fzeros(N), *r16 = fzeros(N);
  uint16_t *y16 = malloc((size_t)N * C * 2);
  be->layernorm_fwd(be, y, mean, rstd, x, w, b, N, C, 1e-5f);
  b16->layernorm_fwd(b16, y16, m16, r16, xh, wh, bh, N, C, 1e-5f);
  same16("layernorm_fwd", y16, y, (size_t)N * C), same32("layernorm_fwd mean", mean, m16, N), same32("layernorm_fwd rstd", rstd, r16, N);
  /* the fused residual: res rounded once, the LayerNorm of the stored res (d + x, both 16-bit values) */
  float *rs = fzeros((size_t)N * C), *rsr = fzeros((size_t)N * C);
  uint16_t *rs16 = malloc((size_t)N * C * 2);
  b16->residual_layernorm_fwd(b16, rs16, y16, m16, r16, dh, xh, wh, bh, N, C, 1e-5f);
  be->residual_fwd(be, rs, d, x, (size_t)N * C);
  same16("residual_layernorm_fwd res", rs16, rs, (size_t)N * C);
  b16->to_fp32(b16, rsr, rs16, (size_t)N * C);
  be->layernorm_fwd(be, rs, mean, rstd, rsr, w, b, N, C, 1e-5f);
  same16("residual_layernorm_fwd out", y16, rs, (size_t)N * C), same32("residual_layernorm_fwd mean", mean, m16, N);
  same32("residual_layernorm_fwd rstd", rstd, r16, N);
  be->layernorm_fwd(be, y, mean, rstd, x, w, b, N, C, 1e-5f); /* as the backward below expects */
  free(rs), free(rsr), free(rs16);
  /* backward: dinp (starting from d) accumulates into a 16-bit value */
  float *g = rand16((size_t)N * C, 1, &gh), *dw = fzeros(C), *db = fzeros(C), *dw16 = fzeros(C), *db16 = fzeros(C);
  be->layernorm_bwd(be, d, dw, db, g, x, w, mean, rstd, N, C, 1);
  b16->layernorm_bwd(b16, dh, dw16, db16, gh, xh, wh, mean, rstd, N, C, 1);
  same16("layernorm_bwd dinp (+=)", dh, d, (size_t)N * C), same32("layernorm_bwd dw", dw, dw16, C);
  same32("layernorm_bwd db", db, db16, C);
  /* matmul with bias, forward and backward */
  void *Wh, *Bh, *Oh;
  float *W = rand16((size_t)M * C, 0.3, &Wh), *B = rand16(M, 1, &Bh), *go = rand16((size_t)N * M, 1, &Oh);
  float *out = fzeros((size_t)N * M), *dx = fzeros((size_t)N * C), *dW = fzeros((size_t)M * C), *dB = fzeros(M);
  float *dW16 = fzeros((size_t)M * C), *dB16 = fzeros(M);
  uint16_t *out16 = malloc((size_t)N * M * 2), *dx16 = malloc((size_t)N * C * 2);
  be->matmul_fwd(be, out, x, W, B, N, C, M, M);
  b16->matmul_fwd(b16, out16, xh, Wh, Bh, N, C, M, M);
  same16("matmul_fwd", out16, out, (size_t)N * M);
  be->matmul_bwd(be, dx, dW, dB, go, x, W, N, C, M, M, 1);
  b16->matmul_bwd(b16, dx16, dW16, dB16, Oh, xh, Wh, N, C, M, M, 1);
  same16("matmul_bwd dinp", dx16, dx, (size_t)N * C), same32("matmul_bwd dw", dW, dW16, (size_t)M * C);
  same32("matmul_bwd dbias", dB, dB16, M);
  storage_mlp(N, C, M, x, xh, W, Wh, B, Bh, g, gh);
  free(g), free(gh);
  free(x), free(w), free(b), free(d), free(y), free(mean), free(rstd), free(m16), free(r16), free(y16), free(dw), free(db),
      free(dw16), free(db16), free(W), free(B), free(go), free(out), free(dx), free(dW), free(dB), free(dW16), free(dB16),
      free(out16), free(dx16), free(xh), free(wh), free(bh), free(dh), free(Wh), free(Bh), free(Oh);
}
/* RMSNorm at 16 bits, in Hugging Face's order: the normalized row (the fp32 op without the weight) rounded, times
 * the weight in fp32, rounded once more; rstd and the backward's dw as at fp32, its dinp (+=) rounded once. SwiGLU:
 * each output the fp32 result rounded once. */
static void storage_rmsnorm_swiglu(void) {
  const int N = 7, C = 24, F = 19;
  const size_t n = (size_t)N * C, nh = (size_t)N * F;
  void *xh, *wh, *gh, *dh, *guh, *hh;
  float *x = rand16(n, 1, &xh), *w = rand16(C, 1, &wh), *g = rand16(n, 1, &gh), *d = rand16(n, 1, &dh);
  float *one = fzeros(C), *y = fzeros(n), *rstd = fzeros(N), *r16 = fzeros(N), *dw = fzeros(C), *dw16 = fzeros(C);
  uint16_t *y16 = malloc(n * 2);
  for (int c = 0; c < C; c++) one[c] = 1.0f;
  be->rmsnorm_fwd(be, y, rstd, x, one, N, C, 1e-6f);
  b16->to_storage(b16, y16, y, n), b16->to_fp32(b16, y, y16, n);
  for (size_t i = 0; i < n; i++) y[i] *= w[i % C];
  b16->rmsnorm_fwd(b16, y16, r16, xh, wh, N, C, 1e-6f);
  same16("rmsnorm_fwd", y16, y, n), same32("rmsnorm_fwd rstd", rstd, r16, N);
  be->rmsnorm_bwd(be, d, dw, g, x, w, rstd, N, C, 0), b16->rmsnorm_bwd(b16, dh, dw16, gh, xh, wh, rstd, N, C, 0);
  same16("rmsnorm_bwd dinp (+=)", dh, d, n), same32("rmsnorm_bwd dw", dw, dw16, C);
  float *gu = rand16(2 * nh, 2, &guh), *h = rand16(nh, 1, &hh), *dgu = fzeros(2 * nh);
  uint16_t *h16 = malloc(nh * 2), *dgu16 = malloc(2 * nh * 2);
  be->swiglu_fwd(be, y, gu, N, F), b16->swiglu_fwd(b16, h16, guh, N, F), same16("swiglu_fwd", h16, y, nh);
  be->swiglu_bwd(be, dgu, h, gu, N, F), b16->swiglu_bwd(b16, dgu16, hh, guh, N, F);
  same16("swiglu_bwd", dgu16, dgu, 2 * nh);
  free(x), free(w), free(g), free(d), free(one), free(y), free(rstd), free(r16), free(dw), free(dw16), free(y16);
  free(xh), free(wh), free(gh), free(dh), free(gu), free(h), free(dgu), free(h16), free(dgu16), free(guh), free(hh);
}

static void storage_attention(void) {
  const int B = 2, T = 70, C = 12, H = 3;
  const size_t ny = (size_t)B * T * C, nl = (size_t)B * H * T;
  for (int window = 0; window <= 5; window += 5) {
    const int Hkv = window ? 1 : H; /* the local case with one key/value head */
    const size_t nq = (size_t)B * T * att_width(C, H, Hkv);
    void *qh, *gh;
    float *qkv = rand16(nq, 0.5, &qh), *g = rand16(ny, 1, &gh), *y = fzeros(ny), *lse = fzeros(nl), *lse16 = fzeros(nl);
    float *dq = fzeros(nq), *yr = fzeros(ny);
    uint16_t *y16 = malloc(ny * 2), *dq16 = malloc(nq * 2);
    void *s32 = be->alloc(be, be->attention_scratch(be, T)), *s16 = b16->alloc(b16, b16->attention_scratch(b16, T));
    be->attention_fwd(be, y, lse, qkv, s32, B, T, C, H, Hkv, window, 1.0f);
    b16->attention_fwd(b16, y16, lse16, qh, s16, B, T, C, H, Hkv, window, 1.0f);
    same16("attention_fwd", y16, y, ny), same32("attention_fwd lse", lse, lse16, nl);
    b16->to_fp32(b16, yr, y16, ny); /* the backward reads the stored (rounded) output */
    be->attention_bwd(be, dq, g, yr, lse, qkv, s32, B, T, C, H, Hkv, window, 1.0f);
    b16->attention_bwd(b16, dq16, gh, y16, lse16, qh, s16, B, T, C, H, Hkv, window, 1.0f);
    same16("attention_bwd", dq16, dq, nq);
    be->free(be, s32), b16->free(b16, s16);
    free(qkv), free(g), free(y), free(lse), free(lse16), free(dq), free(yr), free(y16), free(dq16), free(qh), free(gh);
  }
}

/* The cache at 16 bits: the same rounded inputs, the output rounded once; kv_store copies exactly. */
static void storage_kv_cache(void) {
  const int N = 5, C = 12, H = 3, ring = 9;
  const int32_t seq[5] = {0, 1, 1, 2, 0}, pos[5] = {3, 7, 8, 0, 12};
  void *qh, *kh, *vh;
  float *qkv = rand16((size_t)N * 3 * C, 0.5, &qh), *k = rand16((size_t)3 * ring * C, 0.5, &kh);
  float *v = rand16((size_t)3 * ring * C, 1, &vh), *y = fzeros((size_t)N * C);
  uint16_t *y16 = malloc((size_t)N * C * 2);
  be->kv_store(be, k, v, qkv, seq, pos, N, C, C, ring), b16->kv_store(b16, kh, vh, qh, seq, pos, N, C, C, ring);
  same16("kv_store k", kh, k, (size_t)3 * ring * C), same16("kv_store v", vh, v, (size_t)3 * ring * C);
  be->attention_cached(be, y, qkv, k, v, seq, pos, N, C, H, H, ring, 4, 1.0f);
  b16->attention_cached(b16, y16, qh, kh, vh, seq, pos, N, C, H, H, ring, 4, 1.0f);
  same16("attention_cached", y16, y, (size_t)N * C);
  free(qkv), free(k), free(v), free(y), free(y16), free(qh), free(kh), free(vh);
}

static void storage_elementwise(void) {
  const size_t n = 333;
  void *xh, *ah;
  float *x = rand16(n, 2, &xh), *a = rand16(n, 1, &ah), *y = fzeros(n);
  uint16_t *y16 = malloc(n * 2);
  be->residual_fwd(be, y, x, a, n), b16->residual_fwd(b16, y16, xh, ah, n), same16("residual_fwd", y16, y, n);
  be->accumulate(be, a, x, n), b16->accumulate(b16, ah, xh, n), same16("accumulate (+=)", ah, a, n);
  /* rope in place on a (3, 3 x 37) qkv: the 16-bit result is the fp32 rotation of the stored values, rounded once */
  const backend_rope rope = {10000.0f, 8.0f, 1.0f, 4.0f, 64.0f}; /* Llama 3's scaling */
  be->rope(be, x, NULL, 3, 2, 37, 1, 1, 36, &rope, 1), b16->rope(b16, xh, NULL, 3, 2, 37, 1, 1, 36, &rope, 1);
  same16("rope", xh, x, 3 * 3 * 37);
  /* embedding: rows picked by tokens, and the fp32 gradients of a 16-bit dout */
  const int B = 2, T = 5, C = 6, V = 7;
  int32_t tok[10];
  for (int i = 0; i < B * T; i++) tok[i] = (int32_t)rng_below(&R, (uint64_t)V);
  void *eh, *ph, *gh;
  float *wte = rand16((size_t)V * C, 1, &eh), *wpe = rand16((size_t)T * C, 1, &ph), *g = rand16((size_t)B * T * C, 1, &gh);
  float *e = fzeros((size_t)B * T * C), *dwte = fzeros((size_t)V * C), *dwpe = fzeros((size_t)T * C);
  float *dwte16 = fzeros((size_t)V * C), *dwpe16 = fzeros((size_t)T * C);
  uint16_t *e16 = malloc((size_t)B * T * C * 2);
  be->embed_fwd(be, e, tok, wte + C, wpe, B, T, C, 1, 5), b16->embed_fwd(b16, e16, tok, (char *)eh + 2 * C, ph, B, T, C, 1, 5);
  same16("embed_fwd", e16, e, (size_t)B * T * C);
  be->embed_bwd(be, dwte, dwpe, g, tok, B, T, C, 0, V), b16->embed_bwd(b16, dwte16, dwpe16, gh, tok, B, T, C, 0, V);
  same32("embed_bwd dwte", dwte, dwte16, (size_t)V * C), same32("embed_bwd dwpe", dwpe, dwpe16, (size_t)T * C);
  /* cross-entropy on 16-bit logits: fp32 losses, the gradient stored in 16 bits */
  const int N = 3, NV = 301;
  void *lh;
  float *lg = rand16((size_t)N * NV, 3, &lh), *loss = fzeros(N), *loss16 = fzeros(N);
  int32_t tgt[3] = {0, 150, 300};
  be->xent_fwd_bwd(be, loss, lg, tgt, N, NV, NV, 0.25f), b16->xent_fwd_bwd(b16, loss16, lh, tgt, N, NV, NV, 0.25f);
  same32("xent_fwd_bwd losses", loss, loss16, N), same16("xent_fwd_bwd dlogits", lh, lg, (size_t)N * NV);
  /* the vocabulary-parallel pair on a shard of 100 columns from 200 */
  void *sh16;
  float *sh = rand16((size_t)N * 100, 3, &sh16), part[6], part16[6], lse[3] = {3.0f, 4.5f, 6.0f};
  be->xent_part(be, part, sh, tgt, N, 100, 200, 100), b16->xent_part(b16, part16, sh16, tgt, N, 100, 200, 100);
  same32("xent_part", part, part16, 6);
  be->xent_grad(be, sh, lse, tgt, N, 100, 200, 100, 0.25f), b16->xent_grad(b16, sh16, lse, tgt, N, 100, 200, 100, 0.25f);
  same16("xent_grad", sh16, sh, (size_t)N * 100);
  free(sh), free(sh16);
  /* AdamW: the fp32 master as at fp32, and the compute copy its rounding */
  float *p = frand(n, 1), *p16 = malloc(n * sizeof(float)), *gr = frand(n, 1), *m = fzeros(n), *v = fzeros(n);
  float *m16 = fzeros(n), *v16 = fzeros(n);
  memcpy(p16, p, n * sizeof(float));
  uint16_t *pc = malloc(n * 2);
  backend_adamw_args aa = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .loss_scale = 1, .step = 1};
  be->adamw(be, p, NULL, gr, m, v, n, &aa), b16->adamw(b16, p16, pc, gr, m16, v16, n, &aa);
  same32("adamw master", p, p16, n), same16("adamw compute copy", pc, p, n);
  free(x), free(a), free(y), free(y16), free(xh), free(ah), free(wte), free(wpe), free(g), free(e),
      free(dwte), free(dwpe), free(dwte16), free(dwpe16), free(e16), free(eh), free(ph), free(gh), free(lg), free(loss),
      free(loss16), free(lh), free(p), free(p16), free(gr), free(m), free(v), free(m16), free(v16), free(pc);
}

/* Row strides (the LM head's logits, in rows padded to GPT_LOGITS_ALIGN): on instance b, matmul_fwd,
 * matmul_bwd and the cross-entropy ops with rows L apart give the dense (M-wide) results bit for
 * bit, and the pad columns, filled with NaN, are neither read (no NaN reaches a result) nor written. */
static void *bytes_of(const backend *b, const float *x, size_t n) {
  void *h = malloc(n * 4);
  b->to_storage(b, h, x, n);
  return h;
}
static void *padded(const void *dense, size_t rows, size_t cols, size_t ld, size_t es) {
  char *p = malloc(rows * ld * es);
  memset(p, 0xff, rows * ld * es); /* NaN in fp32, bf16 and fp16 */
  for (size_t r = 0; r < rows; r++) memcpy(p + r * ld * es, (const char *)dense + r * cols * es, cols * es);
  return p;
}
/* rows of p (ld apart) equal dense's, pad bytes still 0xff */
static int same_rows(const void *p, const void *dense, size_t rows, size_t cols, size_t ld, size_t es) {
  int ok = 1;
  for (size_t r = 0; r < rows; r++) {
    const unsigned char *q = (const unsigned char *)p + r * ld * es;
    ok &= memcmp(q, (const char *)dense + r * cols * es, cols * es) == 0;
    for (size_t k = cols * es; k < ld * es; k++) ok &= q[k] == 0xff;
  }
  return ok;
}
static void check_row_stride(const backend *b) {
  enum { N = 5, K = 12, M = 37, L = 48 };
  const size_t es = backend_dtype_size(b->storage);
  float *xf = frand((size_t)N * K, 1), *wf = frand((size_t)M * K, 0.3), *bf = frand(M, 1), *gf = frand((size_t)N * M, 3);
  void *x = bytes_of(b, xf, (size_t)N * K), *w = bytes_of(b, wf, (size_t)M * K), *bias = bytes_of(b, bf, M);
  void *g = bytes_of(b, gf, (size_t)N * M), *dense = malloc((size_t)N * M * es);
  void *pad = padded(dense, N, 0, L, es); /* all NaN */
  b->matmul_fwd(b, dense, x, w, bias, N, K, M, M), b->matmul_fwd(b, pad, x, w, bias, N, K, M, L);
  T_CHECK(same_rows(pad, dense, N, M, L, es), "%s: matmul_fwd with rows %d apart differs or wrote the pad",
          b->precision, L);
  float *dx[2], *dw[2], *db[2];
  void *gp = padded(g, N, M, L, es);
  for (int k = 0; k < 2; k++) {
    dx[k] = malloc((size_t)N * K * es), dw[k] = fzeros((size_t)M * K), db[k] = fzeros(M);
    b->matmul_bwd(b, dx[k], dw[k], db[k], k ? gp : g, x, w, N, K, M, k ? L : M, 1);
  }
  T_CHECK(!memcmp(dx[0], dx[1], (size_t)N * K * es) && !memcmp(dw[0], dw[1], (size_t)M * K * 4) &&
              !memcmp(db[0], db[1], (size_t)M * 4),
          "%s: matmul_bwd with dout's rows %d apart differs", b->precision, L);
  /* the cross-entropy, whole and as a shard, on the same logits dense and padded */
  int32_t tgt[N] = {0, 36, 5, 17, 30};
  float loss[2][N], part[2][2 * N], lse[N] = {3.0f, 4.0f, 5.0f, 6.0f, 7.0f};
  void *lp = padded(g, N, M, L, es), *sp = padded(g, N, M, L, es), *sd = malloc((size_t)N * M * es);
  memcpy(sd, g, (size_t)N * M * es);
  b->xent_fwd_bwd(b, loss[0], g, tgt, N, M, M, 0.5f), b->xent_fwd_bwd(b, loss[1], lp, tgt, N, M, L, 0.5f);
  T_CHECK(!memcmp(loss[0], loss[1], sizeof loss[0]) && same_rows(lp, g, N, M, L, es),
          "%s: xent_fwd_bwd with rows %d apart differs or wrote the pad", b->precision, L);
  b->xent_part(b, part[0], sd, tgt, N, M, 3, M), b->xent_part(b, part[1], sp, tgt, N, M, 3, L);
  b->xent_grad(b, sd, lse, tgt, N, M, 3, M, 0.5f), b->xent_grad(b, sp, lse, tgt, N, M, 3, L, 0.5f);
  T_CHECK(!memcmp(part[0], part[1], sizeof part[0]) && same_rows(sp, sd, N, M, L, es),
          "%s: xent_part/xent_grad with rows %d apart differ or wrote the pad", b->precision, L);
  printf("  %-34s matmul and cross-entropy with rows %d apart: the dense results, pad untouched (%s)\n", "row strides",
         L, b->precision);
  for (int k = 0; k < 2; k++) free(dx[k]), free(dw[k]), free(db[k]);
  free(xf), free(wf), free(bf), free(gf), free(x), free(w), free(bias), free(g), free(dense), free(pad), free(gp);
  free(lp), free(sp), free(sd);
}

static void test_storage(void) {
  for (int k = 0; k < 2; k++) {
    b16 = backend_kind_cpu.open(-1, k ? "fp16" : "bf16");
    backend_shape sh = {.B = 2, .T = 70, .C = 40, .H = 3, .F = 40, .V = 301, .kv_rows = 27};
    b16->prepare(b16, &sh);
    storage_norm_and_linear();
    storage_attention();
    storage_rmsnorm_swiglu();
    storage_kv_cache();
    storage_elementwise();
    check_row_stride(b16);
    printf("  %-34s every op equals fp32 rounded once\n", k ? "fp16 storage" : "bf16 storage");
    backend_close(b16);
  }
}

static void test_matmul_both(void) {
  test_matmul(0);
  test_matmul(1);
  check_row_stride(be);
}

static void test_attention_all(void) {
  test_attention(9, 3, 3, 0, 1.0, "global");
  test_attention(70, 3, 3, 0, 0.5, "global T=70 scaled");
  test_attention(70, 3, 3, 5, 1.0, "local w=5 T=70");
  test_attention(66, 3, 3, 64, 1.0, "local w=64 T=66");
  test_attention(9, 4, 2, 0, 0.5, "GQA 4/2");
  test_attention(70, 4, 1, 0, 0.5, "GQA 4/1 T=70");
  test_attention(70, 6, 2, 5, 1.0, "GQA 6/2 local w=5 T=70");
}

/* Which test covers each op of the list; a new op without one fails here. */

/* PowerSGD's factors (lowrank_*) against double-precision references on a matrix taller than the
 * lanes of the column sums: P = (M + ef) Q, Q = M^T P, orthonormal columns (a zero column stays
 * zero), M = P Q^T and M -= P Q^T (the residual, which adds back to M); and one power iteration
 * reproduces a matrix of rank r. */
static void test_lowrank(void) {
  const size_t n = 300, m = 37;
  const int r = 4;
  float *M = frand(n * m, 1), *ef = frand(n * m, 0.1), *Q = frand(m * (size_t)r, 1), *P = fzeros(n * (size_t)r);
  double *want = calloc(n * m, sizeof(double));
  float *Msum = fcopy(M, n * m);
  for (size_t i = 0; i < n * m; i++) Msum[i] += ef[i];
  be->lowrank_left(be, P, M, ef, Q, n, m, r);
  T_CHECK(memcmp(M, Msum, n * m * sizeof *M) == 0, "lowrank_left: M + ef differs");
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < r; k++)
      for (size_t j = 0; j < m; j++) want[i * (size_t)r + (size_t)k] += (double)M[i * m + j] * Q[j * (size_t)r + (size_t)k];
  T_CHECK(t_rel_err_d(P, want, n * (size_t)r) < 1e-5, "lowrank_left: P = M Q is off by %g", t_rel_err_d(P, want, n * (size_t)r));
  memset(want, 0, n * m * sizeof *want);
  be->lowrank_right(be, Q, M, P, n, m, r);
  for (size_t j = 0; j < m; j++)
    for (int k = 0; k < r; k++)
      for (size_t i = 0; i < n; i++) want[j * (size_t)r + (size_t)k] += (double)M[i * m + j] * P[i * (size_t)r + (size_t)k];
  T_CHECK(t_rel_err_d(Q, want, m * (size_t)r) < 1e-5, "lowrank_right: Q = M^T P is off by %g", t_rel_err_d(Q, want, m * (size_t)r));
  for (size_t i = 0; i < n; i++) P[i * (size_t)r + 2] = 0.0f; /* a zero column */
  be->lowrank_orth(be, P, n, r);
  double worst = 0;
  for (int a = 0; a < r; a++)
    for (int b = 0; b < r; b++) {
      double d = 0;
      for (size_t i = 0; i < n; i++) d += (double)P[i * (size_t)r + (size_t)a] * P[i * (size_t)r + (size_t)b];
      worst = fmax(worst, fabs(d - (a == b && a != 2)));
    }
  T_CHECK(worst < 1e-5, "lowrank_orth: P^T P is %g from the identity (column 2 zero)", worst);
  for (int sub = 0; sub < 2; sub++) {
    float *out = fcopy(M, n * m);
    be->lowrank_expand(be, out, P, Q, n, m, r, sub);
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < m; j++) {
        double y = 0;
        for (int k = 0; k < r; k++) y += (double)P[i * (size_t)r + (size_t)k] * Q[j * (size_t)r + (size_t)k];
        want[i * m + j] = sub ? M[i * m + j] - y : y;
      }
    T_CHECK(t_rel_err_d(out, want, n * m) < 1e-5, "lowrank_expand%s is off by %g", sub ? " (sub)" : "", t_rel_err_d(out, want, n * m));
    if (sub) { /* error feedback's identity: what is sent (P Q^T) and the residual add up to what was to be sent */
      float *sent = fzeros(n * m);
      be->lowrank_expand(be, sent, P, Q, n, m, r, 0);
      for (size_t i = 0; i < n * m; i++) sent[i] += out[i];
      T_CHECK(t_rel_err(sent, M, n * m) < 1e-5, "lowrank: P Q^T + e differs from M by %g", t_rel_err(sent, M, n * m));
      free(sent);
    }
    free(out);
  }
  float *A = frand(n * (size_t)r, 1), *B = frand(m * (size_t)r, 1), *low = fzeros(n * m), *back = fzeros(n * m);
  be->lowrank_expand(be, low, A, B, n, m, r, 0); /* rank r */
  float *Q0 = frand(m * (size_t)r, 1);
  be->lowrank_left(be, P, low, NULL, Q0, n, m, r);
  be->lowrank_orth(be, P, n, r);
  be->lowrank_right(be, Q0, low, P, n, m, r);
  be->lowrank_expand(be, back, P, Q0, n, m, r, 0);
  T_CHECK(t_rel_err(back, low, n * m) < 1e-4, "one power iteration does not reproduce a rank-%d matrix (rel err %g)", r,
          t_rel_err(back, low, n * m));
  free(M), free(ef), free(Q), free(P), free(want), free(Msum), free(A), free(B), free(low), free(back), free(Q0);
}

static void (*const op_tests[BACKEND_NOPS])(void) = {
    [BACKEND_OP_embed_fwd] = test_embedding,       [BACKEND_OP_embed_bwd] = test_embedding,
    [BACKEND_OP_layernorm_fwd] = test_layernorm,   [BACKEND_OP_layernorm_bwd] = test_layernorm,
    [BACKEND_OP_matmul_fwd] = test_matmul_both,    [BACKEND_OP_matmul_bwd] = test_matmul_both,
    [BACKEND_OP_attention_fwd] = test_attention_all, [BACKEND_OP_attention_bwd] = test_attention_all,
    [BACKEND_OP_matmul_gelu_fwd] = test_mlp,       [BACKEND_OP_matmul_dgelu_bwd] = test_mlp,
    [BACKEND_OP_rope] = test_rope,
    [BACKEND_OP_rmsnorm_fwd] = test_rmsnorm,       [BACKEND_OP_rmsnorm_bwd] = test_rmsnorm,
    [BACKEND_OP_swiglu_fwd] = test_swiglu,         [BACKEND_OP_swiglu_bwd] = test_swiglu,
    [BACKEND_OP_residual_fwd] = test_residual,     [BACKEND_OP_accumulate] = test_residual,
    [BACKEND_OP_residual_layernorm_fwd] = test_residual_layernorm,
    [BACKEND_OP_xent_fwd_bwd] = test_xent,         [BACKEND_OP_adamw] = test_adamw,
    [BACKEND_OP_reduce_sum] = test_reduce_sum,               [BACKEND_OP_to_storage] = test_conversions,
    [BACKEND_OP_to_fp32] = test_conversions,       [BACKEND_OP_kv_store] = test_kv_cache_all,
    [BACKEND_OP_attention_cached] = test_kv_cache_all, [BACKEND_OP_xent_part] = test_xent,
    [BACKEND_OP_xent_grad] = test_xent,            [BACKEND_OP_quant_encode] = test_quant_ops,
    [BACKEND_OP_quant_decode] = test_quant_ops,    [BACKEND_OP_lowrank_left] = test_lowrank,
    [BACKEND_OP_lowrank_right] = test_lowrank,     [BACKEND_OP_lowrank_orth] = test_lowrank,
    [BACKEND_OP_lowrank_expand] = test_lowrank,
};

/* fpenv: once flushing, a subnormal result is zero and a subnormal input reads as zero; where the
 * CPU has no such mode, nothing claims that it flushes. Runs last: the other ops keep subnormals. */
static void test_fpenv(void) {
  volatile float tiny = 1e-30f, small = 1e-10f, big = 1e10f;
  volatile float sub = tiny * small; /* 1e-40: subnormal */
  T_CHECK(fpclassify(sub) == FP_SUBNORMAL && !fpenv_flushing(), "before the flush: 1e-30f x 1e-10f = %g (flushing: %d)",
          (double)sub, fpenv_flushing());
  int on = fpenv_flush_subnormals();
  T_CHECK(on == fpenv_flushing(), "fpenv_flush_subnormals says %d, fpenv_flushing %d", on, fpenv_flushing());
#if defined(__x86_64__) || defined(__aarch64__)
  /* these CPUs have the mode; valgrind's emulation of them does not (tests/valgrind.sh sets this) */
  if (!getenv("TEST_NO_FLUSH_MODE")) T_CHECK(on, "no flush on a CPU that has the mode (x86-64 MXCSR, AArch64 FPCR)");
#endif
  volatile float out = tiny * small, in = sub * big;
  if (on) T_CHECK(out == 0.0f && in == 0.0f, "flushing: 1e-30f x 1e-10f = %g and a subnormal x 1e10 = %g, not 0 and 0",
                  (double)out, (double)in);
  else T_CHECK(out != 0.0f && in != 0.0f, "no flush on this CPU, yet a subnormal became 0 (%g, %g)", (double)out, (double)in);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  be = backend_cpu();
  rng_seed(&R, 42, 0, 0);
  void (*done[BACKEND_NOPS])(void) = {0};
  for (int i = 0; i < BACKEND_NOPS; i++) {
    T_CHECK(op_tests[i] != NULL, "op %s has no test in test_ops", backend_op_names[i]);
    int seen = 0;
    for (int j = 0; j < i; j++) seen |= done[j] == op_tests[i];
    if (op_tests[i] && !seen) op_tests[i]();
    done[i] = op_tests[i];
  }
  test_storage();
  test_fpenv();
  int rc = t_done("test_ops");
  MPI_Finalize();
  return rc;
}
