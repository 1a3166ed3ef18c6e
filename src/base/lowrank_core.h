/* lowrank_core: the arithmetic of PowerSGD's low-rank factors (the backend ops lowrank_left,
 * lowrank_right, lowrank_orth, lowrank_expand; src/parallel/psgd.h), written once for the CPU
 * (cpu/cpu_storage.c) and the CUDA kernels (gpu/gpu_quant.cu), so that the factors a GPU computes
 * are bit for bit the CPU's. Matrices are fp32 and row-major: M (n,m), P (n,r), Q (m,r).
 *
 * Every sum has one fixed order, the same on both:
 *   left    P[i,k] = sum over j = 0, 1, ... of M[i,j] Q[j,k]
 *   right   Q[j,k] = sum over i = 0, 1, ... of M[i,j] P[i,k]
 *   expand  (P Q^T)[i,j] = sum over k = 0, 1, ... of P[i,k] Q[j,k]
 *   dot     of two columns of P: LR_LANES lane sums (lane t: rows t, t + LR_LANES, ... in order),
 *           then the lanes halved pairwise (lane t += lane t + h, h = LR_LANES / 2, ..., 1)
 * each a running float s = s + a * b from 0, never contracted into fused multiply-adds (the CPU is
 * compiled as ISO C11, gpu_quant.cu with -fmad=false). The CPU may interleave the sums of
 * different elements (right's loop runs over rows outside) as long as each keeps its own order. */
#ifndef GREENLM_LOWRANK_CORE_H
#define GREENLM_LOWRANK_CORE_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define LR_FN __host__ __device__ static inline
#else
#define LR_FN static inline
#endif

enum { LR_LANES = 256 };

/* P[i,k] of M (n,m) Q (m,r). */
LR_FN float lr_left(const float *M, const float *Q, size_t m, int r, size_t i, int k) {
  float s = 0.0f;
  for (size_t j = 0; j < m; j++) s = s + M[i * m + j] * Q[j * (size_t)r + (size_t)k];
  return s;
}

/* (P Q^T)[i,j] of P (n,r), Q (m,r). */
LR_FN float lr_expand(const float *P, const float *Q, int r, size_t i, size_t j) {
  float s = 0.0f;
  for (int k = 0; k < r; k++) s = s + P[i * (size_t)r + (size_t)k] * Q[j * (size_t)r + (size_t)k];
  return s;
}

/* Lane t's share of the dot product of columns a and b of P (n,r). */
LR_FN float lr_lane(const float *P, size_t n, int r, int a, int b, int t) {
  float s = 0.0f;
  for (size_t i = (size_t)t; i < n; i += LR_LANES) s = s + P[i * (size_t)r + (size_t)a] * P[i * (size_t)r + (size_t)b];
  return s;
}

/* Column a of P scaled to unit length (a zero column stays zero): its element of row i, given the
 * column's sum of squares. */
LR_FN float lr_unit(float x, float sumsq) {
  const float norm = sqrtf(sumsq);
  return norm > 0.0f ? x / norm : 0.0f;
}

#endif
