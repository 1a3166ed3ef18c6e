/* test_ops: every op of the CPU backend, forward and backward, against finite differences.
 *
 * For each op a plain double-precision reference of the forward pass is written here,
 * independently of the float kernels. The test checks
 *   1. the float forward against the double reference (relative error < 2e-5), and
 *   2. the float backward against central finite differences of the double reference:
 *      for a random projection w, L(x) = sum_i w_i * f(x)_i, and dL/dx_j from the op's backward
 *      (fed dout = w) must match (L(x + h e_j) - L(x - h e_j)) / 2h, h = 1e-6 (relative error
 *      < 1e-4 over the tensor).
 * Large tensors are probed at 300 random coordinates. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "base/rng.h"
#include "testing.h"
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
  be->embed_fwd(y, c.tok, wte, wpe, c.B, c.T, c.C);
  emb_ref(&c);
  check_fwd("embedding", y, c.y, n);
  float *dwte = fzeros((size_t)c.V * c.C), *dwpe = fzeros((size_t)c.T * c.C);
  be->embed_bwd(dwte, dwpe, w, c.tok, c.B, c.T, c.C);
  check_grad("embedding d/dwte", emb_loss, &c, c.wte, dwte, (size_t)c.V * c.C);
  check_grad("embedding d/dwpe", emb_loss, &c, c.wpe, dwpe, (size_t)c.T * c.C);
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
  be->layernorm_fwd(y, mean, rstd, x, g, b, c.N, c.C, (float)c.eps);
  ln_ref(&c);
  check_fwd("layernorm", y, c.y, n);
  float *dx = fzeros(n), *dg = fzeros((size_t)c.C), *db = fzeros((size_t)c.C);
  be->layernorm_bwd(dx, dg, db, w, x, g, mean, rstd, c.N, c.C);
  check_grad("layernorm d/dinp", ln_loss, &c, c.x, dx, n);
  check_grad("layernorm d/dweight", ln_loss, &c, c.g, dg, (size_t)c.C);
  check_grad("layernorm d/dbias", ln_loss, &c, c.b, db, (size_t)c.C);
  free(x), free(g), free(b), free(w), free(y), free(mean), free(rstd), free(dx), free(dg), free(db);
  free(c.x), free(c.g), free(c.b), free(c.w), free(c.y);
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
  be->matmul_fwd(y, x, W, with_bias ? bias : NULL, c.N, c.K, c.M);
  mm_ref(&c);
  check_fwd(with_bias ? "matmul+bias" : "matmul", y, c.y, ny);
  float *dx = fzeros(nx), *dW = fzeros(nW), *db = fzeros((size_t)c.M);
  be->matmul_bwd(dx, dW, with_bias ? db : NULL, w, x, W, c.N, c.K, c.M);
  check_grad(with_bias ? "matmul+bias d/dinp" : "matmul d/dinp", mm_loss, &c, c.x, dx, nx);
  check_grad(with_bias ? "matmul+bias d/dweight" : "matmul d/dweight", mm_loss, &c, c.W, dW, nW);
  if (with_bias) check_grad("matmul+bias d/dbias", mm_loss, &c, c.bias, db, (size_t)c.M);
  /* dweight and dbias accumulate: a second backward doubles them */
  be->matmul_bwd(NULL, dW, with_bias ? db : NULL, w, x, W, c.N, c.K, c.M);
  float *dW1 = fzeros(nW);
  be->matmul_bwd(dx, dW1, NULL, w, x, W, c.N, c.K, c.M);
  double err = 0;
  for (size_t i = 0; i < nW; i++) err = fmax(err, fabs(dW[i] - 2 * dW1[i]));
  T_CHECK(err < 1e-5, "matmul dweight does not accumulate (+=): max err %g", err);
  free(x), free(W), free(bias), free(w), free(y), free(dx), free(dW), free(dW1), free(db);
  free(c.x), free(c.W), free(c.bias), free(c.w), free(c.y);
}

/* ---- attention --------------------------------------------------------------------------------- */

typedef struct {
  int B, T, C, H, window;
  double scale;
  double *qkv, *w, *y, *lse;
} att_ctx;

