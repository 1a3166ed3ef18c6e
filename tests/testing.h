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

/* A CPU backend that counts the backend bytes it hands out (t_counted). */
#ifdef GREENLM_BACKEND_H
static size_t t_counted;
static backend t_counting;
static inline void *t_count_alloc(size_t bytes) {
  t_counted += bytes;
  return backend_cpu()->alloc(bytes);
}
static inline const backend *t_counting_backend(void) {
  t_counting = *backend_cpu();
  t_counting.alloc = t_count_alloc;
  return &t_counting;
}
#endif

#endif
