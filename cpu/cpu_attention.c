/* cpu_attention: causal (global or local-window) multi-head attention, tiled over query blocks;
 * and the attention of new rows against a KV cache (generation).
 *
 * For each sequence b, head h and block of CPU_ATT_BQ queries, the scores against the keys that
 * block can see are formed with one SGEMM, masked, soft-maxed and applied to v with a second SGEMM.
 * Only one (BQ x T) score tile exists at a time, never a T x T matrix per head. The backward pass
 * recomputes the probabilities from q, k and the saved log-sum-exp (lse) instead of storing them. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "cpu_math.h"

#define CPU_ATT_BQ 64

size_t cpu_attention_scratch(int T) {
  /* P (BQ x T) and dP (BQ x T) tiles */
  return (size_t)2 * CPU_ATT_BQ * (size_t)T * sizeof(float);
}

/* Keys visible to query i: [key_lo(i), i]. */
static inline int key_lo(int i, int window) {
  int lo = window > 0 ? i - window + 1 : 0;
  return lo > 0 ? lo : 0;
}

void cpu_attention_fwd(float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H, int Hkv,
                       int window, float scale) {
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), Ckv = hs * Hkv;
  float *S = scratch; /* (bq, nk) */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = qkv + (size_t)b * T * C3 + backend_key_col(C, H, Hkv, h),
                  *v = k + Ckv;
      float *o = out + (size_t)b * T * C + h * hs;
      float *l = lse + ((size_t)b * H + h) * T;
      for (int i0 = 0; i0 < T; i0 += CPU_ATT_BQ) {
        int i1 = i0 + CPU_ATT_BQ < T ? i0 + CPU_ATT_BQ : T, bq = i1 - i0;
        int j0 = key_lo(i0, window), nk = i1 - j0;
        /* S (bq,nk) = scale * q[i0:i1] (bq,hs) @ k[j0:i1]^T (hs,nk) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, hs, scale, q + (size_t)i0 * C3, C3,
                    k + (size_t)j0 * C3, C3, 0.0f, S, nk);
        for (int r = 0; r < bq; r++) {
          int i = i0 + r, lo = key_lo(i, window) - j0, hi = i - j0 + 1; /* visible: [lo, hi) */
          float *s = S + (size_t)r * nk;
          float mx = cpu_max(s + lo, (size_t)(hi - lo));
          float sum = cpu_exp_sum(s + lo, (size_t)(hi - lo), mx);
          float inv = 1.0f / sum;
          for (int j = lo; j < hi; j++) s[j] *= inv;
          memset(s, 0, (size_t)lo * sizeof(float));
          memset(s + hi, 0, (size_t)(nk - hi) * sizeof(float));
          l[i] = mx + logf(sum);
        }
        /* o[i0:i1] (bq,hs) = P (bq,nk) @ v[j0:i1] (nk,hs) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, hs, nk, 1.0f, S, nk, v + (size_t)j0 * C3, C3,
                    0.0f, o + (size_t)i0 * C, C);
      }
    }
}

/* A key/value head's gradients sum over the H/Hkv query heads that read it. */
void cpu_attention_bwd(float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv,
                       float *scratch, int B, int T, int C, int H, int Hkv, int window, float scale) {
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), Ckv = hs * Hkv;
  float *P = scratch, *dP = scratch + (size_t)CPU_ATT_BQ * T;
  memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const size_t row0 = (size_t)b * T * C3, kc = (size_t)backend_key_col(C, H, Hkv, h);
      const float *q = qkv + row0 + h * hs, *k = qkv + row0 + kc, *v = k + Ckv;
      float *dq = dqkv + row0 + h * hs, *dk = dqkv + row0 + kc, *dv = dk + Ckv;
      const float *o = out + (size_t)b * T * C + h * hs, *dO = dout + (size_t)b * T * C + h * hs;
      const float *l = lse + ((size_t)b * H + h) * T;
      for (int i0 = 0; i0 < T; i0 += CPU_ATT_BQ) {
        int i1 = i0 + CPU_ATT_BQ < T ? i0 + CPU_ATT_BQ : T, bq = i1 - i0;
        int j0 = key_lo(i0, window), nk = i1 - j0;
        /* recompute P = exp(scale * q k^T - lse) on the visible keys */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, hs, scale, q + (size_t)i0 * C3, C3,
                    k + (size_t)j0 * C3, C3, 0.0f, P, nk);
        /* dP (bq,nk) = dO[i0:i1] (bq,hs) @ v[j0:i1]^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, hs, 1.0f, dO + (size_t)i0 * C, C,
                    v + (size_t)j0 * C3, C3, 0.0f, dP, nk);
        for (int r = 0; r < bq; r++) {
          int i = i0 + r, lo = key_lo(i, window) - j0, hi = i - j0 + 1;
          float *p = P + (size_t)r * nk, *dp = dP + (size_t)r * nk;
          /* D = sum_d dO[i,d] o[i,d] = sum_j P[i,j] dP[i,j] */
          float D = cpu_dot(dO + (size_t)i * C, o + (size_t)i * C, (size_t)hs);
          for (int j = lo; j < hi; j++) {
            p[j] = cpu_expf(p[j] - l[i]);
            dp[j] = p[j] * (dp[j] - D); /* dS */
          }
          memset(p, 0, (size_t)lo * sizeof(float));
          memset(p + hi, 0, (size_t)(nk - hi) * sizeof(float));
          memset(dp, 0, (size_t)lo * sizeof(float));
          memset(dp + hi, 0, (size_t)(nk - hi) * sizeof(float));
        }
        /* dq[i0:i1] (bq,hs) = scale * dS @ k[j0:i1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, hs, nk, scale, dP, nk, k + (size_t)j0 * C3, C3,
                    1.0f, dq + (size_t)i0 * C3, C3);
        /* dk[j0:i1] (nk,hs) += scale * dS^T @ q[i0:i1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, bq, scale, dP, nk, q + (size_t)i0 * C3, C3,
                    1.0f, dk + (size_t)j0 * C3, C3);
        /* dv[j0:i1] (nk,hs) += P^T @ dO[i0:i1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, bq, 1.0f, P, nk, dO + (size_t)i0 * C, C, 1.0f,
                    dv + (size_t)j0 * C3, C3);
      }
    }
}

void cpu_kv_store(size_t es, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos, int N, int C,
                  int Ckv, int ring) {
  const size_t row = (size_t)Ckv * es, q = (size_t)C * es;
  for (int r = 0; r < N; r++) {
    size_t at = ((size_t)seq[r] * ring + (size_t)(pos[r] % ring)) * row;
    const char *src = (const char *)qkv + (size_t)r * (q + 2 * row);
    memcpy((char *)kc + at, src + q, row);
    memcpy((char *)vc + at, src + q + row, row);
  }
}

/* Per row and head: two passes over the visible keys (the max of the scores, then exp, sum and the
 * weighted sum of v), so no score array is kept; o is the accumulator. */
