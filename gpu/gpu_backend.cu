/* gpu_backend: the CUDA backend table: device choice, memory, description, measured GEMM rate. */
#include "gpu.h"

gpu_state gpu;

/* ---- device ---------------------------------------------------------------------------------- */

extern "C" int gpu_device_count(char *why, size_t len) {
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

extern "C" int gpu_device_bus_id(int device, char *buf, size_t len) {
  if (cudaDeviceGetPCIBusId(buf, (int)len, device) != cudaSuccess) {
    cudaGetLastError();
    buf[0] = '\0';
    return -1;
  }
  return 0;
}

static cublasComputeType_t compute_type(const char *precision) {
  if (strcmp(precision, "tf32") == 0) return CUBLAS_COMPUTE_32F_FAST_TF32;
  if (strcmp(precision, "bf16") == 0) return CUBLAS_COMPUTE_32F_FAST_16BF;
  if (strcmp(precision, "fp16") == 0) return CUBLAS_COMPUTE_32F_FAST_16F;
  UTIL_CHECK(strcmp(precision, "fp32") == 0, NULL, "internal: precision '%s'", precision);
  return CUBLAS_COMPUTE_32F;
}

extern "C" void gpu_open(int device, const char *precision) {
  if (gpu.device >= 0) { /* again (the parity test): only the precision may change */
    UTIL_CHECK(device == gpu.device, NULL, "internal: gpu_open of GPU %d after GPU %d", device, gpu.device);
    gpu.compute = compute_type(precision);
    util_strlcpy(gpu.precision, precision, sizeof gpu.precision);
    return;
  }
  GPU_CHECK(cudaSetDevice(device));
  GPU_CHECK(cudaFree(0)); /* create the context now, not in the first timed op */
  GPU_CHECK(cudaGetDeviceProperties(&gpu.prop, device));
  GPU_BLAS(cublasCreate(&gpu.blas));
  /* fp32 mode is plain fp32: no tensor-core shortcut unless the precision asks for one */
  GPU_BLAS(cublasSetMathMode(gpu.blas, CUBLAS_DEFAULT_MATH));
  gpu.compute = compute_type(precision);
  util_strlcpy(gpu.precision, precision, sizeof gpu.precision);
  gpu.device = device;
}

static void need_device(void) {
  UTIL_CHECK(gpu.device >= 0, NULL, "internal: CUDA backend op before gpu_open");
}

void *gpu_workspace(size_t bytes) {
  if (bytes > gpu.work_bytes) {
    if (gpu.work) GPU_CHECK(cudaFree(gpu.work)); /* waits for the ops that used it */
    size_t n = bytes + bytes / 4;
    cudaError_t e = cudaMalloc(&gpu.work, n);
    if (e != cudaSuccess)
      UTIL_FATAL("lower &training micro_batch_size or seq_len", "CUDA: out of device memory for a %zu-byte workspace: %s",
                 n, cudaGetErrorString(e));
    gpu.work_bytes = n;
  }
  return gpu.work;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static void *gpu_alloc(size_t bytes) {
  need_device();
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
               gpu.device, util_fmt_bytes((double)free_b, b[1], 32), util_fmt_bytes((double)total_b, b[2], 32),
               cudaGetErrorString(e));
  }
  GPU_CHECK(cudaMemset(p, 0, n));
  return p;
}

static void gpu_free(void *p) {
  if (p) GPU_CHECK(cudaFree(p));
}

