/* quant_core: the arithmetic of the quantizer (quant.h) for one value, one code group and one
 * bucket's scale, written once for the CPU (quant.c) and the CUDA kernels (gpu/gpu_quant.cu), so
 * that a message encoded on a GPU is bit for bit the one the CPU encodes. The sums of a bucket
 * (its L2 norm, its expected error) are sequential in double, in index order, on both: the same
 * additions in the same order. No function here may be contracted into fused multiply-adds
 * differently on the two (the CUDA file uses the explicitly rounded intrinsics where it sums). */
#ifndef GREENLM_QUANT_CORE_H
#define GREENLM_QUANT_CORE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/quant.h"

#ifdef __CUDACC__
#define QC_FN __host__ __device__ static inline
#else
#define QC_FN static inline
#endif

enum { QC_KIND_TABLE = 0, QC_KIND_UNIFORM = 1, QC_KIND_EXP = 2 }; /* quant_scheme.uniform */

/* Header floats of a message: the scale, or min-max's low end and step. */
QC_FN int qc_headers(const quant_scheme *q) { return q->norm == QUANT_MINMAX ? 2 : 1; }

/* The uniform in [0, 1) of value i: 24 bits of a 32-bit counter-based hash (murmur3's finaliser of
 * the key and i). */
QC_FN uint32_t qc_hash32(uint32_t key, uint32_t i) {
  uint32_t x = key ^ (i * 0x9e3779b9u);
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}
QC_FN float qc_uniform01(uint32_t key, size_t i) { return (float)(qc_hash32(key, (uint32_t)i) >> 8) * 0x1p-24f; }
QC_FN uint32_t qc_key32(uint64_t key) { return (uint32_t)(key ^ (key >> 32)); }

/* A bucket's code group g (8 codes, fewer at the end of n) as stored: bytes g*b... of the packed codes. */
QC_FN void qc_put_group(uint64_t word, size_t g, size_t n, int bits, uint8_t *out) {
  size_t at = g * (size_t)bits, len = (n * (size_t)bits + 7) / 8 - at;
  if (len > (size_t)bits) len = (size_t)bits;
  for (size_t k = 0; k < len; k++) out[at + k] = (uint8_t)(word >> (8 * k));
}
QC_FN uint64_t qc_get_group(const uint8_t *in, size_t g, size_t n, int bits) {
  size_t at = g * (size_t)bits, len = (n * (size_t)bits + 7) / 8 - at;
  if (len > (size_t)bits) len = (size_t)bits;
  uint64_t word = 0;
  for (size_t k = 0; k < len; k++) word |= (uint64_t)in[at + k] << (8 * k);
  return word;
}

/* The bucket's scale h: sigma (L2, sequential in double; or the largest magnitude), or for min-max
 * the low end and the step. (quant_encode_segs computes the L2 sums of several buckets side by side,
 * each in this order.) */
QC_FN void qc_scale(const quant_scheme *q, const float *v, size_t n, float h[2]) {
  if (q->norm == QUANT_L2) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    h[0] = (float)sqrt(s);
    return;
  }
  if (q->norm == QUANT_MAX) { /* 8 running maxima side by side: the largest does not depend on the order */
    float m8[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, m = 0.0f;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; k++) m8[k] = fabsf(v[i + k]) > m8[k] ? fabsf(v[i + k]) : m8[k];
    for (; i < n; i++) m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
    for (int k = 0; k < 8; k++) m = m8[k] > m ? m8[k] : m;
    h[0] = m;
    return;
  }
  float lo = n ? v[0] : 0.0f, hi = lo; /* in order: the first of equal values (a zero's sign) is kept */
  for (size_t i = 0; i < n; i++) lo = v[i] < lo ? v[i] : lo, hi = v[i] > hi ? v[i] : hi;
  h[0] = lo, h[1] = (hi - lo) / (float)((1 << q->bits) - 1);
}

