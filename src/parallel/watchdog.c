/* watchdog: heartbeats to rank 0, the culprit named, the job ended; MPI calls counted through PMPI. */
#include "parallel/watchdog.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/progress.h"
#include "base/util.h"

/* ---- what the main thread is doing (written by it, read by the watchdog thread) ----------------- */

/* What the main thread is doing, as its heartbeats say. */
enum { WD_BUSY, WD_MPI, WD_IO }; /* computing (or in a file system outside MPI), waiting in MPI, in MPI-IO */

static _Thread_local int wd_is_main;            /* this thread is the one watched */
static atomic_int wd_state;                     /* WD_BUSY, WD_MPI or WD_IO */
static _Atomic(const char *) wd_call = "";      /* the MPI call it is in */
static atomic_long wd_step;

/* The blocking calls: entering and leaving one marks the main thread as waiting. */
static inline void enter(const char *name) {
  if (!wd_is_main) return;
  atomic_store_explicit(&wd_call, name, memory_order_relaxed);
  atomic_store_explicit(&wd_state, WD_MPI, memory_order_relaxed);
}
static inline int leave(int rc) {
  if (wd_is_main) atomic_store_explicit(&wd_state, WD_BUSY, memory_order_relaxed);
  return rc;
}
/* MPI-IO: entering and leaving a call is progress of the rank doing it (a checkpoint's collective
 * writes take as long as the file system does). */
