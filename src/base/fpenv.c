/* fpenv: flushing subnormal floats to zero (fpenv.h). */
#include "base/fpenv.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

/* Set the CPU's flush bits on this thread, where it has them. */
static void set_flush(void) {
#if defined(__x86_64__)
  enum { MXCSR_DAZ = 0x0040, MXCSR_FTZ = 0x8000 }; /* subnormal inputs read as zero; subnormal results zero */
  _mm_setcsr(_mm_getcsr() | MXCSR_FTZ | MXCSR_DAZ);
#elif defined(__aarch64__)
  const unsigned long long fz = 1ull << 24; /* FPCR.FZ: subnormal inputs and results zero */
  unsigned long long r;
  __asm__ volatile("mrs %0, fpcr" : "=r"(r));
  r |= fz;
  __asm__ volatile("msr fpcr, %0" : : "r"(r));
#endif
}

int fpenv_flush_subnormals(void) {
  set_flush();
  return fpenv_flushing();
}

/* By what the arithmetic does, not by the control bits: an emulator (valgrind) may keep the bits
 * and ignore them, or drop them. */
int fpenv_flushing(void) {
  volatile float tiny = 0x1p-100f, small = 0x1p-30f; /* their product, 2^-130, is subnormal */
  return tiny * small == 0.0f;
}
