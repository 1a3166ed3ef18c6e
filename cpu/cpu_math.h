/* cpu_math: branch-free exp and tanh that the compiler vectorizes (the libm calls do not
 * vectorize without -ffast-math). Relative error below 2e-7 over the float range; results are
 * the same on every run and every machine with IEEE float. NaN propagates. */
#ifndef GREENLM_CPU_MATH_H
#define GREENLM_CPU_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for float x; underflows to ~1e-38 below -87.3, overflows to +inf above 88.7. */
static inline float cpu_expf(float x) {
  const float lo = -87.3f, hi = 88.72f;
  x = x < lo ? lo : x;
  float big = x > hi ? 1.0f : 0.0f;
  x = x > hi ? hi : x;
  /* x = n ln2 + r, |r| <= ln2/2 */
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  /* exp(r) on [-ln2/2, ln2/2]: Cephes expf polynomial */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t e = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &e, sizeof scale);
  float y = p * scale;
  return big > 0.0f ? y * 1e30f * 1e30f : y; /* +inf past the overflow bound */
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1); the absolute error is below 2e-7 everywhere. */
static inline float cpu_tanhf(float x) { return 1.0f - 2.0f / (cpu_expf(2.0f * x) + 1.0f); }

/* Reductions in CPU_LANES independent partial sums, so that the compiler vectorizes them
 * without reassociating (no -ffast-math); the order is fixed, so results are reproducible. */
#define CPU_LANES 16

static inline float cpu_sum(const float *x, size_t n) {
  float acc[CPU_LANES] = {0};
  size_t i = 0;
  for (; i + CPU_LANES <= n; i += CPU_LANES)
    for (int j = 0; j < CPU_LANES; j++) acc[j] += x[i + j];
  float s = 0.0f;
  for (; i < n; i++) s += x[i];
  for (int j = 0; j < CPU_LANES; j++) s += acc[j];
  return s;
}

static inline float cpu_dot(const float *x, const float *y, size_t n) {
  float acc[CPU_LANES] = {0};
  size_t i = 0;
  for (; i + CPU_LANES <= n; i += CPU_LANES)
    for (int j = 0; j < CPU_LANES; j++) acc[j] += x[i + j] * y[i + j];
  float s = 0.0f;
  for (; i < n; i++) s += x[i] * y[i];
  for (int j = 0; j < CPU_LANES; j++) s += acc[j];
  return s;
}

static inline float cpu_max(const float *x, size_t n) {
  float m = -INFINITY;
  size_t i = 0;
#if defined(__GNUC__)
  /* compilers do not vectorize a max over lanes by themselves: use a GNU vector */
  typedef float vf __attribute__((vector_size(CPU_LANES * sizeof(float))));
  typedef int32_t vi __attribute__((vector_size(CPU_LANES * sizeof(float))));
  vf acc;
  for (int j = 0; j < CPU_LANES; j++) acc[j] = -INFINITY;
  for (; i + CPU_LANES <= n; i += CPU_LANES) {
    vf v;
    memcpy(&v, x + i, sizeof v);
    vi gt = v > acc;
    acc = (vf)((gt & (vi)v) | (~gt & (vi)acc));
  }
  for (int j = 0; j < CPU_LANES; j++) m = acc[j] > m ? acc[j] : m;
#endif
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

/* x[i] = exp(x[i] - shift) in place; returns the sum of the results. */
static inline float cpu_exp_sum(float *x, size_t n, float shift) {
  float acc[CPU_LANES] = {0};
  size_t i = 0;
  for (; i + CPU_LANES <= n; i += CPU_LANES)
    for (int j = 0; j < CPU_LANES; j++) {
      x[i + j] = cpu_expf(x[i + j] - shift);
      acc[j] += x[i + j];
    }
  float s = 0.0f;
  for (; i < n; i++) {
    x[i] = cpu_expf(x[i] - shift);
    s += x[i];
  }
  for (int j = 0; j < CPU_LANES; j++) s += acc[j];
  return s;
}

#endif
