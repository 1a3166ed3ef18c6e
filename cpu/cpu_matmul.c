/* cpu_matmul: linear layers through OpenBLAS SGEMM, and the memory OpenBLAS takes for them. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"
#include "base/util.h"

/* Rows of an output per SGEMM call. OpenBLAS packs a panel of the output's rows into its own buffer,
 * and some of its kernel sets (Haswell, Zen) pack all of them at once: 52 MB for GPT-2's head
 * gradient (50257 rows, 256 tokens), none on others (SkylakeX); in pieces of CPU_GEMM_ROWS rows the
 * buffer stays a few MB on every kernel set, and the memory plan can measure it (cpu_blas_bytes). */
#define CPU_GEMM_ROWS 4096

static int rows_at(int i, int n) { return n - i < CPU_GEMM_ROWS ? n - i : CPU_GEMM_ROWS; }

void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int K, int M, int ldo) {
  /* out (N,M; rows ldo apart) = inp (N,K) @ w (M,K)^T [+ bias]: rows pre-filled with the bias, then beta = 1 */
  float beta = 0.0f;
  if (bias) {
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * ldo, bias, (size_t)M * sizeof(float));
    beta = 1.0f;
  }
  for (int i = 0; i < N; i += CPU_GEMM_ROWS)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows_at(i, N), M, K, 1.0f, inp + (size_t)i * K, K, w, K, beta,
                out + (size_t)i * ldo, ldo);
}

void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                    int N, int K, int M, int ldo) {
  /* dinp (N,K) = dout (N,M; rows ldo apart) @ w (M,K) */
  if (dinp)
    for (int i = 0; i < N; i += CPU_GEMM_ROWS)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows_at(i, N), K, M, 1.0f, dout + (size_t)i * ldo, ldo, w, K,
                  0.0f, dinp + (size_t)i * K, K);
  /* dw (M,K) += dout^T (M,N) @ inp (N,K) */
  for (int j = 0; j < M; j += CPU_GEMM_ROWS)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows_at(j, M), K, N, 1.0f, dout + j, ldo, inp, K, 1.0f,
                dw + (size_t)j * K, K);
  /* dbias (M) += sum over rows of dout */
  if (dbias)
    for (int i = 0; i < N; i++) {
      const float *d = dout + (size_t)i * ldo;
      for (int j = 0; j < M; j++) dbias[j] += d[j];
    }
}

/* Resident bytes of this process now (Linux's /proc/self/statm); -1 where it cannot be read. */
static double resident_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size, resident;
  int ok = f && fscanf(f, "%ld %ld", &size, &resident) == 2;
  if (f) fclose(f);
  return ok ? (double)resident * (double)sysconf(_SC_PAGESIZE) : -1.0;
}

static float *touched(size_t n) {
  float *p = util_aligned_alloc(n * sizeof(float), "OpenBLAS measurement");
  for (size_t i = 0; i < n; i++) p[i] = (float)(i % 7) * 0.125f;
  return p;
}

size_t cpu_blas_bytes(const backend_shape *s) {
  /* the model's linear layers (K inputs -> M outputs): C -> F, F -> C, C -> V. An output's rows
   * (tokens, or the vocabulary's for the head's gradient) come CPU_GEMM_ROWS at most per call; the
   * other sizes OpenBLAS packs in blocks of a few hundred, so 1024 of them take what more would */
  const int rows = CPU_GEMM_ROWS, cap = 1024, N = s->B * s->T < rows ? s->B * s->T : rows;
  const int C = s->C < cap ? s->C : cap, F = s->F < cap ? s->F : cap, V = s->V < rows ? s->V : rows;
  const int shape[3][2] = {{C, F}, {F, C}, {C, V}};
  const size_t in = (size_t)(C > F ? C : F), out = (size_t)(F > V ? F : V);
  float *x = touched(N * in), *dx = touched(N * in), *y = touched(N * out), *w = touched(out * in), *dw = touched(out * in);
  const double before = resident_bytes();
  for (int k = 0; k < 3; k++) {
    int K = shape[k][0], M = shape[k][1];
    cpu_matmul_fwd(y, x, w, NULL, N, K, M, M);
    cpu_matmul_bwd(dx, dw, NULL, y, x, w, N, K, M, M);
  }
  const double after = resident_bytes();
  free(x), free(w), free(y), free(dx), free(dw);
  return before >= 0 && after > before ? (size_t)(after - before) : 0;
}