static void gpu_to_device(void *dst, const void *src, size_t bytes) {
  if (bytes) GPU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static void gpu_to_host(void *dst, const void *src, size_t bytes) {
  if (bytes) GPU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void gpu_zero(void *p, size_t bytes) {
  if (bytes) GPU_CHECK(cudaMemset(p, 0, bytes));
}

static void gpu_copy(void *dst, const void *src, size_t bytes) {
  if (bytes) GPU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

static void gpu_sync(void) { GPU_CHECK(cudaDeviceSynchronize()); }

static void *gpu_host_alloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 64);
  if (e != cudaSuccess)
    UTIL_FATAL("lower the model or batch size in the deck", "CUDA: cannot allocate %zu bytes of pinned host memory: %s",
               bytes, cudaGetErrorString(e));
  return p;
}

static void gpu_host_free(void *p) {
  if (p) GPU_CHECK(cudaFreeHost(p));
}

static const char *gpu_bus_id(void) {
  static char id[32];
  if (gpu.device < 0) return NULL;
  if (!id[0]) {
    if (cudaDeviceGetPCIBusId(id, (int)sizeof id - 4, gpu.device) != cudaSuccess) {
      cudaGetLastError();
      id[0] = '\0';
      return NULL;
    }
    const char *colon = strchr(id, ':'); /* CUDA writes "0000:3B:00.0"; NVML's form has 8 digits */
    if (colon && colon - id == 4) memmove(id + 4, id, strlen(id) + 1), memcpy(id, "0000", 4);
  }
  return id;
}

static const char *gpu_placement(char *buf, size_t len) {
  int n = 0;
  cudaGetDeviceCount(&n);
  const char *vis = getenv("CUDA_VISIBLE_DEVICES"), *bus = gpu_bus_id();
  util_snprintf(buf, len, "GPU %d of %d%s%s%s: %s, PCI %s", gpu.device, n, vis ? " (CUDA_VISIBLE_DEVICES=" : "",
                vis ? vis : "", vis ? ")" : "", gpu.prop.name, bus ? bus : "unknown");
  return buf;
}

/* ---- the engine ------------------------------------------------------------------------------ */

static const char *gpu_describe(char *buf, size_t len) {
  int blas = 0, rt = 0;
  cublasGetVersion(gpu.blas, &blas);
  cudaRuntimeGetVersion(&rt);
  char mem[32];
  int tc = gpu.prop.major >= 8 && (!strcmp(gpu.precision, "bf16") || !strcmp(gpu.precision, "fp16"));
  util_snprintf(buf, len,
                "%s (sm_%d%d, %s), CUDA %d.%d, cuBLAS %d.%d.%d; GEMMs %s (fp32 storage and accumulation), fused "
                "attention %s",
                gpu.prop.name, gpu.prop.major, gpu.prop.minor, util_fmt_bytes((double)gpu.prop.totalGlobalMem, mem, 32),
                rt / 1000, rt % 1000 / 10, blas / 10000, blas / 100 % 100, blas % 100, gpu.precision,
                tc ? "on tensor cores at the GEMM precision (head sizes 33-128; fp32 otherwise)" : "in fp32");
  return buf;
}

static void gpu_set_threads(int n) { (void)n; /* the device's threads are not the host's */ }

static double gpu_measure_gflops(int n, double seconds) {
  need_device();
  if (n < 8192) n = 8192; /* smaller products leave a large GPU partly idle */
  size_t bytes = (size_t)n * n * sizeof(float);
  float *a = (float *)gpu_alloc(bytes), *b = (float *)gpu_alloc(bytes), *c = (float *)gpu_alloc(bytes);
  cudaEvent_t t0, t1;
  GPU_CHECK(cudaEventCreate(&t0));
  GPU_CHECK(cudaEventCreate(&t1));
  /* non-zero operands (0x3c3c3c3c = 0.0115): zeros would draw less power than real data */
  GPU_CHECK(cudaMemset(a, 0x3c, bytes));
  GPU_CHECK(cudaMemset(b, 0x3c, bytes));
  gpu_gemm(CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
  double best = 0.0, t_end = util_now() + seconds;
  int reps = 0;
  do {
    GPU_CHECK(cudaEventRecord(t0, 0));
    gpu_gemm(CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    GPU_CHECK(cudaEventRecord(t1, 0));
    GPU_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    GPU_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    double g = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e9;
    if (g > best) best = g;
  } while (++reps < 3 || util_now() < t_end);
  GPU_CHECK(cudaEventDestroy(t0));
  GPU_CHECK(cudaEventDestroy(t1));
  gpu_free(a);
  gpu_free(b);
  gpu_free(c);
  return best;
}

static backend make_table(void) {
  backend t;
  memset(&t, 0, sizeof t);
  t.name = "cuda";
  t.host_memory = 0;
  t.alloc = gpu_alloc;
  t.free = gpu_free;
  t.to_device = gpu_to_device;
  t.to_host = gpu_to_host;
  t.zero = gpu_zero;
  t.copy = gpu_copy;
  t.sync = gpu_sync;
  t.bus_id = gpu_bus_id;
  t.host_alloc = gpu_host_alloc;
  t.host_free = gpu_host_free;
  t.placement = gpu_placement;
  t.describe = gpu_describe;
  t.set_threads = gpu_set_threads;
  t.measure_gflops = gpu_measure_gflops;
  t.embed_fwd = gpu_embed_fwd;
  t.embed_bwd = gpu_embed_bwd;
  t.layernorm_fwd = gpu_layernorm_fwd;
  t.layernorm_bwd = gpu_layernorm_bwd;
  t.matmul_fwd = gpu_matmul_fwd;
  t.matmul_bwd = gpu_matmul_bwd;
  t.attention_scratch = gpu_attention_scratch;
  t.attention_fwd = gpu_attention_fwd;
  t.attention_bwd = gpu_attention_bwd;
  t.gelu_fwd = gpu_gelu_fwd;
  t.gelu_bwd = gpu_gelu_bwd;
  t.residual_fwd = gpu_residual_fwd;
  t.accumulate = gpu_accumulate;
  t.xent_fwd_bwd = gpu_xent_fwd_bwd;
  t.adamw = gpu_adamw;
  t.sumsq = gpu_sumsq;
  return t;
}

static const backend gpu_table = make_table();

extern "C" const backend *backend_cuda(void) { return &gpu_table; }
