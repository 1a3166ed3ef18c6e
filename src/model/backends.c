/* backends: the backend of a run, from &system backend and precision, this build and the machine. */
#include "config.h" /* first: GREENLM_HAVE_CUDA decides what backend.h declares */

#include "model/backends.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/topo.h"
#include "base/util.h"

const backend *backends_plan(const cfg_config *cfg) {
#ifdef GREENLM_HAVE_CUDA
  if (strcmp(cfg->system.backend, "cpu") != 0) return backend_cuda();
#endif
  (void)cfg;
  return backend_cpu();
}

/* This rank's backend, or NULL after an error at the deck key at fault. */
static const backend *choose(const cfg_config *cfg, MPI_Comm comm, err_list *errs, char *note, size_t nlen) {
  const cfg_system *sy = &cfg->system;
  if (strcmp(sy->backend, "cpu") == 0) return backend_cpu();
#ifdef GREENLM_HAVE_CUDA
  int rank;
  MPI_Comm node;
  MPI_Comm_rank(comm, &rank);
  char why[256] = "";
  int n = gpu_device_count(why, sizeof why);
  if (n > 0) {
    /* the GPU nearest to this rank's cores (hwloc PCI locality), the node's GPUs shared evenly */
    char **bus = util_malloc((size_t)n * sizeof *bus, "bus ids"), where[320];
    for (int d = 0; d < n; d++) {
      bus[d] = util_malloc(32, "bus id");
      if (gpu_device_bus_id(d, bus[d], 32) != 0) free(bus[d]), bus[d] = NULL;
    }
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int d = topo_choose_device(node, strcmp(cfg->parallel.bind, "none") != 0, n, bus, where, sizeof where);
    MPI_Comm_free(&node);
    for (int i = 0; i < n; i++) free(bus[i]);
    free(bus);
    gpu_open(d, sy->precision);
    const backend *be = backend_cuda();
    char how[256];
    util_snprintf(note, nlen, "backend: cuda, precision %s; %s; MPI: %s", sy->precision, where,
                  comm_describe(be, how, sizeof how));
    return be;
  }
  if (strcmp(sy->backend, "auto") == 0 && strcmp(sy->precision, "fp32") == 0) {
    util_snprintf(note, nlen, "backend: auto: no usable GPU (%s): the CPU backend", why);
    return backend_cpu();
  }
  if (strcmp(sy->backend, "auto") == 0)
    cfg_error_at(cfg, errs, "system", "precision",
                 "run where GPUs are visible (nvidia-smi, CUDA_VISIBLE_DEVICES), or set precision = 'fp32'",
                 "backend = 'auto' found no usable GPU (%s), and the CPU backend computes in fp32 only", why);
  else
    cfg_error_at(cfg, errs, "system", "backend",
                 "run on GPU nodes (check nvidia-smi and CUDA_VISIBLE_DEVICES), or set backend = 'auto' (the CPU where "
                 "there is no GPU)", "backend = 'cuda', but no usable GPU (%s)", why);
  return NULL;
#else
  /* 'auto' in a build without CUDA; cfg_load refused 'cuda' and any precision but fp32 */
  (void)comm, (void)errs, (void)note, (void)nlen;
  return backend_cpu();
#endif
}

const backend *backends_open(const cfg_config *cfg, MPI_Comm comm, err_list *errs, char *note, size_t len) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  note[0] = '\0';
  const backend *be = choose(cfg, comm, errs, note, len);
  /* every rank must have one; 'auto' must come out the same everywhere */
  int failed = !be, any, kind = be == backend_cpu() ? 1 : 2, lo, hi;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm);
  MPI_Allreduce(&kind, &lo, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&kind, &hi, 1, MPI_INT, MPI_MAX, comm);
  if (any) return NULL;
  if (lo != hi) {
    if (rank == 0)
      cfg_error_at(cfg, errs, "system", "backend", "set backend = 'cuda' (GPU nodes only) or 'cpu' explicitly",
                   "backend = 'auto' chose CUDA on some ranks and the CPU on others (some nodes have no GPU)");
    return NULL;
  }
  return be;
}
