/* train: the training task: set-up, restore, the step loop with its progress lines and
 * checkpoints, the verdict, clean-up (train_run reads as that list of phases). */
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/progress.h"
#include "base/util.h"
#include "config.h"
#include "energy/energy.h"
#include "energy/metrics.h"
#include "io/ckpt.h"
#include "model/generate.h"
#include "eval/evaluate.h"
#include "textgen.h"
#include "model/sample.h"
#include "parallel/topo.h"
#include "parallel/watchdog.h"
#include "trainer.h"

/* Since the last progress line: time, tokens, steps, compute, bubble, exchange (rank-seconds), bytes. */
typedef struct {
  double time, tokens, steps, compute, bubble, exchange, bytes, tensor; /* tensor: the tensor ranks' sums */
  double grad_bytes, grad_fp32, encode, decode; /* the gradient exchange: bytes, their fp32 equivalent, seconds */
  double grad_inter;                            /* of grad_bytes: to collectives among ranks of several nodes */
  double q_measured, q_expected, q_norm2;       /* its quantization error, where measured (qexch_error) */
} train_window;

/* The run so far, carried from step to step: every rank's, the same on all, unless marked rank 0. */
typedef struct {
  long start;          /* the step the job began at: the restored checkpoint's, else 0 */
  long steps_done;     /* steps done, by this job and the ones before it */
  double tokens0;      /* tokens trained before this job (the checkpoint's count) */
  double tokens;       /* tokens trained by this job */
  double t_start;      /* util_now() when the steps began */
  double t_ckpt;       /* util_now() at the last checkpoint, else when the steps began (&checkpoint every_minutes) */
  double train_time;   /* the steps' wall time, each step's slowest rank's */
  double last_loss;    /* the last step's training loss */
  double val_loss;     /* the last evaluation's loss, weighted over the validation datasets; NaN before one */
  double *val_losses;  /* (nval) the last evaluation's loss of each validation dataset */
  double grad_bytes;   /* rank 0: the gradient exchange's bytes handed to the collectives (all ranks) */
  double grad_fp32;    /* rank 0: the same exchanges' bytes in fp32 */
  double grad_inter;   /* rank 0: of grad_bytes, those handed to collectives among ranks of several nodes */
  double tp_bytes;     /* rank 0: bytes handed to the tensor-parallel sums (all ranks) */
  double tp_s;         /* rank 0: rank-seconds in the tensor-parallel sums */
  train_window win;    /* since the last progress line */
} train_tally;

/* One training job on this rank: the trainer and everything that reports on it. */
typedef struct {
  const cfg_config *cfg;
  const backend *be;
  int rank, size;
  trainer *t;
  energy_meter energy;
  metrics_out out;
  int energy_opened, out_opened;       /* what clean-up has to close */
  double flops_per_token, peak_gflops; /* the job's peak: all ranks */
  char engine[256];
  topo_machine machine;
  int resuming;                        /* &checkpoint restart is set: continue the run in run_dir */
  train_tally tally;                   /* the run so far */
  const char *status;                  /* completed, diverged, time_limit, signal, checkpoint_failed */
  eval_benchmarks bench;               /* &eval benchmarks, scored at each evaluation (one stage) */
  double watch_shown;                  /* rank 0: the watchdog's limit last announced */
  int job;                             /* rank 0: this job's number in the run's restart chain (jobs.csv) */
  double mfu_high;                     /* rank 0: the highest MFU a progress line showed */
  const char *peak_source;             /* where peak_gflops came from */
  char restored[CKPT_PATH_MAX];        /* the checkpoint this job continues, "" for none */
} train_job;

/* ---- signals: a batch system's warning before the time limit, or Ctrl-C --------------------------- */

static volatile sig_atomic_t train_signal;

/* The first SIGTERM, SIGINT or SIGUSR1 asks for a checkpoint and a clean stop after the step; a
 * second SIGTERM or SIGINT stops at once. */
static void on_signal(int sig) {
  if (train_signal && sig != SIGUSR1) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
  train_signal = sig;
}

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}

static const char *signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

/* ---- the run directory ------------------------------------------------------------------------- */

/* Rank 0, a fresh start: a run directory that holds a finished run's files or another run's
 * checkpoints is refused unless &job overwrite is set; with it, the checkpoints are moved aside
 * later (never mixed with this run's, never deleted). Returns the number of errors. */
static int check_run_dir(const cfg_config *cfg, int *set_aside, err_list *errs) {
  char path[UTIL_PATH_MAX], dir[CKPT_PATH_MAX];
  struct stat sb;
  util_snprintf(path, sizeof path, "%s/metrics.csv", cfg->job.run_dir);
  ckpt_dir(cfg, dir, sizeof dir);
  int finished = stat(path, &sb) == 0, nckpt = ckpt_count(dir);
  *set_aside = cfg->job.overwrite && nckpt > 0;
  if (cfg->job.overwrite) return 0;
  if (finished)
    cfg_error_at(cfg, errs, "job", "run_dir",
                 "choose a new run_dir, or set &job overwrite = .true. (or --set job.overwrite=T) to replace it",
                 "'%s' already holds a run (metrics.csv exists)", cfg->job.run_dir);
  else if (nckpt > 0)
    cfg_error_at(cfg, errs, "job", "run_dir",
                 "continue that run with &checkpoint restart = 'latest', or set &job overwrite = .true. (its checkpoints "
                 "are then moved aside, not deleted)", "'%s' holds %d checkpoint%s of an earlier run", dir, nckpt,
                 nckpt == 1 ? "" : "s");
  return finished || nckpt > 0;
}

int train_preflight(const cfg_config *cfg, err_list *errs) {
  int rank, set_aside = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int bad = rank == 0 && !cfg->checkpoint.restart[0] ? check_run_dir(cfg, &set_aside, errs) : 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad;
}

static int write_resolved_deck(const cfg_config *cfg, const char *header) {
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/deck.resolved.nml", cfg->job.run_dir);
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) return -1;
  cfg_write_deck(cfg, af.fp, header);
  return util_atomic_close(&af);
}

/* Rank 0: the run directory's files, once the inputs are known to be good. Returns 0 or -1. */
static int open_outputs(train_job *j, int set_aside, const char *header, err_list *errs) {
  const cfg_config *cfg = j->cfg;
  char moved[CKPT_PATH_MAX + 64];
  if (ckpt_check_dir(cfg, errs) != 0) return -1;
  if (set_aside && ckpt_set_aside_dir(cfg, moved, sizeof moved, errs) != 0) return -1;
  if (metrics_open(&j->out, cfg->job.run_dir, j->resuming, errs) != 0) return -1;
  j->out_opened = 1;
  static const char *const appended[] = {"val.csv", "bench.csv"}; /* rows added at each evaluation */
  for (int i = 0; i < 2 && !j->resuming; i++) { /* a fresh start (overwrite): the earlier run's rows go */
    char path[UTIL_PATH_MAX];
    util_snprintf(path, sizeof path, "%s/%s", cfg->job.run_dir, appended[i]);
    unlink(path);
  }
  if (write_resolved_deck(cfg, header) != 0) {
    err_add(errs, cfg->job.run_dir, 0, 0, "check that the directory is writable and the disk is not full",
            "cannot write deck.resolved.nml: %s", strerror(errno));
    return -1;
  }
  if (set_aside)
    metrics_printf(&j->out, "overwrite: the earlier run's checkpoints were moved to %s (delete them when no longer "
                            "needed)\n", moved);
  char *echo = NULL;
  size_t elen = 0;
  FILE *fp = open_memstream(&echo, &elen);
  cfg_write_deck(cfg, fp, NULL);
  fclose(fp);
  metrics_log(&j->out, "greenlm %s: deck %s\n== resolved deck ==\n%s", PACKAGE_VERSION, cfg->deck_path, echo);
  free(echo);
  return 0;
}

/* The watchdog's rule, from &job. */
static watchdog_rule watch_rule(const cfg_job *c) {
  return (watchdog_rule){.on = c->watchdog, .fixed = c->step_timeout, .floor = c->watchdog_floor};
}

/* Rank 0: the adaptive watchdog's limit, announced when a slower phase raised it by a quarter or more. The
 * slowest phase is every rank's, from the step's agreement, not from heartbeats that may arrive late. */
