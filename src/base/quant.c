/* quant: bucketed stochastic quantization (see quant.h). */
#include "base/quant.h"

#include "base/quant_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"

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
  q->uniform = QC_KIND_UNIFORM;
}

void quant_exponential(quant_scheme *q, int bits, quant_norm norm) {
  set_common(q, bits, norm);
  int k = (1 << (bits - 1)) - 2; /* levels 0, 2^-k, ..., 2^-1, 1 */
  q->nlevels = k + 2;
  q->level[0] = 0.0f;
  for (int j = 1; j <= k + 1; j++) q->level[j] = ldexpf(1.0f, j - 1 - k);
  q->uniform = QC_KIND_EXP;
}

int quant_levels(quant_scheme *q, int bits, quant_norm norm, const float *level, int n) {
  if (bits < 2 || bits > 8 || n < 2 || n > 1 << (bits - 1) || level[0] != 0.0f || level[n - 1] != 1.0f) return -1;
  for (int j = 1; j < n; j++)
    if (!(level[j] > level[j - 1])) return -1;
  set_common(q, bits, norm);
  q->nlevels = n;
  memcpy(q->level, level, (size_t)n * sizeof *level);
  q->uniform = QC_KIND_TABLE;
  return 0;
}

void quant_passthrough(quant_scheme *q) {
  memset(q, 0, sizeof *q);
  q->bits = 32;
}

void quant_topk(quant_scheme *q, uint32_t ppm) {
  UTIL_CHECK(ppm >= 1 && ppm <= 1000000, NULL, "internal: top-k of %u parts per million", ppm);
  memset(q, 0, sizeof *q);
  q->bits = 0;
  q->norm = QUANT_L2; /* unused */
  q->topk_ppm = ppm;
}

/* ---- packing ------------------------------------------------------------------------------------ */

size_t quant_packed_bytes(size_t n, int bits) { return (n * (size_t)bits + 7) / 8; }

/* Codes of 4 and 2 bits by whole bytes: code i in byte i / (8 / bits) at bit (i % (8 / bits)) x bits,
 * the groups' layout, in loops that vectorise. */
static void pack4(const uint8_t *c, size_t n, uint8_t *out) {
  for (size_t j = 0; j < n / 2; j++) out[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
  if (n % 2) out[n / 2] = c[n - 1];
}
static void unpack4(const uint8_t *in, size_t n, uint8_t *c) {
  for (size_t j = 0; j < n / 2; j++) c[2 * j] = in[j] & 15u, c[2 * j + 1] = (uint8_t)(in[j] >> 4);
  if (n % 2) c[n - 1] = in[n / 2] & 15u;
}
static void pack2(const uint8_t *c, size_t n, uint8_t *out) {
  for (size_t j = 0; j < n / 4; j++)
    out[j] = (uint8_t)(c[4 * j] | c[4 * j + 1] << 2 | c[4 * j + 2] << 4 | c[4 * j + 3] << 6);
  if (n % 4) {
    unsigned b = 0;
    for (size_t t = 0; t < n % 4; t++) b |= (unsigned)c[n / 4 * 4 + t] << (2 * t);
    out[n / 4] = (uint8_t)b;
  }
}
static void unpack2(const uint8_t *in, size_t n, uint8_t *c) {
  for (size_t j = 0; j < n / 4; j++)
    c[4 * j] = in[j] & 3u, c[4 * j + 1] = (in[j] >> 2) & 3u, c[4 * j + 2] = (in[j] >> 4) & 3u,
    c[4 * j + 3] = (uint8_t)(in[j] >> 6);
  for (size_t t = 0; t < n % 4; t++) c[n / 4 * 4 + t] = (in[n / 4] >> (2 * t)) & 3u;
}

void quant_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out) {
  switch (bits) { /* whole bytes where bits divides 8; else groups of 8 codes in bits bytes */
  case 2: pack2(codes, n, out); return;
  case 4: pack4(codes, n, out); return;
  case 8: memcpy(out, codes, n); return;
  }
  for (size_t g = 0; g * 8 < n; g++) {
    uint64_t word = 0;
    for (size_t k = 0; k < 8 && g * 8 + k < n; k++) word |= (uint64_t)codes[g * 8 + k] << (k * (size_t)bits);
    qc_put_group(word, g, n, bits, out);
  }
}

void quant_unpack(const uint8_t *in, size_t n, int bits, uint8_t *codes) {
  switch (bits) {
  case 2: unpack2(in, n, codes); return;
  case 4: unpack4(in, n, codes); return;
  case 8: memcpy(codes, in, n); return;
  }
  const uint64_t mask = (1u << bits) - 1;
  for (size_t g = 0; g * 8 < n; g++) {
    uint64_t word = qc_get_group(in, g, n, bits);
    for (size_t k = 0; k < 8 && g * 8 + k < n; k++) codes[g * 8 + k] = (uint8_t)((word >> (k * (size_t)bits)) & mask);
  }
}

/* ---- the scale and the levels ------------------------------------------------------------------- */