/* The parameters of the equal-step codes (min-max, or uniform magnitudes): mm, the low end, the
 * inverse step, the top position and the sign mask. */
typedef struct {
  int mm;
  float lo, inv, top, l1;
  unsigned smask;
} qc_params;

QC_FN qc_params qc_params_of(const quant_scheme *q, const float h[2]) {
  qc_params p;
  p.mm = q->norm == QUANT_MINMAX;
  p.smask = p.mm ? 0u : 1u << (q->bits - 1);
  p.lo = h[0];
  p.l1 = q->level[1];
  if (p.mm || q->uniform == QC_KIND_UNIFORM) {
    float step = p.mm ? h[1] : h[0];
    p.inv = step > 0.0f ? 1.0f / step : 0.0f;
    p.top = p.mm ? (float)((1 << q->bits) - 1) : (float)(q->nlevels - 1);
  } else {
    p.inv = h[0] > 0.0f ? 1.0f / h[0] : 0.0f;
    p.top = (float)(q->nlevels - 1);
  }
  return p;
}

/* Equal steps: uniform magnitudes (mm = 0) or min-max positions (v - lo) * inv. Branch-free. */
QC_FN unsigned qc_code_uniform(const qc_params *p, float v, float u) {
  float x = p->mm ? (v - p->lo) * p->inv : fabsf(v) * p->inv * p->top;
  x = x < 0.0f ? 0.0f : x;
  x = x > p->top ? p->top : x;
  float j = floorf(x);
  j = j > p->top - 1.0f ? p->top - 1.0f : j;
  unsigned code = (unsigned)j + (u < x - j);
  return code | (v < 0.0f && code > 0 ? p->smask : 0u);
}

/* Exponential levels 0, 2^-(top-1), ..., 1/2, 1: the interval from the float's exponent, the
 * probability from its mantissa. */
QC_FN unsigned qc_code_exp(const qc_params *p, float v, float u) {
  const int top = (int)p->top;
  float x = fabsf(v) * p->inv;
  x = x > 1.0f ? 1.0f : x;
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  int e = (int)(b >> 23) - 127 + top; /* x in [level[e], 2 level[e]) when 1 <= e < top */
  uint32_t mb = (b & 0x7fffffu) | 0x3f800000u;
  float f;
  memcpy(&f, &mb, sizeof f);
  float pr = e < 1 ? x / p->l1 : e >= top ? 1.0f : f - 1.0f;
  int j = e < 1 ? 0 : e >= top ? top - 1 : e;
  unsigned code = (unsigned)j + (u < pr);
  return code | (v < 0.0f && code > 0 ? p->smask : 0u);
}

/* One step of a table's search for the last j <= nlevels - 2 with level[j] <= r: from j, forward by
 * `step` where that level is still <= r. A select, not a branch. */
QC_FN int qc_table_step(const quant_scheme *q, int j, int step, float r) {
  const int k = j + step, top = q->nlevels - 2;
  return k <= top && q->level[k <= top ? k : top] <= r ? k : j;
}

/* The level interval [level[j], level[j+1]] holding r in [0, 1]. */
QC_FN int qc_interval(const quant_scheme *q, float r) {
  const int top = q->nlevels - 2;
  int j;
  if (q->uniform == QC_KIND_UNIFORM) {
    j = (int)(r * (float)(q->nlevels - 1));
  } else if (q->uniform == QC_KIND_EXP) {
    int e;
    frexpf(r, &e); /* r in [2^(e-1), 2^e): the lower level 2^(e-1) is level[e + k], k = nlevels - 2 */
    j = r > 0.0f ? e + top : 0;
  } else { /* a search of fixed steps */
    j = 0;
    for (int step = 1 << (q->bits - 2); step > 0; step >>= 1) j = qc_table_step(q, j, step, r);
  }
  j = j < 0 ? 0 : j > top ? top : j;
  /* float rounding at the ends of an interval: step to the one that holds r */
  while (j > 0 && r < q->level[j]) j--;
  while (j < top && r >= q->level[j + 1]) j++;
  return j;
}

