/* gpu: the CUDA backend's internals, shared by the .cu files of gpu/ (CUDA C++).
 *
 * An instance's context (gpu_ctx: device, cuBLAS handle, compute type, workspace) is passed to the
 * functions that need it; the device is made current when the instance opens (one device per
 * process). Every kernel and cuBLAS call runs on the legacy default stream, so the ops run in the
 * order they are called and a copy to the host waits for them. Activations and the parameters'
 * compute copy are stored in the instance's storage type (fp32, or bf16 and fp16 at those
 * precisions); master parameters, gradients and AdamW moments in fp32. Kernels compute in fp32.
 * Errors are fatal, with the failing call, its place and a hint (util_fatal_at). */
#ifndef GREENLM_GPU_H
#define GREENLM_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

struct gpu_sdpa; /* cuDNN's attention graphs (gpu_sdpa.cu) */
struct gpu_lt;   /* cuBLASLt's handle and GEMM plans (gpu_lt.cu) */

typedef struct gpu_ctx {
  int device = -1;              /* CUDA device index (among the visible ones); -1: planning only */
  cudaDeviceProp prop;
  cublasHandle_t blas;
  cublasComputeType_t compute;  /* of the GEMMs, from the precision */
  char precision[8];            /* "fp32", "tf32", "bf16" or "fp16" */
  unsigned prec;                /* its BACKEND_PREC_* bit */
  void *work;                   /* the workspace (attention's D, the norm's partial sums) */
  size_t work_bytes;
  char bus[32];                 /* PCI bus id in NVML's form, once asked */
  gpu_sdpa *sdpa = nullptr;     /* cuDNN attention at 16-bit storage; NULL: greenlm's kernels only */
  char sdpa_off[96] = "";       /* why it is off, for the header */
  gpu_lt *lt = nullptr;         /* GEMM epilogues at 16-bit storage, started at the first such GEMM */
  char lt_off[96] = "";         /* why they are off, for the header */
  void *ones = nullptr;         /* ones_n ones in storage type ones_type: the bias gradients' GEMV */
  size_t ones_n = 0;
  int ones_type = -1;
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

/* ---- storage types ------------------------------------------------------------------------------- */

/* Activations are stored as S = float, __nv_bfloat16 or __half (be->storage); kernels load them
 * into fp32 (ld), compute in fp32 and round once on store (st<S>, to nearest even). */
__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ld(__half x) { return __half2float(x); }
template <typename S>
__device__ __forceinline__ S st(float x);
template <>
__device__ __forceinline__ float st<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half st<__half>(float x) {
  return __float2half_rn(x);
}

/* W consecutive elements of storage type S, widened to fp32 or rounded from it: one at a time (W = 1)
 * or 16 bytes' worth (W = gpu_vec<S>()) in one 128-bit access, p then 16-byte aligned. */
template <typename S>
__host__ __device__ constexpr int gpu_vec() {
  return 16 / (int)sizeof(S);
}
template <int W, typename S>
__device__ __forceinline__ void gpu_load(float *f, const S *p) {
  if constexpr (W == 1) {
    f[0] = ld(p[0]);
  } else {
    static_assert(W * sizeof(S) == 16, "a 128-bit access");
    int4 r = *(const int4 *)p;
    const S *e = (const S *)&r;
    for (int k = 0; k < W; k++) f[k] = ld(e[k]);
  }
}
template <int W, typename S>
__device__ __forceinline__ void gpu_store(S *p, const float *f) {
  if constexpr (W == 1) {
    p[0] = st<S>(f[0]);
  } else {
    static_assert(W * sizeof(S) == 16, "a 128-bit access");
    int4 r;
    S *e = (S *)&r;
    for (int k = 0; k < W; k++) e[k] = st<S>(f[k]);
    *(int4 *)p = r;
  }
}
static inline bool gpu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Run STMT with S the element type of storage type t: GPU_STORAGE(t, kernel<S><<<...>>>(...)). */
#define GPU_STORAGE(t, ...)                                                                                            \
  do {                                                                                                                 \
    if ((t) == BACKEND_BF16) {                                                                                         \
      typedef __nv_bfloat16 S;                                                                                         \
      __VA_ARGS__;                                                                                                     \
    } else if ((t) == BACKEND_FP16) {                                                                                  \
      typedef __half S;                                                                                                \
      __VA_ARGS__;                                                                                                     \
    } else {                                                                                                           \
      typedef float S;                                                                                                 \
      __VA_ARGS__;                                                                                                     \
    }                                                                                                                  \
  } while (0)

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

/* gpu_ops.cu: S arrays (void *) are in storage type t */
/* embed: wte, dwte hold the vocabulary rows [v0, v0 + nv); wpe, dwpe may be NULL (backend.h) */
void gpu_embed_fwd(backend_dtype t, void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T, int C,
                   int v0, int nv);
/* without atomics: the rows sorted by token in gpu_embed_workspace(B * T) bytes of the workspace */
void gpu_embed_bwd(gpu_ctx *g, backend_dtype t, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B,
                   int T, int C, int v0, int nv);
size_t gpu_embed_workspace(int N);
void gpu_layernorm_fwd(backend_dtype t, void *out, float *mean, float *rstd, const void *inp, const void *w,
                       const void *b, int N, int C, float eps);
/* res (N,C) = a + b, then out = LayerNorm(res as stored) (backend.h); a = b = NULL: res is the input */
void gpu_residual_layernorm_fwd(backend_dtype t, void *res, void *out, float *mean, float *rstd, const void *a,
                                const void *b, const void *w, const void *bias, int N, int C, float eps);
/* dw, db through partial sums over chunks of rows in gpu_layernorm_workspace(N, C) bytes of the workspace; added
 * to dw, db when acc, else written. mean and db NULL: RMSNorm's backward (rmsnorm_bwd) */
void gpu_layernorm_bwd(gpu_ctx *g, backend_dtype t, void *dinp, float *dw, float *db, const void *dout,
                       const void *inp, const void *w, const float *mean, const float *rstd, int N, int C, int acc);
size_t gpu_layernorm_workspace(int N, int C);
/* rmsnorm_fwd (backend.h); its backward is gpu_layernorm_bwd with mean and db NULL */
void gpu_rmsnorm_fwd(backend_dtype t, void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps);
/* h NULL: swiglu_bwd's dgu from dh; else swiglu_fwd's h (dgu, dh unused) (backend.h) */
void gpu_swiglu(backend_dtype t, void *h, void *dgu, const void *dh, const void *gu, int N, int F);
/* act: backend_act */
void gpu_gelu_fwd(backend_dtype t, void *out, const void *inp, size_t n, int act);
void gpu_gelu_bwd(backend_dtype t, void *dinp, const void *dout, const void *inp, size_t n, int act);
/* the rope op (backend.h) on qkv (N,C+2Ckv) in place; pos device memory or NULL */
void gpu_rope(backend_dtype t, void *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot,
              const backend_rope *rope, int sign);
void gpu_residual_fwd(backend_dtype t, void *out, const void *a, const void *b, size_t n);
void gpu_accumulate(backend_dtype t, void *dst, const void *src, size_t n);
/* logits' rows ldr apart (backend.h's ld) */
void gpu_xent_fwd_bwd(backend_dtype t, float *losses, void *logits, const int32_t *targets, int N, int V, int ldr,
                      float dscale);
/* the vocabulary-parallel cross-entropy over logits (N,nv), the columns [v0, v0 + nv) (backend.h) */
void gpu_xent_part(backend_dtype t, float *part, const void *logits, const int32_t *targets, int N, int nv, int v0,
                   int ldr);
void gpu_xent_grad(backend_dtype t, void *logits, const float *lse, const int32_t *targets, int N, int nv, int v0,
                   int ldr, float dscale);
/* AdamW on the fp32 master p; pc (n, storage type t) receives the rounded update unless NULL */
void gpu_adamw(backend_dtype t, float *p, void *pc, const float *g, float *m, float *v, size_t n,
               const backend_adamw_args *a);
/* The compressed exchange's ops (gpu_quant.cu): see quant_encode and quant_decode in backend.h. */
void gpu_quant_encode(uint8_t *msg, float *v, float *ef, const quant_seg *seg, int nseg, const quant_scheme *q,
                      uint64_t key);
void gpu_quant_decode(float *out, const uint8_t *msg, size_t base, const quant_seg *seg, int nseg, const quant_scheme *q,
                      int add);
/* PowerSGD's factors (gpu_quant.cu): see lowrank_left, lowrank_right, lowrank_orth and lowrank_expand in backend.h. */
void gpu_lowrank_left(float *P, float *M, const float *ef, const float *Q, size_t n, size_t m, int r);
void gpu_lowrank_right(float *Q, const float *M, const float *P, size_t n, size_t m, int r);
void gpu_lowrank_orth(float *P, size_t n, int r);
void gpu_lowrank_expand(float *M, const float *P, const float *Q, size_t n, size_t m, int r, int sub);
/* *acc (device) += the sum of x (of its squares), block sums in gpu_sum_workspace() bytes of the workspace */
size_t gpu_sum_workspace(void);
void gpu_reduce_sum(gpu_ctx *g, double *acc, const float *x, size_t n, int square);
/* dst (n, type t) = src (fp32) rounded; dst (fp32) = src (n, type t) */
void gpu_to_storage(backend_dtype t, void *dst, const float *src, size_t n);
void gpu_to_fp32(backend_dtype t, float *dst, const void *src, size_t n);

/* gpu_matmul.cu: activations and weights in storage type t, weight and bias gradients fp32; out's and
 * dout's rows ldo >= M elements apart */
void gpu_matmul_fwd(gpu_ctx *g, backend_dtype t, void *out, const void *inp, const void *w, const void *bias, int N,
                    int K, int M, int ldo);
/* dw, dbias: beta = 1 when acc, 0 (overwritten) otherwise */
void gpu_matmul_bwd(gpu_ctx *g, backend_dtype t, void *dinp, float *dw, float *dbias, const void *dout,
                    const void *inp, const void *w, int N, int K, int M, int ldo, int acc);
/* the MLP's fused pair (backend.h): the epilogues in cuBLASLt at 16-bit storage where it takes the
 * shape and the activation is gelu_new (cuBLASLt's GELU is the tanh form), else a GEMM and greenlm's gelu kernels */
void gpu_matmul_gelu_fwd(gpu_ctx *g, backend_dtype t, void *out, void *pre, const void *inp, const void *w,
                         const void *bias, int N, int K, int M, int act);
void gpu_matmul_dgelu_bwd(gpu_ctx *g, backend_dtype t, void *dpre, float *dw, float *dbias, const void *dout,
                          const void *inp, const void *pre, const void *w, int N, int K, int M, int acc, int act);
/* The bias gradients' vector of N ones in storage type t: its bytes (planned beside the workspace),
 * and its allocation by prepare. */
size_t gpu_ones_bytes(backend_dtype t, int N);
void gpu_ones_prepare(gpu_ctx *g, backend_dtype t, int N);
/* C (m,n column-major, ldc) = alpha op(A) op(B) + beta C in fp32 storage at the GEMM precision. */
void gpu_gemm(const gpu_ctx *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* gpu_lt.cu: one GEMM in column-major terms, D (m,n; ldd) = op(A) op(B) with an epilogue, A, B, D (and
 * bias, aux) in 16-bit storage type t, fp32 accumulation. Returns false, having done nothing, where
 * the instance's cuBLASLt is off or declines the shape; the caller then computes it otherwise. */
enum { GPU_LT_WORKSPACE = 32 << 20 }; /* bytes: NVIDIA's advice for Hopper */
typedef struct {
  cublasOperation_t ta, tb;
  int m, n, k;
  const void *A;
  int lda;
  const void *B;
  int ldb;
  void *D;
  int ldd;
  cublasLtEpilogue_t epilogue; /* _BIAS, _GELU_AUX, _GELU_AUX_BIAS or _DGELU */
  const void *bias;            /* (m), for the _BIAS ones */
  void *aux;                   /* the pre-activation (m,n; ldaux, a multiple of 8): written by _GELU_AUX*, read by _DGELU */
  int ldaux;
} gpu_lt_args;
bool gpu_lt_gemm(gpu_ctx *g, backend_dtype t, const gpu_lt_args *a);
void gpu_lt_close(gpu_ctx *g);

/* gpu_attention.cu */
/* The attention kernels' limits: the largest head size, heads per call and sequences per call. */
void gpu_attention_limits(int *head_size, int *heads, int *batch);
size_t gpu_attention_scratch(int T);
size_t gpu_attention_workspace(int B, int T, int H);
void gpu_attention_fwd(gpu_ctx *g, float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H,
                       int Hkv, int window, float scale);
void gpu_attention_bwd(gpu_ctx *g, float *dqkv, const float *dout, const float *out, const float *lse,
                       const float *qkv, float *scratch, int B, int T, int C, int H, int Hkv, int window, float scale);

/* gpu_attention.cu: the KV cache of generation; S arrays in storage type t, seq and pos device int32 */
void gpu_kv_store(backend_dtype t, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos, int N,
                  int C, int Ckv, int ring);
void gpu_attention_cached(backend_dtype t, void *out, const void *qkv, const void *kc, const void *vc,
                          const int32_t *seq, const int32_t *pos, int N, int C, int H, int Hkv, int ring,
                          int window, float scale);

#ifdef GREENLM_HAVE_CUDNN
/* gpu_sdpa.cu: attention_fwd/bwd through cuDNN's fused attention, arrays in 16-bit storage type t
 * (the contract of backend.h). Each returns false, having done nothing, where cuDNN declines the
 * shape (said once on stderr); the caller then runs gpu_attention_fwd/bwd. */
gpu_sdpa *gpu_sdpa_open(char *why, size_t len); /* NULL, with the reason in why, where cuDNN cannot start */
void gpu_sdpa_close(gpu_sdpa *s);
size_t gpu_sdpa_version(void); /* cudnnGetVersion(): 91900 for 9.19.0 */
bool gpu_sdpa_fwd(gpu_ctx *g, backend_dtype t, void *out, float *lse, const void *qkv, int B, int T, int C, int H,
                  int Hkv, int window, float scale);
bool gpu_sdpa_bwd(gpu_ctx *g, backend_dtype t, void *dqkv, const void *dout, const void *out, const float *lse,
                  const void *qkv, int B, int T, int C, int H, int Hkv, int window, float scale);
#endif

/* gpu_mpi.c (C, compiled with MPI): whether the MPI library moves CUDA device memory itself. */
extern "C" int gpu_mpi_direct(const backend *be, const char **how);

#endif