static void announce_watchdog(train_job *j, double longest) {
  const cfg_job *c = &j->cfg->job;
  const double limit = watchdog_limit_after(longest);
  if (j->rank != 0 || c->step_timeout > 0 || limit < 1.25 * (j->watch_shown > 0 ? j->watch_shown : c->watchdog_floor))
    return;
  j->watch_shown = limit;
  metrics_printf(&j->out, "watchdog: the limit is now %.0f s (%d x the slowest phase so far, %.2f s)\n", limit,
                 WATCHDOG_FACTOR, limit / WATCHDOG_FACTOR);
}

/* ---- the job's header -------------------------------------------------------------------------- */

/* Tensor groups whose ranks are not on one node sum their activations across the network, four
 * times per block and micro-batch: a warning on rank 0 with how many do. Collective. */
static void tensor_groups_on_nodes(train_job *r) {
  const trainer *t = r->t;
  int node, lo, hi, split, nsplit; /* a node's id: the lowest job rank on it */
  MPI_Allreduce(&t->rank, &node, 1, MPI_INT, MPI_MIN, t->lay.node);
  MPI_Allreduce(&node, &lo, 1, MPI_INT, MPI_MIN, t->lay.tensor);
  MPI_Allreduce(&node, &hi, 1, MPI_INT, MPI_MAX, t->lay.tensor);
  split = t->lay.tp_rank == 0 && lo != hi;
  MPI_Reduce(&split, &nsplit, 1, MPI_INT, MPI_SUM, 0, t->comm);
  if (t->rank == 0 && nsplit > 0)
    metrics_printf(&r->out, "warning: %d of %d tensor groups span nodes: their sums cross the network (tensor_parallel = %d "
                            "should divide the ranks per node)\n", nsplit, t->size / t->lay.tp, t->lay.tp);
}

/* Topology: every rank's host, node rank, binding and place in the layout, printed by rank 0. */
static void print_topology(train_job *r, const char *bind) {
  trainer *t = r->t;
  enum { LINE = 256 };
  char mine[LINE], host[64] = "?";
  int lrank, nlocal;
  MPI_Comm_rank(t->lay.node, &lrank);
  MPI_Comm_size(t->lay.node, &nlocal);
  gethostname(host, sizeof host - 1);
  char tr[32] = "";
  if (t->lay.tp > 1) util_snprintf(tr, sizeof tr, ", tensor rank %d", t->lay.tp_rank);
  util_snprintf(mine, sizeof mine, "rank %d: %s (node rank %d of %d), stage %d%s, replica %d, %s", t->rank, host, lrank,
                nlocal, t->lay.stage, tr, t->lay.replica, bind);
  char *all = t->rank == 0 ? util_malloc((size_t)t->size * LINE, "topology") : NULL;
  MPI_Gather(mine, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, t->comm);
  int leader = lrank == 0, nodes;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, t->comm);
  if (t->rank == 0) {
    char desc[1024], b[64];
    metrics_printf(&r->out, "== topology ==\nmachine: %s\n", topo_describe(&r->machine, desc, sizeof desc));
    metrics_printf(&r->out, "mpi: %s\n", comm_library(desc, sizeof desc));
    char tl[64] = "";
    if (t->lay.tp > 1) util_snprintf(tl, sizeof tl, " x %d tensor ranks", t->lay.tp);
    metrics_printf(&r->out, "%d rank%s on %d node%s: %d pipeline stage%s%s x %d data-parallel replica%s (%s), ZeRO-%d, "
                            "%d micro-batch%s per step\n",
                   t->size, t->size == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", t->lay.P, t->lay.P == 1 ? "" : "s", tl, t->lay.D,
                   t->lay.D == 1 ? "" : "s", r->cfg->parallel.rank_order, t->lay.zero, t->nmicro, t->nmicro == 1 ? "" : "es");
    metrics_printf(&r->out, "%s\n", par_describe(&t->lay, desc, sizeof desc));
    for (int i = 0; i < t->size; i++)
      if (t->size <= 64 || i < 8 || i >= t->size - 8) metrics_printf(&r->out, "%s\n", all + (size_t)i * LINE);
      else if (i == 8) metrics_printf(&r->out, "... (%d more ranks)\n", t->size - 16);
    (void)b;
  }
  free(all);
  tensor_groups_on_nodes(r);
}

/* Memory per rank of each stage (replica 0), as planned; trainer_open allocated exactly this. */
static void print_memory(train_job *r) {
  trainer *t = r->t;
  if (t->rank != 0) return;
  for (int s = 0; s < t->lay.P; s++) {
    trainer_memory m = trainer_plan_fullest(r->cfg, t->be, &t->lay, s);
    char b[6][32];
    metrics_printf(&r->out, "memory, stage %d: parameters %s, gradients %s, AdamW %s%s, activations %s (%d slot%s)%s%s; "
                            "total %s per rank\n",
                   s, util_fmt_bytes((double)(m.model.params + m.model.compute), b[0], 32),
                   util_fmt_bytes((double)m.model.grads, b[1], 32),
                   util_fmt_bytes((double)m.adam, b[2], 32), t->lay.zero && t->lay.D > 1 ? " (ZeRO-1 shard)" : "",
                   util_fmt_bytes((double)m.model.acts, b[3], 32), m.part.nslots, m.part.nslots == 1 ? "" : "s",
                   m.exchange + m.pipe ? ", buffers " : "",
                   m.exchange + m.pipe ? util_fmt_bytes((double)(m.exchange + m.pipe + m.model.io + m.model.work), b[4], 32) : "",
                   util_fmt_bytes((double)m.total, b[5], 32));
  }
}

/* Bytes this rank's buffers take as planned (trainer_plan_memory). */
static size_t planned_bytes(const train_job *j) {
  const trainer *t = j->t;
  return trainer_plan_memory(j->cfg, t->be, &t->lay, t->lay.stage, t->lay.replica).total;
}

/* The datasets of a blend, each with its weight ("a.nc x 0.7 + b.nc x 0.3"; one: its path) into
 * buf. Returns 1 when one of them is of format 1 (no checksums). */
static int blend_names(const data_set *set, int n, char *buf, size_t size) {
  int v1 = 0;
  buf[0] = '\0';
  for (int s = 0, o = 0; s < n && o < (int)size - 1; s++) {
    o += snprintf(buf + o, size - (size_t)o, n > 1 ? "%s%s x %.4g" : "%s%s", s ? " + " : "", set[s].file.path,
                  set[s].weight);
    v1 |= set[s].file.sum_var < 0;
  }
  return v1;
}

/* Rank 0: the model, batch, compute, data and energy lines. */
static void print_header(train_job *j) {
  const cfg_config *cfg = j->cfg;
  trainer *t = j->t;
  metrics_out *out = &j->out;
  const gpt_shape *s = &t->shape;
  size_t n = gpt_count_params(s);
  metrics_printf(out, "== model ==\n%s: %d layers, n_embd %d, %d heads, vocab %d, block %d, MLP %d; %zu parameters (%.2f M)\n",
                 cfg->model.arch, s->L, s->C, s->H, s->V, s->maxT, s->F, n, (double)n / 1e6);
  metrics_printf(out, "batch: %d sequences x %d tokens per micro-batch, %d micro-batch%s x %d replica%s = %ld tokens per step\n",
                 t->B, t->T, t->nmicro, t->nmicro == 1 ? "" : "es", t->lay.D, t->lay.D == 1 ? "" : "s", t->G * t->T);
  metrics_printf(out, "compute: %s backend, %s\n", j->be->name, j->engine);
  metrics_printf(out, "MFU basis: %.4g GFLOP per token (6N + 12LCT), peak %.1f GFLOP/s for the job (%s)\n",
                 j->flops_per_token / 1e9, j->peak_gflops, j->peak_source);
  const data_loader *d = &t->data;
  char names[2048], vnames[2048];
  int v1 = blend_names(d->set, d->nsets, names, sizeof names) | blend_names(d->val, d->nval, vnames, sizeof vnames);
  int64_t vtokens = 0;
  for (int v = 0; v < d->nval; v++) vtokens += d->val[v].file.ntokens;
  metrics_printf(out, "data: %s: %lld tokens (%llu windows of %d+1); %s: %lld tokens; tokenizer %s; %s\n", names,
                 (long long)data_train_tokens(d), (unsigned long long)d->nwin, t->T, vnames, (long long)vtokens,
                 t->tok.desc, !cfg->data.verify ? "headers checked (&data verify = .false.)"
                 : !v1 ? "every token id and checksum verified"
                 : "every token id verified (a dataset of format 1 has no checksums: prepare it again to add them)");
  for (int k = 0; k < ENERGY_NCOMP; k++)
    metrics_printf(out, "energy: %-4s %s, %s: %s\n", energy_component_name(k), energy_status_name(j->energy.src[k].status),
                   j->energy.src[k].method, j->energy.src[k].note);
  const energy_region *rg = j->energy.region;
  metrics_printf(out, "emissions: PUE %.2f, %.4g gCO2e/kWh (%s)\n", j->energy.pue, j->energy.intensity,
                 rg ? rg->label : "from the deck");
  if (t->lay.P > 1)
    metrics_printf(out, "pipeline: 1F1B, theoretical bubble (p-1)/(m+p-1) = %.1f%%\n",
                   100.0 * (t->lay.P - 1) / (t->nmicro + t->lay.P - 1));
  char wd[320];
  metrics_printf(out, "watchdog: %s\n", watchdog_describe(watch_rule(&cfg->job), wd, sizeof wd));
}


