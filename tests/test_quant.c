/* test_quant: the stochastic quantizer (src/base/quant.h) against its definition.
 *
 * For each level set (uniform with L2 and max norms, NUQSGD's exponential levels, a given table as
 * ALQ produces, min-max), each width b in {2, 3, 4, 8} and vectors of odd lengths (Gaussian,
 * heavy-tailed, with exact zeros, constant, one huge outlier), N = 20000 quantizations with
 * different keys:
 *   - every output is one of the two levels around its input (computed here from the definition);
 *   - unbiased: |mean_i - v_i| <= 5 sqrt(Var_i / N) + 1e-6 sigma for every coordinate, Var_i the
 *     exact variance sigma^2 (l_{j+1} - r)(r - l_j);
 *   - the mean of ||Q(v) - v||^2 within 5 standard errors of the exact expectation quant_expected
 *     (except with the outlier, whose expectation rests on events too rare to sample);
 *   - that expectation within the published bounds: QSGD min(n/s^2, sqrt(n)/s) ||v||^2, NUQSGD
 *     (1/8 + min(2^-k sqrt(n), n 2^-2k / 4)) ||v||^2.
 * The relative expected errors on a Gaussian bucket of 8192 match the research notes' values (QSGD
 * 9.31 and NUQSGD 0.33 within 10%, QSGDinf 0.067 within 25%, at 4 bits). Also: all-zero buckets decode to zeros (no NaN); inputs on a level come back unchanged; pack and
 * unpack round-trip codes of 1..8 bits at every length 0..40; 32 bits is a bitwise pass-through; the
 * same key gives the same message. A table's codes, encoded in passes over a chunk, are those of
 * the one-value function the CUDA kernels use (qc_code), values on a level and at the ends included. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/quant.h"
#include "base/quant_core.h"
#include "testing.h"
#include "base/util.h"

enum { NS = 20000 };
static rng_state R;

static const char *name_of(const quant_scheme *q, int kind) {
  static char buf[64];
  static const char *const kinds[] = {"uniform", "exponential", "table", "min-max"};
  static const char *const norms[] = {"L2", "max", ""};
  snprintf(buf, sizeof buf, "%s %s %d-bit", kinds[kind], norms[q->norm], q->bits);
  return buf;
}

/* A vector of shape k (0 Gaussian, 1 heavy-tailed, 2 with zeros, 3 constant, 4 one outlier). */
static void vector_of(int k, float *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double g = rng_normal(&R);
    v[i] = (float)(k == 1 ? g / (rng_uniform(&R) * rng_uniform(&R) + 0.05) : k == 3 ? 0.75 : g);
    if (k == 2 && i % 3 == 0) v[i] = 0.0f;
  }
  if (k == 4) v[n / 2] = 1e4f;
}

/* The two values coordinate v may decode to, and its exact variance, from the message's scale h. */
static void adjacent(const quant_scheme *q, const float h[2], float v, float *a, float *b, double *var) {
  if (q->norm == QUANT_MINMAX) {
    float top = (float)((1 << q->bits) - 1), x = h[1] > 0 ? (v - h[0]) / h[1] : 0.0f;
    x = x < 0 ? 0 : x > top ? top : x;
    int j = (int)x < (int)top - 1 ? (int)x : (int)top - 1;
    *a = h[0] + (float)j * h[1], *b = h[0] + (float)(j + 1) * h[1];
    *var = (double)h[1] * h[1] * (j + 1 - (double)x) * ((double)x - j);
    return;
  }
  float r = h[0] > 0 ? fabsf(v) / h[0] : 0.0f, sg = v < 0 ? -1.0f : 1.0f;
  r = r > 1 ? 1 : r;
  int j = 0;
  while (j < q->nlevels - 2 && r >= q->level[j + 1]) j++;
  *a = sg * (h[0] * q->level[j]), *b = sg * (h[0] * q->level[j + 1]);
  *var = (double)h[0] * h[0] * ((double)q->level[j + 1] - r) * ((double)r - q->level[j]);
}

