/* watchdog: heartbeats to rank 0, the culprit named, the job ended; MPI calls counted through PMPI. */
#include "parallel/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/util.h"

/* ---- what the main thread is doing (written by it, read by the watchdog thread) ----------------- */

static _Thread_local int wd_is_main;            /* this thread is the one watched */
static atomic_int wd_in_mpi;                    /* the main thread is inside a blocking MPI call */
static _Atomic(const char *) wd_call = "";      /* which one */
static atomic_llong wd_last_ns;                 /* CLOCK_MONOTONIC of the last progress */
static atomic_long wd_step;

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void watchdog_tick(void) { atomic_store_explicit(&wd_last_ns, now_ns(), memory_order_relaxed); }

/* The blocking calls: entering and leaving one marks the main thread as waiting. */
static inline void enter(const char *name) {
  if (!wd_is_main) return;
  atomic_store_explicit(&wd_call, name, memory_order_relaxed);
  atomic_store_explicit(&wd_in_mpi, 1, memory_order_relaxed);
}
static inline int leave(int rc) {
  if (wd_is_main) atomic_store_explicit(&wd_in_mpi, 0, memory_order_relaxed);
  return rc;
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  enter("MPI_Allreduce");
  return leave(PMPI_Allreduce(s, r, n, t, op, c));
}
int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
  enter("MPI_Reduce");
  return leave(PMPI_Reduce(s, r, n, t, op, root, c));
}
int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  enter("MPI_Bcast");
  return leave(PMPI_Bcast(b, n, t, root, c));
}
int MPI_Barrier(MPI_Comm c) {
  enter("MPI_Barrier");
  return leave(PMPI_Barrier(c));
}
int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
  enter("MPI_Gather");
  return leave(PMPI_Gather(s, sn, st, r, rn, rt, root, c));
}
int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *d, MPI_Datatype rt, int root,
                MPI_Comm c) {
  enter("MPI_Gatherv");
  return leave(PMPI_Gatherv(s, sn, st, r, rn, d, rt, root, c));
}
int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
  enter("MPI_Allgather");
  return leave(PMPI_Allgather(s, sn, st, r, rn, rt, c));
}
int MPI_Alltoall(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
  enter("MPI_Alltoall");
  return leave(PMPI_Alltoall(s, sn, st, r, rn, rt, c));
}
int MPI_Alltoallv(const void *s, const int *sn, const int *sd, MPI_Datatype st, void *r, const int *rn, const int *rd,
                  MPI_Datatype rt, MPI_Comm c) {
  enter("MPI_Alltoallv");
  return leave(PMPI_Alltoallv(s, sn, sd, st, r, rn, rd, rt, c));
}
int MPI_Exscan(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  enter("MPI_Exscan");
  return leave(PMPI_Exscan(s, r, n, t, op, c));
}
int MPI_Send(const void *b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c) {
  enter("MPI_Send");
  return leave(PMPI_Send(b, n, t, dest, tag, c));
}
int MPI_Recv(void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st) {
  enter("MPI_Recv");
  return leave(PMPI_Recv(b, n, t, src, tag, c, st));
}
int MPI_Wait(MPI_Request *r, MPI_Status *st) {
  enter("MPI_Wait");
  return leave(PMPI_Wait(r, st));
}
int MPI_Waitall(int n, MPI_Request r[], MPI_Status st[]) {
  enter("MPI_Waitall");
  return leave(PMPI_Waitall(n, r, st));
}

/* ---- faults for tests ------------------------------------------------------------------------------ */

static void inject_fault(long step, int rank) {
  env_fault f;
  if (!env_get_fault(&f) || f.rank != rank || f.step != step) return;
  fprintf(stderr, "greenlm: GREENLM_FAULT: rank %d %s at step %ld\n", rank,
          f.kind == ENV_FAULT_STALL ? "stops answering" : f.kind == ENV_FAULT_EXIT ? "exits" : "crashes", step);
  fflush(stderr);
  if (f.kind == ENV_FAULT_EXIT) _exit(1);
  if (f.kind == ENV_FAULT_CRASH) raise(SIGSEGV);
  for (;;) pause(); /* stall: outside MPI, for ever */
}

