/* testing: a minimal harness for greenlm's C tests.
 *
 * T_CHECK(cond, fmt, ...) records a failure with file:line and a message and carries on;
 * t_done() prints "name: N checks, M failed" and returns the exit status automake expects
 * (0 pass, 1 fail, 77 skip). */
#ifndef GREENLM_TESTING_H
#define GREENLM_TESTING_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_checks, t_failed;

static inline void t_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: FAIL: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  t_failed++;
}

#define T_CHECK(cond, ...)                                                                         \
  do {                                                                                             \
    t_checks++;                                                                                    \
    if (!(cond)) t_fail(__FILE__, __LINE__, __VA_ARGS__);                                          \
  } while (0)

static inline int t_done(const char *name) {
  printf("%s: %d checks, %d failed\n", name, t_checks, t_failed);
  return t_failed ? 1 : 0;
}

/* max |a - b| / max |b|: the relative error of a whole tensor (a NaN counts as infinite). */
static inline double t_rel_err_d(const float *a, const double *b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]), m = fabs(b[i]);
    if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
    if (m > den) den = m;
  }
  return den > 0 ? num / den : num;
}

static inline double t_rel_err(const float *a, const float *b, size_t n) {
  double *bd = malloc((n ? n : 1) * sizeof(double));
  for (size_t i = 0; i < n; i++) bd[i] = b[i];
  double r = t_rel_err_d(a, bd, n);
  free(bd);
  return r;
}

#ifdef MPI_VERSION
/* After MPI_Init, for a test that runs on exactly `need` ranks: this rank in *rank and 0, or (another
 * count) 77, the skip, after MPI_Finalize. */
static inline int t_need_ranks(int need, int *rank) {
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == need) return 0;
  if (*rank == 0) printf("SKIP: needs %d ranks (run under mpiexec -n %d)\n", need, need);
  MPI_Finalize();
  return 77;
}
#endif

#ifdef GREENLM_BACKEND_H
/* A CPU backend that counts the backend bytes it hands out (t_counted), at a precision; with
 * staged, it claims device memory that MPI may not touch, so that every exchange goes through
 * host staging as on a GPU without device-aware MPI. */
static size_t t_counted;
static backend t_counting;
static const backend *t_counting_inner;
static inline void *t_count_alloc(const backend *be, size_t bytes) {
  (void)be;
  t_counted += bytes;
  return t_counting_inner->alloc(t_counting_inner, bytes);
}
static inline int t_staged_mpi(const backend *be, const char **how) {
  (void)be;
  *how = "test: staged";
  return 0;
}
/* A fresh instance each call (its workspace is counted again); the previous one is closed. */
static inline const backend *t_counting_backend(const char *precision, int staged) {
  backend_close(t_counting_inner);
  t_counting_inner = backend_kind_cpu.open(-1, precision);
  t_counting = *t_counting_inner;
  t_counting.alloc = t_count_alloc;
  t_counting.caps.host_memory = !staged;
  if (staged) t_counting.mpi_direct = t_staged_mpi;
  return &t_counting;
}
#endif

#ifdef GREENLM_GPT_H
/* The first `rows` rows of the slot's logits, dense in fp32 (malloc'd): the arena keeps them in rows
 * padded to GPT_LOGITS_ALIGN, in the storage type. */
static inline float *t_logits(const gpt_model *m, int slot, size_t rows) {
  float *x = malloc((rows ? rows : 1) * (size_t)m->s.V * sizeof(float));
  for (size_t r = 0; r < rows; r++) gpt_logits_row(m, slot, r, x + r * (size_t)m->s.V);
  return x;
}
#endif

#endif
