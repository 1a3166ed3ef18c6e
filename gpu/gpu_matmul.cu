/* gpu_matmul: linear layers through cuBLAS at the run's precision.
 *
 * cuBLAS is column-major: a row-major (r,c) matrix is the column-major (c,r) matrix, its
 * transpose, with the same leading dimension c. So the row-major products of backend.h become
 *   out (N,M) = inp (N,K) @ w (M,K)^T   ->  out^T (M,N) = op_T(w^T) (M,K) * inp^T (K,N)
 *   dinp (N,K) = dout (N,M) @ w (M,K)   ->  dinp^T (K,N) = w^T (K,M) * dout^T (M,N)
 *   dw (M,K) += dout^T (M,N) @ inp (N,K) -> dw^T (K,M) += inp^T (K,N) * op_T(dout^T) (N,M)
 * At fp32 storage the matrices are fp32 and the compute type is the precision's (CUBLAS_COMPUTE_32F,
 * _32F_FAST_TF32, _32F_FAST_16BF or _32F_FAST_16F); at bf16 or fp16 storage the activations and
 * weights are bf16 or fp16 and go to the tensor cores as they are (CUBLAS_COMPUTE_32F), the outputs
 * stored in the storage type, the weight gradients in fp32 (beta = 1, or 0 in a step's first backward
 * pass). fp32 accumulation in every case. The GEMMs are cublasGemmEx, except at 16-bit storage those
 * whose output has an epilogue (a bias, gelu_new, gelu_new's gradient): cuBLASLt's fused epilogues
 * (gpu_lt.cu) where they take the shape, else greenlm's kernels after the GEMM. */
#include "gpu.h"

void gpu_gemm(const gpu_ctx *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  GPU_BLAS(cublasGemmEx(g->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, C, CUDA_R_32F,
                        ldc, g->compute, CUBLAS_GEMM_DEFAULT));
}

static cudaDataType_t cuda_type(backend_dtype t) {
  return t == BACKEND_BF16 ? CUDA_R_16BF : t == BACKEND_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

/* A and B in storage type t, C in type ct: fp32 storage takes the precision's compute type; 16-bit
 * inputs go to the tensor cores as they are, with fp32 accumulation (CUBLAS_COMPUTE_32F). */
static void gemm_t(const gpu_ctx *g, backend_dtype t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   const void *A, int lda, const void *B, int ldb, float beta, void *C, cudaDataType_t ct, int ldc) {
  const float alpha = 1.0f;
  cublasComputeType_t compute = t == BACKEND_FP32 ? g->compute : CUBLAS_COMPUTE_32F;
  GPU_BLAS(cublasGemmEx(g->blas, ta, tb, m, n, k, &alpha, A, cuda_type(t), lda, B, cuda_type(t), ldb, &beta, C, ct, ldc,
                        compute, CUBLAS_GEMM_DEFAULT));
}

/* out (N,M; rows ldo apart): every row = bias (M) */
template <typename S>
__global__ void bias_rows_kernel(S *out, const S *bias, size_t N, int M, int ldo) {
  size_t n = N * (size_t)M;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i / (size_t)M * (size_t)ldo + i % (size_t)M] = bias[i % (size_t)M];
}

template <typename S>
__global__ void fill_kernel(S *p, float v, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = st<S>(v);
}

/* N ones in storage type t, kept in the instance (grown where a call has more rows than planned). */
static const void *ones(gpu_ctx *g, backend_dtype t, int N) {
  if (g->ones_n < (size_t)N || g->ones_type != (int)t) {
    if (g->ones) GPU_CHECK(cudaFree(g->ones));
    GPU_CHECK(cudaMalloc(&g->ones, gpu_ones_bytes(t, N)));
    GPU_STORAGE(t, fill_kernel<S><<<gpu_blocks((size_t)N, 256), 256>>>((S *)g->ones, 1.0f, (size_t)N));
    GPU_LAUNCHED();
    g->ones_n = (size_t)N, g->ones_type = (int)t;
  }
  return g->ones;
}

size_t gpu_ones_bytes(backend_dtype t, int N) { return ((size_t)N * backend_dtype_size(t) + 255) / 256 * 256; }

void gpu_ones_prepare(gpu_ctx *g, backend_dtype t, int N) { ones(g, t, N); }

/* dbias (M) = beta dbias + column sums of dout (N,M; rows ldo apart), as a GEMM: dbias (M,1) = dout^T (M,N) *
 * ones (N,1) + beta dbias, fp32 sums (whatever the precision) in cuBLAS's fixed order: the same bits every run. */