/* The normalised position of v (in level units for min-max, a magnitude in [0, 1] otherwise). */
QC_FN float qc_position(const quant_scheme *q, const float h[2], float v) {
  if (q->norm == QUANT_MINMAX) {
    float x = h[1] > 0.0f ? (v - h[0]) / h[1] : 0.0f, top = (float)((1 << q->bits) - 1);
    return x < 0.0f ? 0.0f : x > top ? top : x;
  }
  float r = h[0] > 0.0f ? fabsf(v) / h[0] : 0.0f;
  return r > 1.0f ? 1.0f : r;
}

/* The code of v at position x in interval j of a table's levels: rounded up with probability p. */
QC_FN unsigned qc_round_table(const quant_scheme *q, float v, float x, int j, float u) {
  float p = (x - q->level[j]) / (q->level[j + 1] - q->level[j]);
  unsigned m = (unsigned)j + (u < p), sign = v < 0.0f && m > 0;
  return sign << (q->bits - 1) | m;
}

/* A table of levels (ALQ, AMQ): the interval by search, rounded up with probability p. */
QC_FN unsigned qc_code_table(const quant_scheme *q, const float h[2], float v, float u) {
  float x = qc_position(q, h, v);
  return qc_round_table(q, v, x, qc_interval(q, x), u);
}

/* The code of value v (index i of its bucket) under any scheme. */
QC_FN unsigned qc_code(const quant_scheme *q, const qc_params *p, const float h[2], float v, uint32_t key, size_t i) {
  const float u = qc_uniform01(key, i);
  if (p->mm || q->uniform == QC_KIND_UNIFORM) return qc_code_uniform(p, v, u);
  if (q->uniform == QC_KIND_EXP) return qc_code_exp(p, v, u);
  return qc_code_table(q, h, v, u);
}

/* The value code c stands for in a bucket scaled by h. */
QC_FN float qc_value(const quant_scheme *q, const float h[2], unsigned c) {
  if (q->norm == QUANT_MINMAX) return h[0] + (float)c * h[1];
  const unsigned half = 1u << (q->bits - 1), m = c & (half - 1);
  float x = h[0] * q->level[m < (unsigned)q->nlevels ? m : (unsigned)q->nlevels - 1];
  return c & half ? -x : x;
}

/* The exact expectation E||Q(v) - v||^2 of a bucket scaled by h (sequential in double). */
QC_FN double qc_expected(const quant_scheme *q, const float h[2], const float *v, size_t n) {
  double e = 0.0;
  for (size_t i = 0; i < n; i++) {
    float x = qc_position(q, h, v[i]);
    if (q->norm == QUANT_MINMAX) {
      double j = floor(x) < (double)((1 << q->bits) - 2) ? floor(x) : (double)((1 << q->bits) - 2);
      e += (double)h[1] * h[1] * (j + 1 - x) * (x - j);
    } else {
      int j = qc_interval(q, x);
      e += (double)h[0] * h[0] * ((double)q->level[j + 1] - x) * ((double)x - q->level[j]);
    }
  }
  return e;
}

/* Error feedback's contraction factor 1 / (1 + omega), omega = E||Q(v) - v||^2 / ||v||^2 (1 for an
 * all-zero bucket). */
QC_FN float qc_contraction(const quant_scheme *q, const float h[2], const float *v, size_t n) {
  double norm2 = 0.0;
  for (size_t i = 0; i < n; i++) norm2 += (double)v[i] * v[i];
  if (!(norm2 > 0.0)) return 1.0f;
  return (float)(1.0 / (1.0 + qc_expected(q, h, v, n) / norm2));
}

