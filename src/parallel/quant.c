/* quant: bucketed stochastic quantization (see quant.h). */
#include "parallel/quant.h"

#include <math.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"

enum { KIND_TABLE = 0, KIND_UNIFORM = 1, KIND_EXP = 2 };

static void set_common(quant_scheme *q, int bits, quant_norm norm) {
  UTIL_CHECK(bits >= 2 && bits <= 8, NULL, "internal: %d-bit quantization", bits);
  memset(q, 0, sizeof *q);
  q->bits = bits;
  q->norm = norm;
}

void quant_uniform(quant_scheme *q, int bits, quant_norm norm) {
  set_common(q, bits, norm);
  int s = (1 << (bits - 1)) - 1;
  q->nlevels = s + 1;
  for (int j = 0; j <= s; j++) q->level[j] = (float)j / (float)s;
  q->uniform = KIND_UNIFORM;
}

void quant_exponential(quant_scheme *q, int bits, quant_norm norm) {
  set_common(q, bits, norm);
  int k = (1 << (bits - 1)) - 2; /* levels 0, 2^-k, ..., 2^-1, 1 */
  q->nlevels = k + 2;
  q->level[0] = 0.0f;
  for (int j = 1; j <= k + 1; j++) q->level[j] = ldexpf(1.0f, j - 1 - k);
  q->uniform = KIND_EXP;
}

int quant_levels(quant_scheme *q, int bits, quant_norm norm, const float *level, int n) {
  if (bits < 2 || bits > 8 || n < 2 || n > 1 << (bits - 1) || level[0] != 0.0f || level[n - 1] != 1.0f) return -1;
  for (int j = 1; j < n; j++)
    if (!(level[j] > level[j - 1])) return -1;
  set_common(q, bits, norm);
  q->nlevels = n;
  memcpy(q->level, level, (size_t)n * sizeof *level);
  q->uniform = KIND_TABLE;
  return 0;
}

void quant_passthrough(quant_scheme *q) {
  memset(q, 0, sizeof *q);
  q->bits = 32;
}

/* ---- packing ------------------------------------------------------------------------------------ */

size_t quant_packed_bytes(size_t n, int bits) { return (n * (size_t)bits + 7) / 8; }

/* Group g of codes (8 codes, or fewer at the end) into its bytes of out. */
static void put_group(uint64_t word, size_t g, size_t n, int bits, uint8_t *out) {
  size_t at = g * (size_t)bits, len = quant_packed_bytes(n, bits) - at;
  if (len > (size_t)bits) len = (size_t)bits;
  for (size_t k = 0; k < len; k++) out[at + k] = (uint8_t)(word >> (8 * k));
}

static uint64_t get_group(const uint8_t *in, size_t g, size_t n, int bits) {
  size_t at = g * (size_t)bits, len = quant_packed_bytes(n, bits) - at;
  if (len > (size_t)bits) len = (size_t)bits;
  uint64_t word = 0;
  for (size_t k = 0; k < len; k++) word |= (uint64_t)in[at + k] << (8 * k);
  return word;
}

void quant_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out) {
  for (size_t g = 0; g * 8 < n; g++) {
    uint64_t word = 0;
    for (size_t k = 0; k < 8 && g * 8 + k < n; k++) word |= (uint64_t)codes[g * 8 + k] << (k * (size_t)bits);
    put_group(word, g, n, bits, out);
  }
}

void quant_unpack(const uint8_t *in, size_t n, int bits, uint8_t *codes) {
  const uint64_t mask = (1u << bits) - 1;
  for (size_t g = 0; g * 8 < n; g++) {
    uint64_t word = get_group(in, g, n, bits);
    for (size_t k = 0; k < 8 && g * 8 + k < n; k++) codes[g * 8 + k] = (uint8_t)((word >> (k * (size_t)bits)) & mask);
  }
}

/* ---- the scale and the levels ------------------------------------------------------------------- */

static int headers(const quant_scheme *q) { return q->norm == QUANT_MINMAX ? 2 : 1; }

