/* gpu_matmul: linear layers through cuBLAS at the run's precision.
 *
 * cuBLAS is column-major: a row-major (r,c) matrix is the column-major (c,r) matrix, its
 * transpose, with the same leading dimension c. So the row-major products of backend.h become
 *   out (N,M) = inp (N,K) @ w (M,K)^T   ->  out^T (M,N) = op_T(w^T) (M,K) * inp^T (K,N)
 *   dinp (N,K) = dout (N,M) @ w (M,K)   ->  dinp^T (K,N) = w^T (K,M) * dout^T (M,N)
 *   dw (M,K) += dout^T (M,N) @ inp (N,K) -> dw^T (K,M) += inp^T (K,N) * op_T(dout^T) (N,M)
 * Every GEMM is cublasGemmEx on fp32 matrices with the compute type of the precision
 * (CUBLAS_COMPUTE_32F, _32F_FAST_TF32, _32F_FAST_16BF or _32F_FAST_16F: fp32 accumulation). */
#include "gpu.h"

void gpu_gemm(const gpu_ctx *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  GPU_BLAS(cublasGemmEx(g->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, C,
                        CUDA_R_32F, ldc, g->compute, CUBLAS_GEMM_DEFAULT));
}

/* out (N,M): every row = bias (M) */
__global__ void bias_rows_kernel(float *out, const float *bias, size_t N, int M) {
  size_t n = N * (size_t)M;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = bias[i % (size_t)M];
}

/* dbias (M) += column sums of dout (N,M): block (32,32) owns 32 columns; its 32 rows of threads
 * stride over the rows, then sum their partials in a fixed order (deterministic). */
__global__ void bias_grad_kernel(float *dbias, const float *dout, int N, int M) {
  __shared__ float part[32][33];
  int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < M)
    for (int r = threadIdx.y; r < N; r += 32) s += dout[(size_t)r * M + col];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < M) {
    float t = 0.0f;
    for (int k = 0; k < 32; k++) t += part[k][threadIdx.x];
    dbias[col] += t;
  }
}

void gpu_matmul_fwd(const gpu_ctx *g, float *out, const float *inp, const float *w, const float *bias, int N, int K, int M) {
  float beta = 0.0f;
  if (bias) { /* rows pre-filled with the bias, then beta = 1 (as the CPU backend does) */
    bias_rows_kernel<<<gpu_blocks((size_t)N * M, 256), 256>>>(out, bias, (size_t)N, M);
    GPU_LAUNCHED();
    beta = 1.0f;
  }
  /* out^T (M,N) = w (M,K) * inp^T (K,N) */
  gpu_gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, 1.0f, w, K, inp, K, beta, out, M);
}

void gpu_matmul_bwd(const gpu_ctx *g, float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int N,
                    int K, int M) {
  /* dinp^T (K,N) = w^T (K,M) * dout^T (M,N) */
  if (dinp) gpu_gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, 1.0f, w, K, dout, M, 0.0f, dinp, K);
  /* dw^T (K,M) += inp^T (K,N) * dout (N,M) */
  gpu_gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, 1.0f, inp, K, dout, M, 1.0f, dw, K);
  if (dbias) {
    bias_grad_kernel<<<(M + 31) / 32, dim3(32, 32)>>>(dbias, dout, N, M);
    GPU_LAUNCHED();
  }
}
