/* cpu_ops: embedding, LayerNorm, RMSNorm, gelu (tanh and erf forms), SwiGLU, rotary embedding, residual, softmax cross-entropy and AdamW on the CPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "cpu_math.h"
#include "base/util.h"

void cpu_embed_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C, int v0,
                   int nv) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((size_t)b * T + t) * C;
      int r = tok[b * T + t] - v0;
      if (r >= 0 && r < nv) memcpy(o, wte + (size_t)r * C, (size_t)C * sizeof(float));
      else memset(o, 0, (size_t)C * sizeof(float));
      if (wpe) cpu_accumulate(o, wpe + (size_t)t * C, (size_t)C);
    }
}

void cpu_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C, int v0, int nv) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dout + ((size_t)b * T + t) * C;
      int r = tok[b * T + t] - v0;
      if (r >= 0 && r < nv) cpu_accumulate(dwte + (size_t)r * C, d, (size_t)C);
      if (dwpe) cpu_accumulate(dwpe + (size_t)t * C, d, (size_t)C);
    }
}

void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                       int C, float eps) {
  for (int i = 0; i < N; i++) {
    const float *x = inp + (size_t)i * C;
    float *o = out + (size_t)i * C;
    float m = cpu_sum(x, (size_t)C) / (float)C;
    /* variance in two passes over the row (stable); o holds x - m meanwhile */
    for (int c = 0; c < C; c++) o[c] = x[c] - m;
    float v = cpu_dot(o, o, (size_t)C);
    float r = 1.0f / sqrtf(v / (float)C + eps);
    for (int c = 0; c < C; c++) o[c] = o[c] * r * w[c] + b[c];
    mean[i] = m;
    rstd[i] = r;
  }
}

void cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
  for (int i = 0; i < N; i++) {
    const float *x = inp + (size_t)i * C;
    float *o = out + (size_t)i * C;
    const float r = 1.0f / sqrtf(cpu_dot(x, x, (size_t)C) / (float)C + eps);
    for (int c = 0; c < C; c++) o[c] = x[c] * r;
    if (w)
      for (int c = 0; c < C; c++) o[c] *= w[c];
    rstd[i] = r;
  }
}

void cpu_mul_rows(float *x, const float *w, int N, int C) {
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) x[(size_t)i * C + c] *= w[c];
}

/* One row of the LayerNorm backward (db NULL: RMSNorm's, m = 0 and no sum of dnorm: dx = (dn - n * mean(dn * n)) *
 * r, n = x r); the buffers never overlap (restrict lets it vectorize). */
static void layernorm_bwd_row(float *restrict dx, float *restrict dw, float *restrict db, const float *restrict d,
                              const float *restrict x, const float *restrict w, float m, float r, int C) {
  /* two reductions: mean(dnorm) and mean(dnorm * norm), with dnorm = dout * w */
  float a1[CPU_LANES] = {0}, a2[CPU_LANES] = {0};
  int c0 = 0;
  for (; c0 + CPU_LANES <= C; c0 += CPU_LANES)
    for (int j = 0; j < CPU_LANES; j++) {
      float n = (x[c0 + j] - m) * r, dn = d[c0 + j] * w[c0 + j];
      a1[j] += dn;
      a2[j] += dn * n;
    }
  float s1 = 0.0f, s2 = 0.0f;
  for (int c = c0; c < C; c++) {
    float n = (x[c] - m) * r, dn = d[c] * w[c];
    s1 += dn;
    s2 += dn * n;
  }
  for (int j = 0; j < CPU_LANES; j++) {
    s1 += a1[j];
    s2 += a2[j];
  }
  s1 = db ? s1 / (float)C : 0.0f;
  s2 /= (float)C;
  for (int c = 0; c < C; c++) {
    float n = (x[c] - m) * r, dn = d[c] * w[c];
    dx[c] += (dn - s1 - n * s2) * r;
    dw[c] += d[c] * n;
  }
  if (db)
    for (int c = 0; c < C; c++) db[c] += d[c];
}

void cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                       const float *mean, const float *rstd, int N, int C) {
  for (int i = 0; i < N; i++)
    layernorm_bwd_row(dinp + (size_t)i * C, dw, db, dout + (size_t)i * C, inp + (size_t)i * C, w, mean ? mean[i] : 0.0f,
                      rstd[i], C);
}

static float silu(float g) { return g / (1.0f + expf(-g)); } /* as torch's silu */

void cpu_swiglu_fwd(float *h, const float *gu, int N, int F) {
  for (int i = 0; i < N; i++) {
    const float *g = gu + (size_t)i * 2 * F, *u = g + F;
    for (int j = 0; j < F; j++) h[(size_t)i * F + j] = silu(g[j]) * u[j];
  }
}