size_t quant_bytes(const quant_scheme *q, size_t n) {
  if (q->bits == 32) return n * sizeof(float);
  return (size_t)headers(q) * sizeof(float) + quant_packed_bytes(n, q->bits);
}

/* The bucket's scale: sigma (L2 or max), or for min-max the low end and the step. */
static void scale_of(const quant_scheme *q, const float *v, size_t n, float h[2]) {
  if (q->norm == QUANT_L2) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    h[0] = (float)sqrt(s);
    return;
  }
  float lo = n ? v[0] : 0.0f, hi = lo, m = 0.0f;
  for (size_t i = 0; i < n; i++) {
    lo = v[i] < lo ? v[i] : lo, hi = v[i] > hi ? v[i] : hi;
    m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
  }
  if (q->norm == QUANT_MAX) h[0] = m;
  else h[0] = lo, h[1] = (hi - lo) / (float)((1 << q->bits) - 1);
}

/* The level interval [level[j], level[j+1]] holding r in [0, 1]. */
static int interval(const quant_scheme *q, float r) {
  const int top = q->nlevels - 2;
  int j;
  if (q->uniform == KIND_UNIFORM) {
    j = (int)(r * (float)(q->nlevels - 1));
  } else if (q->uniform == KIND_EXP) {
    int e;
    frexpf(r, &e); /* r in [2^(e-1), 2^e): the lower level 2^(e-1) is level[e + k], k = nlevels - 2 */
    j = r > 0.0f ? e + top : 0;
  } else {
    int lo = 0, hi = top; /* the last j with level[j] <= r */
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (q->level[mid] <= r) lo = mid;
      else hi = mid - 1;
    }
    j = lo;
  }
  j = j < 0 ? 0 : j > top ? top : j;
  /* float rounding at the ends of an interval: step to the one that holds r */
  while (j > 0 && r < q->level[j]) j--;
  while (j < top && r >= q->level[j + 1]) j++;
  return j;
}

/* The normalised position of v (in level units for min-max, a magnitude in [0, 1] otherwise). */
static float position(const quant_scheme *q, const float h[2], float v) {
  if (q->norm == QUANT_MINMAX) {
    float x = h[1] > 0.0f ? (v - h[0]) / h[1] : 0.0f, top = (float)((1 << q->bits) - 1);
    return x < 0.0f ? 0.0f : x > top ? top : x;
  }
  float r = h[0] > 0.0f ? fabsf(v) / h[0] : 0.0f;
  return r > 1.0f ? 1.0f : r;
}

/* ---- encode, decode, the exact error ------------------------------------------------------------ */

/* The uniform in [0, 1) of value i: 24 bits of a 32-bit counter-based hash (murmur3's finaliser of
 * the key and i), cheap enough to vectorise with the rounding. */
static inline uint32_t hash32(uint32_t key, uint32_t i) {
  uint32_t x = key ^ (i * 0x9e3779b9u);
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}
static inline float uniform01(uint32_t key, size_t i) { return (float)(hash32(key, (uint32_t)i) >> 8) * 0x1p-24f; }

/* The code of v: rounded up with probability p by the random bits of (key, i). */
static unsigned code_of(const quant_scheme *q, const float h[2], float v, uint32_t key, size_t i) {
  const float u = uniform01(key, i);
  float x = position(q, h, v);
  if (q->norm == QUANT_MINMAX) {
    int top = (1 << q->bits) - 2, j = (int)x;
    j = j > top ? top : j;
    return (unsigned)j + (u < x - (float)j);
  }
  int j = interval(q, x);
  float p = (x - q->level[j]) / (q->level[j + 1] - q->level[j]);
  unsigned m = (unsigned)j + (u < p), sign = v < 0.0f && m > 0;
  return sign << (q->bits - 1) | m;
}

/* Codes of n values v (indices i0...) on equal steps: uniform magnitudes (mm = 0: sign bit smask)
 * or min-max (mm = 1: positions (v - lo) * inv). No branch in the loop: it vectorises. */