static inline void enter_io(const char *name) {
  if (!wd_is_main) return;
  progress_mark();
  atomic_store_explicit(&wd_call, name, memory_order_relaxed);
  atomic_store_explicit(&wd_state, WD_IO, memory_order_relaxed);
}
static inline int leave_io(int rc) {
  if (!wd_is_main) return rc;
  progress_mark();
  atomic_store_explicit(&wd_state, WD_BUSY, memory_order_relaxed);
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

/* The MPI-IO calls PnetCDF makes. */
int MPI_File_open(MPI_Comm c, const char *name, int mode, MPI_Info info, MPI_File *fh) {
  enter_io("MPI_File_open");
  return leave_io(PMPI_File_open(c, name, mode, info, fh));
}
int MPI_File_close(MPI_File *fh) {
  enter_io("MPI_File_close");
  return leave_io(PMPI_File_close(fh));
}
int MPI_File_sync(MPI_File fh) {
  enter_io("MPI_File_sync");
  return leave_io(PMPI_File_sync(fh));
}
int MPI_File_set_view(MPI_File fh, MPI_Offset disp, MPI_Datatype et, MPI_Datatype ft, const char *rep, MPI_Info info) {
  enter_io("MPI_File_set_view");
  return leave_io(PMPI_File_set_view(fh, disp, et, ft, rep, info));
}
int MPI_File_write_at(MPI_File fh, MPI_Offset o, const void *b, int n, MPI_Datatype t, MPI_Status *st) {
  enter_io("MPI_File_write_at");
  return leave_io(PMPI_File_write_at(fh, o, b, n, t, st));
}
int MPI_File_write_at_all(MPI_File fh, MPI_Offset o, const void *b, int n, MPI_Datatype t, MPI_Status *st) {
  enter_io("MPI_File_write_at_all");
  return leave_io(PMPI_File_write_at_all(fh, o, b, n, t, st));
}
int MPI_File_write_all(MPI_File fh, const void *b, int n, MPI_Datatype t, MPI_Status *st) {
  enter_io("MPI_File_write_all");
  return leave_io(PMPI_File_write_all(fh, b, n, t, st));
}
int MPI_File_read_at(MPI_File fh, MPI_Offset o, void *b, int n, MPI_Datatype t, MPI_Status *st) {
  enter_io("MPI_File_read_at");
  return leave_io(PMPI_File_read_at(fh, o, b, n, t, st));
}
int MPI_File_read_at_all(MPI_File fh, MPI_Offset o, void *b, int n, MPI_Datatype t, MPI_Status *st) {
  enter_io("MPI_File_read_at_all");
  return leave_io(PMPI_File_read_at_all(fh, o, b, n, t, st));
}
int MPI_File_read_all(MPI_File fh, void *b, int n, MPI_Datatype t, MPI_Status *st) {
  enter_io("MPI_File_read_all");
  return leave_io(PMPI_File_read_all(fh, b, n, t, st));
}

static void sleep_s(double s);

/* ---- faults for tests ------------------------------------------------------------------------------ */

static void inject_fault(long step, int rank) {
  env_fault f;
  if (!env_get_fault(&f) || f.rank != rank || f.step != step) return;
  static const char *const what[] = {"stops answering", "exits", "crashes", "stops (SIGSTOP)", "pauses for 1 s"};
  fprintf(stderr, "greenlm: GREENLM_FAULT: rank %d %s at step %ld\n", rank, what[f.kind], step);
  fflush(stderr);
  switch (f.kind) {
  case ENV_FAULT_EXIT: _exit(1);
  case ENV_FAULT_CRASH: raise(SIGSEGV); return;
  case ENV_FAULT_STOP: raise(SIGSTOP); return; /* every thread stops: the watchdog's heartbeats too */
  case ENV_FAULT_SLOW: sleep_s(1.0); return;
  case ENV_FAULT_STALL: break;
  }
  for (;;) pause(); /* stall: outside MPI, for ever */
}

/* ---- heartbeats -------------------------------------------------------------------------------------- */

enum { TAG_BEAT = 1, TAG_LAST = 2 };

typedef struct {
  double idle;    /* seconds since the main thread's last progress */
  double longest; /* the longest interval between its progress marks since the first step */
  long step;      /* 0 before the first step */
  int state;      /* WD_BUSY, WD_MPI or WD_IO */
  char call[24];
} wd_beat;

typedef struct {
  wd_beat beat;
  double at;    /* rank 0's clock when it arrived (seconds); the start before the first */
} wd_seen;

static struct {
  int on, rank, size;
  watchdog_rule rule;
  double period;
  atomic_llong limit_ms; /* the limit now (watchdog_limit) */
  MPI_Comm comm;
  pthread_t thread;
  int stop;             /* watchdog_stop asks the thread to end (under lock, with wake) */
  pthread_mutex_t lock;
  pthread_cond_t wake;
  wd_seen *seen; /* rank 0: (size) */
} wd;

static double seconds(void) { return (double)progress_now_ns() * 1e-9; }

static wd_beat my_beat(void) {
  wd_beat b;
  memset(&b, 0, sizeof b);
  b.idle = (double)(progress_now_ns() - progress_last_ns()) * 1e-9;
  b.longest = progress_longest();
  b.step = atomic_load(&wd_step);
  b.state = atomic_load(&wd_state);
  util_strlcpy(b.call, b.state != WD_BUSY ? atomic_load(&wd_call) : "", sizeof b.call);
  return b;
}

/* The limit for a job whose slowest phase so far took `longest` seconds. */
static double limit_for(double longest) {
  const watchdog_rule *r = &wd.rule;
  return r->fixed > 0 ? r->fixed : fmax(r->floor, WATCHDOG_FACTOR * longest);
}

/* The limit on progress: before the first step at least WATCHDOG_STARTUP, unless it is fixed. */
static double progress_limit(double limit, int started) {
  return started || wd.rule.fixed > 0 ? limit : fmax(limit, WATCHDOG_STARTUP);
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

/* End the job: the reason, and a hint that says which limit was reached. */
static void end_job(const char *why, double limit) {
  char hint[256];
  if (wd.rule.fixed > 0)
    util_snprintf(hint, sizeof hint, "&job step_timeout = %g sets the limit", wd.rule.fixed);
  else
    util_snprintf(hint, sizeof hint, "the limit is adaptive, max(&job watchdog_floor = %g s, %d x the slowest phase so far); "
                  "&job step_timeout = SECONDS fixes it", wd.rule.floor, WATCHDOG_FACTOR);
  fprintf(stderr, "greenlm: error: the watchdog ends the job at a limit of %.0f s: %s\n"
                  "  hint: %s; the checkpoints written so far are intact\n", limit, why, hint);
  util_abort(WATCHDOG_EXIT);
}

/* Seconds rank r has gone without progress, at time t. */
static double idle_of(int r, double t) { return wd.seen[r].beat.idle + (t - wd.seen[r].at); }

/* Rank 0: the ranks whose heartbeats stopped for the limit, into msg; how many. */
static int silent_ranks(double t, double limit, char *msg, size_t len) {
  int n = 0, o = 0;
  for (int r = 1; r < wd.size && o < (int)len - 200; r++)
    if (t - wd.seen[r].at > limit)
      o += util_snprintf(msg + o, len - (size_t)o, "%srank %d stopped answering: no heartbeat for %.0f s, last in step %ld "
                         "(its process was stopped or died, or its node froze)", n++ ? "; " : "", r, t - wd.seen[r].at,
                         wd.seen[r].beat.step);
  return n;
}

/* Rank 0, when no rank progressed: the culprit into msg, in the order of evidence (module comment). */
static void name_culprit(double t, char *msg, size_t len) {
  static const int order[] = {WD_BUSY, WD_IO}; /* busy outside MPI, then in MPI-IO */
  int o = 0, n = 0;
  for (int i = 0; i < 2 && !n; i++)
    for (int r = 0, kind = order[i]; r < wd.size && o < (int)len - 200; r++)
      if (wd.seen[r].beat.state == kind)
        o += util_snprintf(msg + o, len - (size_t)o, kind == WD_BUSY ? "%srank %d stopped answering: busy outside MPI for "
                           "%.0f s in step %ld%s (a stall in computation, a device or a file system)" : "%srank %d stopped "
                           "answering: in MPI-IO for %.0f s in step %ld, in %s (a file system stall, or a rank missing from "
                           "a collective write)", n++ ? "; " : "", r, idle_of(r, t), wd.seen[r].beat.step,
                           kind == WD_BUSY ? "" : wd.seen[r].beat.call);
  if (n) return;
  int worst = 0;
  for (int r = 1; r < wd.size; r++)
    if (idle_of(r, t) > idle_of(worst, t)) worst = r;
  util_snprintf(msg, len, "no rank made progress: every rank waits in MPI (a deadlock); rank %d progressed least recently, "
                "%.0f s ago, in step %ld, now in %s", worst, idle_of(worst, t), wd.seen[worst].beat.step,
                wd.seen[worst].beat.call);
}

/* Rank 0: a rank silent for the limit, or no rank progressing for it, ends the job. */
static void judge(double t) {
  wd.seen[0] = (wd_seen){my_beat(), t};
  double longest = 0, least = 1e300;
  int started = 1;
  for (int r = 0; r < wd.size; r++) {
    longest = fmax(longest, wd.seen[r].beat.longest);
    started &= wd.seen[r].beat.step > 0;
    least = fmin(least, idle_of(r, t));
  }
  const double limit = limit_for(longest);
  atomic_store(&wd.limit_ms, (long long)(limit * 1e3));
  char msg[1024];
  if (silent_ranks(t, limit, msg, sizeof msg)) end_job(msg, limit);
  const double plimit = progress_limit(limit, started);
  if (least < plimit) return;
  /* no progress for the limit: a rank silent for half of it has stopped, though its last beat, sent
   * late under load, may say that it waited in MPI and the silence has not yet reached the limit */
  if (!silent_ranks(t, limit / 2, msg, sizeof msg)) name_culprit(t, msg, sizeof msg);
  end_job(msg, plimit);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* A rank other than 0: a heartbeat when the last one has left; its own limit; and, should rank 0's
 * watchdog have acted long ago, the end of the job (rank 0 may have stopped). */
static void beat(MPI_Request *req, wd_beat *out) {
  int done = 1;
  if (*req != MPI_REQUEST_NULL) PMPI_Test(req, &done, MPI_STATUS_IGNORE);
  wd_beat now = my_beat();
  if (done) {
    *out = now;
    PMPI_Isend(out, (int)sizeof *out, MPI_BYTE, 0, TAG_BEAT, wd.comm, req);
  }
  const double limit = limit_for(now.longest);
  atomic_store(&wd.limit_ms, (long long)(limit * 1e3));
  if (now.idle > 2 * progress_limit(limit, now.step > 0) + 10 * wd.period) {
    fprintf(stderr, "greenlm: error: the watchdog ends the job: rank %d made no progress for %.0f s and rank 0 did not "
                    "answer (rank 0 may have stopped or died)\n", wd.rank, now.idle);
    util_abort(WATCHDOG_EXIT);
  }
}

/* Sleep one period, or less when watchdog_stop wakes the thread; whether to stop. */
static int wait_period(void) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  long long ns = until.tv_nsec + (long long)(wd.period * 1e9);
  until.tv_sec += (time_t)(ns / 1000000000LL);
  until.tv_nsec = (long)(ns % 1000000000LL);
  pthread_mutex_lock(&wd.lock);
  int rc = 0;
  while (!wd.stop && rc == 0) rc = pthread_cond_timedwait(&wd.wake, &wd.lock, &until); /* ETIMEDOUT: the period is over */
  int stop = wd.stop;
  pthread_mutex_unlock(&wd.lock);
  return stop;
}

static void *watch(void *arg) {
  (void)arg;
  MPI_Request req = MPI_REQUEST_NULL;
  wd_beat out;
  int *finished = wd.rank == 0 ? util_calloc((size_t)wd.size, sizeof(int), "watchdog") : NULL, nfinished = 1;
  while (!wait_period()) {
    if (wd.rank == 0) {
      nfinished += drain(finished);
      judge(seconds());
    } else {
      beat(&req, &out);
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

void watchdog_start(MPI_Comm comm, watchdog_rule rule) {
  wd_is_main = 1;
  progress_measure(0);
  progress_mark();
  atomic_store(&wd_step, 0);
  memset(&wd, 0, sizeof wd);
  MPI_Comm_rank(comm, &wd.rank);
  MPI_Comm_size(comm, &wd.size);
  int level;
  MPI_Query_thread(&level);
  if (!rule.on || level < MPI_THREAD_MULTIPLE) {
    if (rule.on && wd.rank == 0)
      fprintf(stderr, "greenlm: warning: no watchdog: the MPI library does not support MPI_THREAD_MULTIPLE\n");
    return;
  }
  wd.rule = rule;
  const double least = rule.fixed > 0 ? rule.fixed : rule.floor;
  wd.period = least / 20 < 0.05 ? 0.05 : least / 20 > 2 ? 2 : least / 20;
  atomic_store(&wd.limit_ms, (long long)(limit_for(0) * 1e3));
  MPI_Comm_dup(comm, &wd.comm);
  if (wd.rank == 0) {
    wd.seen = util_malloc((size_t)wd.size * sizeof *wd.seen, "watchdog");
    double t = seconds();
    for (int r = 0; r < wd.size; r++) wd.seen[r] = (wd_seen){.at = t}; /* a grace of one limit for the first beat */
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the period's deadline on the clock wait_period reads */
  pthread_cond_init(&wd.wake, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&wd.lock, NULL);
  UTIL_CHECK(pthread_create(&wd.thread, NULL, watch, NULL) == 0, NULL, "cannot start the watchdog thread");
  wd.on = 1;
}

double watchdog_limit(void) { return wd.on ? (double)atomic_load(&wd.limit_ms) * 1e-3 : 0.0; }

double watchdog_limit_after(double longest) { return wd.on ? fmax(watchdog_limit(), limit_for(longest)) : 0.0; }

const char *watchdog_describe(watchdog_rule rule, char *buf, size_t len) {
  if (!rule.on) util_snprintf(buf, len, "off (&job watchdog = .false.)");
  else if (rule.fixed > 0)
    util_snprintf(buf, len, "fixed: the job ends when a rank's heartbeats stop, or no rank progresses, for %g s (&job "
                  "step_timeout)", rule.fixed);
  else
    util_snprintf(buf, len, "adaptive: the job ends when a rank's heartbeats stop, or no rank progresses, for max(%g s, %d x "
                  "the slowest phase so far) (progress: %g s before the first step)", rule.floor, WATCHDOG_FACTOR,
                  WATCHDOG_STARTUP);
  return buf;
}

void watchdog_step(long step) {
  if (atomic_load(&wd_step) == 0) progress_measure(1);
  atomic_store(&wd_step, step);
  progress_mark();
  inject_fault(step, wd.rank);
}

void watchdog_stop(void) {
  if (!wd.on) return;
  pthread_mutex_lock(&wd.lock);
  wd.stop = 1;
  pthread_cond_signal(&wd.wake);
  pthread_mutex_unlock(&wd.lock);
  pthread_join(wd.thread, NULL);
  pthread_cond_destroy(&wd.wake);
  pthread_mutex_destroy(&wd.lock);
  MPI_Comm_free(&wd.comm);
  free(wd.seen);
  wd.seen = NULL;
  wd.on = 0;
}
