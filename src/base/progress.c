/* progress: marks of the main thread's progress and the longest interval between them. */
#include "base/progress.h"

#include <stdatomic.h>
#include <time.h>

static atomic_llong last_ns;    /* CLOCK_MONOTONIC of the last mark */
static atomic_llong longest_ns; /* the longest interval between marks while measuring */
static atomic_int measuring;

long long progress_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void progress_mark(void) {
  long long now = progress_now_ns();
  long long gap = now - atomic_exchange_explicit(&last_ns, now, memory_order_relaxed);
  if (atomic_load_explicit(&measuring, memory_order_relaxed) && gap > atomic_load_explicit(&longest_ns, memory_order_relaxed))
    atomic_store_explicit(&longest_ns, gap, memory_order_relaxed);
}

void progress_measure(int on) {
  if (on) atomic_store(&last_ns, progress_now_ns()); /* the first interval starts now */
  else atomic_store(&longest_ns, 0);
  atomic_store(&measuring, on != 0);
}

long long progress_last_ns(void) { return atomic_load_explicit(&last_ns, memory_order_relaxed); }

double progress_longest(void) { return (double)atomic_load_explicit(&longest_ns, memory_order_relaxed) * 1e-9; }