static void check_scheme(const quant_scheme *q, int kind, const float *v, size_t n, const char *what) {
  uint8_t *msg = malloc(quant_bytes(q, n));
  float *y = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), h[2];
  double *sum = calloc(n, sizeof(double)), *var = malloc(n * sizeof(double)), e1 = 0.0, e2 = 0.0, sigma = 0.0;
  quant_encode(q, v, n, 0, msg);
  memcpy(h, msg, sizeof h);
  for (size_t i = 0; i < n; i++) adjacent(q, h, v[i], &a[i], &b[i], &var[i]), sigma = fmax(sigma, fabs(v[i]));
  size_t off = 0;
  for (int s = 0; s < NS; s++) {
    quant_encode(q, v, n, rng_hash(12345, (uint64_t)s), msg);
    quant_decode(q, msg, n, y, 0);
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
      sum[i] += y[i];
      e += ((double)y[i] - v[i]) * ((double)y[i] - v[i]);
      off += y[i] != a[i] && y[i] != b[i];
    }
    e1 += e, e2 += e * e;
  }
  /* 5 sigma, and 6 draws' worth of the gap between the two levels: a coordinate rounded up with a
   * tiny probability sees a handful of rare events or none, counts that a normal law does not
   * bound (at NS p = 0.1 a second event would be 5 sigma out, one run in 200) */
  size_t bad_mean = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs(sum[i] / NS - v[i]) > 5.0 * sqrt(var[i] / NS) + 6.0 * fabs((double)b[i] - a[i]) / NS + 1e-6 * sigma)
      bad_mean++;
  double expect = quant_expected(q, v, n), mean_err = e1 / NS, sd = sqrt(fmax(e2 / NS - mean_err * mean_err, 0.0));
  T_CHECK(off == 0, "%s, %s: %zu outputs are not on a level next to their input", name_of(q, kind), what, off);
  T_CHECK(bad_mean == 0, "%s, %s: %zu coordinates biased beyond 5 sigma", name_of(q, kind), what, bad_mean);
  /* (not with the outlier: its expected error is dominated by events of probability ~1e-7, which
   * N draws do not see) */
  if (strcmp(what, "outlier") != 0)
    T_CHECK(fabs(mean_err - expect) <= 5.0 * sd / sqrt(NS) + 1e-9 * expect,
            "%s, %s: mean error %.6g, exact %.6g (sd %.3g)", name_of(q, kind), what, mean_err, expect, sd);
  double norm2 = 0.0;
  for (size_t i = 0; i < n; i++) norm2 += (double)v[i] * v[i];
  if (q->norm == QUANT_L2 && kind == 0) {
    double s = q->nlevels - 1, bound = fmin(n / (s * s), sqrt((double)n) / s) * norm2;
    T_CHECK(expect <= bound * (1 + 1e-6), "QSGD bound: %.6g > %.6g", expect, bound);
  }
  if (q->norm == QUANT_L2 && kind == 1) {
    int k = q->nlevels - 2;
    double bound = (0.125 + fmin(ldexp(1, -k) * sqrt((double)n), n * ldexp(1, -2 * k) / 4)) * norm2;
    T_CHECK(expect <= bound * (1 + 1e-6), "NUQSGD bound: %.6g > %.6g", expect, bound);
  }
  free(msg), free(y), free(a), free(b), free(sum), free(var);
}

/* The schemes of kind (0 uniform, 1 exponential, 2 table, 3 min-max) at b bits and norm. */
static int scheme_of(quant_scheme *q, int kind, int bits, quant_norm norm) {
  if (kind == 0) quant_uniform(q, bits, norm);
  else if (kind == 1) quant_exponential(q, bits, norm);
  else if (kind == 3) quant_uniform(q, bits, QUANT_MINMAX);
  else {
    float lv[QUANT_MAX_LEVELS];
    int n = 1 << (bits - 1);
    const float ratio = expf(logf(1e-4f) / (float)(n > 2 ? n - 2 : 1)); /* smallest level 1e-4, ALQ-like */
    for (int j = 0; j < n; j++) lv[j] = j == 0 ? 0.0f : powf(ratio, (float)(n - 1 - j)) * (1.0f - 0.001f * (float)(n - 1 - j));
    lv[n - 1] = 1.0f;
    return quant_levels(q, bits, norm, lv, n);
  }
  return 0;
}

