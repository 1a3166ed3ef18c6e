/* cpu_matmul: linear layers through OpenBLAS SGEMM. */
#include <cblas.h>
#include <string.h>

#include "cpu.h"

void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int K, int M, int ldo) {
  /* out (N,M; rows ldo apart) = inp (N,K) @ w (M,K)^T [+ bias]: rows pre-filled with the bias, then beta = 1 */
  float beta = 0.0f;
  if (bias) {
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * ldo, bias, (size_t)M * sizeof(float));
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.0f, inp, K, w, K, beta, out, ldo);
}

void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                    int N, int K, int M, int ldo) {
  /* dinp (N,K) = dout (N,M; rows ldo apart) @ w (M,K) */
  if (dinp) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, M, 1.0f, dout, ldo, w, K, 0.0f, dinp, K);
  /* dw (M,K) += dout^T (M,N) @ inp (N,K) */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, K, N, 1.0f, dout, ldo, inp, K, 1.0f, dw, K);
  /* dbias (M) += sum over rows of dout */
  if (dbias)
    for (int i = 0; i < N; i++) {
      const float *d = dout + (size_t)i * ldo;
      for (int j = 0; j < M; j++) dbias[j] += d[j];
    }
}
