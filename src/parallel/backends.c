/* backends: the backend of a run, from &system backend and precision, this build and the machine. */
#include "parallel/backends.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/topo.h"
#include "base/util.h"

/* The kind backend = 'auto' means in this build: the first built kind with devices, else the CPU. */
static const backend_kind *auto_kind(void) {
  int n;
  const backend_kind *const *k = backend_kinds(&n);
  for (int i = 0; i < n; i++)
    if (k[i]->devices) return k[i];
  return k[0];
}

/* The deck's shape against a backend's attention limits (backend_caps): errors at the deck keys. */
static void check_limits(const cfg_config *cfg, const backend_caps *c, const char *kind, err_list *errs) {
  const cfg_model *m = &cfg->model;
  long head = m->n_embd / m->n_head, heads = m->n_head / cfg->parallel.tensor_parallel;
  char hint[160];
  if (c->max_head_size && head > c->max_head_size) {
    util_snprintf(hint, sizeof hint, "use more heads: n_embd / n_head <= %d (n_head >= %ld)", c->max_head_size,
                  (m->n_embd + c->max_head_size - 1) / c->max_head_size);
    cfg_error_at(cfg, errs, "model", "n_head", hint, "head size n_embd / n_head = %ld is more than the %s backend's "
                 "attention takes (%d)", head, kind, c->max_head_size);
  }
  if (c->max_heads && heads > c->max_heads)
    cfg_error_at(cfg, errs, "model", "n_head", "use fewer heads, or more &parallel tensor_parallel ranks",
                 "%ld heads on one rank are more than the %s backend's attention takes (%d)", heads, kind, c->max_heads);
  if (c->max_batch && cfg->training.micro_batch_size > c->max_batch) {
    util_snprintf(hint, sizeof hint, "set micro_batch_size <= %d (more micro-batches give the same batch)", c->max_batch);
    cfg_error_at(cfg, errs, "training", "micro_batch_size", hint, "micro_batch_size = %ld is more sequences than the "
                 "%s backend's attention takes in one call (%d)", cfg->training.micro_batch_size, kind, c->max_batch);
  }
}

void backends_check(const cfg_config *cfg, err_list *errs) {
  const cfg_system *sy = &cfg->system;
  const char *build = NULL;
  int is_auto = cfg_system_backend_of(sy) == CFG_BACKEND_AUTO;
  const backend_kind *k = is_auto ? auto_kind() : backend_find_kind(sy->backend, &build);
  if (!k) {
    cfg_error_at(cfg, errs, "system", "backend", build ? build : "set backend = 'cpu' or 'auto'",
                 "backend = '%s', but this greenlm was built without it", sy->backend);
    return;
  }
  backend_caps caps = k->caps();
  if (!is_auto) check_limits(cfg, &caps, k->name, errs); /* 'auto': those of the backend it opens */
  /* 'auto' runs on the devices' kind where it finds devices, else on the CPU (backends_open) */
  unsigned can = caps.precisions, bit = backend_precision_bit(sy->precision);
  if (is_auto) can |= backend_kind_cpu.caps().precisions;
  if (bit & can) return;
  char names[64], hint[160];
  util_snprintf(hint, sizeof hint, "precisions of the %s backend: %s", k->name,
                backend_precision_names(can, names, sizeof names));
  cfg_error_at(cfg, errs, "system", "precision", hint, "precision = '%s' is not one the %s backend computes at",
               sy->precision, k->name);
}

int backends_check_device(const cfg_config *cfg, const backend *be, const char *where, err_list *errs) {
  const char *precision = cfg->system.precision;
  unsigned can = be->caps.precisions;
  long n0 = err_count(errs);
  check_limits(cfg, &be->caps, be->name, errs);
  if (can & backend_precision_bit(precision)) return err_count(errs) > n0 ? -1 : 0;
  char names[64], hint[256];
  int fp16 = (can & BACKEND_PREC_FP16) && cfg_system_precision_of(&cfg->system) == CFG_PREC_BF16;
  util_snprintf(hint, sizeof hint, "this device computes at %s: set precision = '%s'%s",
                backend_precision_names(can, names, sizeof names), fp16 ? "fp16" : "fp32",
                fp16 ? " (tensor cores, with dynamic loss scaling)" : "");
  cfg_error_at(cfg, errs, "system", "precision", hint, "precision = '%s', but the %s backend's device (%s) does not compute at it",
               precision, be->name, where);
  return -1;
}

