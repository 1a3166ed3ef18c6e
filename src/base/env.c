/* env: the table of greenlm's environment variables, their checks and accessors. */
#include "base/env.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

typedef enum { ENV_BYTES, ENV_MILLIS, ENV_BOOL01, ENV_PATH, ENV_FAULT, ENV_AUTO_KERNELS } env_kind;

static const struct {
  const char *name;
  env_kind kind;
  const char *doc;
} env_table[] = {
    {"GREENLM_ATTENTION", ENV_AUTO_KERNELS,
     "`auto` (default): attention at bf16 and fp16 storage runs in cuDNN where the build has it; `kernels`: in "
     "greenlm's own kernels (doc/gpu.md)"},
    {"GREENLM_EPILOGUES", ENV_AUTO_KERNELS,
     "`auto` (default): at bf16 and fp16 storage the linear layers' bias, gelu_new and its gradient run in "
     "cuBLASLt's GEMM epilogues; `kernels`: in greenlm's own kernels after the GEMMs (doc/gpu.md)"},
    {"GREENLM_CUDA_AWARE_MPI", ENV_BOOL01,
     "1: the MPI library moves CUDA device memory itself; 0: greenlm stages device buffers through host memory "
     "(unset: asked of the MPI library, doc/gpu.md)"},
    {"GREENLM_NVML_LIBRARY", ENV_PATH, "Path of the NVML library to load for GPU energy (default libnvidia-ml.so.1)"},
    {"GREENLM_POWERCAP_ROOT", ENV_PATH, "For testing: the directory read as /sys/class/powercap (RAPL zones)"},
    {"GREENLM_HWMON_ROOT", ENV_PATH, "For testing: the directory read as /sys/class/hwmon (power sensors where there is no RAPL)"},
    {"GREENLM_FILE_SIZE_LIMIT", ENV_BYTES, "For testing: a file-size limit in bytes on the run (RLIMIT_FSIZE), to rehearse a full disk or a quota"},
    {"GREENLM_CHECKPOINT_PAUSE", ENV_MILLIS,
     "For testing: milliseconds every checkpoint write waits once its `.tmp` file exists, before any data is written "
     "(0 to 60000), so that a test can kill a job inside a checkpoint write (`run/chaos`)"},
    {"GREENLM_FAULT", ENV_FAULT,
     "For testing: KIND:RANK:STEP makes rank RANK fail at the start of step STEP; KIND is stall (stops answering), "
     "exit (exits with status 1 without MPI_Finalize), crash (SIGSEGV), stop (SIGSTOP: the whole process stops, as a job-control stop or a frozen node) or slow (sleeps one second outside MPI, then goes on); doc/testing.md"},
};
enum { ENV_N = sizeof env_table / sizeof env_table[0] };