/* ---- top-k sparsification (quant_topk) ----
 * A bucket of n values keeps its k largest magnitudes (ties: the lower indices), sent as k indices
 * (16 bits when n <= 65536, else 32, little-endian) in increasing order, then their k fp32 values.
 * Only comparisons and copies: the CPU and a GPU thread select the same values. */

/* Values kept of a bucket of n: ceil(n ppm / 10^6), at least 1, at most n. */
QC_FN size_t qc_topk_count(const quant_scheme *q, size_t n) {
  size_t k = (n * (size_t)q->topk_ppm + 999999u) / 1000000u;
  return k < 1 ? (n > 0) : k > n ? n : k;
}
QC_FN size_t qc_topk_index_bytes(size_t n) { return n <= 65536 ? 2 : 4; }
/* The magnitude's bits: for finite non-negative floats their order is the values' order. */
QC_FN uint32_t qc_mag(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u & 0x7fffffffu;
}

/* The k-th largest magnitude key of v (n, k >= 1) by radix selection, a byte at a time from the
 * top; *ties: how many of the keys equal to it are kept (the first ones in index order). */
QC_FN uint32_t qc_topk_threshold(const float *v, size_t n, size_t k, size_t *ties) {
  uint32_t prefix = 0, mask = 0;
  size_t need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t hist[256];
    for (int b = 0; b < 256; b++) hist[b] = 0;
    for (size_t i = 0; i < n; i++) {
      const uint32_t u = qc_mag(v[i]);
      if ((u & mask) == prefix) hist[(u >> shift) & 255u]++;
    }
    int b = 255;
    while (b > 0 && hist[b] < need) need -= hist[b--];
    prefix |= (uint32_t)b << shift, mask |= 255u << shift;
  }
  *ties = need;
  return prefix;
}

/* Whether value i (magnitude key u) is kept at threshold t, counting down the ties left. */
QC_FN int qc_topk_keeps(uint32_t u, uint32_t t, size_t *ties) {
  if (u > t) return 1;
  if (u < t || *ties == 0) return 0;
  --*ties;
  return 1;
}

/* The message of v (n values): the kept values' indices, then the values. */
QC_FN void qc_topk_encode(const quant_scheme *q, const float *v, size_t n, uint8_t *msg) {
  const size_t k = qc_topk_count(q, n), w = qc_topk_index_bytes(n);
  if (k == 0) return;
  size_t ties, j = 0;
  const uint32_t t = qc_topk_threshold(v, n, k, &ties);
  for (size_t i = 0; i < n && j < k; i++) {
    if (!qc_topk_keeps(qc_mag(v[i]), t, &ties)) continue;
    for (size_t b = 0; b < w; b++) msg[j * w + b] = (uint8_t)(i >> (8 * b));
    memcpy(msg + k * w + j * sizeof(float), &v[i], sizeof(float));
    j++;
  }
}

enum { QC_SET = 0, QC_ADD = 1, QC_RESIDUAL = 2 }; /* out = y, out += y, out = v - y */

/* The kept values of msg (a bucket of n) into out at their indices as mode says (QC_SET: the caller
 * has zeroed out; QC_RESIDUAL: out[i] = v[i] - y, out holding v elsewhere). */
QC_FN void qc_topk_scatter(const quant_scheme *q, const uint8_t *msg, size_t n, float *out, int mode, const float *v) {
  const size_t k = qc_topk_count(q, n), w = qc_topk_index_bytes(n);
  for (size_t j = 0; j < k; j++) {
    size_t i = 0;
    float y;
    for (size_t b = 0; b < w; b++) i |= (size_t)msg[j * w + b] << (8 * b);
    memcpy(&y, msg + k * w + j * sizeof(float), sizeof y);
    if (i >= n) continue; /* not a message of this bucket: nothing outside it is touched */
    out[i] = mode == QC_ADD ? out[i] + y : mode == QC_RESIDUAL ? v[i] - y : y;
  }
}

#endif
