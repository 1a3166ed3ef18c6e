/* progress: the main thread's marks of progress, which the watchdog (parallel/watchdog.h) reads.
 *
 * Any layer marks progress where a unit of work ends: a forward or backward pass, a batch of a
 * checkpoint, a block of a dataset verified, a tensor imported. A mark is one atomic store, cheap
 * enough for every pass. From progress_measure(1) on, each mark also measures the interval since
 * the previous one, and the longest such interval (a step's slowest phase: a micro-batch, a
 * checkpoint batch, an evaluation batch) is what the adaptive watchdog scales its limit by.
 * Only the thread that runs the tasks marks progress. */
#ifndef GREENLM_PROGRESS_H
#define GREENLM_PROGRESS_H

/* The main thread finished a unit of work. */
void progress_mark(void);
/* From now on (on != 0) the intervals between marks count towards progress_longest; the time
 * before (start-up) does not. progress_measure(0) also forgets the longest interval. */
void progress_measure(int on);
/* CLOCK_MONOTONIC nanoseconds of the last mark. */
long long progress_last_ns(void);
/* The longest interval between two marks since progress_measure(1), in seconds (0 before). */
double progress_longest(void);
/* CLOCK_MONOTONIC now, in nanoseconds. */
long long progress_now_ns(void);

#endif