/* ---- heartbeats -------------------------------------------------------------------------------------- */

enum { TAG_BEAT = 1, TAG_LAST = 2 };

typedef struct {
  double idle;  /* seconds since the main thread's last progress */
  long step;
  int in_mpi;
  char call[24];
} wd_beat;

typedef struct {
  wd_beat beat;
  double at;    /* rank 0's clock when it arrived (seconds); the start before the first */
} wd_seen;

static struct {
  int on, rank, size;
  double timeout, period;
  MPI_Comm comm;
  pthread_t thread;
  atomic_int stop;
  wd_seen *seen; /* rank 0: (size) */
} wd;

static double seconds(void) { return (double)now_ns() * 1e-9; }

static wd_beat my_beat(void) {
  wd_beat b;
  memset(&b, 0, sizeof b);
  b.idle = (double)(now_ns() - atomic_load(&wd_last_ns)) * 1e-9;
  b.step = atomic_load(&wd_step);
  b.in_mpi = atomic_load(&wd_in_mpi);
  util_strlcpy(b.call, b.in_mpi ? atomic_load(&wd_call) : "", sizeof b.call);
  return b;
}

/* Rank 0: take every heartbeat that has arrived; returns the ranks that sent their last one. */
static int drain(int *finished) {
  int flag, n = 0;
  MPI_Status st;
  for (;;) {
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, wd.comm, &flag, &st);
    if (!flag) return n;
    wd_beat b;
    PMPI_Recv(&b, (int)sizeof b, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, wd.comm, MPI_STATUS_IGNORE);
    if (st.MPI_TAG == TAG_LAST) {
      finished[st.MPI_SOURCE] = 1;
      n++;
    } else {
      wd.seen[st.MPI_SOURCE] = (wd_seen){b, seconds()};
    }
  }
}