static void att_ref(att_ctx *c) {
  int hs = c->C / c->H, C3 = 3 * c->C;
  double *s = malloc((size_t)c->T * sizeof(double));
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++)
      for (int i = 0; i < c->T; i++) {
        const double *q = c->qkv + ((size_t)b * c->T + i) * C3 + h * hs;
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          int visible = c->window <= 0 || i - j < c->window;
          const double *k = c->qkv + ((size_t)b * c->T + j) * C3 + c->C + h * hs;
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
          const double *v = c->qkv + ((size_t)b * c->T + j) * C3 + 2 * c->C + h * hs;
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

static void test_attention(int T, int window, double scale, const char *what) {
  att_ctx c = {.B = 2, .T = T, .C = 12, .H = 3, .window = window, .scale = scale};
  size_t nq = (size_t)c.B * T * 3 * c.C, ny = (size_t)c.B * T * c.C, nl = (size_t)c.B * c.H * T;
  float *qkv = frand(nq, 1), *w = frand(ny, 1), *y = fzeros(ny), *lse = fzeros(nl);
  float *scratch = be->alloc(be->attention_scratch(T));
  c.qkv = dcopy(qkv, nq), c.w = dcopy(w, ny);
  c.y = malloc(ny * sizeof(double)), c.lse = malloc(nl * sizeof(double));
  be->attention_fwd(y, lse, qkv, scratch, c.B, T, c.C, c.H, window, (float)scale);
  att_ref(&c);
  char name[80];
  snprintf(name, sizeof name, "attention %s", what);
  check_fwd(name, y, c.y, ny);
  snprintf(name, sizeof name, "attention %s lse", what);
  check_fwd(name, lse, c.lse, nl);
  float *dqkv = fzeros(nq);
  be->attention_bwd(dqkv, w, y, lse, qkv, scratch, c.B, T, c.C, c.H, window, (float)scale);
  snprintf(name, sizeof name, "attention %s d/dqkv", what);
  check_grad(name, att_loss, &c, c.qkv, dqkv, nq);
  be->free(scratch);
  free(qkv), free(w), free(y), free(lse), free(dqkv), free(c.qkv), free(c.w), free(c.y), free(c.lse);
}

/* ---- gelu_new ---------------------------------------------------------------------------------- */

typedef struct {
  size_t n;
  double *x, *w, *y;
} el_ctx;

static void gelu_ref(el_ctx *c) {
  for (size_t i = 0; i < c->n; i++) {
    double x = c->x[i];
    c->y[i] = 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
  }
}
static double gelu_loss(void *p) {
  el_ctx *c = p;
  gelu_ref(c);
  return wsum(c->w, c->y, c->n);
}

static void test_gelu(void) {
  el_ctx c = {.n = 301};
  float *x = frand(c.n, 3), *w = frand(c.n, 1), *y = fzeros(c.n);
  x[0] = 0.0f, x[1] = 12.0f, x[2] = -12.0f, x[3] = 1e-4f; /* flat tails and the origin */
  c.x = dcopy(x, c.n), c.w = dcopy(w, c.n), c.y = malloc(c.n * sizeof(double));
  be->gelu_fwd(y, x, c.n);
  gelu_ref(&c);
  check_fwd("gelu_new", y, c.y, c.n);
  float *dx = fzeros(c.n);
  be->gelu_bwd(dx, w, x, c.n);
  check_grad("gelu_new d/dinp", gelu_loss, &c, c.x, dx, c.n);
  memcpy(dx, w, c.n * sizeof(float)); /* in place, as the model calls it */
  be->gelu_bwd(dx, dx, x, c.n);
  check_grad("gelu_new d/dinp (in place)", gelu_loss, &c, c.x, dx, c.n);
  free(x), free(w), free(y), free(dx), free(c.x), free(c.w), free(c.y);
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
  be->residual_fwd(y, a, b, c.n);
  res_loss(&c);
  check_fwd("residual", y, c.y, c.n);
  /* backward: both inputs receive dout, accumulated */
  float *da = fzeros(c.n), *db = fzeros(c.n);
  be->accumulate(da, w, c.n);
  be->accumulate(db, w, c.n);
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
  be->xent_fwd_bwd(l, xg, c.tgt, c.N, c.V, (float)c.dscale);
  xent_total(&c);
  check_fwd("softmax+cross-entropy loss", l, c.loss, (size_t)c.N);
  check_grad("softmax+cross-entropy d/dlogits", xent_total, &c, c.x, xg, n);
  /* dscale = 0: losses only */
  float *l0 = fzeros((size_t)c.N);
  memcpy(xg, x, n * sizeof(float));
  be->xent_fwd_bwd(l0, xg, c.tgt, c.N, c.V, 0.0f);
  check_fwd("cross-entropy loss (no grad)", l0, c.loss, (size_t)c.N);
  free(x), free(l), free(l0), free(xg), free(c.tgt), free(c.x), free(c.loss);
}

/* ---- AdamW and sumsq against a double reference ------------------------------------------------- */

static void test_adamw(void) {
  size_t n = 257;
  float *p = frand(n, 1), *g = frand(n, 1), *m = frand(n, 0.1), *v = frand(n, 0.1);
  for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  double *pd = dcopy(p, n), *md = dcopy(m, n), *vd = dcopy(v, n);
  backend_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .grad_scale = 0.5f, .step = 3};
  be->adamw(p, g, m, v, n, &a);
  double b1 = 0.9, b2 = 0.95, lr = 1e-2, bc1 = 1 - pow(b1, 3), bc2 = 1 - pow(b2, 3);
  for (size_t i = 0; i < n; i++) {
    double gi = 0.5 * g[i];
    pd[i] *= 1 - lr * 0.1;
    md[i] = b1 * md[i] + (1 - b1) * gi;
    vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
    pd[i] -= lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + 1e-8);
  }
  check_fwd("adamw parameters", p, pd, n);
  check_fwd("adamw first moment", m, md, n);
  check_fwd("adamw second moment", v, vd, n);
  double ss = 0;
  size_t big = 100003;
  float *x = frand(big, 1);
  for (size_t i = 0; i < big; i++) ss += (double)x[i] * x[i];
  double got = be->sumsq(x, big);
  T_CHECK(fabs(got - ss) / ss < 1e-6, "sumsq: %.10g vs %.10g", got, ss);
  free(p), free(g), free(m), free(v), free(pd), free(md), free(vd), free(x);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  be = backend_cpu();
  rng_seed(&R, 42, 0, 0);
  test_embedding();
  test_layernorm();
  test_matmul(0);
  test_matmul(1);
  test_attention(9, 0, 1.0, "global");
  test_attention(70, 0, 0.5, "global T=70 scaled");
  test_attention(70, 5, 1.0, "local w=5 T=70");
  test_attention(66, 64, 1.0, "local w=64 T=66");
  test_gelu();
  test_residual();
  test_xent();
  test_adamw();
  int rc = t_done("test_ops");
  MPI_Finalize();
  return rc;
}
