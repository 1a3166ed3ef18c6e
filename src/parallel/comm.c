/* comm: whether MPI may touch backend memory, and host staging where it may not. */
#include "parallel/comm.h"

#include <mpi.h>
#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> /* Open MPI's MPIX_CUDA_AWARE_SUPPORT and MPIX_Query_cuda_support */
#endif
#endif
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/util.h"

/* Whether the MPI library moves CUDA device memory itself; `how` says what told. */
static int cuda_aware(const char **how) {
  int env = env_cuda_aware_mpi();
  if (env >= 0) {
    *how = "set by GREENLM_CUDA_AWARE_MPI";
    return env;
  }
#if defined(MPIX_GPU_SUPPORT_CUDA) /* MPICH >= 4 */
  int yes = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) == MPI_SUCCESS) {
    *how = "MPIX_GPU_query_support";
    return yes != 0;
  }
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT /* Open MPI built with CUDA */
  *how = "MPIX_Query_cuda_support";
  return MPIX_Query_cuda_support() != 0;
#endif
  /* MPIs without a query: the switches that turn their GPU support on */
  static const char *const hints[][2] = {{"MPICH_GPU_SUPPORT_ENABLED", "Cray MPICH"},
                                         {"OMPI_MCA_opal_cuda_support", "Open MPI"},
                                         {"MV2_USE_CUDA", "MVAPICH2"}};
  for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++) {
    const char *v = getenv(hints[i][0]);
    if (v && (strcmp(v, "1") == 0 || util_strieq(v, "true") || util_strieq(v, "yes"))) {
      *how = hints[i][0];
      return 1;
    }
  }
  *how = "no CUDA support reported by the MPI library";
  return 0;
}

int comm_direct(const backend *be) {
  if (be->host_memory) return 1;
  static int known = -1;
  static const char *how;
  if (known < 0) known = cuda_aware(&how);
  return known;
}

const char *comm_describe(const backend *be, char *buf, size_t len) {
  const char *how = "";
  if (be->host_memory)
    util_snprintf(buf, len, "MPI on host memory");
  else if (cuda_aware(&how))
    util_snprintf(buf, len, "CUDA-aware MPI on device buffers (%s)", how);
  else
    util_snprintf(buf, len, "pinned host staging (%s; GREENLM_CUDA_AWARE_MPI=1 overrides)", how);
  return buf;
}

void comm_stage_init(comm_stage *s, const backend *be, size_t cap) {
  memset(s, 0, sizeof *s);
  s->be = be;
  s->direct = comm_direct(be);
  s->cap = cap;
  if (!s->direct && cap) s->host = be->host_alloc(cap * sizeof(float));
}

void comm_stage_free(comm_stage *s) {
  if (s->host) s->be->host_free(s->host);
  memset(s, 0, sizeof *s);
}

float *comm_stage_send(comm_stage *s, size_t at, const float *dev, size_t n) {
  if (s->direct) {
    if (!s->be->host_memory) s->be->sync(); /* MPI must not read what a kernel is still writing */
    return (float *)dev;
  }
  UTIL_CHECK(at + n <= s->cap, NULL, "internal: staging [%zu, %zu) beyond %zu", at, at + n, s->cap);
  s->be->to_host(s->host + at, dev, n * sizeof(float));
  return s->host + at;
}

float *comm_stage_recv(comm_stage *s, size_t at, float *dev) {
  if (s->direct) return dev;
  UTIL_CHECK(at <= s->cap, NULL, "internal: staging at %zu beyond %zu", at, s->cap);
  return s->host + at;
}

void comm_stage_done(comm_stage *s, size_t at, float *dev, size_t n) {
  if (s->direct) return;
  UTIL_CHECK(at + n <= s->cap, NULL, "internal: staging [%zu, %zu) beyond %zu", at, at + n, s->cap);
  s->be->to_device(dev, s->host + at, n * sizeof(float));
}
