/* quant: bucketed stochastic quantization (see quant.h). */
#include "parallel/quant.h"

#include <math.h>
#include <stdlib.h>
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

void quant_encode_contract(const quant_scheme *q, const float *v, size_t n, uint64_t key, uint8_t *msg) {
  quant_encode(q, v, n, key, msg);
  double norm2 = 0.0;
  for (size_t i = 0; i < n; i++) norm2 += (double)v[i] * v[i];
  if (q->bits == 32 || !(norm2 > 0.0)) return;
  float f = (float)(1.0 / (1.0 + quant_expected(q, v, n) / norm2)), h[2];
  memcpy(h, msg, (size_t)headers(q) * sizeof(float)); /* every decoded value is linear in the header */
  for (int i = 0; i < headers(q); i++) h[i] *= f;
  memcpy(msg, h, (size_t)headers(q) * sizeof(float));
}

void quant_feedback_add(float *v, const float *e, size_t n) {
  for (size_t i = 0; i < n; i++) v[i] += e[i];
}

void quant_feedback_take(const quant_scheme *q, const uint8_t *msg, const float *v, size_t n, float *e) {
  quant_decode(q, msg, n, e, 0); /* what the message carries, then what it left behind */
  for (size_t i = 0; i < n; i++) e[i] = v[i] - e[i];
}

