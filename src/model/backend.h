/* backend: the table of memory operations and tensor ops that every compute backend provides.
 *
 * Model code never touches tensor elements: it calls these ops on backend memory (host memory
 * for the CPU backend, device memory for GPU backends). cpu/ is always built; it is the
 * reference every other backend is tested against.
 *
 * Shapes in comments: B batch, T sequence, C channels, H heads, V vocabulary, N rows (= B*T).
 * All tensors are row-major float32 unless noted; token ids are int32.
 * Accumulating outputs are marked "+=": they are added to, never overwritten. */
#ifndef GREENLM_BACKEND_H
#define GREENLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* gpu/ is CUDA C++ */
#endif

typedef struct {
  float lr;           /* learning rate of this step */
  float beta1, beta2; /* moment decays */
  float eps;
  float weight_decay; /* decoupled: p -= lr * weight_decay * p */
  float grad_scale;   /* gradients are multiplied by this first (clipping) */
  int step;           /* 1-based step, for bias correction */
} backend_adamw_args;

typedef struct backend {
  const char *name;
  int host_memory; /* backend memory is ordinary host memory (no staging needed for I/O) */

  /* ---- memory ---- */
  void *(*alloc)(size_t bytes); /* zero-filled */
  void (*free)(void *p);
  void (*to_device)(void *dst, const void *src, size_t bytes);
  void (*to_host)(void *dst, const void *src, size_t bytes);
  void (*zero)(void *p, size_t bytes);
  void (*copy)(void *dst, const void *src, size_t bytes); /* within backend memory */
  void (*sync)(void);
  /* PCI bus id ("00000000:3B:00.0") of the device this rank computes on, for the energy sensors;
   * NULL (the function or its result) where there is none, as on the CPU backend. */
  const char *(*bus_id)(void);
  /* Host memory that copies to and from backend memory fast (pinned for a GPU): MPI staging. */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  /* The device this rank computes on, for the topology summary ("GPU 1 of 4: NVIDIA H200, PCI
   * 00000000:3B:00.0"), into buf; NULL (the function) on the CPU backend. */
  const char *(*placement)(char *buf, size_t len);

  /* ---- the engine ---- */
  /* One line naming what computes (library, kernel set, threads) into buf. */
  const char *(*describe)(char *buf, size_t len);
  /* Threads the backend's math library may use per rank (0 leaves the library's default). */
  void (*set_threads)(int n);
  /* Measured GEMM rate in GFLOP/s at the backend's GEMM precision (fp32 on the CPU): best of
   * repeated n x n x n products over `seconds` (a GPU uses n >= 8192 to approach its peak). */
  double (*measure_gflops)(int n, double seconds);

  /* ---- ops ---- */
  /* out (B,T,C) = wte[tok[b,t]] + wpe[t];  tok (B,T), wte (V,C), wpe (>=T,C) */
  void (*embed_fwd)(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C);
  /* dwte[tok[b,t]] += dout[b,t];  dwpe[t] += sum_b dout[b,t] */
  void (*embed_bwd)(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C);

  /* out (N,C) = (inp - mean) * rstd * w + b;  mean, rstd (N) saved for the backward */
  void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                        int N, int C, float eps);
  /* dinp (N,C) +=, dw (C) +=, db (C) += */
  void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                        const float *mean, const float *rstd, int N, int C);

  /* out (N,M) = inp (N,K) @ w(M,K)^T + bias (M); bias may be NULL */
  void (*matmul_fwd)(float *out, const float *inp, const float *w, const float *bias, int N, int K, int M);
  /* dinp (N,K) = dout (N,M) @ w (overwritten; skipped when NULL);
   * dw (M,K) += dout^T @ inp;  dbias (M) += column sums of dout (skipped when NULL) */
  void (*matmul_bwd)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                     int N, int K, int M);

  /* Causal self-attention on qkv (B,T,3C) = [q | k | v], head h in columns h*C/H..(h+1)*C/H of each.
   * window <= 0: global (query i sees keys j <= i); else local (i - window < j <= i).
   * out (B,T,C) = softmax(scale * q k^T) v per head; lse (B,H,T) the log-sum-exp of each row.
   * scratch: attention_scratch(T) bytes of backend memory. */
  size_t (*attention_scratch)(int T);
  void (*attention_fwd)(float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H,
                        int window, float scale);
  /* dqkv (B,T,3C) = gradient w.r.t. qkv (overwritten), from dout (B,T,C) and the forward's out, lse */
  void (*attention_bwd)(float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv,
                        float *scratch, int B, int T, int C, int H, int window, float scale);

  /* out (n) = gelu_new(inp) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  void (*gelu_fwd)(float *out, const float *inp, size_t n);
  /* dinp (n) = dout * gelu_new'(inp); dinp may alias dout */
  void (*gelu_bwd)(float *dinp, const float *dout, const float *inp, size_t n);

  /* out (n) = a + b (the residual connection; its backward is accumulate) */
  void (*residual_fwd)(float *out, const float *a, const float *b, size_t n);
  /* dst (n) += src */
  void (*accumulate)(float *dst, const float *src, size_t n);

  /* Fused softmax + cross-entropy over logits (N,V) with targets (N):
   * losses (N) = logsumexp(logits[i]) - logits[i, targets[i]].
   * The logits are overwritten: when dscale != 0 with dscale * (softmax - onehot(target)), the
   * gradient of dscale * sum(losses); otherwise with scratch values. */
  void (*xent_fwd_bwd)(float *losses, float *logits, const int32_t *targets, int N, int V, float dscale);

  /* AdamW on n parameters p with gradients g and moments m, v (PyTorch's formulation). */
  void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, const backend_adamw_args *a);
  /* Sum of squares of x (n), accumulated in double; the result lands in host memory. */
  double (*sumsq)(const float *x, size_t n);
} backend;

/* The CPU backend (cpu/): OpenBLAS GEMMs and plain C kernels. */
const backend *backend_cpu(void);

#ifdef GREENLM_HAVE_CUDA /* config.h: built with ./configure --with-cuda */
/* The CUDA backend (gpu/): cuBLAS GEMMs and CUDA kernels on the device gpu_open chose. The table
 * may be read before a device is opened (the dry run plans memory with it); its ops may not. */
const backend *backend_cuda(void);
/* CUDA devices this process may use (CUDA_VISIBLE_DEVICES applies); 0 when there are none or no
 * usable driver, with the reason in why. */
int gpu_device_count(char *why, size_t len);
/* PCI bus id of visible device `device` as CUDA writes it ("0000:3B:00.0"); 0, or -1 with "". */
int gpu_device_bus_id(int device, char *buf, size_t len);
/* Make device `device` this process's device and set the GEMM precision ("fp32", "tf32", "bf16"
 * or "fp16"). Errors are fatal. Called again (with the same device) it changes the precision. */
void gpu_open(int device, const char *precision);
#endif

#ifdef __cplusplus
}
#endif

#endif
