/* cpu_backend: the CPU backend table; memory is 64-byte aligned host memory. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "base/util.h"

static void *cpu_alloc(size_t bytes) {
  void *p = util_aligned_alloc(bytes, "CPU backend buffer");
  memset(p, 0, bytes);
  return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_sync(void) {}
static void *cpu_host_alloc(size_t bytes) { return util_aligned_alloc(bytes, "host staging buffer"); }

static const char *cpu_describe(char *buf, size_t len) {
  /* openblas_get_config() starts "OpenBLAS 0.3.21 ..." */
  char number[48] = "", version[64];
  const char *cfg = openblas_get_config(), *core = openblas_get_corename();
  if (cfg) sscanf(cfg, "%*s %47s", number);
  snprintf(version, sizeof version, "OpenBLAS%s%s", number[0] ? " " : "", number);
  int n = snprintf(buf, len, "%s with %s kernels, %d thread%s", version, core ? core : "unknown",
                   openblas_get_num_threads(), openblas_get_num_threads() == 1 ? "" : "s");
#if defined(__x86_64__) && defined(__GNUC__)
  /* OpenBLAS falls back to its oldest x86-64 kernels on CPUs it does not know */
  const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
  if (core && better && strcmp(core, "Prescott") == 0 && n > 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, " (OpenBLAS did not recognise this CPU; OPENBLAS_CORETYPE=%s may be several times faster)",
             better);
#endif
  return buf;
}

static void cpu_set_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
}

static double cpu_measure_gflops(int n, double seconds) {
  size_t nn = (size_t)n * n;
  float *a = cpu_alloc(nn * sizeof(float)), *b = cpu_alloc(nn * sizeof(float)), *c = cpu_alloc(nn * sizeof(float));
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

static const backend cpu_table = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .describe = cpu_describe,
    .set_threads = cpu_set_threads,
    .measure_gflops = cpu_measure_gflops,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .attention_scratch = cpu_attention_scratch,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .residual_fwd = cpu_residual_fwd,
    .accumulate = cpu_accumulate,
    .xent_fwd_bwd = cpu_xent_fwd_bwd,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
};

const backend *backend_cpu(void) { return &cpu_table; }
