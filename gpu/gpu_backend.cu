/* gpu_backend: the CUDA backend: its kind, instances (device, memory, description, measured GEMM
 * rate) and the table's ops around the kernels of gpu_ops.cu, gpu_matmul.cu and gpu_attention.cu. */
#include "gpu.h"
extern "C" {
#include "base/env.h"
}

/* ---- device ---------------------------------------------------------------------------------- */

static int gpu_device_count(char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    util_snprintf(why, len, "%s", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0) util_snprintf(why, len, "no CUDA device is visible");
  return n;
}

static int gpu_device_bus_id(int device, char *buf, size_t len) {
  if (cudaDeviceGetPCIBusId(buf, (int)len, device) != cudaSuccess) {
    cudaGetLastError();
    buf[0] = '\0';
    return -1;
  }
  return 0;
}

static cublasComputeType_t compute_type(unsigned prec) {
  switch (prec) {
  case BACKEND_PREC_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
  case BACKEND_PREC_BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
  case BACKEND_PREC_FP16: return CUBLAS_COMPUTE_32F_FAST_16F;
  }
  UTIL_CHECK(prec == BACKEND_PREC_FP32, NULL, "internal: precision bit %u", prec);
  return CUBLAS_COMPUTE_32F;
}

void *gpu_workspace(gpu_ctx *g, size_t bytes) {
  if (bytes > g->work_bytes) {
    if (g->work) GPU_CHECK(cudaFree(g->work)); /* waits for the ops that used it */
    cudaError_t e = cudaMalloc(&g->work, bytes);
    if (e != cudaSuccess)
      UTIL_FATAL("lower &training micro_batch_size or seq_len", "CUDA: out of device memory for a %zu-byte workspace: %s",
                 bytes, cudaGetErrorString(e));
    g->work_bytes = bytes;
  }
  return g->work;
}

static void need_device(const gpu_ctx *g) {
  UTIL_CHECK(g->device >= 0, NULL, "internal: an op of a CUDA backend opened for planning only");
}

/* ---- memory ---------------------------------------------------------------------------------- */

static void *gpu_alloc(const backend *be, size_t bytes) {
  need_device(gpu_of(be));
  void *p = NULL;
  size_t n = bytes ? bytes : 256;
  cudaError_t e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    char b[3][32];
    UTIL_FATAL("lower &training micro_batch_size, add pipeline stages, or use &parallel zero_stage = 1 (greenlm "
               "--dry-run prints the memory per rank)",
               "CUDA: cannot allocate %s on GPU %d (%s free of %s): %s", util_fmt_bytes((double)bytes, b[0], 32),
               gpu_of(be)->device, util_fmt_bytes((double)free_b, b[1], 32), util_fmt_bytes((double)total_b, b[2], 32),
               cudaGetErrorString(e));
  }
  GPU_CHECK(cudaMemset(p, 0, n));
  return p;
}

static void gpu_free(const backend *be, void *p) {
  (void)be;
  if (p) GPU_CHECK(cudaFree(p));
}

static void gpu_to_device(const backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) GPU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static void gpu_to_device_async(const backend *be, void *dst, const void *src, size_t bytes) {
  (void)be; /* the default stream, which every op runs on */
  if (bytes) GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0));
}

static void gpu_to_host(const backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) GPU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void gpu_zero(const backend *be, void *p, size_t bytes) {
  (void)be;
  if (bytes) GPU_CHECK(cudaMemset(p, 0, bytes));
}

static void gpu_copy(const backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) GPU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

static void gpu_sync(const backend *be) {
  (void)be;
  GPU_CHECK(cudaDeviceSynchronize());
}

static void *gpu_host_alloc(const backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 64);
  if (e != cudaSuccess)
    UTIL_FATAL("lower the model or batch size in the deck", "CUDA: cannot allocate %zu bytes of pinned host memory: %s",
               bytes, cudaGetErrorString(e));
  return p;
}

static void gpu_host_free(const backend *be, void *p) {
  (void)be;
  if (p) GPU_CHECK(cudaFreeHost(p));
}

