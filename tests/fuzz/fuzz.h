/* fuzz: what the fuzz targets share (tests/fuzz/, doc/testing.md). Each target defines
 * LLVMFuzzerTestOneInput over one reader of outside input. Built with --enable-fuzzing it links
 * libFuzzer's main (run/fuzz); otherwise replay.c's main runs the files it is given through it,
 * so the corpora and the reproducers of every finding run in make check as regression tests.
 * FUZZ_VERBOSE=1 in the environment makes the file readers' targets print the errors of each input. */
#ifndef GREENLM_FUZZ_H
#define GREENLM_FUZZ_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A directory of this process's own for the files a target writes (removed at exit). */
static char fuzz_dir[256];

static inline void fuzz_remove_dir(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
  if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir);
}

static inline void fuzz_setup(int *argc, char ***argv, int mpi) {
  if (mpi) {
    int inited;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init(argc, argv);
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(fuzz_dir, sizeof fuzz_dir, "%s/greenlm-fuzz-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", fuzz_dir);
  if (system(cmd) != 0) abort();
  atexit(fuzz_remove_dir);
}

/* Write n bytes to dir/name; the path into path. */
static inline void fuzz_write(const char *name, const void *data, size_t n, char *path, size_t len) {
  snprintf(path, len, "%s/%s", fuzz_dir, name);
  FILE *fp = fopen(path, "wb");
  if (!fp || fwrite(data, 1, n, fp) != n || fclose(fp) != 0) abort();
}

/* An input of two files, split at its first NUL byte (no NUL: all of it the first, the second
 * empty), written as fuzz_dir/first and fuzz_dir/second. */
static inline void fuzz_write_pair(const char *first, const char *second, const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  size_t len = nul ? (size_t)(nul - data) : size;
  char path[400];
  fuzz_write(first, data, len, path, sizeof path);
  fuzz_write(second, nul ? nul + 1 : data, nul ? size - len - 1 : 0, path, sizeof path);
}

/* A finding: a property that must hold did not. */
#define FUZZ_ASSERT(cond, what)                                                                    \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz: property broken: %s (%s:%d)\n", what, __FILE__, __LINE__);             \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#endif
