/* cpu_backend: the CPU backend table; memory is 64-byte aligned host memory. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "base/fpenv.h"
#include "base/util.h"

static void *cpu_alloc(const backend *be, size_t bytes) {
  (void)be;
  void *p = util_aligned_alloc(bytes, "CPU backend buffer");
  memset(p, 0, bytes);
  return p;
}
static void cpu_free(const backend *be, void *p) { (void)be, free(p); }
static void cpu_copy(const backend *be, void *dst, const void *src, size_t bytes) { (void)be, memcpy(dst, src, bytes); }
static void cpu_zero(const backend *be, void *p, size_t bytes) { (void)be, memset(p, 0, bytes); }
static void cpu_sync(const backend *be) { (void)be; }
static void *cpu_host_alloc(const backend *be, size_t bytes) {
  (void)be;
  return util_aligned_alloc(bytes, "host staging buffer");
}
static int cpu_mpi_direct(const backend *be, const char **how) {
  (void)be;
  *how = "host memory";
  return 1;
}

static const char *cpu_describe(const backend *be, char *buf, size_t len) {
  /* openblas_get_config() starts "OpenBLAS 0.3.21 ..." */
  char number[48] = "", version[64];
  const char *cfg = openblas_get_config(), *core = openblas_get_corename();
  if (cfg) sscanf(cfg, "%*s %47s", number);
  snprintf(version, sizeof version, "OpenBLAS%s%s", number[0] ? " " : "", number);
  int n = snprintf(buf, len, "%s with %s kernels, %d thread%s; %s storage%s; subnormals %s", version, core ? core : "unknown",
                   openblas_get_num_threads(), openblas_get_num_threads() == 1 ? "" : "s",
                   backend_dtype_name(be->storage), be->storage == BACKEND_FP32 ? "" : " (fp32 arithmetic, rounded on store)",
                   fpenv_flushing() ? "flushed to zero" : "kept");
#if defined(__x86_64__) && defined(__GNUC__)
  /* OpenBLAS falls back to its oldest x86-64 kernels on CPUs it does not know */
  const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
  if (core && better && strcmp(core, "Prescott") == 0 && n > 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, " (OpenBLAS did not recognise this CPU; OPENBLAS_CORETYPE=%s may be several times faster)",
             better);
#else
  (void)n; /* the hint above is for x86-64's kernels only */
#endif
  return buf;
}

static void cpu_set_threads(const backend *be, int n) {
  (void)be;
  if (n > 0) openblas_set_num_threads(n);
}

static double cpu_measure_gflops(const backend *be, int n, double seconds) {
  size_t nn = (size_t)n * n;
  float *a = cpu_alloc(be, nn * sizeof(float)), *b = cpu_alloc(be, nn * sizeof(float)), *c = cpu_alloc(be, nn * sizeof(float));
  for (size_t i = 0; i < nn; i++) {
    a[i] = (float)(i % 13) * 0.01f;
    b[i] = (float)(i % 7) * 0.02f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
  double best = 0.0, t_end = util_now() + seconds;
  int reps = 0;
  do {
    double t = util_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    t = util_now() - t;
    double g = 2.0 * n * (double)n * n / t / 1e9;
    if (g > best) best = g;
  } while (++reps < 3 || util_now() < t_end);
  free(a);
  free(b);
  free(c);
  return best;
}

static size_t cpu_attention_bytes(const backend *be, int T) {
  (void)be;
  return cpu_attention_scratch(T);
}

static size_t cpu_workspace_bytes(const backend *be, const backend_shape *s) {
  return cpu_stage_floats(be->storage, s) * sizeof(float);
}

static size_t cpu_library_bytes(const backend *be, const backend_shape *s) {
  (void)be;
  return cpu_blas_bytes(s);
}

/* The workspace comes from the table's alloc, so that what an instance holds is counted as
 * backend memory (the tests compare it with the plan). */
static void cpu_prepare(const backend *be, const backend_shape *s) {
  cpu_ctx *c = be->ctx;
  size_t n = cpu_stage_floats(be->storage, s);
  if (n <= c->work_floats) return;
  if (c->work) be->free(be, c->work);
  c->work = be->alloc(be, n * sizeof(float));
  c->work_floats = n;
}

static void cpu_close(backend *be) {
  cpu_ctx *c = be->ctx;
  if (c->work) be->free(be, c->work);
  free(c);
  free(be);
}

static backend_caps backend_cpu_caps(void) {
  return (backend_caps){.precisions = BACKEND_PREC_FP32 | BACKEND_PREC_BF16 | BACKEND_PREC_FP16,
                        .storage = 1u << BACKEND_FP32 | 1u << BACKEND_BF16 | 1u << BACKEND_FP16,
                        .host_memory = 1,
                        .devices = 0,
                        .attention = "tiled fp32 (OpenBLAS SGEMM per query block)"};
}

#define CPU_OP_SET(name, params, args) be->name = cpu_op_##name;

static backend *cpu_open(int device, const char *precision) {
  (void)device;
  unsigned bit = backend_precision_bit(precision);
  UTIL_CHECK(bit & backend_cpu_caps().precisions, NULL, "internal: the CPU backend at precision '%s'", precision);
  backend *be = util_calloc(1, sizeof *be, "backend");
  be->name = "cpu";
  be->caps = backend_cpu_caps();
  be->storage = backend_precision_storage(precision);
  util_strlcpy(be->precision, precision, sizeof be->precision);
  be->ctx = util_calloc(1, sizeof(cpu_ctx), "CPU backend context");
  be->alloc = cpu_alloc;
  be->free = cpu_free;
  be->to_device = cpu_copy;
  be->to_device_async = cpu_copy;
  be->to_host = cpu_copy;
  be->zero = cpu_zero;
  be->copy = cpu_copy;
  be->sync = cpu_sync;
  be->host_alloc = cpu_host_alloc;
  be->host_free = cpu_free;
  be->describe = cpu_describe;
  be->set_threads = cpu_set_threads;
  be->measure_gflops = cpu_measure_gflops;
  be->mpi_direct = cpu_mpi_direct;
  be->attention_scratch = cpu_attention_bytes;
  be->workspace_bytes = cpu_workspace_bytes;
  be->library_bytes = cpu_library_bytes;
  be->prepare = cpu_prepare;
  be->close = cpu_close;
  BACKEND_OPS(CPU_OP_SET)
  return be;
}

const backend_kind backend_kind_cpu = {.name = "cpu", .caps = backend_cpu_caps, .open = cpu_open};

const backend *backend_cpu(void) {
  static backend *be;
  if (!be) be = cpu_open(-1, "fp32");
  return be;
}