static void test_unbiased(void) {
  static const int widths[] = {2, 3, 4, 8};
  static const char *const shapes[] = {"Gaussian", "heavy-tailed", "with zeros", "constant", "outlier"};
  for (int kind = 0; kind < 4; kind++)
    for (int w = 0; w < 4; w++)
      for (int norm = 0; norm < (kind == 3 ? 1 : 2); norm++) {
        quant_scheme q;
        T_CHECK(scheme_of(&q, kind, widths[w], norm ? QUANT_MAX : QUANT_L2) == 0, "levels refused");
        for (int k = 0; k < 5; k++) {
          size_t n = k == 0 ? 257 : 37;
          float v[257];
          vector_of(k, v, n);
          check_scheme(&q, kind, v, n, shapes[k]);
        }
      }
  printf("  unbiased, two adjacent levels, exact expected error and bounds: 4 level sets x 4 widths x 2 norms x 5 "
         "vectors, %d draws each\n", NS);
}

static void test_edges(void) {
  quant_scheme q;
  float zero[19] = {0}, y[19];
  uint8_t msg[256];
  for (int kind = 0; kind < 4; kind++) {
    scheme_of(&q, kind, 4, QUANT_L2);
    quant_encode(&q, zero, 19, 7, msg);
    quant_decode(&q, msg, 19, y, 0);
    int ok = 1;
    for (int i = 0; i < 19; i++) ok &= y[i] == 0.0f;
    T_CHECK(ok, "%s: an all-zero bucket does not decode to zeros", name_of(&q, kind));
  }
  /* inputs on a level come back unchanged (max norm 1: the normalised values are the levels) */
  for (int kind = 0; kind < 2; kind++) {
    scheme_of(&q, kind, 4, QUANT_MAX);
    float v[8];
    for (int j = 0; j < 8; j++) v[j] = (j % 2 ? -1.0f : 1.0f) * q.level[j];
    v[7] = 1.0f;
    int ok = 1;
    for (int s = 0; s < 200; s++) {
      quant_encode(&q, v, 8, (uint64_t)s, msg);
      quant_decode(&q, msg, 8, y, 0);
      ok &= memcmp(y, v, sizeof v) == 0;
    }
    T_CHECK(ok, "%s: values on levels changed", name_of(&q, kind));
  }
  /* the same key, the same message; 32 bits pass through */
  float v[19];
  vector_of(0, v, 19);
  uint8_t m2[256];
  quant_uniform(&q, 3, QUANT_L2);
  quant_encode(&q, v, 19, 99, msg), quant_encode(&q, v, 19, 99, m2);
  T_CHECK(memcmp(msg, m2, quant_bytes(&q, 19)) == 0, "the same key gave two messages");
  quant_passthrough(&q);
  T_CHECK(quant_bytes(&q, 19) == 19 * sizeof(float), "32-bit message size");
  quant_encode(&q, v, 19, 1, msg);
  quant_decode(&q, msg, 19, y, 0);
  T_CHECK(memcmp(y, v, sizeof v) == 0, "32 bits is not a pass-through");
  /* a bad table is refused */
  float bad[3] = {0.0f, 0.5f, 0.4f};
  T_CHECK(quant_levels(&q, 3, QUANT_L2, bad, 3) == -1, "decreasing levels accepted");
}

/* Relative expected errors on a Gaussian bucket of 8192, beside the values of the research notes
 * (compression.md section 1.5: QSGD L2 s = 7: 9.31; NUQSGD 4-bit: 0.33; QSGDinf s = 7: 0.067). The
 * max-norm figure scales with the square of the bucket's largest value, which varies from sample to
 * sample (0.067 is a maximum near 4.4, this sample's about 3.9): 25% there, 10% for the others. */