static void codes_uniform(const float *v, size_t n, int mm, float lo, float inv, float top, unsigned smask,
                          uint32_t key, size_t i0, uint8_t *c) {
  for (size_t k = 0; k < n; k++) {
    float u = uniform01(key, i0 + k);
    float x = mm ? (v[k] - lo) * inv : fabsf(v[k]) * inv * top;
    x = x < 0.0f ? 0.0f : x;
    x = x > top ? top : x;
    float j = floorf(x);
    j = j > top - 1.0f ? top - 1.0f : j;
    unsigned code = (unsigned)j + (u < x - j);
    c[k] = (uint8_t)(code | (v[k] < 0.0f && code > 0 ? smask : 0u));
  }
}

/* Codes of n values on exponential levels 0, 2^-(top-1), ..., 1/2, 1 (top = nlevels - 1): the
 * interval from the float's exponent, the probability from its mantissa. */
static void codes_exp(const float *v, size_t n, float inv, int top, float l1, unsigned smask, uint32_t key, size_t i0,
                      uint8_t *c) {
  for (size_t k = 0; k < n; k++) {
    float u = uniform01(key, i0 + k);
    float x = fabsf(v[k]) * inv;
    x = x > 1.0f ? 1.0f : x;
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    int e = (int)(b >> 23) - 127 + top; /* x in [level[e], 2 level[e]) when 1 <= e < top */
    uint32_t mb = (b & 0x7fffffu) | 0x3f800000u;
    float f;
    memcpy(&f, &mb, sizeof f);
    float p = e < 1 ? x / l1 : e >= top ? 1.0f : f - 1.0f;
    int j = e < 1 ? 0 : e >= top ? top - 1 : e;
    unsigned code = (unsigned)j + (u < p);
    c[k] = (uint8_t)(code | (v[k] < 0.0f && code > 0 ? smask : 0u));
  }
}

/* Codes of n values (indices i0...) of a bucket scaled by h. */
static void codes_of(const quant_scheme *q, const float h[2], const float *v, size_t n, uint32_t key, size_t i0,
                     uint8_t *c) {
  const int mm = q->norm == QUANT_MINMAX;
  const unsigned smask = mm ? 0u : 1u << (q->bits - 1);
  if (mm || q->uniform == KIND_UNIFORM) {
    float step = mm ? h[1] : h[0];
    codes_uniform(v, n, mm, h[0], step > 0.0f ? 1.0f / step : 0.0f,
                  mm ? (float)((1 << q->bits) - 1) : (float)(q->nlevels - 1), smask, key, i0, c);
  } else if (q->uniform == KIND_EXP) {
    codes_exp(v, n, h[0] > 0.0f ? 1.0f / h[0] : 0.0f, q->nlevels - 1, q->level[1], smask, key, i0, c);
  } else {
    for (size_t k = 0; k < n; k++) c[k] = (uint8_t)code_of(q, h, v[k], key, i0 + k);
  }
}

float quant_scale(const quant_scheme *q, const float *v, size_t n) {
  float h[2] = {0.0f, 0.0f};
  scale_of(q, v, n, h);
  return h[0];
}

void quant_int_encode(const quant_scheme *q, const float *v, size_t n, float scale, uint64_t key, int16_t *out) {
  const float s = (float)(q->nlevels - 1), k = scale > 0.0f ? s / scale : 0.0f;
  const uint32_t k32 = (uint32_t)(key ^ (key >> 32));
  for (size_t i = 0; i < n; i++) {
    float x = v[i] * k;
    x = x < -s ? -s : x > s ? s : x;
    float j = floorf(x);
    out[i] = (int16_t)(j + (uniform01(k32, i) < x - j));
  }
}

