/* watchdog: a training job that stops making progress ends with a message naming the rank that
 * stopped answering, instead of hanging until the batch system's time limit.
 *
 * Every rank runs a watchdog thread (MPI_THREAD_MULTIPLE) that sends rank 0's watchdog a
 * heartbeat several times per limit: the step, the seconds since the main thread last made
 * progress (base/progress.h: a forward or backward pass, a checkpoint batch, a step, and the entry
 * to and return from every MPI-IO call, so that time in PnetCDF's collective writes counts as the
 * writing rank's progress), the longest interval between two such marks, and whether the main
 * thread is waiting inside an MPI call. The blocking MPI calls greenlm and PnetCDF make are counted
 * through MPI's profiling interface (this module defines MPI_Allreduce, MPI_Wait,
 * MPI_File_write_at_all, ... which call PMPI_Allreduce, ...).
 *
 * The limit: a fixed number of seconds (&job step_timeout > 0), or by default adaptive:
 * max(&job watchdog_floor, WATCHDOG_FACTOR x the longest interval between progress marks any rank
 * has seen since the first step began), so it grows with the job's slowest micro-batch, step or
 * checkpoint batch. Before the first step (reading datasets and checkpoints, importing a model) a
 * job gets at least WATCHDOG_STARTUP seconds without progress.
 *
 * Rank 0's watchdog ends the job, naming the culprit, when a rank's heartbeats stopped for the
 * limit (its process was stopped or died, or its node froze), or when no rank has made progress
 * for the limit: then a rank whose heartbeats stopped for half the limit (a stopped process whose
 * last beat, late under load, said it waited in MPI), else a rank busy outside MPI (a stall in
 * computation, a device or a file system) while the others wait for it, else (every rank waiting
 * in MPI: a deadlock) the rank that progressed least recently. It ends the job with MPI_Abort
 * (exit status 5 where the launcher passes it on). Should rank 0 itself stop, the other ranks'
 * watchdogs end the job after twice their limit.
 *
 * For tests, GREENLM_FAULT (doc/testing.md) makes one rank fail at the start of a chosen step:
 *   stall:RANK:STEP   the rank stops answering (sleeps outside MPI)
 *   stop:RANK:STEP    the rank's process stops (SIGSTOP: no heartbeats either)
 *   exit:RANK:STEP    the rank exits at once with status 1, without MPI_Finalize
 *   crash:RANK:STEP   the rank raises SIGSEGV
 *   slow:RANK:STEP    the rank sleeps one second outside MPI, then goes on (a slower phase) */
#ifndef GREENLM_WATCHDOG_H
#define GREENLM_WATCHDOG_H

#include <mpi.h>
#include <stddef.h>

#include "base/err.h"

/* Exit status of a job the watchdog ended. */
enum { WATCHDOG_EXIT = ERR_EXIT_WATCHDOG };

/* The adaptive limit's factor, and the least a job gets before its first step. */
enum { WATCHDOG_FACTOR = 10 };
#define WATCHDOG_STARTUP 1800.0

/* How a job is watched: off, a fixed limit, or the adaptive one with its floor. */
typedef struct {
  int on;
  double fixed; /* > 0: the limit in seconds; 0: adaptive */
  double floor; /* the adaptive limit's least value, seconds */
} watchdog_rule;

/* Start watching the ranks of comm: collective. Needs MPI_THREAD_MULTIPLE; without it the
 * watchdog says so on rank 0 and stays off (the fault injection still works). */
void watchdog_start(MPI_Comm comm, watchdog_rule rule);
/* The limit now, in seconds (before the first step, progress may take WATCHDOG_STARTUP if that
 * is longer): on rank 0 over every rank's heartbeats, elsewhere this rank's own; 0 when the
 * watchdog is off. */
double watchdog_limit(void);
/* The limit once every rank's heartbeat has told of a slowest phase of `longest` seconds (the larger
 * of that and watchdog_limit); 0 when the watchdog is off. */
double watchdog_limit_after(double longest);
/* The rule in words, for the run's header ("adaptive: max(180 s, 10 x the longest phase)"). */
const char *watchdog_describe(watchdog_rule rule, char *buf, size_t len);
/* Step `step` (1-based) begins: progress, the step named in messages, the start of the adaptive
 * limit's measurement, and GREENLM_FAULT's chance. */
void watchdog_step(long step);
/* Stop watching: collective over the comm of watchdog_start. */
void watchdog_stop(void);

#endif