static void test_reference_values(void) {
  enum { B = 8192 };
  static float v[B];
  double norm2 = 0.0;
  for (int i = 0; i < B; i++) v[i] = (float)rng_normal(&R), norm2 += (double)v[i] * v[i];
  quant_scheme q;
  static const struct {
    int kind;
    quant_norm norm;
    double want, tol;
  } cases[] = {{0, QUANT_L2, 9.31, 0.1}, {1, QUANT_L2, 0.33, 0.1}, {0, QUANT_MAX, 0.067, 0.25}};
  for (int c = 0; c < 3; c++) {
    scheme_of(&q, cases[c].kind, 4, cases[c].norm);
    double rel = quant_expected(&q, v, B) / norm2;
    T_CHECK(fabs(rel - cases[c].want) <= cases[c].tol * cases[c].want, "%s, Gaussian B=8192: relative error %.4g, notes %.3g",
            name_of(&q, cases[c].kind), rel, cases[c].want);
    printf("  %-28s Gaussian B=8192: relative expected error %.4f (notes: %.3g)\n", name_of(&q, cases[c].kind), rel,
           cases[c].want);
  }
}

/* The integer form: values in [-s, s], each on one of the two integers around v / scale * s, and
 * unbiased: the mean over N draws within 5 standard errors. */
static void test_integers(void) {
  quant_scheme q;
  quant_uniform(&q, 4, QUANT_MAX);
  enum { N = 41 };
  float v[N];
  vector_of(1, v, N);
  float scale = 2.0f * quant_scale(&q, v, N), s = (float)(q.nlevels - 1); /* a shared scale above this bucket's */
  int16_t c[N];
  double sum[N] = {0};
  long off = 0;
  for (int t = 0; t < NS; t++) {
    quant_int_encode(&q, v, N, scale, rng_hash(5, (uint64_t)t), c);
    for (int i = 0; i < N; i++) {
      double x = v[i] / scale * s;
      off += c[i] < -s || c[i] > s || fabs(c[i] - x) >= 1.0;
      sum[i] += c[i];
    }
  }
  long bad = 0;
  for (int i = 0; i < N; i++) {
    double x = v[i] / scale * s, p = x - floor(x);
    bad += fabs(sum[i] / NS - x) > 5.0 * sqrt(p * (1 - p) / NS) + 1e-9;
  }
  T_CHECK(off == 0, "%ld integers off their two neighbours", off);
  T_CHECK(bad == 0, "%ld integer codes biased", bad);
  printf("  integer form: adjacent and unbiased over %d draws\n", NS);
}

/* Error feedback over T = 1000 steps of Gaussian gradients g_t (a bucket of 1000 values, a drift
 * shared by the steps so the sums grow): what the messages carried plus the last residual equals
 * what went in, sum_t Q(p_t) + e_T = sum_t g_t, to fp32 rounding (|difference| <= 1e-6 of sum_t |g_t|
 * per value), for the byte form of every level set (contracted: quant_encode_contract) and the
 * integer form; the residual stays finite and below twice the largest |g| (without the contraction
 * the 2-bit max-norm and the 4-bit L2 forms, whose relative variance exceeds 1, let it grow). */