static void bias_grad(gpu_ctx *g, backend_dtype t, float *dbias, const void *dout, int N, int M, int ldo, float beta) {
  const float one = 1.0f;
  GPU_BLAS(cublasGemmEx(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, M, 1, N, &one, dout, cuda_type(t), ldo, ones(g, t, N),
                        cuda_type(t), N, &beta, dbias, CUDA_R_32F, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The forward GEMM in cuBLASLt's terms: out^T (M,N; ldo) = w (M,K) * inp^T (K,N) */
static gpu_lt_args fwd_args(void *out, const void *inp, const void *w, int N, int K, int M, int ldo) {
  gpu_lt_args a;
  memset(&a, 0, sizeof a);
  a.ta = CUBLAS_OP_T, a.tb = CUBLAS_OP_N, a.m = M, a.n = N, a.k = K;
  a.A = w, a.lda = K, a.B = inp, a.ldb = K, a.D = out, a.ldd = ldo;
  return a;
}

void gpu_matmul_fwd(gpu_ctx *g, backend_dtype t, void *out, const void *inp, const void *w, const void *bias, int N,
                    int K, int M, int ldo) {
  float beta = 0.0f;
  if (bias) { /* in cuBLASLt's epilogue; else rows pre-filled with the bias, then beta = 1 (as the CPU does) */
    gpu_lt_args a = fwd_args(out, inp, w, N, K, M, ldo);
    a.epilogue = CUBLASLT_EPILOGUE_BIAS, a.bias = bias;
    if (gpu_lt_gemm(g, t, &a)) return;
    GPU_STORAGE(t, bias_rows_kernel<S><<<gpu_blocks((size_t)N * M, 256), 256>>>((S *)out, (const S *)bias, (size_t)N,
                                                                                  M, ldo));
    GPU_LAUNCHED();
    beta = 1.0f;
  }
  gemm_t(g, t, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, w, K, inp, K, beta, out, cuda_type(t), ldo);
}

void gpu_matmul_bwd(gpu_ctx *g, backend_dtype t, void *dinp, float *dw, float *dbias, const void *dout,
                    const void *inp, const void *w, int N, int K, int M, int ldo, int acc) {
  const float beta = acc ? 1.0f : 0.0f;
  /* dinp^T (K,N) = w^T (K,M) * dout^T (M,N; ldo) */
  if (dinp) gemm_t(g, t, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, w, K, dout, ldo, 0.0f, dinp, cuda_type(t), K);
  /* dw^T (K,M) (+)= inp^T (K,N) * dout (N,M), in fp32 */
  gemm_t(g, t, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, inp, K, dout, ldo, beta, dw, CUDA_R_32F, K);
  if (dbias) bias_grad(g, t, dbias, dout, N, M, ldo, beta);
}

void gpu_matmul_gelu_fwd(gpu_ctx *g, backend_dtype t, void *out, void *pre, const void *inp, const void *w,
                         const void *bias, int N, int K, int M, int act) {
  gpu_lt_args a = fwd_args(out, inp, w, N, K, M, M);
  a.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  a.bias = bias, a.aux = pre, a.ldaux = M; /* pre^T (M,N) */
  if (act == BACKEND_GELU_TANH && gpu_lt_gemm(g, t, &a)) return;
  gpu_matmul_fwd(g, t, pre, inp, w, bias, N, K, M, M);
  gpu_gelu_fwd(t, out, pre, (size_t)N * M, act);
}

void gpu_matmul_dgelu_bwd(gpu_ctx *g, backend_dtype t, void *dpre, float *dw, float *dbias, const void *dout,
                          const void *inp, const void *pre, const void *w, int N, int K, int M, int acc, int act) {
  /* dpre^T (K,N) = (w^T (K,M) * dout^T (M,N)) * gelu'(pre^T (K,N)) */
  gpu_lt_args a;
  memset(&a, 0, sizeof a);
  a.ta = CUBLAS_OP_N, a.tb = CUBLAS_OP_N, a.m = K, a.n = N, a.k = M;
  a.A = w, a.lda = K, a.B = dout, a.ldb = M, a.D = dpre, a.ldd = K;
  a.epilogue = CUBLASLT_EPILOGUE_DGELU, a.aux = (void *)pre, a.ldaux = K;
  const bool fused = act == BACKEND_GELU_TANH && gpu_lt_gemm(g, t, &a);
  gpu_matmul_bwd(g, t, fused ? NULL : dpre, dw, dbias, dout, inp, w, N, K, M, M, acc);
  if (!fused) gpu_gelu_bwd(t, dpre, dpre, pre, (size_t)N * K, act);
}