void quant_encode(const quant_scheme *q, const float *v, size_t n, uint64_t key, uint8_t *msg) {
  if (q->bits == 32) {
    memcpy(msg, v, n * sizeof(float));
    return;
  }
  float h[2] = {0.0f, 0.0f};
  scale_of(q, v, n, h);
  memcpy(msg, h, (size_t)headers(q) * sizeof(float));
  uint8_t *out = msg + (size_t)headers(q) * sizeof(float), c[256];
  const uint32_t k32 = (uint32_t)(key ^ (key >> 32));
  for (size_t i = 0; i < n; i += 256) { /* chunks of 256 codes (whole groups of 8), then packed */
    size_t m = n - i < 256 ? n - i : 256;
    codes_of(q, h, v + i, m, k32, i, c);
    for (size_t g = 0; g * 8 < m; g++) {
      uint64_t word = 0;
      for (size_t k = 0; k < 8 && g * 8 + k < m; k++) word |= (uint64_t)c[g * 8 + k] << (k * (size_t)q->bits);
      put_group(word, i / 8 + g, n, q->bits, out);
    }
  }
}

/* Values of n codes c of a bucket scaled by h, into out (added to it when accumulate). */
static void values_of(const quant_scheme *q, const float h[2], const uint8_t *c, size_t n, float *out, int accumulate) {
  if (q->norm == QUANT_MINMAX) {
    for (size_t k = 0; k < n; k++) {
      float y = h[0] + (float)c[k] * h[1];
      out[k] = accumulate ? out[k] + y : y;
    }
    return;
  }
  float table[2 * QUANT_MAX_LEVELS]; /* every code's value: magnitudes, then their negatives */
  const unsigned half = 1u << (q->bits - 1);
  for (unsigned m = 0; m < half; m++) {
    float x = h[0] * q->level[m < (unsigned)q->nlevels ? m : (unsigned)q->nlevels - 1];
    table[m] = x, table[half + m] = -x;
  }
  for (size_t k = 0; k < n; k++) {
    float y = table[c[k]];
    out[k] = accumulate ? out[k] + y : y;
  }
}

void quant_decode(const quant_scheme *q, const uint8_t *msg, size_t n, float *out, int accumulate) {
  if (q->bits == 32) {
    const float *x = (const float *)(const void *)msg;
    for (size_t i = 0; i < n; i++) {
      float y;
      memcpy(&y, x + i, sizeof y);
      out[i] = accumulate ? out[i] + y : y;
    }
    return;
  }
  float h[2] = {0.0f, 0.0f};
  memcpy(h, msg, (size_t)headers(q) * sizeof(float));
  const uint8_t *codes = msg + (size_t)headers(q) * sizeof(float);
  const uint64_t mask = (1u << q->bits) - 1;
  uint8_t c[256];
  for (size_t i = 0; i < n; i += 256) { /* chunks of 256 codes: unpacked, then turned into values */
    size_t m = n - i < 256 ? n - i : 256;
    for (size_t g = 0; g * 8 < m; g++) {
      uint64_t word = get_group(codes, i / 8 + g, n, q->bits);
      for (size_t k = 0; k < 8 && g * 8 + k < m; k++) c[g * 8 + k] = (uint8_t)((word >> (k * (size_t)q->bits)) & mask);
    }
    values_of(q, h, c, m, out + i, accumulate);
  }
}

double quant_expected(const quant_scheme *q, const float *v, size_t n) {
  if (q->bits == 32) return 0.0;
  float h[2] = {0.0f, 0.0f};
  scale_of(q, v, n, h);
  double e = 0.0;
  for (size_t i = 0; i < n; i++) {
    float x = position(q, h, v[i]);
    if (q->norm == QUANT_MINMAX) {
      double j = floor(x) < (double)((1 << q->bits) - 2) ? floor(x) : (double)((1 << q->bits) - 2);
      e += (double)h[1] * h[1] * (j + 1 - x) * (x - j);
    } else {
      int j = interval(q, x);
      e += (double)h[0] * h[0] * ((double)q->level[j + 1] - x) * ((double)x - q->level[j]);
    }
  }
  return e;
}