static void test_feedback(void) {
  enum { T = 1000, N = 1000 };
  static float g[N], p[N], e[N], out[N];
  static double in[N], sent[N], mag[N];
  static uint8_t msg[4 * N + 64];
  static int16_t ints[N];
  for (int kind = 0; kind < 7; kind++) {
    quant_scheme q;
    if (kind == 6) quant_topk(&q, 100000); /* 10%: biased, a contraction as it is */
    else if (kind == 0) quant_uniform(&q, 2, QUANT_MAX);
    else if (kind == 1) quant_exponential(&q, 4, QUANT_L2);
    else if (kind == 2) quant_uniform(&q, 3, QUANT_MINMAX);
    else if (kind == 3) quant_uniform(&q, 4, QUANT_L2); /* relative variance about 4.5: contracted */
    else quant_uniform(&q, kind == 4 ? 4 : 8, QUANT_MAX); /* the integer form */
    memset(e, 0, sizeof e), memset(in, 0, sizeof in), memset(sent, 0, sizeof sent), memset(mag, 0, sizeof mag);
    double worst = 0, emax = 0, pmax = 0, gmax = 0;
    for (int t = 0; t < T; t++) {
      for (int i = 0; i < N; i++) g[i] = (float)(rng_normal(&R) + 0.1 * sin(i)), p[i] = g[i];
      quant_feedback_add(p, e, N);
      if (kind < 4 || kind == 6) {
        quant_encode_contract(&q, p, N, rng_hash(9, (uint64_t)t), msg);
        quant_decode(&q, msg, N, out, 0);
        quant_feedback_take(&q, msg, p, N, e);
      } else {
        float scale = 1.5f * quant_scale(&q, p, N); /* as if another replica's scale were larger */
        quant_int_encode(&q, p, N, scale, rng_hash(9, (uint64_t)t), ints);
        for (int i = 0; i < N; i++) out[i] = (float)ints[i] * (scale / (float)(q.nlevels - 1));
        quant_int_feedback_take(&q, ints, scale, p, N, e);
      }
      for (int i = 0; i < N; i++) {
        in[i] += g[i], sent[i] += out[i], mag[i] += fabs(g[i]);
        emax = fmax(emax, fabs(e[i])), pmax = fmax(pmax, fabs(p[i])), gmax = fmax(gmax, fabs(g[i]));
      }
    }
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs(sent[i] + e[i] - in[i]) / mag[i]);
    printf("  error feedback, %s%s: telescoping identity within %.2g of sum |g|; largest residual %.3g, |p| %.3g, |g| %.3g\n",
           kind == 6 ? "top-k 10%" : name_of(&q, kind == 1 ? 1 : kind == 2 ? 3 : 0), kind == 4 || kind == 5 ? " (integers)" : "",
           worst, emax, pmax, gmax);
    T_CHECK(worst <= 1e-6, "error feedback %d: sum of messages + residual misses the inputs by %.3g", kind, worst);
    /* top-k's residual is bounded by about 2 n / k times the gradients (Stich et al. 2018), not 2 */
    const double bound = kind == 6 ? 20.0 : 2.0;
    T_CHECK(isfinite(emax) && emax < bound * gmax, "error feedback %d: residual %.3g against |g| %.3g", kind, emax, gmax);
  }
}

/* ALQ and AMQ on the histogram of Gaussian and heavy-tailed buckets: Psi of the histogram matches
 * the exact expected error of the quantizer (bins narrower than the levels' gaps); ALQ's levels
 * strictly increase from 0 to 1 and its Psi never rises with more sweeps; ALQ and AMQ do at least as
 * well as NUQSGD's levels (an AMQ member, and one of ALQ's starts), and ALQ as well as AMQ. */