/* Why the run went faster than its peak. */
/* The compressed exchange in words: "qsgdinf 4-bit, allgather, error feedback", "topk 1%, ...",
 * "powersgd rank 4, error feedback" (its two all-reduces have no exchange form). */
static void comm_label(const cfg_comm *c, char *buf, size_t len) {
  const cfg_comm_method m = cfg_comm_method_of(c);
  int o = m == CFG_COMM_TOPK ? snprintf(buf, len, "topk %g%%, %s", 100 * c->topk_fraction, c->exchange)
          : m == CFG_COMM_POWERSGD ? snprintf(buf, len, "powersgd rank %ld", c->powersgd_rank)
                                   : snprintf(buf, len, "%s %ld-bit, %s", c->method, c->bits, c->exchange);
  if (c->error_feedback && o > 0 && (size_t)o < len) snprintf(buf + o, len - (size_t)o, ", error feedback");
}

static const char *peak_low_why(const cfg_config *cfg) {
  return cfg->system.peak_gflops > 0 ? "&system peak_gflops is below what the run reaches; raise it, or 0 measures it"
                                     : "other work shared the cores while the peak was measured, so MFU figures read high; the "
                                       "verdict measures it again";
}

/* The job's peak for MFU: the deck's, or each rank's SGEMM rate measured now, summed over the ranks
 * (collective); `source` says when it was measured. */
static void measure_peak(train_job *j, const char *source) {
  const double deck = j->cfg->system.peak_gflops;
  double mine = deck > 0 ? deck : j->be->measure_gflops(j->be, 1024, 1.0), all;
  MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  j->peak_source = deck > 0 ? "from the deck" : source;
  if (all > j->peak_gflops) j->peak_gflops = all;
}

/* Placement, threads, the peak for MFU, the energy meter, and the header lines. Returns 0, or 1
 * (on every rank) after errors. */
static int describe_job(train_job *j, err_list *errs) {
  const cfg_config *cfg = j->cfg;
  const backend *be = j->be;
  trainer *t = j->t;
  char bind[320];
  topo_discover(&j->machine);
  int cores = topo_bind(t->lay.node, cfg_parallel_bind_of(&cfg->parallel) != CFG_BIND_NONE, bind, sizeof bind);
  if (be->placement) { /* this rank's GPU and its PCI bus id, in the topology lines */
    char dev[200];
    size_t o = strlen(bind);
    util_snprintf(bind + o, sizeof bind - o, ", %s", be->placement(be, dev, sizeof dev));
  }
  be->set_threads(be, cfg->system.blas_threads > 0 ? (int)cfg->system.blas_threads : cores);
  be->describe(be, j->engine, sizeof j->engine);
  print_topology(j, bind);
  measure_peak(j, "measured SGEMM at start-up, all ranks");
  j->flops_per_token = gpt_flops_per_token(&t->shape, t->T);
  char ecsv[UTIL_PATH_MAX];
  util_snprintf(ecsv, sizeof ecsv, "%s/energy.csv", cfg->job.run_dir);
  j->energy_opened = 1; /* energy_close undoes a partial open too */
  if (energy_open(&j->energy, &cfg->energy, MPI_COMM_WORLD, t->lay.node, j->machine.cores, be->bus_id ? be->bus_id(be) : NULL,
                  j->rank == 0 ? ecsv : NULL, j->resuming, errs) != 0)
    return 1;
  if (j->rank == 0) print_header(j);
  print_memory(j);
  return 0;
}

/* ---- restore -------------------------------------------------------------------------------------- */

/* Step 0 from the Hugging Face directory &model init_from. Returns 0, or 1 after errors (every rank). */
static int init_from(train_job *j, err_list *errs) {
  double t0 = util_now();
  if (trainer_init_from(j->t, errs) != 0) return TRAIN_BAD_INPUT;
  if (j->rank == 0)
    metrics_printf(&j->out, "init: weights from the Hugging Face directory %s (config.json agrees with &model) in %.2f s\n",
                   j->cfg->model.init_from, util_now() - t0);
  return TRAIN_OK;
}

/* A checkpoint restored at or past &training max_steps: at it the run is complete and the job has
 * nothing to do (a later link of a restart chain: it ends with 0 and leaves the run's files alone);
 * past it the deck asks for fewer steps than were trained, an error at the key. Returns 0 or 1. */
static int at_max_steps(train_job *j, const char *path, err_list *errs) {
  const long step = j->tally.start, max = j->cfg->training.max_steps;
  if (step == max && j->rank == 0)
    metrics_printf(&j->out, "restart: step %ld is &training max_steps: the run is complete, nothing to train\n", step);
  if (step <= max) return 0;
  char hint[256];
  util_snprintf(hint, sizeof hint, "set max_steps above %ld to train on, or restart from an earlier checkpoint "
                "(&checkpoint restart = its path)", step);
  cfg_error_at(j->cfg, errs, "training", "max_steps", hint, "%ld, but the checkpoint %s is at step %ld: the steps "
               "trained cannot be undone", max, path, step);
  return 1;
}

/* Whether the run directory's verdict.json is a completed run's at &training max_steps (collective).
 * A job killed after the last checkpoint and before its verdict leaves none; the restart that finds
 * the run complete then writes it (no steps to train, the parameters restored). */