void cpu_swiglu_bwd(float *dgu, const float *dh, const float *gu, int N, int F) {
  for (int i = 0; i < N; i++) {
    const float *g = gu + (size_t)i * 2 * F, *u = g + F, *d = dh + (size_t)i * F;
    float *dg = dgu + (size_t)i * 2 * F, *du = dg + F;
    for (int j = 0; j < F; j++) {
      const float sg = 1.0f / (1.0f + expf(-g[j])); /* silu' = sg (1 + g (1 - sg)) */
      dg[j] = d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
      du[j] = d[j] * silu(g[j]);
    }
  }
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

#define GELU_R 0.7071067811865476f /* 1/sqrt(2) */
#define GELU_P 0.3989422804014327f /* 1/sqrt(2 pi) */

void cpu_gelu_fwd(float *out, const float *inp, size_t n, int act) {
  if (act == BACKEND_GELU_ERF) {
    for (size_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * GELU_R));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + cpu_tanhf(GELU_S * (x + GELU_A * x * x * x)));
  }
}

void cpu_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n, int act) {
  if (act == BACKEND_GELU_ERF) { /* d/dx: Phi(x) + x phi(x) */
    for (size_t i = 0; i < n; i++) {
      float x = inp[i];
      dinp[i] = dout[i] * (0.5f * (1.0f + erff(x * GELU_R)) + x * GELU_P * expf(-0.5f * x * x));
    }
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float t = cpu_tanhf(GELU_S * (x + GELU_A * x * x * x));
    float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
}

void cpu_rope(float *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot, const backend_rope *rope,
              int sign) {
  const int hs = C / H, half = rot / 2, W = backend_qkv_width(C, H, Hkv);
  float *cs = util_malloc(2 * (size_t)(half > 0 ? half : 1) * sizeof(float), "rotary table"), *sn = cs + half;
  for (int r = 0; r < N; r++) {
    const float p = (float)(pos ? pos[r] : r % T);
    for (int i = 0; i < half; i++) {
      const double a = (double)(p * backend_rope_inv_freq(rope, i, rot)); /* the fp32 angle, its cos and sin exact */
      cs[i] = (float)cos(a), sn[i] = (float)sin(a) * (float)sign;
    }
    for (int h = 0; h < H + Hkv; h++) { /* q's heads, then k's (columns C + (h - H) hs) */
      float *x = qkv + (size_t)r * W + (size_t)h * hs;
      for (int i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
  free(cs);
}

void cpu_residual_fwd(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_accumulate(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void cpu_xent_fwd_bwd(float *losses, float *logits, const int32_t *targets, int N, int V, int ld, float dscale) {
  for (int i = 0; i < N; i++) {
    float *x = logits + (size_t)i * ld;
    float mx = cpu_max(x, (size_t)V);
    float xt = x[targets[i]];
    float sum = cpu_exp_sum(x, (size_t)V, mx); /* x now holds exp(x - mx) */
    if (dscale != 0.0f) {
      float k = dscale / sum;
      for (int v = 0; v < V; v++) x[v] *= k;
      x[targets[i]] -= dscale;
    }
    losses[i] = mx + logf(sum) - xt;
  }
}

void cpu_xent_part(float *part, const float *logits, const int32_t *targets, int N, int nv, int v0, int ld) {
  for (int i = 0; i < N; i++) {
    const float *x = logits + (size_t)i * ld;
    float mx = cpu_max(x, (size_t)nv);
    double sum = 0.0;
    for (int v = 0; v < nv; v++) sum += expf(x[v] - mx);
    int r = targets[i] - v0;
    part[2 * i] = mx + (float)log(sum);
    part[2 * i + 1] = r >= 0 && r < nv ? x[r] : 0.0f;
  }
}

void cpu_xent_grad(float *logits, const float *lse, const int32_t *targets, int N, int nv, int v0, int ld,
                   float dscale) {
  for (int i = 0; i < N; i++) {
    float *x = logits + (size_t)i * ld;
    for (int v = 0; v < nv; v++) x[v] = dscale * expf(x[v] - lse[i]);
    int r = targets[i] - v0;
    if (r >= 0 && r < nv) x[r] -= dscale;
  }
}

int cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, const backend_adamw_args *a) {
  const float b1 = a->beta1, b2 = a->beta2, gs = backend_adamw_factor(a);
  if (gs < 0.0f) return 0; /* a non-finite step: skipped */
  const float bc1 = 1.0f - powf(b1, (float)a->step), bc2 = 1.0f - powf(b2, (float)a->step);
  const float step_size = a->lr / bc1, rbc2 = 1.0f / sqrtf(bc2);
  const float decay = 1.0f - a->lr * a->weight_decay;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * gs;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) * rbc2 + a->eps);
  }
  return 1;
}

double cpu_dsum(const float *x, size_t n) {
  double total = 0.0;
  for (size_t i = 0; i < n; i++) total += x[i];
  return total;
}

double cpu_sumsq(const float *x, size_t n) {
  /* blocks of float partial sums keep the loop vectorized; blocks are summed in double */
  double total = 0.0;
  for (size_t i0 = 0; i0 < n; i0 += 4096) {
    size_t len = i0 + 4096 < n ? 4096 : n - i0;
    total += cpu_dot(x + i0, x + i0, len);
  }
  return total;
}