void cpu_attention_cached(float *out, const float *qkv, const float *kc, const float *vc, const int32_t *seq,
                          const int32_t *pos, int N, int C, int H, int Hkv, int ring, int window, float scale) {
  const int hs = C / H, Ckv = hs * Hkv, W = backend_qkv_width(C, H, Hkv);
  for (int r = 0; r < N; r++) {
    const size_t base = (size_t)seq[r] * ring * Ckv;
    const int p = pos[r], lo = key_lo(p, window);
    for (int h = 0; h < H; h++) {
      const float *q = qkv + (size_t)r * W + h * hs;
      const size_t kh = (size_t)(backend_key_col(C, H, Hkv, h) - C); /* the key head's columns in a cache row */
      float *o = out + (size_t)r * C + h * hs, mx = -INFINITY, sum = 0.0f;
      for (int j = lo; j <= p; j++) {
        float s = scale * cpu_dot(q, kc + base + (size_t)(j % ring) * Ckv + kh, (size_t)hs);
        mx = s > mx ? s : mx;
      }
      memset(o, 0, (size_t)hs * sizeof(float));
      for (int j = lo; j <= p; j++) {
        const size_t at = base + (size_t)(j % ring) * Ckv + kh;
        float e = cpu_expf(scale * cpu_dot(q, kc + at, (size_t)hs) - mx);
        sum += e;
        for (int d = 0; d < hs; d++) o[d] += e * vc[at + d];
      }
      for (int d = 0; d < hs; d++) o[d] /= sum;
    }
  }
}