/* Parse an integer in [lo, hi] that fills the whole text. */
static int parse_long(const char *s, long long lo, long long hi, long long *out) {
  if (!*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_fault(const char *s, env_fault *f) {
  static const char *const kinds[] = {"stall", "exit", "crash", "stop", "slow"}; /* in env_fault_kind's order */
  const int nkinds = (int)(sizeof kinds / sizeof *kinds);
  char word[16];
  const char *c1 = strchr(s, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
  if (!c1 || !c2 || c1 - s >= (long)sizeof word) return -1;
  util_snprintf(word, sizeof word, "%.*s", (int)(c1 - s), s);
  int k = 0;
  while (k < nkinds && strcmp(word, kinds[k]) != 0) k++;
  char rank[24];
  long long r, st;
  util_snprintf(rank, sizeof rank, "%.*s", (int)(c2 - c1 - 1), c1 + 1);
  if (k == nkinds || c2 - c1 - 1 >= (long)sizeof rank || parse_long(rank, 0, 1 << 24, &r) || parse_long(c2 + 1, 1, 1LL << 50, &st))
    return -1;
  *f = (env_fault){(env_fault_kind)k, (int)r, (long)st};
  return 0;
}

static int check_one(int i, const char *v, err_list *errs) {
  const char *name = env_table[i].name;
  long long x;
  env_fault f;
  switch (env_table[i].kind) {
  case ENV_BYTES:
    if (parse_long(v, 0, INT64_MAX, &x) == 0) return 0;
    err_add(errs, name, 0, 0, env_table[i].doc, "'%s' is not a number of bytes (an integer >= 0)", v);
    return 1;
  case ENV_MILLIS:
    if (parse_long(v, 0, 60000, &x) == 0) return 0;
    err_add(errs, name, 0, 0, env_table[i].doc, "'%s' is not a number of milliseconds from 0 to 60000", v);
    return 1;
  case ENV_BOOL01:
    if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) return 0;
    err_add(errs, name, 0, 0, env_table[i].doc, "'%s' is neither 0 nor 1", v);
    return 1;
  case ENV_PATH:
    if (*v) return 0;
    err_add(errs, name, 0, 0, env_table[i].doc, "set but empty: give a path, or unset it");
    return 1;
  case ENV_AUTO_KERNELS:
    if (strcmp(v, "auto") == 0 || strcmp(v, "kernels") == 0) return 0;
    err_add(errs, name, 0, 0, env_table[i].doc, "'%s' is neither auto nor kernels", v);
    return 1;
  case ENV_FAULT:
    if (parse_fault(v, &f) == 0) return 0;
    err_add(errs, name, 0, 0, env_table[i].doc, "'%s' is not KIND:RANK:STEP (e.g. stall:1:5)", v);
    return 1;
  }
  return 0;
}

int env_check(err_list *errs) {
  extern char **environ;
  int bad = 0;
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "GREENLM_", 8) != 0) continue;
    const char *eq = strchr(*e, '=');
    char name[128];
    util_snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - *e) : (int)strlen(*e), *e);
    int i = 0, best = -1, bd = 99;
    while (i < ENV_N && strcmp(env_table[i].name, name) != 0) {
      int d = util_edit_distance(name + 8, env_table[i].name + 8);
      if (d < bd) bd = d, best = i;
      i++;
    }
    if (i < ENV_N) {
      bad += check_one(i, eq ? eq + 1 : "", errs);
      continue;
    }
    if (best >= 0 && bd <= 2) { /* a misspelt variable would be silently ignored; names far from all are others' */
      err_add(errs, name, 0, 0, "correct its name, or unset it (doc/reference.md lists greenlm's variables)",
              "greenlm has no such environment variable; did you mean %s?", env_table[best].name);
      bad++;
    }
  }
  return bad;
}

long long env_file_size_limit(void) {
  const char *v = getenv("GREENLM_FILE_SIZE_LIMIT");
  long long x = 0;
  return v && parse_long(v, 0, INT64_MAX, &x) == 0 ? x : 0;
}

long long env_checkpoint_pause_ms(void) {
  const char *v = getenv("GREENLM_CHECKPOINT_PAUSE");
  long long x = 0;
  return v && parse_long(v, 0, 60000, &x) == 0 ? x : 0;
}

int env_cuda_aware_mpi(void) {
  const char *v = getenv("GREENLM_CUDA_AWARE_MPI");
  return !v || !*v ? -1 : strcmp(v, "1") == 0;
}

int env_auto_kernels(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v || strcmp(v, "auto") == 0) return 0;
  return strcmp(v, "kernels") == 0 ? 1 : -1;
}

const char *env_path(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

int env_get_fault(env_fault *f) {
  const char *v = getenv("GREENLM_FAULT");
  return v && parse_fault(v, f) == 0;
}

void env_write_reference(FILE *fp) {
  fprintf(fp, "| variable | meaning |\n|---|---|\n");
  for (int i = 0; i < ENV_N; i++) fprintf(fp, "| `%s` | %s |\n", env_table[i].name, env_table[i].doc);
}