static int complete_verdict(const train_job *j) {
  int yes = 0;
  if (j->rank == 0) {
    char path[4096];
    util_snprintf(path, sizeof path, "%s/verdict.json", j->cfg->job.run_dir);
    json_t *v = json_load_file(path, 0, NULL);
    const char *status = json_string_value(json_object_get(v, "status"));
    json_t *last = json_object_get(json_object_get(v, "job"), "last_step");
    yes = status && strcmp(status, "completed") == 0 && json_integer_value(last) == j->cfg->training.max_steps;
    json_decref(v);
  }
  MPI_Bcast(&yes, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return yes;
}

/* The restart line's words on the error-feedback residual: restored, or why it starts from zero. */
static const char *residual_note(trainer *t, const ckpt_stats *st, char *buf, size_t len) {
  if (st->residual == 1) util_snprintf(buf, len, "; error-feedback residual restored");
  else if (st->residual == 0 && !st->residual_held[0])
    util_snprintf(buf, len, "; the error-feedback residual starts from zero (the checkpoint has none)");
  else if (st->residual == 0)
    util_snprintf(buf, len, "; the error-feedback residual starts from zero (the checkpoint's was held by %s; this "
                  "job's by %s)", st->residual_held, trainer_residual_holders(t));
  else buf[0] = 0;
  return buf;
}

/* Continue from &checkpoint restart: its path, or with 'latest' the newest complete checkpoint. A
 * damaged newest checkpoint is set aside (PATH.damaged) and the next older one tried when
 * &checkpoint fallback is set; the errors that condemned it are printed. Returns 0, or 1 after
 * errors (every rank). */
static int restore(train_job *j, err_list *errs) {
  train_tally *k = &j->tally;
  const cfg_config *cfg = j->cfg;
  char (*paths)[CKPT_PATH_MAX];
  int n = ckpt_candidates(cfg, &paths), rc = 1;
  if (n == 0) {
    char dir[CKPT_PATH_MAX];
    ckpt_dir(cfg, dir, sizeof dir);
    if (j->rank == 0) metrics_printf(&j->out, "restart: no checkpoint in %s yet: starting from step 0\n", dir);
    if (j->rank == 0) metrics_rewind(&j->out, cfg->job.run_dir, 0);
    rc = 0;
  }
  int latest = cfg_restart_latest(&cfg->checkpoint);
  for (int i = 0; i < n && rc != 0; i++) {
    ckpt_stats st;
    err_list tried = {0};
    char note[320];
    if (trainer_restore(j->t, paths[i], &k->start, &k->tokens0, &st, &tried) == 0) {
      util_strlcpy(j->restored, paths[i], sizeof j->restored);
      if (j->rank == 0)
        metrics_printf(&j->out, "restart: %s, step %ld: run state and checksums verified, %.3g GB read in %.2f s (%.2f GB/s, "
                       "%s; %.2f s of it sharing pieces between replicas)%s\n", paths[i], k->start, st.bytes / 1e9,
                       st.seconds, st.bytes / 1e9 / st.seconds, st.direct ? "straight from the disk" : "through the page cache",
                       st.share_seconds, residual_note(j->t, &st, note, sizeof note));
      rc = at_max_steps(j, paths[i], errs);
      if (rc == 0 && j->rank == 0) metrics_rewind(&j->out, cfg->job.run_dir, k->start);
      err_free(&tried);
      break; /* past max_steps: an older checkpoint is no answer */
    } else if (latest && cfg->checkpoint.fallback && i + 1 < n && st.damaged) {
      char moved[CKPT_PATH_MAX + 16], outcome[3 * CKPT_PATH_MAX];
      int mv = j->rank == 0 ? ckpt_set_aside_file(paths[i], moved, sizeof moved) : 0;
      util_snprintf(outcome, sizeof outcome, "%s is damaged: %s; trying the next older checkpoint, %s "
                    "(&checkpoint fallback)", paths[i], mv == 0 ? "set aside as .damaged" : "left in place", paths[i + 1]);
      err_report(&tried, MPI_COMM_WORLD, 10, NULL);
      if (j->rank == 0) fprintf(stderr, "greenlm: warning: %s\n", outcome), metrics_log(&j->out, "restart: %s\n", outcome);
    } else {
      if (!latest) cfg_relocate(cfg, &tried, 0, "checkpoint", "restart"); /* the deck named the file */
      for (int k = 0; k < tried.n; k++) err_add(errs, tried.v[k].file, tried.v[k].line, tried.v[k].col, tried.v[k].hint, "%s", tried.v[k].msg);
      if (latest && i + 1 < n && !cfg->checkpoint.fallback)
        err_add(errs, NULL, 0, 0, NULL, "older checkpoints are there: &checkpoint fallback = .true. would try them");
      err_free(&tried);
      break;
    }
    err_free(&tried);
  }
  free(paths);
  return rc;
}
/* Progress-line power and energy so far: measured components; else the labelled estimate. */
static void fmt_energy(const energy_meter *e, char *w, size_t wl, char *j, size_t jl) {
  if (energy_any_measured(e)) {
    snprintf(w, wl, "%.1f W", e->watts);
    snprintf(j, jl, "%.3g Wh", e->joules / 3600.0);
  } else if (e->est_joules > 0) {
    snprintf(w, wl, "%.1f W est", e->est_watts);
    snprintf(j, jl, "%.3g Wh est", e->est_joules / 3600.0);
  } else {
    snprintf(w, wl, "-- W");
    snprintf(j, jl, "-- Wh");
  }
}

/* "measured", "estimated" or "not measured": what the progress figures are */
static const char *energy_kind(const energy_meter *e) {
  return energy_any_measured(e) ? "measured" : e->est_joules > 0 ? "estimated" : "not measured";
}

static void print_to_out(void *ctx, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  metrics_printf(ctx, "%s", line);
}


/* ---- benchmarks during training ----------------------------------------------------------------- */

/* &eval benchmarks with the model as it is at this step (the whole model on every rank: one
 * pipeline stage): a line in the log, rows in bench.csv (step, task, metric, value, stderr, n).
 * Contexts longer than &training seq_len are cut on the left (the eval task plans for block_size). */
static void score_benchmarks(train_job *j) {
  trainer *t = j->t;
  for (int s = 0; s < j->bench.n; s++) {
    const bench_set *set = &j->bench.sets[s];
    bench_scores sc;
    double tokens;
    long cut;
    eval_benchmark_score(set, &t->model, &t->tok, MPI_COMM_WORLD, &sc, &tokens, &cut);
    if (j->rank != 0) continue;
    metrics_printf(&j->out, "bench: step %ld | %s | acc %.4f ± %.4f", j->tally.steps_done, set->name, sc.acc,
                   sc.acc_stderr);
    if (!isnan(sc.acc_norm)) metrics_printf(&j->out, " | acc_norm %.4f ± %.4f", sc.acc_norm, sc.acc_norm_stderr);
    if (!isnan(sc.ppl)) metrics_printf(&j->out, " | ppl %.4g", sc.ppl);
    metrics_printf(&j->out, " | %ld items%s\n", sc.n, cut ? ", contexts cut to seq_len" : "");
    char path[UTIL_PATH_MAX];
    util_snprintf(path, sizeof path, "%s/bench.csv", j->cfg->job.run_dir);
    FILE *fp = fopen(path, "a");
    if (!fp) continue; /* the log line has the figures */
    if (ftell(fp) == 0) fprintf(fp, "step,task,metric,value,stderr,n\n");
    const char *name[3] = {"acc", "acc_norm", "ppl"};
    double v[3] = {sc.acc, sc.acc_norm, sc.ppl}, e[3] = {sc.acc_stderr, sc.acc_norm_stderr, NAN};
    for (int k = 0; k < 3; k++) {
      if (isnan(v[k])) continue;
      fprintf(fp, "%ld,%s,%s,%.10g,", j->tally.steps_done, set->name, name[k], v[k]);
      if (!isnan(e[k])) fprintf(fp, "%.10g", e[k]);
      fprintf(fp, ",%ld\n", sc.n);
    }
    fclose(fp);
  }
}

/* ---- validation --------------------------------------------------------------------------------- */

/* Rank 0, after an evaluation: rows of val.csv (step, dataset, weight, loss), and for a blend of
 * validation datasets a line with each one's loss. */
static void log_validation(train_job *j) {
  const train_tally *k = &j->tally;
  const data_loader *d = &j->t->data;
  if (j->rank != 0) return;
  if (d->nval > 1) {
    metrics_printf(&j->out, "val: step %ld | loss %.4f =", k->steps_done, k->val_loss);
    for (int v = 0; v < d->nval; v++)
      metrics_printf(&j->out, "%s %.4g x %.4f (%s)", v ? " +" : "", d->val[v].weight, k->val_losses[v], d->val[v].file.path);
    metrics_printf(&j->out, "\n");
  }
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/val.csv", j->cfg->job.run_dir);
  FILE *fp = fopen(path, "a");
  if (!fp) return; /* metrics.csv and the log have the loss */
  if (ftell(fp) == 0) fprintf(fp, "step,dataset,weight,loss\n");
  for (int v = 0; v < d->nval; v++)
    fprintf(fp, "%ld,%s,%.10g,%.10g\n", k->steps_done, d->val[v].file.path, d->val[v].weight, k->val_losses[v]);
  fclose(fp);
}

/* ---- the step loop ------------------------------------------------------------------------------- */

/* Rank 0, with &data trace_windows: windows.csv, appended to when the run continues, else begun anew;
 * NULL (with a warning) where it cannot be written, or without the key. */
static FILE *trace_open(const train_job *j) {
  if (j->rank != 0 || !j->cfg->data.trace_windows) return NULL;
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/windows.csv", j->cfg->job.run_dir);
  FILE *fp = fopen(path, j->resuming ? "a" : "w");
  if (!fp) fprintf(stderr, "greenlm: warning: %s: %s: &data trace_windows writes nothing\n", path, strerror(errno));
  else if (ftell(fp) == 0) fprintf(fp, "step,position,dataset,window,token\n");
  return fp;
}

/* The windows of step `step` (1-based) as rows of windows.csv. */
static void trace_step(const train_job *j, FILE *fp, long step) {
  if (!fp) return;
  const data_loader *d = &j->t->data;
  for (long i = 0; i < j->t->G; i++) {
    int s = data_window_set(d, j->t->win[i]);
    uint64_t w = j->t->win[i] - d->set[s].first;
    fprintf(fp, "%ld,%ld,%d,%llu,%llu\n", step, i, s, (unsigned long long)w, (unsigned long long)w * (uint64_t)d->T);
  }
  fflush(fp); /* whole steps on disk when a job is stopped */
}

/* The progress line and the metrics.csv row (rank 0), after the collective energy sample. */
static void progress(train_job *j, const trainer_step_info *info, double vl, int evaluated) {
  train_tally *k = &j->tally;
  train_window *w = &k->win;
  energy_sample(&j->energy); /* collective */
  if (j->rank == 0) {
    const cfg_training *tc = &j->cfg->training;
    double tps = w->tokens / w->time, mfu = tps * j->flops_per_token / (j->peak_gflops * 1e9);
    double eta = (double)(tc->max_steps - k->steps_done) * (k->train_time / (double)(k->steps_done - k->start));
    double busy = w->time * j->size; /* rank-seconds */
    const energy_meter *e = &j->energy;
    int measured = energy_any_measured(e), shown = measured || e->est_joules > 0;
    char wt[32], en[32], es[32], vs[48] = "", ps[160] = "";
    fmt_energy(e, wt, sizeof wt, en, sizeof en);
    if (evaluated) snprintf(vs, sizeof vs, " | val %.4f", vl);
    if (j->size > 1) {
      int o = snprintf(ps, sizeof ps, " | bubble %.1f%% | exchange %.1f%%", 100.0 * w->bubble / busy,
                       100.0 * w->exchange / busy);
      if (j->t->lay.tp > 1 && o > 0 && (size_t)o < sizeof ps)
        o += snprintf(ps + o, sizeof ps - (size_t)o, " | tensor sums %.1f%%", 100.0 * w->tensor / busy);
      if (w->grad_inter > 0 && w->grad_inter < w->grad_bytes && o > 0 && (size_t)o < sizeof ps) /* two-level */
        o += snprintf(ps + o, sizeof ps - (size_t)o, " (%.1fx fewer bytes between nodes)", w->grad_fp32 / w->grad_inter);
      else if (w->grad_fp32 > 0 && w->grad_bytes < w->grad_fp32 && o > 0 && (size_t)o < sizeof ps) /* compressed */
        o += snprintf(ps + o, sizeof ps - (size_t)o, " (%.1fx fewer bytes)", w->grad_fp32 / w->grad_bytes);
      if (w->q_norm2 > 0 && o > 0 && (size_t)o < sizeof ps) /* measured this window: relative error, its expectation */
        snprintf(ps + o, sizeof ps - (size_t)o, " | q-error %.3g (expected %.3g)", w->q_measured / w->q_norm2,
                 w->q_expected / w->q_norm2);
    }
    if (mfu > 1 && j->mfu_high <= 1)
      metrics_printf(&j->out, "warning: MFU %.0f%%, above the peak of %.1f GFLOP/s (%s): %s\n", 100.0 * mfu, j->peak_gflops,
                     j->peak_source, peak_low_why(j->cfg));
    j->mfu_high = fmax(j->mfu_high, mfu);
    metrics_printf(&j->out, "step %*ld/%ld | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%%%s | %s | %s | ETA %s\n",
                   (int)snprintf(NULL, 0, "%ld", tc->max_steps), k->steps_done, tc->max_steps, info->loss, vs, info->lr,
                   tps, 100.0 * mfu, ps, wt, en, util_fmt_duration(eta, es, sizeof es));
    metrics_row row = {k->steps_done, info->loss, info->lr, info->grad_norm, 1e3 * w->time / w->steps, tps, mfu, vl,
                       !shown ? NAN : measured ? e->watts : e->est_watts, !shown ? NAN : measured ? e->joules : e->est_joules,
                       energy_kind(e), w->compute / busy, w->bubble / busy, w->exchange / busy, w->bytes / w->steps,
                       w->grad_bytes / w->steps, w->grad_fp32 > 0 ? w->grad_bytes / w->grad_fp32 : NAN,
                       1e3 * w->encode / (w->steps * j->size), 1e3 * w->decode / (w->steps * j->size),
                       w->q_norm2 > 0 ? w->q_measured / w->q_norm2 : NAN, w->q_norm2 > 0 ? w->q_expected / w->q_norm2 : NAN,
                       w->grad_inter / w->steps};
    metrics_csv_row(&j->out, &row);
  }
  memset(w, 0, sizeof *w);
}

/* What every rank acts on after a step, agreed in one MPI_Allreduce (MAX): the slowest rank's step time, and the
 * decisions that stop the steps or write a checkpoint. */
typedef struct {
  double step_s;   /* the step's wall time: each rank contributes its own */
  int out_of_time; /* &training max_minutes reached since the steps began: rank 0's clock (the others give 0) */
  int ckpt_due;    /* &checkpoint every_minutes passed since the last checkpoint: rank 0's clock (the others 0) */
  int sig;         /* a signal caught (train_signal): any rank's, the highest number when several */
  double longest;  /* the slowest phase so far of any rank (progress_longest), for the watchdog's announcement */
} train_agreement;

static train_agreement agree(const train_job *j, double step_s) {
  const cfg_training *tc = &j->cfg->training;
  const cfg_checkpoint *ck = &j->cfg->checkpoint;
  const double now = util_now();
  const int judge = j->rank == 0; /* the time limits are rank 0's to judge, so every rank stops at the same step */
  double v[5] = {step_s, judge && tc->max_minutes > 0 && now - j->tally.t_start >= 60.0 * tc->max_minutes,
                 judge && ck->every_minutes > 0 && now - j->tally.t_ckpt >= 60.0 * ck->every_minutes, train_signal,
                 progress_longest()};
  MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return (train_agreement){v[0], v[1] != 0, v[2] != 0, (int)v[3], v[4]};
}

/* The step's figures: the wall time dt is the slowest rank's (the agreement's), the breakdown summed over ranks. */
static void account(train_job *j, const trainer_step_info *info, double dt) {
  double mine[14] = {info->pipe.compute_s, info->pipe.wait_s,      info->grad.wait_s,   info->pipe.bytes + info->grad.bytes,
                     info->grad.bytes,     info->grad.fp32_bytes, info->grad.encode_s, info->grad.decode_s,
                     info->grad.q_measured, info->grad.q_expected, info->grad.q_norm2, info->tp_s, info->tp_bytes,
                     info->grad.inter_bytes},
         sum[14];
  MPI_Reduce(mine, sum, 14, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  train_tally *k = &j->tally;
  train_window *w = &k->win;
  double tokens = (double)j->t->G * j->t->T;
  k->train_time += dt;
  k->tokens += tokens;
  w->time += dt, w->tokens += tokens, w->steps += 1;
  if (j->rank == 0) {
    w->compute += sum[0], w->bubble += sum[1], w->exchange += sum[2], w->bytes += sum[3];
    w->grad_bytes += sum[4], w->grad_fp32 += sum[5], w->encode += sum[6], w->decode += sum[7];
    k->grad_bytes += sum[4], k->grad_fp32 += sum[5];
    w->q_measured += sum[8], w->q_expected += sum[9], w->q_norm2 += sum[10];
    w->tensor += sum[11], w->bytes += sum[12];
    k->tp_s += sum[11], k->tp_bytes += sum[12];
    w->grad_inter += sum[13], k->grad_inter += sum[13];
  }
}

/* A checkpoint now: by step count, by wall time (ag), on a signal (ag), when stopping or at the end (with
 * &checkpoint at_end). Returns 0 or -1 (every rank) after errors. */
static int checkpoint_if_due(train_job *j, const train_agreement *ag, int stop, int last, err_list *errs) {
  const cfg_checkpoint *ck = &j->cfg->checkpoint;
  train_tally *k = &j->tally;
  int due = (ck->every_steps > 0 && k->steps_done % ck->every_steps == 0) || ag->ckpt_due || ag->sig;
  if (!due && !((stop || last) && ck->at_end)) return 0;
  ckpt_stats st;
  if (trainer_checkpoint(j->t, k->steps_done, k->tokens0 + k->tokens, &st, errs) != 0) return -1;
  k->t_ckpt = util_now();
  if (j->rank == 0)
    metrics_printf(&j->out, "checkpoint: %s, step %ld: %.3g GB in %.2f s (%.2f GB/s)\n", st.path, k->steps_done,
                   st.bytes / 1e9, st.seconds, st.bytes / 1e9 / st.seconds);
  return 0;
}

/* The loss or the gradient norm of step `step` (0-based) stopped being finite: the error, TRAIN_DIVERGED. */
static int diverged(train_job *j, long step, const trainer_step_info *info, err_list *errs) {
  if (j->rank == 0) {
    err_add(errs, NULL, 0, 0, "lower &training lr, raise warmup_steps, or keep grad_clip > 0",
            "training diverged at step %ld (loss %g, gradient norm %g)", step + 1, info->loss, info->grad_norm);
    metrics_log(&j->out, "error: training diverged at step %ld (loss %g, gradient norm %g)\n", step + 1, info->loss,
                info->grad_norm);
  }
  j->status = "diverged";
  return TRAIN_DIVERGED;
}

/* An evaluation after this step: the validation loss (into the tally, and returned), its rows, the benchmarks. */
static double evaluate(train_job *j) {
  j->tally.val_loss = trainer_eval(j->t, j->tally.val_losses);
  log_validation(j);
  if (j->bench.n) score_benchmarks(j);
  return j->tally.val_loss;
}

/* After the step's checkpoint: a signal or the time limit ends the steps (TRAIN_OK); else -1, go on. */
static int stop_if_asked(train_job *j, int sig, int out_of_time) {
  if (sig) {
    j->status = "signal";
    if (j->rank == 0)
      metrics_printf(&j->out, "stopping: signal %d (%s) at step %ld; continue with &checkpoint restart = 'latest'\n", sig,
                     signal_name(sig), j->tally.steps_done);
    return TRAIN_OK;
  }
  if (out_of_time) {
    j->status = "time_limit";
    if (j->rank == 0)
      metrics_printf(&j->out, "stopping: &training max_minutes = %g reached\n", j->cfg->training.max_minutes);
    return TRAIN_OK;
  }
  return -1;
}

/* Step `step` (0-based), its windows into trace (may be NULL), and what follows it: the agreement, the figures,
 * an evaluation, the progress line, a checkpoint, a stop. Returns -1 to go on, else the exit status so far. */
static int one_step(train_job *j, long step, FILE *trace, err_list *errs) {
  const cfg_training *tc = &j->cfg->training;
  train_tally *k = &j->tally;
  trainer_step_info info;
  watchdog_step(step + 1);
  int res = trainer_step(j->t, step, &info);
  trace_step(j, trace, step + 1);
  k->last_loss = info.loss;
  if (res != 0) return diverged(j, step, &info, errs); /* the same on every rank: no agreement needed */
  if (info.skipped && j->rank == 0)
    metrics_printf(&j->out, "step %ld: fp16 gradients overflowed at loss scale %g: update skipped, scale now %g\n",
                   step + 1, info.loss_scale, info.loss_scale / 2);
  k->steps_done = step + 1;
  const train_agreement ag = agree(j, info.step_s);
  account(j, &info, ag.step_s);
  const int last = k->steps_done == tc->max_steps, out_of_time = ag.out_of_time && !last;
  const int eval = last || out_of_time || (tc->eval_every > 0 && k->steps_done % tc->eval_every == 0);
  double vl = eval ? evaluate(j) : NAN;
  if (k->steps_done % j->cfg->job.log_every == 0 || eval) {
    progress(j, &info, vl, eval);
    announce_watchdog(j, ag.longest);
  }
  if (checkpoint_if_due(j, &ag, out_of_time || ag.sig, last, errs) != 0) {
    j->status = "checkpoint_failed";
    return TRAIN_IO_FAILED;
  }
  return stop_if_asked(j, ag.sig, out_of_time);
}

/* Steps from the tally's start to &training max_steps, or to the first stop (divergence, time limit, signal,
 * failed checkpoint), their windows into trace (may be NULL). Returns the exit status so far. */
static int steps(train_job *j, FILE *trace, err_list *errs) {
  const cfg_training *tc = &j->cfg->training;
  train_tally *k = &j->tally;
  if (j->rank == 0) metrics_printf(&j->out, "== training: steps %ld to %ld ==\n", k->start + 1, tc->max_steps);
  catch_signals();
  k->t_start = k->t_ckpt = util_now();
  k->steps_done = k->start;
  int rc = -1;
  for (long step = k->start; step < tc->max_steps && rc < 0; step++) rc = one_step(j, step, trace, errs);
  return rc < 0 ? TRAIN_OK : rc;
}

/* Rank 0: this job's row in the run's chain (jobs.csv), and its number there. */
static void begin_job(train_job *j) {
  if (j->rank != 0) return;
  j->job = metrics_job_begin(j->cfg->job.run_dir, j->resuming, j->tally.start, j->restored);
  if (j->job < 0)
    metrics_printf(&j->out, "warning: cannot write %s/jobs.csv (%s): the verdict will not say which job of the chain it "
                   "describes\n", j->cfg->job.run_dir, strerror(errno));
}

/* The steps, with &data trace_windows' file open around them. */
static int step_loop(train_job *j, err_list *errs) {
  FILE *trace = trace_open(j);
  int rc = steps(j, trace, errs);
  if (trace) fclose(trace);
  return rc;
}

/* Which job of the run's restart chain a verdict or report describes (jobs.csv has them all). */
static json_t *job_json(const train_job *r) {
  json_t *o = json_object();
  json_object_set_new(o, "index", r->job > 0 ? json_integer(r->job) : json_null());
  json_object_set_new(o, "first_step", json_integer(r->tally.start + 1));
  json_object_set_new(o, "last_step", json_integer(r->tally.steps_done));
  json_object_set_new(o, "restarted_from", r->restored[0] ? json_string(r->restored) : json_null());
  json_object_set_new(o, "chain", json_string("jobs.csv"));
  return o;
}

/* verdict.json's object: the run's outcome and figures after `wall` seconds, the final parameters' hash and count. */
static json_t *verdict_json(const train_job *r, double wall, uint64_t param_hash, size_t nparams) {
  const train_tally *k = &r->tally;
  const double tokens = k->tokens;
  const cfg_config *cfg = r->cfg;
  const energy_meter *e = &r->energy;
  double tps = k->train_time > 0 ? tokens / k->train_time : 0.0;
  double mfu = r->peak_gflops > 0 ? tps * r->flops_per_token / (r->peak_gflops * 1e9) : 0.0;
  double kwh = e->joules / 3.6e6, fac = kwh * e->pue;
  int measured = energy_any_measured(e);
  json_t *j = json_object();
  json_object_set_new(j, "run", json_string(cfg->job.name));
  json_object_set_new(j, "status", json_string(r->status));
  json_object_set_new(j, "job", job_json(r));
  json_object_set_new(j, "steps", json_integer(k->steps_done));
  json_object_set_new(j, "tokens_trained", json_real(k->tokens0 + tokens));
  json_object_set_new(j, "tokens_this_job", json_real(tokens));
  json_object_set_new(j, "duration_s", json_real(wall));
  json_object_set_new(j, "train_time_s", json_real(k->train_time));
  json_object_set_new(j, "train_loss", isfinite(k->last_loss) ? json_real(k->last_loss) : json_null());
  json_object_set_new(j, "val_loss", isfinite(k->val_loss) ? json_real(k->val_loss) : json_null());
  json_object_set_new(j, "tokens_per_s", json_real(tps));
  json_object_set_new(j, "mfu", mfu <= 1 ? json_real(mfu) : json_null()); /* above the peak: not a figure */
  json_object_set_new(j, "mfu_valid", json_boolean(mfu <= 1));
  json_object_set_new(j, "peak_gflops", json_real(r->peak_gflops));
  json_object_set_new(j, "peak_source", json_string(r->peak_source));
  json_object_set_new(j, "flops_per_token", json_real(r->flops_per_token));
  json_object_set_new(j, "flops_total", json_real(r->flops_per_token * tokens));
  json_object_set_new(j, "flops_formula", json_string("6N + 12*lay*C*T per token (PaLM), N without the lookup-only embeddings: wpe, an untied token embedding"));
  json_object_set_new(j, "n_params", json_integer((json_int_t)nparams));
  json_object_set_new(j, "backend", json_string(r->t->be->name));
  json_object_set_new(j, "engine", json_string(r->engine));
  json_object_set_new(j, "ranks", json_integer(r->t->size));
  json_object_set_new(j, "pipeline_stages", json_integer(r->t->lay.P));
  json_object_set_new(j, "tensor_parallel", json_integer(r->t->lay.tp));
  json_object_set_new(j, "data_parallel", json_integer(r->t->lay.D));
  if (r->t->lay.tp > 1) { /* the tensor ranks' sums over the whole job */
    json_t *ts = json_object();
    json_object_set_new(ts, "bytes", json_real(k->tp_bytes));
    json_object_set_new(ts, "rank_seconds", json_real(k->tp_s));
    json_object_set_new(j, "tensor_sums", ts);
  }
  json_object_set_new(j, "zero_stage", json_integer(r->t->lay.zero));
  json_t *gx = json_object(); /* the gradient exchange over the whole job: bytes handed to the collectives */
  json_object_set_new(gx, "method", json_string(cfg->comm.method));
  json_object_set_new(gx, "bits", json_integer(cfg->comm.bits));
  json_object_set_new(gx, "exchange", json_string(cfg->comm.exchange));
  if (cfg_comm_method_of(&cfg->comm) == CFG_COMM_TOPK) json_object_set_new(gx, "topk_fraction", json_real(cfg->comm.topk_fraction));
  if (cfg_comm_method_of(&cfg->comm) == CFG_COMM_POWERSGD)
    json_object_set_new(gx, "powersgd_rank", json_integer(cfg->comm.powersgd_rank));
  json_object_set_new(gx, "error_feedback", json_boolean(cfg->comm.error_feedback));
  json_object_set_new(gx, "bytes", json_real(k->grad_bytes));
  json_object_set_new(gx, "fp32_bytes", json_real(k->grad_fp32));
  json_object_set_new(gx, "fewer", k->grad_bytes > 0 ? json_real(k->grad_fp32 / k->grad_bytes) : json_null());
  json_object_set_new(gx, "hierarchy", json_string(cfg->comm.hierarchy));
  json_object_set_new(gx, "inter_node_bytes", json_real(k->grad_inter)); /* to collectives among ranks of several nodes */
  json_object_set_new(gx, "inter_node_fewer", k->grad_inter > 0 ? json_real(k->grad_fp32 / k->grad_inter) : json_null());
  json_object_set_new(j, "gradient_exchange", gx);
  /* the final parameters' hash (trainer_params_hash): equal hashes mean bitwise-equal models */
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)param_hash);
  json_object_set_new(j, "param_hash", json_string(hash));
  json_t *en = json_object();
  /* a summary; report.json has the whole energy record */
  json_object_set_new(en, "status", json_string(energy_kind(e)));
  json_object_set_new(en, "energy_consumed", measured ? json_real(kwh) : json_null());
  json_object_set_new(en, "estimated_energy", json_real(e->est_joules / 3.6e6));
  json_object_set_new(en, "estimated_emissions", json_real(e->est_joules / 3.6e6 * e->pue * e->intensity / 1000.0));
  json_object_set_new(en, "energy_basis", json_string(energy_basis(e)));
  json_object_set_new(en, "pue", json_real(e->pue));
  json_object_set_new(en, "facility_energy", measured ? json_real(fac) : json_null());
  json_object_set_new(en, "carbon_intensity_g_per_kwh", json_real(e->intensity));
  json_object_set_new(en, "emissions", measured ? json_real(fac * e->intensity / 1000.0) : json_null());
  json_object_set_new(en, "j_per_token", measured && tokens > 0 ? json_real(e->joules / tokens) : json_null());
  json_object_set_new(en, "report", json_string("report.json"));
  json_object_set_new(j, "energy", en);
  return j;
}


