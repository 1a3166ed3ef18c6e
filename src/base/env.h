/* env: greenlm's environment variables, one table (name, kind, meaning) that validation, the
 * accessors and doc/reference.md come from. Every GREENLM_* variable set is checked once at
 * start-up (env_check): a malformed value, or a GREENLM_ name one or two letters away from one of
 * greenlm's (a misspelling), is an error at the variable, never a silent 0 or a silent no-op;
 * GREENLM_ names far from all of greenlm's belong to others (scripts, test harnesses). */
#ifndef GREENLM_ENV_H
#define GREENLM_ENV_H

#include <stdio.h>

#include "base/err.h"

typedef enum { ENV_FAULT_STALL, ENV_FAULT_EXIT, ENV_FAULT_CRASH, ENV_FAULT_STOP, ENV_FAULT_SLOW } env_fault_kind;

typedef struct {
  env_fault_kind kind;
  int rank;
  long step;
} env_fault;

/* Check every GREENLM_* variable of the environment. Returns the number of errors added. */
int env_check(err_list *errs);

/* GREENLM_FILE_SIZE_LIMIT in bytes; 0 when unset. */
long long env_file_size_limit(void);
/* GREENLM_CHECKPOINT_PAUSE in milliseconds; 0 when unset. */
long long env_checkpoint_pause_ms(void);
/* GREENLM_CUDA_AWARE_MPI: 1 or 0; -1 when unset. */
int env_cuda_aware_mpi(void);
/* A variable that picks a library's path or greenlm's kernels (GREENLM_ATTENTION, GREENLM_EPILOGUES):
 * 1 for kernels, 0 for auto or unset, -1 for anything else. */
int env_auto_kernels(const char *name);
/* A path variable's value, or NULL when unset or empty. */
const char *env_path(const char *name);
/* GREENLM_FAULT: 1 and *f when set. */
int env_get_fault(env_fault *f);

/* The Markdown table of the variables (doc/reference.md). */
void env_write_reference(FILE *fp);

#endif
