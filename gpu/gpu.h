/* gpu: the CUDA backend's internals, shared by the .cu files of gpu/ (CUDA C++).
 *
 * An instance's context (gpu_ctx: device, cuBLAS handle, compute type, workspace) is passed to the
 * functions that need it; the device is made current when the instance opens (one device per
 * process). Every kernel and cuBLAS call runs on the legacy default stream, so the ops run in the
 * order they are called and a copy to the host waits for them. Storage is fp32 everywhere
 * (parameters, gradients, activations, AdamW moments): the backend's capabilities say so, and at
 * bf16 and fp16 precision the run stores fp32 and only the GEMMs and the tensor-core attention
 * round their inputs (fp32 accumulation in every mode). Errors are fatal, with the failing call,
 * its place and a hint (util_fatal_at). */
#ifndef GREENLM_GPU_H
#define GREENLM_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "config.h" /* GREENLM_HAVE_CUDA: backend.h declares the entry points */
#include "model/backend.h"
extern "C" {
#include "base/util.h"
}

/* ---- errors ---------------------------------------------------------------------------------- */

#define GPU_HINT "check the GPU with nvidia-smi; CUDA_LAUNCH_BLOCKING=1 names the failing kernel"

#define GPU_CHECK(call)                                                                            \
  do {                                                                                             \
    cudaError_t gpu_e_ = (call);                                                                   \
    if (gpu_e_ != cudaSuccess)                                                                     \
      util_fatal_at(__FILE__, __LINE__, GPU_HINT, "CUDA: %s: %s", #call, cudaGetErrorString(gpu_e_)); \
  } while (0)

#define GPU_BLAS(call)                                                                             \
  do {                                                                                             \
    cublasStatus_t gpu_s_ = (call);                                                                \
    if (gpu_s_ != CUBLAS_STATUS_SUCCESS)                                                           \
      util_fatal_at(__FILE__, __LINE__, GPU_HINT, "cuBLAS: %s: %s", #call, cublasGetStatusString(gpu_s_)); \
  } while (0)

/* After a kernel launch: a bad launch configuration is reported here, at its place. */
#define GPU_LAUNCHED() GPU_CHECK(cudaGetLastError())

/* ---- an instance's context (gpu_backend.cu) ---------------------------------------------------- */

typedef struct gpu_ctx {
  int device = -1;              /* CUDA device index (among the visible ones); -1: planning only */
  cudaDeviceProp prop;
  cublasHandle_t blas;
  cublasComputeType_t compute;  /* of the GEMMs, from the precision */
  char precision[8];            /* "fp32", "tf32", "bf16" or "fp16" */
  void *work;                   /* the workspace (attention's D, the norm's partial sums) */
  size_t work_bytes;
  char bus[32];                 /* PCI bus id in NVML's form, once asked */
} gpu_ctx;

static inline gpu_ctx *gpu_of(const backend *be) { return (gpu_ctx *)be->ctx; }

/* Device memory of at least `bytes` for an op's temporary values, valid until the next call. The
 * instance's prepare allocates what the planned shapes need; a larger request (a test calling ops
 * on other shapes) grows it. */
void *gpu_workspace(gpu_ctx *g, size_t bytes);

/* Blocks for a grid-stride loop over n elements with `threads` per block. */
static inline unsigned gpu_blocks(size_t n, int threads) {
  size_t b = (n + (size_t)threads - 1) / (size_t)threads;
  if (b > 65536) b = 65536;
  return b ? (unsigned)b : 1u;
}

/* ---- warp reductions ------------------------------------------------------------------------- */

#define GPU_FULL_MASK 0xffffffffu

__device__ __forceinline__ float gpu_warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(GPU_FULL_MASK, x, o);
  return x;
}
__device__ __forceinline__ float gpu_warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(GPU_FULL_MASK, x, o));
  return x;
}

/* ---- the ops (one file per kind, as in cpu/) ---------------------------------------------------- */

/* gpu_ops.cu */
void gpu_embed_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C);
void gpu_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C);
void gpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                       int C, float eps);
void gpu_layernorm_bwd(const gpu_ctx *g, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                       const float *w, const float *mean, const float *rstd, int N, int C);
void gpu_gelu_fwd(float *out, const float *inp, size_t n);
void gpu_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n);
void gpu_residual_fwd(float *out, const float *a, const float *b, size_t n);
void gpu_accumulate(float *dst, const float *src, size_t n);
void gpu_xent_fwd_bwd(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale);
void gpu_adamw(float *p, const float *g, float *m, float *v, size_t n, const backend_adamw_args *a);
size_t gpu_sumsq_workspace(void);
double gpu_sumsq(gpu_ctx *g, const float *x, size_t n);

/* gpu_matmul.cu */
void gpu_matmul_fwd(const gpu_ctx *g, float *out, const float *inp, const float *w, const float *bias, int N, int K,
                    int M);
void gpu_matmul_bwd(const gpu_ctx *g, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                    const float *w, int N, int K, int M);
/* C (m,n column-major, ldc) = alpha op(A) op(B) + beta C in fp32 storage at the GEMM precision. */
void gpu_gemm(const gpu_ctx *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* gpu_attention.cu */
size_t gpu_attention_scratch(int T);
size_t gpu_attention_workspace(int B, int T, int H);
void gpu_attention_fwd(gpu_ctx *g, float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H,
                       int window, float scale);
void gpu_attention_bwd(gpu_ctx *g, float *dqkv, const float *dout, const float *out, const float *lse,
                       const float *qkv, float *scratch, int B, int T, int C, int H, int window, float scale);

/* gpu_mpi.c (C, compiled with MPI): whether the MPI library moves CUDA device memory itself. */
extern "C" int gpu_mpi_direct(const backend *be, const char **how);

#endif