/* ---- the verdict ----------------------------------------------------------------------------------- */

/* The windows drawn from each training dataset since step 0 against its weight: a line each, and
 * verdict.json's "data_blend"; for a blend of validation datasets each one's last loss, a line each and
 * "val_blend". */
static void print_blend(train_job *j, json_t *v) {
  const train_tally *k = &j->tally;
  const data_loader *d = &j->t->data;
  double all = (double)data_drawn_all(d);
  json_t *a = json_array();
  for (int s = 0; s < d->nsets; s++) {
    double n = (double)data_drawn(d, s), share = all > 0 ? n / all : 0.0;
    metrics_printf(&j->out, "data: %s: %.0f windows since step 0 (%.2f epochs), share %.4f of weight %.4f\n",
                   d->set[s].file.path, n, n / (double)d->set[s].nwin, share, d->set[s].weight);
    json_t *e = json_object();
    json_object_set_new(e, "path", json_string(d->set[s].file.path));
    json_object_set_new(e, "weight", json_real(d->set[s].weight));
    json_object_set_new(e, "windows", json_integer((json_int_t)n));
    json_object_set_new(e, "epochs", json_real(n / (double)d->set[s].nwin));
    json_object_set_new(e, "share", json_real(share));
    json_array_append_new(a, e);
  }
  json_object_set_new(v, "data_blend", a);
  if (d->nval < 2 || !isfinite(k->val_loss)) return;
  a = json_array();
  for (int s = 0; s < d->nval; s++) {
    metrics_printf(&j->out, "validation: %s: loss %.4f, weight %.4f\n", d->val[s].file.path, k->val_losses[s],
                   d->val[s].weight);
    json_t *e = json_object();
    json_object_set_new(e, "path", json_string(d->val[s].file.path));
    json_object_set_new(e, "weight", json_real(d->val[s].weight));
    json_object_set_new(e, "loss", json_real(k->val_losses[s]));
    json_array_append_new(a, e);
  }
  json_object_set_new(v, "val_blend", a);
}

