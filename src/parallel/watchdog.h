/* watchdog: a training job that stops making progress ends with a message naming the rank that
 * stopped answering, instead of hanging until the batch system's time limit.
 *
 * Every rank runs a watchdog thread (MPI_THREAD_MULTIPLE) that sends rank 0's watchdog a
 * heartbeat several times per timeout: the step, the seconds since the main thread last made
 * progress (watchdog_tick: a micro-batch, a step, a checkpoint batch), and whether the main thread
 * is waiting inside an MPI call. The blocking MPI calls greenlm and PnetCDF make are counted
 * through MPI's profiling interface (this module defines MPI_Allreduce, MPI_Wait, ... which call
 * PMPI_Allreduce, PMPI_Wait, ...). When no rank has made progress for the timeout, rank 0's
 * watchdog names the culprit, in this order of evidence:
 *   - a rank whose heartbeats stopped: its process or its node died;
 *   - a rank busy outside MPI (a stall in computation, a device or a file system) while the
 *     others wait for it in MPI;
 *   - every rank waiting in MPI: a deadlock; the rank that progressed least recently is named;
 * and ends the job with MPI_Abort (exit status 5 where the launcher passes it on). Should rank 0
 * itself die, the other ranks' watchdogs end the job after twice the timeout.
 *
 * For tests, GREENLM_FAULT (doc/testing.md) makes one rank fail at the start of a chosen step:
 *   stall:RANK:STEP   the rank stops answering (sleeps outside MPI)
 *   exit:RANK:STEP    the rank exits at once with status 1, without MPI_Finalize
 *   crash:RANK:STEP   the rank raises SIGSEGV */
#ifndef GREENLM_WATCHDOG_H
#define GREENLM_WATCHDOG_H

#include <mpi.h>

#include "base/err.h"

/* Exit status of a job the watchdog ended. */
enum { WATCHDOG_EXIT = ERR_EXIT_WATCHDOG };

/* Start watching the ranks of comm: collective; timeout in seconds (0 or less: no watchdog, only
 * the fault injection). Needs MPI_THREAD_MULTIPLE; without it the watchdog says so on rank 0 and
 * stays off. */
void watchdog_start(MPI_Comm comm, double timeout);
/* The main thread made progress (cheap: one atomic store). */
void watchdog_tick(void);
/* Step `step` (1-based) begins: progress, the step named in messages, and GREENLM_FAULT's chance. */
void watchdog_step(long step);
/* Stop watching: collective over the comm of watchdog_start. */
void watchdog_stop(void);

#endif
