/* fpenv: the calling thread's floating-point environment: flushing subnormal floats to zero.
 *
 * A float below 2^-126 in magnitude (a subnormal) costs a microcode assist of about a hundred
 * cycles on x86-64 each time an instruction reads or writes one. A trained model's arithmetic makes
 * them: a CPU step of a trained 11 M-parameter GPT-Neo took 3 times as long as the same step of a
 * freshly initialised one (doc/performance.md). Flushing them to zero changes results only below
 * 2^-126.
 *
 * x86-64: MXCSR's FTZ (results) and DAZ (inputs) bits; Arm (AArch64): FPCR's FZ bit (both); POWER
 * has no such mode (nothing is set, and the function says so). The setting is per thread; threads
 * created afterwards inherit it, threads that exist already (OpenBLAS may start its workers when
 * the library loads) keep theirs. */
#ifndef GREENLM_FPENV_H
#define GREENLM_FPENV_H

/* Flush subnormal floats to zero in this thread's arithmetic; whether it now does (0 where the CPU,
 * or an emulator of it, has no such mode). */
int fpenv_flush_subnormals(void);
/* Whether this thread's arithmetic flushes subnormal floats to zero (by a subnormal product). */
int fpenv_flushing(void);

#endif