size_t quant_bytes(const quant_scheme *q, size_t n) {
  if (q->bits == 32) return n * sizeof(float);
  if (q->topk_ppm) return qc_topk_count(q, n) * (qc_topk_index_bytes(n) + sizeof(float));
  return (size_t)qc_headers(q) * sizeof(float) + quant_packed_bytes(n, q->bits);
}

/* ---- encode, decode, the exact error ------------------------------------------------------------ */

/* Codes of n <= 256 values of a table's levels (ALQ, AMQ), those of qc_code_table, in passes that
 * vectorise: the positions x (n), the interval j (n) by qc_interval's search of fixed steps, one
 * pass a step (its end corrections have nothing to correct: the levels increase strictly), then
 * the rounding. */
static void codes_of_table(const quant_scheme *q, const float h[2], const float *v, size_t n, uint32_t key, size_t i0,
                           uint8_t *c) {
  float x[256];
  int j[256];
  for (size_t k = 0; k < n; k++) x[k] = qc_position(q, h, v[k]), j[k] = 0;
  for (int step = 1 << (q->bits - 2); step > 0; step >>= 1)
    for (size_t k = 0; k < n; k++) j[k] = qc_table_step(q, j[k], step, x[k]);
  for (size_t k = 0; k < n; k++) c[k] = (uint8_t)qc_round_table(q, v[k], x[k], j[k], qc_uniform01(key, i0 + k));
}

/* Codes of n values (indices i0...) of a bucket scaled by h: one loop per kind, each branch-free
 * for the equal steps and the exponential levels, so that it vectorises. */
static void codes_of(const quant_scheme *q, const float h[2], const float *v, size_t n, uint32_t key, size_t i0,
                     uint8_t *c) {
  const qc_params p = qc_params_of(q, h);
  if (p.mm || q->uniform == QC_KIND_UNIFORM)
    for (size_t k = 0; k < n; k++) c[k] = (uint8_t)qc_code_uniform(&p, v[k], qc_uniform01(key, i0 + k));
  else if (q->uniform == QC_KIND_EXP)
    for (size_t k = 0; k < n; k++) c[k] = (uint8_t)qc_code_exp(&p, v[k], qc_uniform01(key, i0 + k));
  else
    codes_of_table(q, h, v, n, key, i0, c);
}

float quant_scale(const quant_scheme *q, const float *v, size_t n) {
  float h[2] = {0.0f, 0.0f};
  qc_scale(q, v, n, h);
  return h[0];
}