const backend *backends_plan(const cfg_config *cfg) {
  const char *build;
  const backend_kind *k =
      cfg_system_backend_of(&cfg->system) == CFG_BACKEND_AUTO ? auto_kind() : backend_find_kind(cfg->system.backend, &build);
  unsigned bit = backend_precision_bit(cfg->system.precision);
  if (!k || !(k->caps().precisions & bit)) k = &backend_kind_cpu; /* 'auto' at a precision only the CPU has */
  return k->open(-1, cfg->system.precision);
}

/* This rank's device of kind k (the one nearest its cores, the node's devices shared evenly), or
 * -1 with the reason in why. */
static int pick_device(const backend_kind *k, const cfg_config *cfg, MPI_Comm comm, char *why, size_t wlen, char *where,
                       size_t len) {
  int n = k->devices(why, wlen), rank;
  if (n <= 0) return -1;
  MPI_Comm node;
  MPI_Comm_rank(comm, &rank);
  char **bus = util_malloc((size_t)n * sizeof *bus, "bus ids");
  for (int d = 0; d < n; d++) {
    bus[d] = util_malloc(32, "bus id");
    if (k->device_bus_id(d, bus[d], 32) != 0) free(bus[d]), bus[d] = NULL;
  }
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int d = topo_choose_device(node, cfg_parallel_bind_of(&cfg->parallel) != CFG_BIND_NONE, n, bus, where, len);
  MPI_Comm_free(&node);
  for (int i = 0; i < n; i++) free(bus[i]);
  free(bus);
  return d;
}

/* This rank's backend, or NULL after an error at the deck key at fault. */
static const backend *choose(const cfg_config *cfg, MPI_Comm comm, err_list *errs, char *note, size_t nlen) {
  const cfg_system *sy = &cfg->system;
  const char *build;
  int is_auto = cfg_system_backend_of(sy) == CFG_BACKEND_AUTO;
  const backend_kind *k = is_auto ? auto_kind() : backend_find_kind(sy->backend, &build);
  if (!k->devices) return k->open(-1, sy->precision);
  char why[256] = "", where[320] = "";
  int d = pick_device(k, cfg, comm, why, sizeof why, where, sizeof where);
  if (d >= 0) {
    const backend *be = k->open(d, sy->precision);
    if (backends_check_device(cfg, be, where, errs) != 0) {
      backend_close(be);
      return NULL;
    }
    char how[256];
    util_snprintf(note, nlen, "backend: %s, precision %s (%s storage); %s; MPI: %s", k->name, sy->precision,
                  backend_dtype_name(be->storage), where, comm_describe(be, how, sizeof how));
    return be;
  }
  if (is_auto && (backend_kind_cpu.caps().precisions & backend_precision_bit(sy->precision))) {
    util_snprintf(note, nlen, "backend: auto: no usable %s device (%s): the CPU backend", k->name, why);
    return backend_kind_cpu.open(-1, sy->precision);
  }
  if (is_auto)
    cfg_error_at(cfg, errs, "system", "precision", "run where the devices are visible, or set a precision the CPU runs",
                 "backend = 'auto' found no usable %s device (%s), and the CPU backend does not compute at %s", k->name,
                 why, sy->precision);
  else
    cfg_error_at(cfg, errs, "system", "backend",
                 "run on nodes with the devices (check what the system sees), or set backend = 'auto' (the CPU where "
                 "there are none)", "backend = '%s', but no usable device (%s)", k->name, why);
  return NULL;
}

const backend *backends_open(const cfg_config *cfg, MPI_Comm comm, err_list *errs, char *note, size_t len) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  note[0] = '\0';
  const backend *be = choose(cfg, comm, errs, note, len);
  /* every rank must have one; 'auto' must come out the same everywhere */
  int failed = !be, any, kind = be && !be->caps.host_memory ? 2 : 1, lo, hi;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm);
  MPI_Allreduce(&kind, &lo, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&kind, &hi, 1, MPI_INT, MPI_MAX, comm);
  if (any) {
    backend_close(be);
    return NULL;
  }
  if (lo != hi) {
    if (rank == 0)
      cfg_error_at(cfg, errs, "system", "backend", "name the backend explicitly: the device kind (those nodes only) or 'cpu'",
                   "backend = 'auto' chose devices on some ranks and the CPU on others (some nodes have none)");
    backend_close(be);
    return NULL;
  }
  return be;
}