void quant_int_feedback_take(const quant_scheme *q, const int16_t *ints, float scale, const float *v, size_t n, float *e) {
  const float unit = scale / (float)(q->nlevels - 1); /* as the integer sum is decoded */
  for (size_t i = 0; i < n; i++) e[i] = v[i] - (float)ints[i] * unit;
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

/* ---- adaptive levels ---------------------------------------------------------------------------- */

enum { LOG_SPAN = 30 }; /* bins cover magnitudes 2^-30 .. 1; bin 0 holds zeros and smaller */

static int bin_of(float r) {
  if (!(r > 0x1p-30f)) return 0;
  double x = (log2((double)r) + LOG_SPAN) / LOG_SPAN * (QUANT_HIST_BINS - 1);
  int k = 1 + (int)x;
  return k >= QUANT_HIST_BINS ? QUANT_HIST_BINS - 1 : k;
}

void quant_hist_clear(quant_hist *h) { memset(h, 0, sizeof *h); }

void quant_hist_add(quant_hist *h, const float *v, size_t n) {
  double n2 = 0.0;
  for (size_t i = 0; i < n; i++) n2 += (double)v[i] * v[i];
  if (!(n2 > 0.0)) return;
  const float inv = (float)(1.0 / sqrt(n2));
  for (size_t i = 0; i < n; i++) {
    float r = fabsf(v[i]) * inv;
    r = r > 1.0f ? 1.0f : r;
    int k = bin_of(r);
    h->w[k] += n2, h->s[k] += n2 * r, h->q[k] += n2 * (double)r * r;
  }
}

/* Prefix sums of the histogram: P[k] = sum over bins < k (k = 0..BINS). */
typedef struct {
  double W[QUANT_HIST_BINS + 1], S[QUANT_HIST_BINS + 1], Q[QUANT_HIST_BINS + 1];
  double c[QUANT_HIST_BINS]; /* each bin's mean magnitude (its location); -1 when empty */
} prefix;

static void prefix_of(const quant_hist *h, prefix *p) {
  p->W[0] = p->S[0] = p->Q[0] = 0.0;
  for (int k = 0; k < QUANT_HIST_BINS; k++) {
    p->W[k + 1] = p->W[k] + h->w[k], p->S[k + 1] = p->S[k] + h->s[k], p->Q[k + 1] = p->Q[k] + h->q[k];
    p->c[k] = h->w[k] > 0.0 ? h->s[k] / h->w[k] : -1.0;
  }
}

/* The first bin whose location is above x (bins are ordered by location). */
static int first_above(const prefix *p, double x) {
  int lo = 0, hi = QUANT_HIST_BINS;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    double c = p->c[mid] >= 0.0 ? p->c[mid] : (mid > 0 ? exp2((double)(mid - 1) / (QUANT_HIST_BINS - 1) * LOG_SPAN - LOG_SPAN) : 0.0);
    if (c > x) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/* Psi of the bins [k0, k1) all in the interval [a, b]: sum w (b - r)(r - a) = -Q + (a + b) S - a b W. */
static double psi_range(const prefix *p, int k0, int k1, double a, double b) {
  if (k1 <= k0) return 0.0;
  return -(p->Q[k1] - p->Q[k0]) + (a + b) * (p->S[k1] - p->S[k0]) - a * b * (p->W[k1] - p->W[k0]);
}

static double psi_prefix(const prefix *p, const float *level, int n) {
  double psi = 0.0;
  int k0 = 0;
  for (int j = 0; j + 1 < n; j++) {
    int k1 = j + 2 == n ? QUANT_HIST_BINS : first_above(p, level[j + 1]);
    psi += psi_range(p, k0, k1, level[j], level[j + 1]);
    k0 = k1;
  }
  return psi;
}

double quant_hist_psi(const quant_hist *h, const float *level, int n) {
  prefix *p = util_malloc(sizeof *p, "histogram sums");
  prefix_of(h, p);
  double psi = psi_prefix(p, level, n);
  free(p);
  return psi;
}

/* Level j at its best place between its neighbours: among the bins' locations in (a, b). */
static void best_level(const prefix *p, float *level, int j) {
  const double a = level[j - 1], b = level[j + 1];
  int k0 = first_above(p, a), k1 = first_above(p, b);
  double best = psi_range(p, k0, first_above(p, level[j]), a, level[j]) +
                psi_range(p, first_above(p, level[j]), k1, level[j], b);
  for (int k = k0; k < k1; k++) {
    if (p->c[k] < 0.0 || !(p->c[k] > a) || !(p->c[k] < b)) continue;
    double l = p->c[k], psi = psi_range(p, k0, k + 1, a, l) + psi_range(p, k + 1, k1, l, b);
    float lf = (float)l;
    if (psi < best && lf > level[j - 1] && lf < level[j + 1]) best = psi, level[j] = lf;
  }
}

static double descend(const prefix *p, float *level, int n, int sweeps) {
  for (int s = 0; s < sweeps; s++)
    for (int j = 1; j + 1 < n; j++) best_level(p, level, j);
  return psi_prefix(p, level, n);
}

double quant_fit_alq(const quant_hist *h, int n, int sweeps, float *level) {
  prefix *p = util_malloc(sizeof *p, "histogram sums");
  prefix_of(h, p);
  float start[3][QUANT_MAX_LEVELS];
  const double total = p->W[QUANT_HIST_BINS];
  for (int j = 0; j < n; j++) {
    start[0][j] = j == 0 ? 0.0f : ldexpf(1.0f, j + 1 - n); /* exponential (NUQSGD) */
    start[1][j] = (float)j / (float)(n - 1);             /* uniform */
    /* equal-mass quantiles of the weight, kept strictly increasing */
    int k = 0;
    while (k < QUANT_HIST_BINS && p->W[k + 1] < total * j / (n - 1)) k++;
    float qv = k < QUANT_HIST_BINS && p->c[k] > 0.0 ? (float)p->c[k] : start[1][j];
    start[2][j] = j == 0 ? 0.0f : j == n - 1 ? 1.0f : qv > start[2][j - 1] ? qv : nextafterf(start[2][j - 1], 1.0f);
  }
  for (int j = n - 2; j > 0; j--) /* the quantiles below the top */
    if (!(start[2][j] < start[2][j + 1])) start[2][j] = nextafterf(start[2][j + 1], 0.0f);
  double best = INFINITY;
  for (int i = 0; i < 3; i++) {
    double psi = descend(p, start[i], n, sweeps);
    if (psi < best) best = psi, memcpy(level, start[i], (size_t)n * sizeof *level);
  }
  free(p);
  return best;
}

static void amq_levels(float r, int n, float *level) {
  level[0] = 0.0f;
  for (int j = n - 1; j >= 1; j--) level[j] = j == n - 1 ? 1.0f : level[j + 1] * r;
}

double quant_fit_amq(const quant_hist *h, int n, float *level, float *ratio) {
  prefix *p = util_malloc(sizeof *p, "histogram sums");
  prefix_of(h, p);
  float lv[QUANT_MAX_LEVELS];
  double best = INFINITY, bp = 0.5;
  for (int g = 1; g < 10; g++) { /* a grid of starts, then golden-section around the best */
    double r = 0.1 * g;
    amq_levels((float)r, n, lv);
    double psi = psi_prefix(p, lv, n);
    if (psi < best) best = psi, bp = r;
  }
  double lo = bp - 0.1 > 0.001 ? bp - 0.1 : 0.001, hi = bp + 0.1 < 0.999 ? bp + 0.1 : 0.999;
  const double gr = 0.6180339887498949;
  for (int it = 0; it < 40; it++) {
    double m1 = hi - gr * (hi - lo), m2 = lo + gr * (hi - lo), f1, f2;
    amq_levels((float)m1, n, lv), f1 = psi_prefix(p, lv, n);
    amq_levels((float)m2, n, lv), f2 = psi_prefix(p, lv, n);
    if (f1 < f2) hi = m2;
    else lo = m1;
    if (f1 < best) best = f1, bp = m1;
    if (f2 < best) best = f2, bp = m2;
  }
  amq_levels((float)bp, n, level);
  *ratio = (float)bp;
  free(p);
  return best;
}