static void test_adaptive(void) {
  static quant_hist h;
  static float v[8 * 8192];
  quant_hist_clear(&h);
  for (int b = 0; b < 8; b++) {
    vector_of(b % 2 ? 1 : 0, v + b * 8192, 8192);
    quant_hist_add(&h, v + b * 8192, 8192);
  }
  quant_scheme q;
  quant_exponential(&q, 4, QUANT_L2);
  double exact = 0.0;
  for (int b = 0; b < 8; b++) exact += quant_expected(&q, v + b * 8192, 8192);
  double psi_nuq = quant_hist_psi(&h, q.level, q.nlevels);
  T_CHECK(fabs(psi_nuq - exact) <= 0.01 * exact, "histogram Psi %.6g, exact expected error %.6g", psi_nuq, exact);
  float lv[QUANT_MAX_LEVELS], am[QUANT_MAX_LEVELS], ratio;
  double prev = INFINITY;
  for (int sweeps = 1; sweeps <= 16; sweeps *= 2) {
    double psi = quant_fit_alq(&h, 8, sweeps, lv);
    T_CHECK(psi <= prev * (1 + 1e-12), "ALQ's Psi rose from %.6g to %.6g with %d sweeps", prev, psi, sweeps);
    prev = psi;
  }
  int inc = lv[0] == 0.0f && lv[7] == 1.0f;
  for (int j = 1; j < 8; j++) inc &= lv[j] > lv[j - 1];
  T_CHECK(inc, "ALQ's levels are not increasing from 0 to 1");
  T_CHECK(quant_levels(&q, 4, QUANT_L2, lv, 8) == 0, "the quantizer refuses ALQ's levels");
  double psi_amq = quant_fit_amq(&h, 8, am, &ratio);
  T_CHECK(prev <= psi_nuq && psi_amq <= psi_nuq * (1 + 1e-9), "ALQ %.6g, AMQ %.6g, NUQSGD %.6g", prev, psi_amq, psi_nuq);
  T_CHECK(prev <= psi_amq * 1.001, "ALQ %.6g worse than AMQ %.6g", prev, psi_amq);
  printf("  adaptive levels, 4-bit, 8 buckets of 8192: Psi NUQSGD %.4g, AMQ %.4g (p = %.3f), ALQ %.4g; ALQ levels %.2g "
         "%.2g %.2g %.2g %.2g %.2g\n", psi_nuq, psi_amq, (double)ratio, prev, lv[1], lv[2], lv[3], lv[4], lv[5], lv[6]);
}

/* Packed codes round-trip, and are laid out as the GPU's kernels write them: groups of 8 codes,
 * each a little-endian word of bits bytes (qc_put_group), whatever fast path packs them. */
static void test_pack(void) {
  static const size_t lens[] = {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 40, 255, 256, 257, 300};
  uint8_t codes[300], back[300], packed[320], groups[320];
  long bad = 0, layout = 0;
  for (int bits = 1; bits <= 8; bits++)
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
      const size_t n = lens[l];
      for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)rng_below(&R, 1u << bits);
      memset(packed, 0xAB, sizeof packed), memset(groups, 0xAB, sizeof groups);
      quant_pack(codes, n, bits, packed);
      T_CHECK(packed[quant_packed_bytes(n, bits)] == 0xAB, "pack wrote past %zu bytes", quant_packed_bytes(n, bits));
      for (size_t g = 0; g * 8 < n; g++) {
        uint64_t word = 0;
        for (size_t k = 0; k < 8 && g * 8 + k < n; k++) word |= (uint64_t)codes[g * 8 + k] << (k * (size_t)bits);
        qc_put_group(word, g, n, bits, groups);
      }
      layout += memcmp(packed, groups, quant_packed_bytes(n, bits)) != 0;
      quant_unpack(packed, n, bits, back);
      bad += memcmp(codes, back, n) != 0;
    }
  T_CHECK(bad == 0, "%ld pack/unpack round trips failed", bad);
  T_CHECK(layout == 0, "%ld packings differ from the groups' layout (qc_put_group)", layout);
  printf("  pack/unpack: 1..8 bits, lengths 0..300, in the groups' layout\n");
}

/* quant_encode_segs (the L2 scales of several buckets side by side) writes what quant_encode writes
 * bucket by bucket, and the largest magnitude's scale is the in-order maximum's bit for bit, with
 * zeros of both signs, infinities and NaNs (ignored) among the values. */