void quant_int_encode(const quant_scheme *q, const float *v, size_t n, float scale, uint64_t key, int16_t *out) {
  const float s = (float)(q->nlevels - 1), k = scale > 0.0f ? s / scale : 0.0f;
  const uint32_t k32 = qc_key32(key);
  for (size_t i = 0; i < n; i++) {
    float x = v[i] * k;
    x = x < -s ? -s : x > s ? s : x;
    float j = floorf(x);
    out[i] = (int16_t)(j + (qc_uniform01(k32, i) < x - j));
  }
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

/* A quantizer's message of n values v whose bucket scale is h (qc_scale's): the header, then the
 * codes in chunks of 256 (whole groups of 8), each packed where its groups start. */
static void encode_scaled(const quant_scheme *q, const float h[2], const float *v, size_t n, uint64_t key,
                          uint8_t *msg) {
  memcpy(msg, h, (size_t)qc_headers(q) * sizeof(float));
  uint8_t *out = msg + (size_t)qc_headers(q) * sizeof(float), c[256];
  const uint32_t k32 = qc_key32(key);
  for (size_t i = 0; i < n; i += 256) {
    size_t m = n - i < 256 ? n - i : 256;
    codes_of(q, h, v + i, m, k32, i, c);
    quant_pack(c, m, q->bits, out + i / 8 * (size_t)q->bits);
  }
}

void quant_encode(const quant_scheme *q, const float *v, size_t n, uint64_t key, uint8_t *msg) {
  if (q->bits == 32) {
    memcpy(msg, v, n * sizeof(float));
    return;
  }
  if (q->topk_ppm) {
    qc_topk_encode(q, v, n, msg);
    return;
  }
  float h[2] = {0.0f, 0.0f};
  qc_scale(q, v, n, h);
  encode_scaled(q, h, v, n, key, msg);
}

void quant_encode_contract(const quant_scheme *q, const float *v, size_t n, uint64_t key, uint8_t *msg) {
  if (q->bits == 32 || q->topk_ppm) { /* top-k is a contraction as it is */
    quant_encode(q, v, n, key, msg);
    return;
  }
  float h[2] = {0.0f, 0.0f};
  qc_scale(q, v, n, h);
  encode_scaled(q, h, v, n, key, msg);
  const float f = qc_contraction(q, h, v, n);
  for (int i = 0; i < qc_headers(q); i++) h[i] *= f; /* every decoded value is linear in the header */
  memcpy(msg, h, (size_t)qc_headers(q) * sizeof(float));
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
  if (q->topk_ppm) {
    if (!accumulate) memset(out, 0, n * sizeof *out);
    qc_topk_scatter(q, msg, n, out, accumulate ? QC_ADD : QC_SET, NULL);
    return;
  }
  float h[2] = {0.0f, 0.0f}, table[256]; /* every code's value, once per bucket */
  memcpy(h, msg, (size_t)qc_headers(q) * sizeof(float));
  for (unsigned k = 0; k < 1u << q->bits; k++) table[k] = qc_value(q, h, k);
  const uint8_t *codes = msg + (size_t)qc_headers(q) * sizeof(float);
  uint8_t c[256];
  for (size_t i = 0; i < n; i += 256) { /* chunks of 256 codes: unpacked, then looked up */
    size_t m = n - i < 256 ? n - i : 256;
    quant_unpack(codes + i / 8 * (size_t)q->bits, m, q->bits, c);
    float *o = out + i;
    if (accumulate)
      for (size_t k = 0; k < m; k++) o[k] += table[c[k]];
    else
      for (size_t k = 0; k < m; k++) o[k] = table[c[k]];
  }
}

double quant_expected(const quant_scheme *q, const float *v, size_t n) {
  if (q->bits == 32) return 0.0;
  if (q->topk_ppm) { /* what is dropped, exactly */
    const size_t k = qc_topk_count(q, n);
    size_t ties;
    double e = 0.0;
    const uint32_t t = k ? qc_topk_threshold(v, n, k, &ties) : 0;
    for (size_t i = 0; i < n; i++)
      if (!k || !qc_topk_keeps(qc_mag(v[i]), t, &ties)) e += (double)v[i] * v[i];
    return e;
  }
  float h[2] = {0.0f, 0.0f};
  qc_scale(q, v, n, h);
  return qc_expected(q, h, v, n);
}

enum { SCALE_LANES = 8 };

/* The L2 scales of m <= SCALE_LANES quantized segments g of v: each segment's sum of squares in
 * qc_scale's order (sequential in double), the m sums side by side so that their additions' latency
 * overlaps; bit for bit qc_scale's. */
static void scales_l2(const quant_seg *g, int m, const float *v, float h[][2]) {
  double s[SCALE_LANES] = {0.0};
  size_t common = g[0].n;
  for (int k = 1; k < m; k++) common = g[k].n < common ? g[k].n : common;
  for (size_t i = 0; i < common; i++)
    for (int k = 0; k < m; k++) s[k] += (double)v[g[k].at + i] * v[g[k].at + i];
  for (int k = 0; k < m; k++) {
    for (size_t i = common; i < g[k].n; i++) s[k] += (double)v[g[k].at + i] * v[g[k].at + i];
    h[k][0] = (float)sqrt(s[k]), h[k][1] = 0.0f;
  }
}

/* Segments s... of seg that scales_l2 takes together (quantized, at most SCALE_LANES); 0 where the
 * scheme has no L2 scale or segment s is not quantized. */
static int l2_run(const quant_scheme *q, const quant_seg *seg, int nseg, int s) {
  if (q->norm != QUANT_L2 || q->bits == 32 || q->topk_ppm) return 0;
  int m = 0;
  while (m < SCALE_LANES && s + m < nseg && seg[s + m].quantized) m++;
  return m;
}

void quant_encode_segs(const quant_scheme *q, const quant_seg *seg, int nseg, float *v, float *ef, uint64_t key,
                       uint8_t *msg) {
  for (int s = 0; s < nseg; s++) {
    const quant_seg *g = &seg[s];
    int m = ef ? 0 : l2_run(q, seg, nseg, s);
    if (m > 0) { /* L2 buckets without error feedback: their scales together, then their codes */
      float h[SCALE_LANES][2];
      scales_l2(g, m, v, h);
      for (int k = 0; k < m; k++) encode_scaled(q, h[k], v + g[k].at, g[k].n, rng_hash(key, g[k].id), msg + g[k].off);
      s += m - 1;
      continue;
    }
    if (!g->quantized) {
      memcpy(msg + g->off, v + g->at, g->n * sizeof(float));
      continue;
    }
    if (ef) {
      quant_feedback_add(v + g->at, ef + g->at, g->n);
      quant_encode_contract(q, v + g->at, g->n, rng_hash(key, g->id), msg + g->off);
      quant_feedback_take(q, msg + g->off, v + g->at, g->n, ef + g->at);
    } else {
      quant_encode(q, v + g->at, g->n, rng_hash(key, g->id), msg + g->off);
    }
  }
}

void quant_decode_segs(const quant_scheme *q, const quant_seg *seg, int nseg, const uint8_t *msg, size_t base,
                       float *out, int add) {
  for (int s = 0; s < nseg; s++) {
    const quant_seg *g = &seg[s];
    if (g->quantized) {
      quant_decode(q, msg + g->off - base, g->n, out + g->at, add);
      continue;
    }
    for (size_t j = 0; j < g->n; j++) {
      float y;
      memcpy(&y, msg + g->off - base + j * sizeof(float), sizeof y);
      out[g->at + j] = add ? out[g->at + j] + y : y;
    }
  }
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