/* A progress line showed MFU above 100%: the peak measured at start-up was lowered by other work; it is
 * measured again and the higher one kept (collective). */
static void recheck_peak(train_job *j) {
  int again = j->rank == 0 && j->mfu_high > 1 && j->cfg->system.peak_gflops <= 0;
  MPI_Bcast(&again, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (again) measure_peak(j, "measured SGEMM at start-up and again at the end, the higher");
}

/* The end-of-run verdict: lines, verdict.json and report.json (rank 0), after the collective
 * gather of the parameters (their hash) and the last energy sample. Returns 0, or -1 when a file
 * could not be written (an error added). */
static int verdict(train_job *j, err_list *errs) {
  const train_tally *k = &j->tally;
  const cfg_config *cfg = j->cfg;
  size_t np;
  uint64_t param_hash = trainer_params_hash(j->t, &np);
  recheck_peak(j);
  energy_sample(&j->energy); /* collective */
  double rss = util_peak_rss(), planned = (double)planned_bytes(j), mine[2] = {rss, planned}, most[2];
  MPI_Reduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, 0, j->t->comm); /* the fullest rank's */
  int rc = 0;
  if (j->rank == 0) {
    metrics_out *out = &j->out;
    double wall = util_now() - k->t_start;
    json_t *v = verdict_json(j, wall, param_hash, np);
    double tps = json_real_value(json_object_get(v, "tokens_per_s")), mfu = tps * j->flops_per_token / (j->peak_gflops * 1e9);
    char chain[128] = "";
    if (j->job > 1 && k->steps_done == k->start)
      util_snprintf(chain, sizeof chain, " (job %d of the run's chain: no steps left, the verdict its last job did not write)",
                    j->job);
    else if (j->job > 1)
      util_snprintf(chain, sizeof chain, " (job %d of the run's chain, steps %ld to %ld)", j->job, k->start + 1, k->steps_done);
    metrics_printf(out, "== verdict: %s%s ==\n", j->status, chain);
    metrics_printf(out, "steps %ld, tokens %.0f, wall %.1f s (training %.1f s) on %d rank%s\n", k->steps_done,
                   k->tokens0 + k->tokens, wall, k->train_time, j->size, j->size == 1 ? "" : "s");
    if (isfinite(k->val_loss))
      metrics_printf(out, "loss: train %.4f, validation %.4f\n", k->last_loss, k->val_loss);
    else if (isfinite(k->last_loss))
      metrics_printf(out, "loss: train %.4f (not evaluated)\n", k->last_loss);
    else
      metrics_printf(out, "loss: none (no step in this job, not evaluated)\n");
    if (mfu <= 1)
      metrics_printf(out, "figure of merit: %.1f tokens/s, MFU %.1f%% of %.1f GFLOP/s (%s)\n", tps, 100.0 * mfu, j->peak_gflops,
                     j->peak_source);
    else
      metrics_printf(out, "figure of merit: %.1f tokens/s; MFU not valid: %.0f%% of %.1f GFLOP/s (%s), above the peak: %s\n",
                     tps, 100.0 * mfu, j->peak_gflops, j->peak_source, peak_low_why(cfg));
    char b[2][32];
    metrics_printf(out, "memory: peak resident %s on the fullest rank; planned buffers %s on the fullest rank\n",
                   util_fmt_bytes(most[0], b[0], 32), util_fmt_bytes(most[1], b[1], 32));
    print_blend(j, v);
    json_object_set_new(v, "peak_rss_bytes", json_real(most[0]));
    json_object_set_new(v, "planned_bytes", json_real(most[1]));
    if (j->t->lay.tp > 1)
      metrics_printf(out, "tensor-parallel sums: %.4g GB handed to them by all ranks, %.1f%% of the ranks' time\n",
                     k->tp_bytes / 1e9, 100.0 * k->tp_s / (k->train_time * j->size));
    char how[96];
    comm_label(&cfg->comm, how, sizeof how);
    if (k->grad_inter > 0 && k->grad_inter < k->grad_bytes) /* two-level */
      metrics_printf(out, "gradient exchange: %.4g GB handed to the collectives by all ranks, %.4g GB of it between nodes, "
                     "%.1fx fewer than fp32's (%s, in two levels)\n", k->grad_bytes / 1e9, k->grad_inter / 1e9,
                     k->grad_fp32 / k->grad_inter, how);
    else if (k->grad_bytes > 0 && k->grad_bytes < k->grad_fp32) /* compressed */
      metrics_printf(out, "gradient exchange: %.4g GB handed to the collectives by all ranks, %.1fx fewer than fp32 (%s)\n",
                     k->grad_bytes / 1e9, k->grad_fp32 / k->grad_bytes, how);
    double flops = j->flops_per_token * k->tokens;
    energy_report_print(&j->energy, k->tokens, flops, print_to_out, out);
    json_t *rep = energy_report_json(&j->energy, cfg, wall, k->tokens, flops, mfu <= 1 ? mfu : NAN, j->machine.cpu_model,
                                     j->machine.cores, j->machine.memory_gib);
    json_object_set_new(rep, "job", job_json(j)); /* the energy of this job only */
    const char *name[2] = {"report.json", "verdict.json"};
    json_t *obj[2] = {rep, v};
    for (int k = 0; k < 2; k++) {
      if (metrics_write_json(cfg->job.run_dir, name[k], obj[k]) != 0) {
        err_add(errs, cfg->job.run_dir, 0, 0, "check that the run directory is writable and the disk is not full",
                "cannot write %s: %s", name[k], strerror(errno));
        rc = -1;
      }
      json_decref(obj[k]);
    }
  }
  return rc;
}