static const char *gpu_bus_id(const backend *be) {
  gpu_ctx *g = gpu_of(be);
  if (g->device < 0) return NULL;
  if (!g->bus[0]) {
    if (cudaDeviceGetPCIBusId(g->bus, (int)sizeof g->bus - 4, g->device) != cudaSuccess) {
      cudaGetLastError();
      g->bus[0] = '\0';
      return NULL;
    }
    const char *colon = strchr(g->bus, ':'); /* CUDA writes "0000:3B:00.0"; NVML's form has 8 digits */
    if (colon && colon - g->bus == 4) memmove(g->bus + 4, g->bus, strlen(g->bus) + 1), memcpy(g->bus, "0000", 4);
  }
  return g->bus;
}

static size_t gpu_memory_used(const backend *be) {
  (void)be;
  size_t free_b = 0, total_b = 0;
  GPU_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

static const char *gpu_placement(const backend *be, char *buf, size_t len) {
  int n = 0;
  cudaGetDeviceCount(&n);
  const char *vis = getenv("CUDA_VISIBLE_DEVICES"), *bus = gpu_bus_id(be);
  util_snprintf(buf, len, "GPU %d of %d%s%s%s: %s, PCI %s", gpu_of(be)->device, n, vis ? " (CUDA_VISIBLE_DEVICES=" : "",
                vis ? vis : "", vis ? ")" : "", gpu_of(be)->prop.name, bus ? bus : "unknown");
  return buf;
}

/* ---- the engine ------------------------------------------------------------------------------ */

/* The attention path the instance takes, for the run header and verdict.json. */
static const char *attention_path(const backend *be, char *buf, size_t len) {
  const gpu_ctx *g = gpu_of(be);
  const char *kernels = g->prop.major >= 8 && (g->prec & (BACKEND_PREC_BF16 | BACKEND_PREC_FP16))
                            ? "greenlm's tensor-core kernels at the GEMM precision (head sizes 33-128; fp32 otherwise)"
                            : "greenlm's fp32 kernels";
#ifdef GREENLM_HAVE_CUDNN
  if (!g->sdpa_off[0] && be->storage != BACKEND_FP32) {
    size_t v = gpu_sdpa_version();
    util_snprintf(buf, len, "fused attention: cuDNN %zu.%zu.%zu (%s where it declines a shape)", v / 10000,
                  v / 100 % 100, v % 100, kernels);
    return buf;
  }
#endif
  util_snprintf(buf, len, "fused attention: %s%s%s%s", kernels, g->sdpa_off[0] ? " (cuDNN: " : "", g->sdpa_off,
                g->sdpa_off[0] ? ")" : "");
  return buf;
}

static const char *gpu_describe(const backend *be, char *buf, size_t len) {
  const gpu_ctx *g = gpu_of(be);
  int blas = 0, rt = 0;
  cublasGetVersion(g->blas, &blas);
  cudaRuntimeGetVersion(&rt);
  char mem[32], att[160];
  const char *epi = be->storage == BACKEND_FP32 ? "" : g->lt_off[0] ? ", epilogues in greenlm's kernels"
                                                                    : ", bias and gelu_new in cuBLASLt's epilogues";
  util_snprintf(buf, len, "%s (sm_%d%d, %s), CUDA %d.%d, cuBLAS %d.%d.%d; %s storage, GEMMs %s (fp32 accumulation%s), %s",
                g->prop.name, g->prop.major, g->prop.minor, util_fmt_bytes((double)g->prop.totalGlobalMem, mem, 32),
                rt / 1000, rt % 1000 / 10, blas / 10000, blas / 100 % 100, blas % 100, backend_dtype_name(be->storage),
                g->precision, epi, attention_path(be, att, sizeof att));
  return buf;
}

static void gpu_set_threads(const backend *be, int n) { (void)be, (void)n; /* the device's threads are not the host's */ }

static double gpu_measure_gflops(const backend *be, int n, double seconds) {
  const gpu_ctx *g = gpu_of(be);
  need_device(g);
  if (n < 8192) n = 8192; /* smaller products leave a large GPU partly idle */
  size_t bytes = (size_t)n * n * sizeof(float);
  float *a = (float *)gpu_alloc(be, bytes), *b = (float *)gpu_alloc(be, bytes), *c = (float *)gpu_alloc(be, bytes);
  cudaEvent_t t0, t1;
  GPU_CHECK(cudaEventCreate(&t0));
  GPU_CHECK(cudaEventCreate(&t1));
  /* non-zero operands (0x3c3c3c3c = 0.0115): zeros would draw less power than real data */
  GPU_CHECK(cudaMemset(a, 0x3c, bytes));
  GPU_CHECK(cudaMemset(b, 0x3c, bytes));
  gpu_gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
  double best = 0.0, t_end = util_now() + seconds;
  int reps = 0;
  do {
    GPU_CHECK(cudaEventRecord(t0, 0));
    gpu_gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    GPU_CHECK(cudaEventRecord(t1, 0));
    GPU_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    GPU_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    double g = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e9;
    if (g > best) best = g;
  } while (++reps < 3 || util_now() < t_end);
  GPU_CHECK(cudaEventDestroy(t0));
  GPU_CHECK(cudaEventDestroy(t1));
  gpu_free(be, a);
  gpu_free(be, b);
  gpu_free(be, c);
  return best;
}

/* ---- the table's ops ------------------------------------------------------------------------------ */

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

static void op_embed_fwd(const backend *be, void *o, const int32_t *tok, const void *wte, const void *wpe, int B, int T,
                         int C, int v0, int nv) {
  gpu_embed_fwd(be->storage, o, tok, wte, wpe, B, T, C, v0, nv);
}
static void op_embed_bwd(const backend *be, float *dwte, float *dwpe, const void *d, const int32_t *tok, int B, int T,
                         int C, int v0, int nv) {
  gpu_embed_bwd(gpu_of(be), be->storage, dwte, dwpe, d, tok, B, T, C, v0, nv);
}
static void op_layernorm_fwd(const backend *be, void *o, float *mean, float *rstd, const void *x, const void *w,
                             const void *b, int N, int C, float eps) {
  gpu_layernorm_fwd(be->storage, o, mean, rstd, x, w, b, N, C, eps);
}
static void op_residual_layernorm_fwd(const backend *be, void *res, void *o, float *mean, float *rstd, const void *a,
                                      const void *b, const void *w, const void *bias, int N, int C, float eps) {
  gpu_residual_layernorm_fwd(be->storage, res, o, mean, rstd, a, b, w, bias, N, C, eps);
}
static void op_layernorm_bwd(const backend *be, void *dx, float *dw, float *db, const void *d, const void *x,
                             const void *w, const float *mean, const float *rstd, int N, int C, int acc) {
  gpu_layernorm_bwd(gpu_of(be), be->storage, dx, dw, db, d, x, w, mean, rstd, N, C, acc);
}
static void op_matmul_fwd(const backend *be, void *o, const void *x, const void *w, const void *b, int N, int K, int M,
                          int ldo) {
  gpu_matmul_fwd(gpu_of(be), be->storage, o, x, w, b, N, K, M, ldo);
}
static void op_matmul_bwd(const backend *be, void *dx, float *dw, float *db, const void *d, const void *x, const void *w,
                          int N, int K, int M, int ldo, int acc) {
  gpu_matmul_bwd(gpu_of(be), be->storage, dx, dw, db, d, x, w, N, K, M, ldo, acc);
}

/* At 16-bit storage attention runs in cuDNN where it is built and takes the shape (gpu_sdpa.cu, its
 * workspace within this one); greenlm's kernels compute on fp32 arrays: at 16-bit storage their
 * operands are widened into the workspace, after the attention's own (B,H,T) array, and their
 * outputs rounded back. */
static size_t att_own(int B, int T, int H) { return (gpu_attention_workspace(B, T, H) + 255) / 256 * 256; }
static size_t att_wide(backend_dtype t, int B, int T, int C) {
  return t == BACKEND_FP32 ? 0 : (size_t)8 * B * T * C * sizeof(float); /* dqkv, dout, out, qkv (each qkv row <= 3C) */
}

#ifdef GREENLM_HAVE_CUDNN
/* cuDNN's attention graphs, opened at the first call that wants them; NULL where off */
static gpu_sdpa *sdpa_of(gpu_ctx *g) {
  if (!g->sdpa && !g->sdpa_off[0]) {
    char why[64];
    g->sdpa = gpu_sdpa_open(why, sizeof why);
    if (!g->sdpa) {
      util_snprintf(g->sdpa_off, sizeof g->sdpa_off, "cannot start: %s", why);
      fprintf(stderr, "greenlm: warning: cuDNN %s: greenlm's kernels compute attention\n", g->sdpa_off);
    }
  }
  return g->sdpa;
}
#endif

static void op_attention_fwd(const backend *be, void *o, float *lse, const void *qkv, void *s, int B, int T, int C,
                             int H, int Hkv, int window, float scale) {
  gpu_ctx *g = gpu_of(be);
  const backend_dtype t = be->storage;
  if (t == BACKEND_FP32) {
    gpu_attention_fwd(g, F(o), lse, CF(qkv), F(s), B, T, C, H, Hkv, window, scale);
    return;
  }
#ifdef GREENLM_HAVE_CUDNN
  if (sdpa_of(g) && gpu_sdpa_fwd(g, t, o, lse, qkv, B, T, C, H, Hkv, window, scale)) return;
#endif
  const size_t n = (size_t)B * T * C, nq = (size_t)B * T * backend_qkv_width(C, H, Hkv);
  float *w = (float *)((char *)gpu_workspace(g, att_own(B, T, H) + att_wide(t, B, T, C)) + att_own(B, T, H));
  float *q32 = w, *o32 = w + 3 * n;
  gpu_to_fp32(t, q32, qkv, nq);
  gpu_attention_fwd(g, o32, lse, q32, F(s), B, T, C, H, Hkv, window, scale);
  gpu_to_storage(t, o, o32, n);
}

static void op_attention_bwd(const backend *be, void *dqkv, const void *d, const void *o, const float *lse,
                             const void *qkv, void *s, int B, int T, int C, int H, int Hkv, int window, float scale) {
  gpu_ctx *g = gpu_of(be);
  const backend_dtype t = be->storage;
  if (t == BACKEND_FP32) {
    gpu_attention_bwd(g, F(dqkv), CF(d), CF(o), lse, CF(qkv), F(s), B, T, C, H, Hkv, window, scale);
    return;
  }
#ifdef GREENLM_HAVE_CUDNN
  if (sdpa_of(g) && gpu_sdpa_bwd(g, t, dqkv, d, o, lse, qkv, B, T, C, H, Hkv, window, scale)) return;
#endif
  const size_t n = (size_t)B * T * C, nq = (size_t)B * T * backend_qkv_width(C, H, Hkv);
  float *w = (float *)((char *)gpu_workspace(g, att_own(B, T, H) + att_wide(t, B, T, C)) + att_own(B, T, H));
  float *dq32 = w, *d32 = w + 3 * n, *o32 = w + 4 * n, *q32 = w + 5 * n;
  gpu_to_fp32(t, d32, d, n);
  gpu_to_fp32(t, o32, o, n);
  gpu_to_fp32(t, q32, qkv, nq);
  gpu_attention_bwd(g, dq32, d32, o32, lse, q32, F(s), B, T, C, H, Hkv, window, scale);
  gpu_to_storage(t, dqkv, dq32, nq);
}

static void op_matmul_gelu_fwd(const backend *be, void *o, void *pre, const void *x, const void *w, const void *b, int N,
                               int K, int M, int act) {
  gpu_matmul_gelu_fwd(gpu_of(be), be->storage, o, pre, x, w, b, N, K, M, act);
}
static void op_matmul_dgelu_bwd(const backend *be, void *dpre, float *dw, float *db, const void *d, const void *x,
                                const void *pre, const void *w, int N, int K, int M, int acc, int act) {
  gpu_matmul_dgelu_bwd(gpu_of(be), be->storage, dpre, dw, db, d, x, pre, w, N, K, M, acc, act);
}
static void op_rmsnorm_fwd(const backend *be, void *o, float *rstd, const void *x, const void *w, int N, int C,
                           float eps) {
  gpu_rmsnorm_fwd(be->storage, o, rstd, x, w, N, C, eps);
}
static void op_rmsnorm_bwd(const backend *be, void *dx, float *dw, const void *d, const void *x, const void *w,
                           const float *rstd, int N, int C, int acc) {
  gpu_layernorm_bwd(gpu_of(be), be->storage, dx, dw, NULL, d, x, w, NULL, rstd, N, C, acc);
}
static void op_swiglu_fwd(const backend *be, void *h, const void *gu, int N, int F) {
  gpu_swiglu(be->storage, h, NULL, NULL, gu, N, F);
}
static void op_swiglu_bwd(const backend *be, void *dgu, const void *dh, const void *gu, int N, int F) {
  gpu_swiglu(be->storage, NULL, dgu, dh, gu, N, F);
}
static void op_rope(const backend *be, void *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot,
                    const backend_rope *rope, int sign) {
  gpu_rope(be->storage, qkv, pos, N, T, C, H, Hkv, rot, rope, sign);
}
static void op_residual_fwd(const backend *be, void *o, const void *a, const void *b, size_t n) {
  gpu_residual_fwd(be->storage, o, a, b, n);
}
static void op_accumulate(const backend *be, void *dst, const void *src, size_t n) {
  gpu_accumulate(be->storage, dst, src, n);
}
static void op_xent_fwd_bwd(const backend *be, float *losses, void *logits, const int32_t *tgt, int N, int V, int ld,
                            float ds) {
  gpu_xent_fwd_bwd(be->storage, losses, logits, tgt, N, V, ld, ds);
}
static void op_xent_part(const backend *be, float *part, const void *logits, const int32_t *tgt, int N, int nv, int v0,
                         int ld) {
  gpu_xent_part(be->storage, part, logits, tgt, N, nv, v0, ld);
}
static void op_xent_grad(const backend *be, void *logits, const float *lse, const int32_t *tgt, int N, int nv, int v0,
                         int ld, float ds) {
  gpu_xent_grad(be->storage, logits, lse, tgt, N, nv, v0, ld, ds);
}
static void op_adamw(const backend *be, float *p, void *pc, const float *g, float *m, float *v, size_t n,
                     const backend_adamw_args *a) {
  gpu_adamw(be->storage, p, pc, g, m, v, n, a);
}
static void op_reduce_sum(const backend *be, double *acc, const float *x, size_t n, int square) {
  gpu_reduce_sum(gpu_of(be), acc, x, n, square);
}
static void op_quant_encode(const backend *be, uint8_t *msg, float *v, float *ef, const quant_seg *seg, int nseg,
                            const quant_scheme *q, uint64_t key) {
  (void)be;
  gpu_quant_encode(msg, v, ef, seg, nseg, q, key);
}
static void op_quant_decode(const backend *be, float *out, const uint8_t *msg, size_t base, const quant_seg *seg,
                            int nseg, const quant_scheme *q, int add) {
  (void)be;
  gpu_quant_decode(out, msg, base, seg, nseg, q, add);
}
static void op_lowrank_left(const backend *be, float *P, float *M, float *ef, const float *Q, size_t n, size_t m, int r) {
  (void)be;
  gpu_lowrank_left(P, M, ef, Q, n, m, r);
}
static void op_lowrank_right(const backend *be, float *Q, const float *M, const float *P, size_t n, size_t m, int r) {
  (void)be;
  gpu_lowrank_right(Q, M, P, n, m, r);
}
static void op_lowrank_orth(const backend *be, float *P, size_t n, int r) {
  (void)be;
  gpu_lowrank_orth(P, n, r);
}
static void op_lowrank_expand(const backend *be, float *M, const float *P, const float *Q, size_t n, size_t m, int r,
                              int sub) {
  (void)be;
  gpu_lowrank_expand(M, P, Q, n, m, r, sub);
}
static void op_to_storage(const backend *be, void *dst, const float *src, size_t n) {
  gpu_to_storage(be->storage, dst, src, n);
}
static void op_to_fp32(const backend *be, float *dst, const void *src, size_t n) { gpu_to_fp32(be->storage, dst, src, n); }
static void op_kv_store(const backend *be, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos,
                        int N, int C, int Ckv, int ring) {
  gpu_kv_store(be->storage, kc, vc, qkv, seq, pos, N, C, Ckv, ring);
}
static void op_attention_cached(const backend *be, void *o, const void *qkv, const void *kc, const void *vc,
                                const int32_t *seq, const int32_t *pos, int N, int C, int H, int Hkv, int ring,
                                int window, float scale) {
  gpu_attention_cached(be->storage, o, qkv, kc, vc, seq, pos, N, C, H, Hkv, ring, window, scale);
}

/* ---- planning, instances, the kind ------------------------------------------------------------------ */

static size_t gpu_scratch(const backend *be, int T) {
  (void)be;
  return gpu_attention_scratch(T);
}

/* The largest of one op's needs: attention's, the norm's partial sums, the embedding backward's sort,
 * the LayerNorm backward's partial sums, cuBLASLt's at 16-bit storage. */
static size_t scratch_bytes(const backend *be, const backend_shape *s) {
  const int N = s->B * s->T;
  size_t need[5] = {att_own(s->B, s->T, s->H) + att_wide(be->storage, s->B, s->T, s->C), gpu_sum_workspace(),
                    gpu_embed_workspace(N), gpu_layernorm_workspace(N, s->C),
                    be->storage != BACKEND_FP32 && !gpu_of(be)->lt_off[0] ? (size_t)GPU_LT_WORKSPACE : 0};
  size_t most = 0;
  for (int i = 0; i < 5; i++) most = need[i] > most ? need[i] : most;
  return most;
}

/* that scratch and the bias gradients' vector of ones (one per row) */
static size_t gpu_workspace_bytes(const backend *be, const backend_shape *s) {
  return scratch_bytes(be, s) + gpu_ones_bytes(be->storage, s->B * s->T);
}

static void gpu_prepare(const backend *be, const backend_shape *s) {
  gpu_ctx *g = gpu_of(be);
  if (g->device < 0) return;
  gpu_workspace(g, scratch_bytes(be, s));
  gpu_ones_prepare(g, be->storage, s->B * s->T);
}

static void gpu_close(backend *be) {
  gpu_ctx *g = gpu_of(be);
  if (g->device >= 0) {
    if (g->work) GPU_CHECK(cudaFree(g->work));
#ifdef GREENLM_HAVE_CUDNN
    gpu_sdpa_close(g->sdpa);
#endif
    gpu_lt_close(g);
    if (g->ones) GPU_CHECK(cudaFree(g->ones));
    GPU_BLAS(cublasDestroy(g->blas));
  }
  delete g;
  free(be);
}

static backend_caps gpu_caps(void) {
  backend_caps c;
  memset(&c, 0, sizeof c);
  c.precisions = BACKEND_PREC_FP32 | BACKEND_PREC_TF32 | BACKEND_PREC_BF16 | BACKEND_PREC_FP16;
  /* the bf16 and fp16 storage kernels are built (and compiled for sm_70 to sm_90), and the parity
   * program tests them (it sets an instance's storage itself), but runs store fp32 until that
   * program has passed on a GPU */
  c.storage = 1u << BACKEND_FP32;
  c.host_memory = 0;
  c.devices = 1;
  gpu_attention_limits(&c.max_head_size, &c.max_heads, &c.max_batch);
  c.attention =
#ifdef GREENLM_HAVE_CUDNN
      "cuDNN's fused attention at bf16 and fp16 storage (GREENLM_ATTENTION=kernels: greenlm's); "
#endif
      "fused fp32 kernels; tensor-core (WMMA) kernels at bf16 and fp16 precision on sm_80+ (16-bit "
      "storage widened to fp32 around them)";
  return c;
}

/* GREENLM_ATTENTION and GREENLM_EPILOGUES: whether greenlm's kernels replace a library's path. */
static bool env_kernels(const char *name) {
  const int kernels = env_auto_kernels(name);
  if (kernels < 0)
    UTIL_FATAL("set it to auto or kernels, or unset it", "%s='%s' names no path", name, getenv(name));
  return kernels;
}

/* At 16-bit storage attention runs in cuDNN where the build has it (GREENLM_ATTENTION=auto, its
 * handle opened at the first such call: fp32 runs never load it) and the GEMMs' epilogues in
 * cuBLASLt (GREENLM_EPILOGUES=auto, likewise); kernels keeps greenlm's own (the parity program
 * checks both). g->sdpa_off and g->lt_off say why a library is not used. */
static void open_libraries(gpu_ctx *g) {
  if (env_kernels("GREENLM_EPILOGUES")) util_strlcpy(g->lt_off, "off by GREENLM_EPILOGUES=kernels", sizeof g->lt_off);
  if (env_kernels("GREENLM_ATTENTION")) {
    util_strlcpy(g->sdpa_off, "off by GREENLM_ATTENTION=kernels", sizeof g->sdpa_off);
    return;
  }
#ifndef GREENLM_HAVE_CUDNN
  util_strlcpy(g->sdpa_off, "not built in", sizeof g->sdpa_off);
#endif
}

#define GPU_OP_SET(name, params, args) be->name = op_##name;

static backend *gpu_open(int device, const char *precision) {
  gpu_ctx *g = new gpu_ctx();
  util_strlcpy(g->precision, precision, sizeof g->precision);
  g->prec = backend_precision_bit(precision);
  g->compute = compute_type(g->prec);
  if (device >= 0) {
    GPU_CHECK(cudaSetDevice(device));
    GPU_CHECK(cudaFree(0)); /* create the context now, not in the first timed op */
    GPU_CHECK(cudaGetDeviceProperties(&g->prop, device));
    GPU_BLAS(cublasCreate(&g->blas));
    /* fp32 mode is plain fp32: no tensor-core shortcut unless the precision asks for one */
    GPU_BLAS(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
    g->device = device;
    open_libraries(g);
  }
  backend *be = (backend *)util_calloc(1, sizeof *be, "backend");
  be->name = "cuda";
  be->caps = gpu_caps();
  /* this device's: bf16 and tf32 need sm_80 (the V100, sm_70, has fp16 tensor cores only) */
  if (device >= 0 && g->prop.major < 8) be->caps.precisions &= ~(unsigned)(BACKEND_PREC_BF16 | BACKEND_PREC_TF32);
  backend_dtype want = backend_precision_storage(precision);
  be->storage = be->caps.storage & (1u << want) ? want : BACKEND_FP32;
  util_strlcpy(be->precision, precision, sizeof be->precision);
  be->ctx = g;
  be->alloc = gpu_alloc;
  be->free = gpu_free;
  be->to_device = gpu_to_device;
  be->to_device_async = gpu_to_device_async;
  be->to_host = gpu_to_host;
  be->zero = gpu_zero;
  be->copy = gpu_copy;
  be->sync = gpu_sync;
  be->host_alloc = gpu_host_alloc;
  be->host_free = gpu_host_free;
  be->bus_id = gpu_bus_id;
  be->placement = gpu_placement;
  be->device_memory_used = gpu_memory_used;
  be->describe = gpu_describe;
  be->set_threads = gpu_set_threads;
  be->measure_gflops = gpu_measure_gflops;
  be->mpi_direct = gpu_mpi_direct;
  be->attention_scratch = gpu_scratch;
  be->workspace_bytes = gpu_workspace_bytes;
  be->prepare = gpu_prepare;
  be->close = gpu_close;
  BACKEND_OPS(GPU_OP_SET)
  return be;
}

static backend_kind make_kind(void) {
  backend_kind k;
  memset(&k, 0, sizeof k);
  k.name = "cuda";
  k.caps = gpu_caps;
  k.devices = gpu_device_count;
  k.device_bus_id = gpu_device_bus_id;
  k.open = gpu_open;
  return k;
}

extern "C" const backend_kind backend_kind_cuda = make_kind();