static void test_segs(void) {
  enum { N = 20000, MAXSEG = 600 };
  static float v[N];
  static uint8_t a[N * 4], b[N * 4];
  static quant_seg seg[N];
  rng_state r; /* its own stream: the other tests' draws stay as they were */
  rng_seed(&r, 5, RNG_DATA, 0);
  for (size_t i = 0; i < N; i++) v[i] = (float)rng_normal(&r) * (i % 7 ? 1e-3f : 1.0f);
  v[5] = -0.0f, v[6] = 0.0f, v[40] = INFINITY, v[41] = -INFINITY, v[77] = NAN;
  quant_scheme qs[4];
  float lv[8] = {0.0f, 0.05f, 0.1f, 0.17f, 0.25f, 0.4f, 0.6f, 1.0f};
  T_CHECK(quant_levels(&qs[0], 4, QUANT_L2, lv, 8) == 0, "levels refused");
  quant_exponential(&qs[1], 4, QUANT_L2), quant_uniform(&qs[2], 3, QUANT_L2), quant_uniform(&qs[3], 2, QUANT_MAX);
  int differ = 0, scales = 0, nseg = 0;
  for (int t = 0; t < 4; t++) {
    size_t at = 100, off = 0; /* the first 100 values (the infinities, the NaN) are the scale checks' */
    for (nseg = 0; at < N; nseg++) {
      size_t len = 1 + rng_below(&r, MAXSEG);
      len = at + len > N ? N - at : len;
      const int quantized = rng_below(&r, 5) != 0;
      seg[nseg] = (quant_seg){.at = at, .n = len, .off = off, .quantized = quantized, .id = 3u * (uint64_t)nseg + 1};
      off += quantized ? quant_bytes(&qs[t], len) : len * sizeof(float), at += len;
    }
    quant_encode_segs(&qs[t], seg, nseg, v, NULL, 99, a);
    for (int k = 0; k < nseg; k++)
      if (seg[k].quantized) quant_encode(&qs[t], v + seg[k].at, seg[k].n, rng_hash(99, seg[k].id), b + seg[k].off);
      else memcpy(b + seg[k].off, v + seg[k].at, seg[k].n * sizeof(float));
    differ += memcmp(a, b, off) != 0;
  }
  for (size_t n = 0; n <= 100; n++) {
    float m = 0.0f, h[2] = {0.0f, 0.0f};
    for (size_t i = 0; i < n; i++) m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
    qc_scale(&qs[3], v, n, h);
    scales += memcmp(&m, &h[0], sizeof m) != 0;
  }
  T_CHECK(differ == 0, "%d of 4 schemes: quant_encode_segs differs from quant_encode bucket by bucket", differ);
  T_CHECK(scales == 0, "%d of 101 largest magnitudes differ from the in-order maximum", scales);
  printf("  segments: quant_encode_segs = quant_encode per bucket (4 schemes, %d segments of the last)\n", nseg);
}

/* Indices in the order top-k keeps them: larger magnitude first, then the lower index. */
static const float *order_of;
static int by_magnitude(const void *a, const void *b) {
  size_t i = *(const size_t *)a, j = *(const size_t *)b;
  float x = fabsf(order_of[i]), y = fabsf(order_of[j]);
  return x > y ? -1 : x < y ? 1 : i < j ? -1 : i > j;
}

/* Top-k against a sort: for every vector shape (ties: the constant one, zeros), bucket lengths from 1
 * to 70,000 (32-bit indices past 65,536) and shares from 0.1% to all, exactly the k = ceil(n share)
 * largest magnitudes (ties to the lower index) decode to themselves and the rest to 0; decoding
 * adds where asked; the message has k (index + 4) bytes; quant_expected is the dropped values'
 * squares, within the contraction bound (1 - k/n) ||v||^2. */