/* The whole model on this rank: the generator with its KV cache (textgen.h). out: the prompt and
 * the new text; note: the timing and how it ended. */
static void sample_cached(train_job *r, textgen_out *out, char *note, size_t len) {
  trainer *t = r->t;
  const char *prompt = r->cfg->sample.prompt;
  gen_timing tm;
  textgen_generate(&t->model, &t->tok, &r->cfg->sample, (uint64_t)r->cfg->job.seed, &prompt, 1, 0, NULL, out, &tm);
  snprintf(note, len, "KV cache: prefill %.2f s, %.1f tokens/s; ended: %s", tm.prefill_s, tm.decode_tps, gen_end_name(out->end));
}

/* Pipeline stages or tensor shards: the whole model is on no single rank, so the stages recompute the
 * whole sequence for every new token (pipe_forward_one; the last stage's tensor ranks gather the logits,
 * draw the same token and hand it to the first). */
static void sample_pipelined(train_job *r, tok_ids *ids) {
  trainer *t = r->t;
  const cfg_sample *c = &r->cfg->sample;
  int Tmax = t->T < t->shape.maxT ? t->T : t->shape.maxT;
  float *logits = t->model.has_head ? util_malloc((size_t)t->shape.V * sizeof(float), "logits") : NULL;
  sample_state ss;
  sample_init(&ss, c, t->shape.V, (uint64_t)r->cfg->job.seed, 0);
  for (long k = 0; k < c->n_tokens; k++) {
    int ctx = (int)ids->n < Tmax ? (int)ids->n : Tmax;
    pipe_forward_one(&t->pipe, ids->v + (ids->n - (size_t)ctx), ctx, logits);
    int32_t next = t->model.has_head ? sample_next(&ss, logits, ids->v, ids->n) : 0;
    MPI_Bcast(&next, 1, MPI_INT32_T, t->lay.P - 1, t->lay.pipe);
    tok_ids_push(ids, next);
  }
  sample_free(&ss);
  free(logits);
}