/* Rank 0: has every rank gone without progress for the timeout? Then name the culprit and end. */
static void judge(double t) {
  wd.seen[0] = (wd_seen){my_beat(), t};
  double least = 1e300;
  for (int r = 0; r < wd.size; r++) {
    double idle = wd.seen[r].beat.idle + (t - wd.seen[r].at);
    if (idle < least) least = idle;
  }
  if (least < wd.timeout) return;
  char msg[1024];
  int o = 0, culprits = 0;
  for (int r = 0; r < wd.size && o < (int)sizeof msg - 200; r++) /* silent ranks first */
    if (t - wd.seen[r].at > wd.timeout)
      o += util_snprintf(msg + o, sizeof msg - (size_t)o, "%srank %d stopped answering: no heartbeat for %.0f s (its "
                         "process or its node died)", culprits++ ? "; " : "", r, t - wd.seen[r].at);
  for (int r = 0; r < wd.size && !culprits; r++)
    if (!wd.seen[r].beat.in_mpi)
      o += util_snprintf(msg + o, sizeof msg - (size_t)o, "%srank %d stopped answering: busy outside MPI for %.0f s in "
                         "step %ld (a stall in computation, a device or a file system)", culprits++ ? "; " : "", r,
                         wd.seen[r].beat.idle + (t - wd.seen[r].at), wd.seen[r].beat.step);
  if (!culprits) {
    int worst = 0;
    for (int r = 1; r < wd.size; r++)
      if (wd.seen[r].beat.idle + (t - wd.seen[r].at) > wd.seen[worst].beat.idle + (t - wd.seen[worst].at)) worst = r;
    o += util_snprintf(msg + o, sizeof msg - (size_t)o, "every rank waits in MPI (a deadlock); rank %d progressed least "
                       "recently, %.0f s ago, in step %ld, now in %s", worst, wd.seen[worst].beat.idle + (t - wd.seen[worst].at),
                       wd.seen[worst].beat.step, wd.seen[worst].beat.call);
  }
  fprintf(stderr, "greenlm: error: the watchdog ends the job: no rank made progress for %.0f s: %s\n"
                  "  hint: &job step_timeout = %g sets the limit; the checkpoints written so far are intact\n",
          wd.timeout, msg, wd.timeout);
  util_abort(WATCHDOG_EXIT);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void *watch(void *arg) {
  (void)arg;
  MPI_Request req = MPI_REQUEST_NULL;
  wd_beat out;
  int *finished = wd.rank == 0 ? util_calloc((size_t)wd.size, sizeof(int), "watchdog") : NULL, nfinished = 1;
  while (!atomic_load(&wd.stop)) {
    sleep_s(wd.period);
    double t = seconds();
    if (wd.rank == 0) {
      nfinished += drain(finished);
      judge(t);
      continue;
    }
    int done = 1;
    if (req != MPI_REQUEST_NULL) PMPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) {
      out = my_beat();
      PMPI_Isend(&out, (int)sizeof out, MPI_BYTE, 0, TAG_BEAT, wd.comm, &req);
    }
    if (out.idle > 2 * wd.timeout + 10 * wd.period) { /* rank 0's watchdog should have acted: it may be gone */
      fprintf(stderr, "greenlm: error: the watchdog ends the job: rank %d made no progress for %.0f s and rank 0 did "
                      "not answer (rank 0 may have died)\n", wd.rank, out.idle);
      util_abort(WATCHDOG_EXIT);
    }
  }
  /* the end: every rank's last message reaches rank 0, so no send is left pending */
  if (wd.rank == 0) {
    while (nfinished < wd.size) {
      nfinished += drain(finished);
      if (nfinished < wd.size) sleep_s(0.001);
    }
    free(finished);
  } else {
    if (req != MPI_REQUEST_NULL) PMPI_Wait(&req, MPI_STATUS_IGNORE);
    wd_beat last = my_beat();
    PMPI_Send(&last, (int)sizeof last, MPI_BYTE, 0, TAG_LAST, wd.comm);
  }
  return NULL;
}

void watchdog_start(MPI_Comm comm, double timeout) {
  wd_is_main = 1;
  watchdog_tick();
  atomic_store(&wd_step, 0);
  memset(&wd, 0, sizeof wd);
  MPI_Comm_rank(comm, &wd.rank);
  MPI_Comm_size(comm, &wd.size);
  int level;
  MPI_Query_thread(&level);
  if (timeout <= 0 || level < MPI_THREAD_MULTIPLE) {
    if (timeout > 0 && wd.rank == 0)
      fprintf(stderr, "greenlm: warning: no watchdog: the MPI library does not support MPI_THREAD_MULTIPLE\n");
    return;
  }
  wd.timeout = timeout;
  wd.period = timeout / 20 < 0.05 ? 0.05 : timeout / 20 > 2 ? 2 : timeout / 20;
  MPI_Comm_dup(comm, &wd.comm);
  if (wd.rank == 0) {
    wd.seen = util_malloc((size_t)wd.size * sizeof *wd.seen, "watchdog");
    double t = seconds();
    for (int r = 0; r < wd.size; r++) wd.seen[r] = (wd_seen){.at = t}; /* a grace of one timeout for the first beat */
  }
  UTIL_CHECK(pthread_create(&wd.thread, NULL, watch, NULL) == 0, NULL, "cannot start the watchdog thread");
  wd.on = 1;
}

void watchdog_step(long step) {
  atomic_store(&wd_step, step);
  watchdog_tick();
  inject_fault(step, wd.rank);
}

void watchdog_stop(void) {
  if (!wd.on) return;
  atomic_store(&wd.stop, 1);
  pthread_join(wd.thread, NULL);
  MPI_Comm_free(&wd.comm);
  free(wd.seen);
  wd.seen = NULL;
  wd.on = 0;
}