static void test_topk(void) {
  static const size_t lens[] = {1, 7, 100, 8192, 70000};
  static const uint32_t ppms[] = {1000, 10000, 500000, 1000000};
  enum { NMAX = 70000 };
  static float v[NMAX], out[NMAX], acc[NMAX];
  static size_t idx[NMAX];
  static uint8_t msg[NMAX * 8];
  static unsigned char kept[NMAX];
  int bad = 0, cases = 0;
  for (int shape = 0; shape < 5; shape++)
    for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
      for (size_t b = 0; b < sizeof ppms / sizeof ppms[0]; b++) {
        const size_t n = lens[a];
        quant_scheme q;
        quant_topk(&q, ppms[b]);
        vector_of(shape, v, n);
        size_t k = (n * ppms[b] + 999999) / 1000000;
        k = k < 1 ? 1 : k > n ? n : k;
        for (size_t i = 0; i < n; i++) idx[i] = i, kept[i] = 0, acc[i] = 1.0f;
        order_of = v;
        qsort(idx, n, sizeof *idx, by_magnitude);
        double norm2 = 0, dropped = 0;
        for (size_t j = 0; j < k; j++) kept[idx[j]] = 1;
        for (size_t i = 0; i < n; i++) norm2 += (double)v[i] * v[i], dropped += kept[i] ? 0.0 : (double)v[i] * v[i];
        quant_encode(&q, v, n, 0, msg);
        quant_decode(&q, msg, n, out, 0);
        quant_decode(&q, msg, n, acc, 1);
        int ok = quant_bytes(&q, n) == k * ((n <= 65536 ? 2 : 4) + sizeof(float));
        for (size_t i = 0; i < n; i++)
          ok &= out[i] == (kept[i] ? v[i] : 0.0f) && acc[i] == 1.0f + out[i];
        double e = quant_expected(&q, v, n);
        ok &= e == dropped && e <= (1.0 - (double)k / n) * norm2 * (1 + 1e-12);
        bad += !ok, cases++;
        T_CHECK(ok, "top-k shape %d, n = %zu, %u ppm: not the %zu largest (or bytes %zu, error %.6g against %.6g)", shape, n,
                ppms[b], k, quant_bytes(&q, n), e, dropped);
      }
  printf("  top-k: %d cases (5 shapes, 5 lengths, 4 shares) keep exactly the k largest magnitudes; %d differ\n", cases, bad);
}

/* Random tables of 2..2^(b-1) strictly increasing levels, b = 2..8, both norms, buckets across the
 * encoder's 256-value chunks: every code quant_encode packs is qc_code's for that value and index.
 * With the max norm and a largest value of 1, values are put exactly on levels and their midpoints. */
static void test_table_codes(void) {
  static const size_t lens[] = {1, 7, 255, 256, 257, 700};
  float v[700], lv[QUANT_MAX_LEVELS];
  uint8_t msg[800], codes[700];
  int bad = 0, total = 0;
  for (int b = 2; b <= 8; b++)
    for (int t = 0; t < 6; t++) {
      int n = 2 + (int)(rng_uniform(&R) * (double)((1 << (b - 1)) - 1)), ok = 0;
      while (!ok) {
        lv[0] = 0.0f, lv[n - 1] = 1.0f;
        for (int j = 1; j < n - 1; j++) lv[j] = (float)(((double)j + rng_uniform(&R) - 0.5) / (n - 1));
        quant_scheme q;
        ok = quant_levels(&q, b, t % 2 ? QUANT_MAX : QUANT_L2, lv, n) == 0;
        if (!ok) continue;
        const size_t len = lens[t];
        for (size_t i = 0; i < len; i++) {
          const int j = (int)(rng_uniform(&R) * n) % n, sg = i % 2 ? -1 : 1;
          v[i] = i % 3 == 0 ? (float)(sg * rng_normal(&R)) : (float)sg * (i % 3 == 1 ? lv[j] : 0.5f * (lv[j] + lv[j == n - 1 ? j : j + 1]));
        }
        if (t % 2) v[0] = 1.0f, v[len > 1] = len > 1 ? -1.0f : 1.0f;
        float h[2] = {0.0f, 0.0f};
        qc_scale(&q, v, len, h);
        const qc_params par = qc_params_of(&q, h);
        const uint64_t key = 977u * (uint64_t)(b * 8 + t);
        quant_encode(&q, v, len, key, msg);
        quant_unpack(msg + sizeof(float), len, b, codes);
        for (size_t i = 0; i < len; i++, total++)
          bad += codes[i] != qc_code(&q, &par, h, v[i], qc_key32(key), i);
      }
    }
  T_CHECK(bad == 0, "table codes: %d of %d differ from qc_code's", bad, total);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  rng_seed(&R, 7, 0, 0);
  test_pack();
  test_segs();
  test_edges();
  test_unbiased();
  test_reference_values();
  test_integers();
  test_adaptive();
  test_feedback();
  test_topk();
  test_table_codes();
  int rc = t_done("test_quant");
  MPI_Finalize();
  return rc;
}