/* Generate the deck's sample on replica 0; rank 0 prints it and writes sample.txt. */
static void write_sample(train_job *r) {
  trainer *t = r->t;
  const cfg_sample *c = &r->cfg->sample;
  if (c->n_tokens <= 0 || t->lay.replica != 0) return;
  textgen_out out = {0};
  char note[160] = "pipeline or tensor shards, recomputed";
  if (t->lay.P == 1 && t->lay.tp == 1) {
    sample_cached(r, &out, note, sizeof note);
  } else {
    tok_ids ids = {0};
    const char *p = c->prompt[0] ? c->prompt : "\n";
    tok_encode(&t->tok, p, strlen(p), 1, &ids);
    size_t np = ids.n;
    sample_pipelined(r, &ids);
    out.n_new = (int)(ids.n - np);
    out.text = util_malloc(ids.n * (size_t)t->tok.max_len + 1, "sample text");
    out.text[tok_decode(&t->tok, ids.v, ids.n, out.text)] = '\0';
    tok_ids_free(&ids);
  }
  if (t->rank == 0) {
    metrics_printf(&r->out, "== sample (%d tokens, temperature %g, top-k %ld, top-p %g; %s) ==\n%s\n", out.n_new,
                   c->temperature, c->top_k, c->top_p, note, out.text);
    char path[4096];
    snprintf(path, sizeof path, "%s/sample.txt", r->cfg->job.run_dir);
    util_atomic_file af;
    if (util_atomic_open(&af, path) == 0) {
      fputs(out.text, af.fp);
      util_atomic_close(&af);
    }
  }
  textgen_out_free(&out, 1);
}

/* ---- the phases ------------------------------------------------------------------------------------ */

/* Inputs first (nothing is written before they are known to be good), then the run directory's
 * files. Returns 0, or 1 (every rank) after errors. */
static int set_up(train_job *j, const char *header, err_list *errs) {
  const cfg_config *cfg = j->cfg;
  int set_aside = 0, bad = j->rank == 0 && !j->resuming ? check_run_dir(cfg, &set_aside, errs) : 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (bad) return 1;
  j->t = trainer_open(cfg, j->be, MPI_COMM_WORLD, errs);
  if (!j->t) return 1;
  j->tally.val_losses = util_calloc((size_t)j->t->data.nval, sizeof *j->tally.val_losses, "validation losses");
  if (cfg->eval.during_training && j->t->lay.P == 1 && eval_benchmarks_load(&j->bench, cfg, MPI_COMM_WORLD, errs)) return 1;
  bad = j->rank == 0 && open_outputs(j, set_aside, header, errs) != 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (bad) return 1;
  return describe_job(j, errs);
}

/* What is left of the job: every open thing closed, whatever phase it reached. Returns -1 when
 * log.txt or metrics.csv lost a write (a full disk), after adding an error. */
static int clean_up(train_job *j, err_list *errs) {
  int rc = 0;
  if (j->out_opened && metrics_close(&j->out) != 0) {
    err_add(errs, j->cfg->job.run_dir, 0, 0, "check that the disk is not full", "writing log.txt or metrics.csv failed: "
            "they are incomplete");
    rc = -1;
  }
  if (j->energy_opened) energy_close(&j->energy);
  eval_benchmarks_free(&j->bench);
  trainer_close(j->t);
  free(j->tally.val_losses);
  return rc;
}

int train_run(const cfg_config *cfg, const backend *be, const char *header, err_list *errs) {
  train_job j = {.cfg = cfg, .be = be, .status = "completed", .tally = {.last_loss = NAN, .val_loss = NAN}};
  MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &j.size);
  j.resuming = cfg->checkpoint.restart[0] != '\0';
  watchdog_start(MPI_COMM_WORLD, watch_rule(&cfg->job));
  int rc = set_up(&j, header, errs);
  if (rc == TRAIN_OK && j.resuming) rc = restore(&j, errs);
  /* restored complete, its verdict written: nothing to do */
  const int done = rc == TRAIN_OK && j.tally.start == cfg->training.max_steps && complete_verdict(&j);
  if (rc == TRAIN_OK && j.tally.start == 0 && cfg->model.init_from[0]) rc = init_from(&j, errs);
  if (rc == TRAIN_OK && !done) begin_job(&j);
  if (rc == TRAIN_OK && !done) rc = step_loop(&j, errs);
  if (rc != TRAIN_BAD_INPUT && !done && verdict(&j, errs) != 0 && rc == TRAIN_OK) rc = TRAIN_IO_FAILED;
  if (rc == TRAIN_OK && !done && strcmp(j.status, "signal") != 0) write_sample(&j);
  if (clean_up(&j, errs) != 0 && rc == TRAIN_OK) rc = TRAIN_IO_FAILED;
  watchdog_stop();
  int worst; /* the ranks agree on the exit status */
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
