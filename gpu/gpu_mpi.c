/* gpu_mpi: whether the MPI library moves CUDA device memory itself (the CUDA backend's mpi_direct).
 * Plain C compiled with MPI's headers, the one file of gpu/ that is. Checked once per process: the
 * environment variable GREENLM_CUDA_AWARE_MPI=0|1 decides when set, else MPIX_GPU_query_support or
 * MPIX_Query_cuda_support where the MPI has them, else the usual switches of Cray MPICH, Open MPI
 * and MVAPICH2. */
#include "config.h"

#include <mpi.h>
#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> /* Open MPI's MPIX_CUDA_AWARE_SUPPORT and MPIX_Query_cuda_support */
#endif
#endif
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "base/env.h"
#include "base/util.h"

/* Whether the MPI library moves CUDA device memory itself; `how` says what told. */
static int query(const char **how) {
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
  *how = "no CUDA support reported by the MPI library; GREENLM_CUDA_AWARE_MPI=1 overrides";
  return 0;
}

int gpu_mpi_direct(const backend *be, const char **how);

int gpu_mpi_direct(const backend *be, const char **how) {
  (void)be;
  static int known = -1;
  static const char *said;
  if (known < 0) known = query(&said);
  *how = said;
  return known;
}
