/* train: the trainer (one rank's part of a P x D job) and the training task's reports. */
#include "train.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/ckpt.h"
#include "config.h"
#include "text/data.h"
#include "energy/energy.h"
#include "energy/metrics.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "parallel/par.h"
#include "model/sample.h"
#include "text/tok.h"
#include "parallel/topo.h"
#include "base/util.h"

struct trainer {
  const cfg_config *cfg;
  const backend *be;
  MPI_Comm comm;
  int rank, size;
  par_layout L;
  gpt_shape shape;
  gpt_model model;
  optim_state opt;
  optim_scaler scaler; /* dynamic loss scaling of precision = 'fp16'; scale 1 otherwise */
  grad_exchange *gx;
  pipe_state pipe;
  tok_tokenizer tok;
  data_loader data;
  int B, T, m;
  long G;        /* sequences (windows) per global batch: B x m x D */
  uint64_t *win; /* (G) the windows of the current step */
};

/* ---- the trainer ---------------------------------------------------------------------------- */

train_memory train_plan_memory(const cfg_config *cfg, const backend *be, const par_layout *L, int stage, int replica) {
  train_memory t;
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  int B = (int)cfg->training.micro_batch_size, T = (int)cfg->training.seq_len;
  t.part = par_stage_part(L, stage);
  t.model = gpt_plan_memory(&s, be, B, T, t.part);
  size_t n = gpt_part_params(&s, t.part);
  t.adam = optim_bytes(grad_own_params(n, L, replica));
  t.exchange = grad_exchange_bytes(n, L);
  t.pipe = pipe_bytes(&s, t.part, B, T);
  t.total = t.model.total + t.adam + t.exchange + t.pipe;
  gpt_shape_free(&s);
  return t;
}

/* Training micro-batch k of this replica: windows [replica * B * m + k * B, ... + B) of the step. */
static void train_batch(void *ctx, int k, int32_t *tokens, int32_t *targets) {
  trainer *t = ctx;
  data_read_train(&t->data, t->win + ((size_t)t->L.replica * t->m + (size_t)k) * t->B, t->B, tokens, targets);
}

/* Validation: replica r takes batches r, r + D, r + 2D, ... of the eval_batches. */
static void eval_batch(void *ctx, int k, int32_t *tokens, int32_t *targets) {
  trainer *t = ctx;
  data_val_batch(&t->data, t->L.replica + k * t->L.D, t->B, tokens, targets);
}

trainer *trainer_open(const cfg_config *cfg, const backend *be, MPI_Comm comm, nml_errors *errs) {
  trainer *t = util_calloc(1, sizeof *t, "trainer");
  t->cfg = cfg;
  t->be = be;
  t->comm = comm;
  MPI_Comm_rank(comm, &t->rank);
  MPI_Comm_size(comm, &t->size);
  t->B = (int)cfg->training.micro_batch_size;
  t->T = (int)cfg->training.seq_len;
  t->m = (int)cfg->parallel.micro_batches;
  par_create(&t->L, cfg, comm);
  t->G = (long)t->B * t->m * t->L.D;
  /* inputs: every rank reads the same headers, so all find the same problems */
  int n0 = errs->n;
  char err[2048] = "";
  if (tok_open(&t->tok, cfg->tokenizer.kind, cfg->tokenizer.dir, err, sizeof err) != 0)
    cfg_error_at(cfg, errs, "tokenizer", "dir", "run the 'tokenizer' task first, or point dir at GPT-2's files", "%s",
                 err);
  else
    data_open(&t->data, cfg, &t->tok, t->T, errs);
  int bad = errs->n > n0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (any) {
    if (!bad) nml_error_add(errs, NULL, 0, 0, NULL, "another rank could not open the datasets");
    if (t->tok.bytes) tok_free(&t->tok);
    par_free(&t->L);
    free(t);
    return NULL;
  }
  gpt_shape_from_cfg(&t->shape, &cfg->model);
  gpt_init(&t->model, &t->shape, be, t->B, t->T, par_part(&t->L), (uint64_t)cfg->job.seed);
  t->gx = grad_create(&t->model, &t->L, cfg->parallel.bucket_mb);
  size_t lo, hi;
  grad_own_range(t->gx, &lo, &hi);
  optim_init(&t->opt, be, lo, hi);
  optim_scaler_init(&t->scaler, strcmp(cfg->system.precision, "fp16") == 0, cfg->system.loss_scale,
                    cfg->system.loss_scale_window);
  pipe_init(&t->pipe, &t->L, &t->model, t->B, t->T);
  t->win = util_malloc((size_t)t->G * sizeof *t->win, "step windows");
  return t;
}

void trainer_close(trainer *t) {
  if (!t) return;
  pipe_free(&t->pipe);
  optim_free(&t->opt);
  grad_free(t->gx);
  gpt_free(&t->model);
  gpt_shape_free(&t->shape);
  data_close(&t->data);
  tok_free(&t->tok);
  par_free(&t->L);
  free(t->win);
  free(t);
}

int trainer_step(trainer *t, long step, trainer_step_info *info) {
  const cfg_training *tc = &t->cfg->training;
  double t0 = util_now();
  const double tokens = (double)t->G * t->T;
  data_next_windows(&t->data, t->G, t->win);
  gpt_zero_grad(&t->model);
  grad_begin(t->gx);
  /* fp16: the loss gradient is multiplied by the loss scale, so the gradients carry it (optim.h) */
  const double scale = t->scaler.scale;
  double loss_sum = pipe_train_step(&t->pipe, t->m, (float)(scale / tokens), train_batch, t, grad_hook, t->gx);
  grad_finish(t->gx);
  /* the loss lives on the last stages, the norm's pieces everywhere */
  double local[2] = {loss_sum, grad_sumsq(t->gx)}, global[2];
  MPI_Allreduce(local, global, 2, MPI_DOUBLE, MPI_SUM, t->comm);
  info->loss = global[0] / tokens;
  info->grad_norm = sqrt(global[1]) / scale;
  info->lr = optim_lr(tc, step);
  info->loss_scale = scale;
  /* 1: update; 0: fp16 overflow, step skipped and the scale halved; -1: diverged */
  int ok = optim_scaler_update(&t->scaler, isfinite(info->loss) && isfinite(info->grad_norm));
  info->skipped = ok == 0;
  if (ok > 0) { /* AdamW divides the loss scale out with the clipping factor */
    optim_adamw_step(&t->opt, &t->model, tc, step, info->lr, optim_clip_scale(tc, info->grad_norm) / scale);
    grad_gather_params(t->gx);
    t->be->sync();
  }
  info->step_s = util_now() - t0;
  info->pipe = pipe_take_stats(&t->pipe);
  info->grad = grad_take_stats(t->gx);
  return ok < 0 ? -1 : 0;
}

double trainer_eval(trainer *t) {
  long nb = t->cfg->training.eval_batches, D = t->L.D;
  int mine = (int)(nb / D + (t->L.replica < nb % D));
  double loss = pipe_eval(&t->pipe, mine, eval_batch, t), total;
  pipe_take_stats(&t->pipe); /* evaluation is not part of the steps' figures */
  MPI_Allreduce(&loss, &total, 1, MPI_DOUBLE, MPI_SUM, t->comm);
  return total / ((double)nb * t->B * t->T);
}

float *trainer_gather_params(trainer *t, size_t *n) {
  *n = gpt_count_params(&t->shape);
  if (t->L.replica != 0) return NULL;
  /* replica 0's stages, in order, give the whole model's buffer; the last stage's copy of the tied
   * embedding (at the start of its buffer) is left out */
  const gpt_model *m = &t->model;
  size_t skip = 0;
  if (t->L.P > 1 && t->L.stage == t->L.P - 1) skip = gpt_find_tensor(m, "transformer.wte.weight")->numel;
  int count = (int)(m->nparams - skip), P = t->L.P;
  float *host = util_malloc((m->nparams - skip + 1) * sizeof(float), "parameter copy");
  t->be->to_host(host, m->params + skip, (size_t)count * sizeof(float));
  int *counts = NULL, *displs = NULL;
  float *all = NULL;
  if (t->L.stage == 0) {
    counts = util_malloc((size_t)P * sizeof(int), "gather");
    displs = util_malloc((size_t)P * sizeof(int), "gather");
    all = util_malloc(*n * sizeof(float), "whole model");
  }
  MPI_Gather(&count, 1, MPI_INT, counts, 1, MPI_INT, 0, t->L.pipe);
  if (t->L.stage == 0)
    for (int s = 0, o = 0; s < P; s++) displs[s] = o, o += counts[s];
  MPI_Gatherv(host, count, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, t->L.pipe);
  free(host), free(counts), free(displs);
  return all;
}

/* The checkpoint's view of this rank. */
static ckpt_state ckpt_view(trainer *t, long step, double tokens) {
  return (ckpt_state){t->cfg, &t->L, &t->model, &t->opt, &t->data, t->tok.hash_hex, step, tokens, t->scaler.scale};
}

int trainer_checkpoint(trainer *t, long step, double tokens, ckpt_stats *st, char *err, size_t errlen) {
  ckpt_state cs = ckpt_view(t, step, tokens);
  return ckpt_write(&cs, st, err, errlen);
}

int trainer_restore(trainer *t, const char *path, long *step, double *tokens, ckpt_stats *st, nml_errors *errs) {
  ckpt_state cs = ckpt_view(t, 0, 0.0);
  int n = ckpt_read(&cs, path, st, errs);
  /* fp16 continues with the saved loss scale; a checkpoint without scaling (1) keeps the deck's */
  if (n == 0 && t->scaler.enabled && cs.loss_scale != 1.0) t->scaler.scale = cs.loss_scale;
  *step = cs.step;
  *tokens = cs.tokens;
  return n;
}

/* ---- signals: a batch system's warning before the time limit ----------------------------------- */

static volatile sig_atomic_t train_signal;
static void on_signal(int sig) { train_signal = sig; }

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}

/* ---- reports -------------------------------------------------------------------------------- */

typedef struct {
  const cfg_config *cfg;
  trainer *t;
  energy_meter energy;
  metrics_out out;
  double flops_per_token, peak_gflops; /* the job's peak: all ranks */
  char engine[256];
  topo_machine machine;
} report;

/* Refuse to clobber a finished run unless &job overwrite is set. */
static int check_run_dir(const cfg_config *cfg, nml_errors *errs) {
  char path[4096];
  struct stat sb;
  snprintf(path, sizeof path, "%s/metrics.csv", cfg->job.run_dir);
  if (!cfg->job.overwrite && stat(path, &sb) == 0) {
    cfg_error_at(cfg, errs, "job", "run_dir",
                 "choose a new run_dir, or set &job overwrite = .true. (or --set job.overwrite=T) to replace it",
                 "'%s' already holds a run (metrics.csv exists)", cfg->job.run_dir);
    return 1;
  }
  return 0;
}

static int write_resolved_deck(const cfg_config *cfg, const char *header) {
  char path[4096];
  snprintf(path, sizeof path, "%s/deck.resolved.nml", cfg->job.run_dir);
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) return -1;
  cfg_write_deck(cfg, af.fp, header);
  return util_atomic_close(&af);
}

/* Topology: every rank's host, node rank, binding and place in the layout, printed by rank 0. */
static void print_topology(report *r, const char *bind) {
  trainer *t = r->t;
  enum { LINE = 256 };
  char mine[LINE], host[64] = "?";
  int lrank, nlocal;
  MPI_Comm_rank(t->L.node, &lrank);
  MPI_Comm_size(t->L.node, &nlocal);
  gethostname(host, sizeof host - 1);
  util_snprintf(mine, sizeof mine, "rank %d: %s (node rank %d of %d), stage %d, replica %d, %s", t->rank, host, lrank,
                nlocal, t->L.stage, t->L.replica, bind);
  char *all = t->rank == 0 ? util_malloc((size_t)t->size * LINE, "topology") : NULL;
  MPI_Gather(mine, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, t->comm);
  int leader = lrank == 0, nodes;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, t->comm);
  if (t->rank == 0) {
    char desc[1024], b[64];
    metrics_printf(&r->out, "== topology ==\nmachine: %s\n", topo_describe(&r->machine, desc, sizeof desc));
    metrics_printf(&r->out, "%d rank%s on %d node%s: %d pipeline stage%s x %d data-parallel replica%s (%s), ZeRO-%d, "
                            "%d micro-batch%s per step\n",
                   t->size, t->size == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", t->L.P, t->L.P == 1 ? "" : "s", t->L.D,
                   t->L.D == 1 ? "" : "s", r->cfg->parallel.rank_order, t->L.zero, t->m, t->m == 1 ? "" : "es");
    metrics_printf(&r->out, "%s\n", par_describe(&t->L, desc, sizeof desc));
    for (int i = 0; i < t->size; i++)
      if (t->size <= 64 || i < 8 || i >= t->size - 8) metrics_printf(&r->out, "%s\n", all + (size_t)i * LINE);
      else if (i == 8) metrics_printf(&r->out, "... (%d more ranks)\n", t->size - 16);
    (void)b;
  }
  free(all);
}

/* Memory per rank of each stage (replica 0), as planned; trainer_open allocated exactly this. */
static void print_memory(report *r) {
  trainer *t = r->t;
  if (t->rank != 0) return;
  for (int s = 0; s < t->L.P; s++) {
    train_memory m = train_plan_memory(r->cfg, t->be, &t->L, s, 0);
    char b[6][32];
    metrics_printf(&r->out, "memory, stage %d: parameters %s, gradients %s, AdamW %s%s, activations %s (%d slot%s)%s%s; "
                            "total %s per rank\n",
                   s, util_fmt_bytes((double)m.model.params, b[0], 32), util_fmt_bytes((double)m.model.grads, b[1], 32),
                   util_fmt_bytes((double)m.adam, b[2], 32), t->L.zero && t->L.D > 1 ? " (ZeRO-1 shard)" : "",
                   util_fmt_bytes((double)m.model.acts, b[3], 32), m.part.nslots, m.part.nslots == 1 ? "" : "s",
                   m.exchange + m.pipe ? ", buffers " : "",
                   m.exchange + m.pipe ? util_fmt_bytes((double)(m.exchange + m.pipe + m.model.io), b[4], 32) : "",
                   util_fmt_bytes((double)m.total, b[5], 32));
  }
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

static json_t *verdict_json(const report *r, const char *status, long steps, double wall, double train_time,
                            double train_loss, double val_loss, double tokens0, double tokens, const float *params,
                            size_t nparams) {
  const cfg_config *cfg = r->cfg;
  const energy_meter *e = &r->energy;
  double tps = train_time > 0 ? tokens / train_time : 0.0;
  double mfu = r->peak_gflops > 0 ? tps * r->flops_per_token / (r->peak_gflops * 1e9) : 0.0;
  double kwh = e->joules / 3.6e6, fac = kwh * e->pue;
  int measured = energy_any_measured(e);
  json_t *j = json_object();
  json_object_set_new(j, "run", json_string(cfg->job.name));
  json_object_set_new(j, "status", json_string(status));
  json_object_set_new(j, "steps", json_integer(steps));
  json_object_set_new(j, "tokens_trained", json_real(tokens0 + tokens));
  json_object_set_new(j, "tokens_this_job", json_real(tokens));
  json_object_set_new(j, "duration_s", json_real(wall));
  json_object_set_new(j, "train_time_s", json_real(train_time));
  json_object_set_new(j, "train_loss", isfinite(train_loss) ? json_real(train_loss) : json_null());
  json_object_set_new(j, "val_loss", isfinite(val_loss) ? json_real(val_loss) : json_null());
  json_object_set_new(j, "tokens_per_s", json_real(tps));
  json_object_set_new(j, "mfu", json_real(mfu));
  json_object_set_new(j, "peak_gflops", json_real(r->peak_gflops));
  json_object_set_new(j, "flops_per_token", json_real(r->flops_per_token));
  json_object_set_new(j, "flops_total", json_real(r->flops_per_token * tokens));
  json_object_set_new(j, "flops_formula", json_string("6N + 12*L*C*T per token (PaLM), N without wpe"));
  json_object_set_new(j, "n_params", json_integer((json_int_t)nparams));
  json_object_set_new(j, "backend", json_string(r->t->be->name));
  json_object_set_new(j, "engine", json_string(r->engine));
  json_object_set_new(j, "ranks", json_integer(r->t->size));
  json_object_set_new(j, "pipeline_stages", json_integer(r->t->L.P));
  json_object_set_new(j, "data_parallel", json_integer(r->t->L.D));
  json_object_set_new(j, "zero_stage", json_integer(r->t->L.zero));
  /* FNV-1a of the final parameter bytes (whole model): equal hashes mean bitwise-equal models */
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)util_hash64(params, nparams * sizeof(float), 0));
  json_object_set_new(j, "param_hash", json_string(hash));
  json_t *en = json_object();
  /* a summary; report.json has the whole energy record */
  json_object_set_new(en, "status", json_string(energy_kind(e)));
  json_object_set_new(en, "energy_consumed", measured ? json_real(kwh) : json_null());
  json_object_set_new(en, "estimated_energy", json_real(e->est_joules / 3.6e6));
  json_object_set_new(en, "pue", json_real(e->pue));
  json_object_set_new(en, "facility_energy", measured ? json_real(fac) : json_null());
  json_object_set_new(en, "carbon_intensity_g_per_kwh", json_real(e->intensity));
  json_object_set_new(en, "emissions", measured ? json_real(fac * e->intensity / 1000.0) : json_null());
  json_object_set_new(en, "j_per_token", measured && tokens > 0 ? json_real(e->joules / tokens) : json_null());
  json_object_set_new(en, "report", json_string("report.json"));
  json_object_set_new(j, "energy", en);
  return j;
}

/* Generate the deck's sample on replica 0 (the pipeline's last stage draws each token and hands
 * it to the first); rank 0 prints it and writes sample.txt. */
static void write_sample(report *r) {
  trainer *t = r->t;
  const cfg_sample *c = &r->cfg->sample;
  if (c->n_tokens <= 0 || t->L.replica != 0) return;
  gpt_model *m = &t->model;
  tok_ids ids = {0};
  const char *p = c->prompt[0] ? c->prompt : "\n";
  tok_encode(&t->tok, p, strlen(p), 1, &ids);
  int np = (int)ids.n, nn = (int)c->n_tokens, Tmax = t->T < t->shape.maxT ? t->T : t->shape.maxT;
  float *logits = m->has_head ? util_malloc((size_t)t->shape.V * sizeof(float), "logits") : NULL;
  sample_state ss;
  sample_init(&ss, c, t->shape.V, (uint64_t)r->cfg->job.seed);
  for (int k = 0; k < nn; k++) {
    int ctx = (int)ids.n < Tmax ? (int)ids.n : Tmax;
    pipe_forward_one(&t->pipe, ids.v + (ids.n - (size_t)ctx), ctx, logits);
    int32_t next = m->has_head ? sample_next(&ss, logits) : 0;
    MPI_Bcast(&next, 1, MPI_INT32_T, t->L.P - 1, t->L.pipe);
    tok_ids_push(&ids, next);
  }
  if (t->rank == 0) {
    char *text = util_malloc(ids.n * (size_t)t->tok.max_len + 1, "sample text");
    size_t len = tok_decode(&t->tok, ids.v, ids.n, text);
    text[len] = '\0';
    metrics_printf(&r->out, "== sample (%d tokens, temperature %g, top-k %ld) ==\n%s\n", nn, c->temperature, c->top_k,
                   text);
    char path[4096];
    snprintf(path, sizeof path, "%s/sample.txt", r->cfg->job.run_dir);
    util_atomic_file af;
    if (util_atomic_open(&af, path) == 0) {
      fwrite(text, 1, len, af.fp);
      util_atomic_close(&af);
    }
    free(text);
  }
  sample_free(&ss);
  free(logits);
  tok_ids_free(&ids);
  (void)np;
}

int train_run(const cfg_config *cfg, const backend *be, const char *header) {
  report r;
  memset(&r, 0, sizeof r);
  r.cfg = cfg;
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const cfg_training *tc = &cfg->training;

  /* inputs first: nothing is written before they are known to be good */
  nml_errors errs = {0};
  const int resuming = cfg->checkpoint.restart[0] != '\0'; /* continues the run in run_dir */
  int bad = rank == 0 && !resuming ? check_run_dir(cfg, &errs) : 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  trainer *t = bad ? NULL : trainer_open(cfg, be, MPI_COMM_WORLD, &errs);
  if (!t) {
    if (rank == 0) nml_errors_print(&errs, 20);
    nml_errors_free(&errs);
    return 1;
  }
  r.t = t;
  char err[600] = "";
  int ok = 1;
  if (rank == 0 && (metrics_open(&r.out, cfg->job.run_dir, resuming, err, sizeof err) != 0 || write_resolved_deck(cfg, header) != 0)) {
    if (!err[0]) util_snprintf(err, sizeof err, "cannot write the resolved deck in '%s': %s", cfg->job.run_dir, strerror(errno));
    cfg_error_at(cfg, &errs, "job", "run_dir", "check that the directory is writable and the disk is not full", "%s", err);
    nml_errors_print(&errs, 20);
    ok = 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!ok) {
    trainer_close(t);
    nml_errors_free(&errs);
    return 1;
  }
  if (rank == 0) {
    char *echo = NULL;
    size_t elen = 0;
    FILE *fp = open_memstream(&echo, &elen);
    cfg_write_deck(cfg, fp, NULL);
    fclose(fp);
    metrics_log(&r.out, "greenlm %s: deck %s\n== resolved deck ==\n%s", PACKAGE_VERSION, cfg->deck_path, echo);
    free(echo);
  }

  /* placement, threads, peak */
  char bind[320];
  topo_discover(&r.machine);
  int cores = topo_bind(t->L.node, strcmp(cfg->parallel.bind, "none") != 0, bind, sizeof bind);
  if (be->placement) { /* this rank's GPU and its PCI bus id, in the topology lines */
    char dev[200];
    size_t o = strlen(bind);
    util_snprintf(bind + o, sizeof bind - o, ", %s", be->placement(dev, sizeof dev));
  }
  be->set_threads(cfg->system.blas_threads > 0 ? (int)cfg->system.blas_threads : cores);
  be->describe(r.engine, sizeof r.engine);
  print_topology(&r, bind);
  double my_peak = cfg->system.peak_gflops > 0 ? cfg->system.peak_gflops : be->measure_gflops(1024, 1.0);
  MPI_Allreduce(&my_peak, &r.peak_gflops, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  r.flops_per_token = gpt_flops_per_token(&t->shape, t->T);
  char ecsv[4200];
  snprintf(ecsv, sizeof ecsv, "%s/energy.csv", cfg->job.run_dir);
  if (energy_open(&r.energy, &cfg->energy, MPI_COMM_WORLD, t->L.node, r.machine.cores, be->bus_id ? be->bus_id() : NULL,
                  rank == 0 ? ecsv : NULL, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "greenlm: error: %s\n", err), metrics_close(&r.out);
    trainer_close(t);
    return 1;
  }

  if (rank == 0) {
    const gpt_shape *s = &t->shape;
    size_t n = gpt_count_params(s);
    metrics_printf(&r.out, "== model ==\n%s: %d layers, n_embd %d, %d heads, vocab %d, block %d, MLP %d; %zu parameters (%.2f M)\n",
                   cfg->model.arch, s->L, s->C, s->H, s->V, s->maxT, s->F, n, (double)n / 1e6);
  }
  print_memory(&r);
  if (rank == 0) {
    metrics_printf(&r.out, "batch: %d sequences x %d tokens per micro-batch, %d micro-batch%s x %d replica%s = %ld tokens per step\n",
                   t->B, t->T, t->m, t->m == 1 ? "" : "es", t->L.D, t->L.D == 1 ? "" : "s", t->G * t->T);
    metrics_printf(&r.out, "compute: %s backend, %s\n", be->name, r.engine);
    metrics_printf(&r.out, "MFU basis: %.4g GFLOP per token (6N + 12LCT), peak %.1f GFLOP/s for the job (%s)\n",
                   r.flops_per_token / 1e9, r.peak_gflops, cfg->system.peak_gflops > 0 ? "from the deck" : "measured SGEMM, all ranks");
    metrics_printf(&r.out, "data: %s: %lld tokens (%llu windows of %d+1); %s: %lld tokens; tokenizer %s\n", cfg->data.train,
                   (long long)t->data.train.ntokens, (unsigned long long)t->data.nwin, t->T, cfg->data.val,
                   (long long)t->data.val.ntokens, t->tok.desc);
    for (int k = 0; k < ENERGY_NCOMP; k++)
      metrics_printf(&r.out, "energy: %-4s %s, %s: %s\n", energy_component_name(k), energy_status_name(r.energy.src[k].status),
                     r.energy.src[k].method, r.energy.src[k].note);
    const energy_region *rg = r.energy.region;
    metrics_printf(&r.out, "emissions: PUE %.2f, %.4g gCO2e/kWh (%s)\n", r.energy.pue, r.energy.intensity,
                   rg ? rg->label : "from the deck");
    if (t->L.P > 1)
      metrics_printf(&r.out, "pipeline: 1F1B, theoretical bubble (p-1)/(m+p-1) = %.1f%%\n",
                     100.0 * (t->L.P - 1) / (t->m + t->L.P - 1));
  }
  /* restart */
  long start = 0;
  double tokens0 = 0.0;
  if (resuming) {
    char path[CFG_STR_LEN + 64], dir[CFG_STR_LEN + 32];
    if (ckpt_find(cfg, path, sizeof path)) {
      ckpt_stats st;
      if (trainer_restore(t, path, &start, &tokens0, &st, &errs) > 0) {
        if (rank == 0) nml_errors_print(&errs, 20);
        if (rank == 0) metrics_close(&r.out);
        energy_close(&r.energy);
        trainer_close(t);
        nml_errors_free(&errs);
        return 1;
      }
      if (rank == 0)
        metrics_printf(&r.out, "restart: %s, step %ld: checksums verified, %.3g GB read in %.2f s (%.2f GB/s, %s; %.2f s "
                       "of it sharing pieces between replicas)\n", path, start, st.bytes / 1e9, st.seconds,
                       st.bytes / 1e9 / st.seconds, st.direct ? "straight from the disk" : "through the page cache",
                       st.share_seconds);
    } else if (rank == 0) {
      ckpt_dir(cfg, dir, sizeof dir);
      metrics_printf(&r.out, "restart: no checkpoint in %s yet: starting from step 0\n", dir);
    }
  }
  if (rank == 0) metrics_printf(&r.out, "== training: steps %ld to %ld ==\n", start + 1, tc->max_steps);
  catch_signals();

  const double tokens_per_step = (double)t->G * t->T;
  double t_start = util_now(), train_time = 0.0, tokens = 0.0, last_loss = NAN, val_loss = NAN;
  double lg[6] = {0}; /* since the last progress line: time, tokens, steps, compute, bubble, exchange */
  double bytes = 0.0;
  const char *status = "completed";
  long steps_done = start;
  int rc = 0;
  double t_ckpt = util_now();
  for (long step = start; step < tc->max_steps; step++) {
    trainer_step_info info;
    int res = trainer_step(t, step, &info);
    last_loss = info.loss;
    if (res != 0) {
      if (rank == 0)
        metrics_printf(&r.out, "greenlm: error: training diverged at step %ld (loss %g, gradient norm %g)\n"
                               "  hint: lower &training lr, raise warmup_steps, or keep grad_clip > 0\n",
                       step + 1, info.loss, info.grad_norm);
      status = "diverged";
      rc = 3;
      break;
    }
    if (info.skipped && rank == 0)
      metrics_printf(&r.out, "step %ld: fp16 gradients overflowed at loss scale %g: update skipped, scale now %g\n",
                     step + 1, info.loss_scale, info.loss_scale / 2);
    /* the step's wall time is the slowest rank's; the breakdown is summed over ranks */
    double mine[4] = {info.pipe.compute_s, info.pipe.wait_s, info.grad.wait_s, info.pipe.bytes + info.grad.bytes}, sum[4];
    double dt;
    MPI_Allreduce(&info.step_s, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Reduce(mine, sum, 4, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    steps_done = step + 1;
    train_time += dt;
    tokens += tokens_per_step;
    lg[0] += dt, lg[1] += tokens_per_step, lg[2] += 1;
    if (rank == 0) lg[3] += sum[0], lg[4] += sum[1], lg[5] += sum[2], bytes += sum[3];

    int last = steps_done == tc->max_steps;
    int out_of_time = tc->max_minutes > 0 && util_now() - t_start >= 60.0 * tc->max_minutes;
    MPI_Bcast(&out_of_time, 1, MPI_INT, 0, MPI_COMM_WORLD); /* every rank stops at the same step */
    out_of_time = out_of_time && !last;
    int do_eval = last || out_of_time || (tc->eval_every > 0 && steps_done % tc->eval_every == 0);
    double vl = NAN;
    if (do_eval) vl = val_loss = trainer_eval(t);
    if (steps_done % cfg->job.log_every == 0 || do_eval) {
      energy_sample(&r.energy); /* collective */
      if (rank == 0) {
        double tps = lg[1] / lg[0], mfu = tps * r.flops_per_token / (r.peak_gflops * 1e9);
        double eta = (double)(tc->max_steps - steps_done) * (train_time / (double)(steps_done - start));
        double busy = lg[0] * size; /* rank-seconds */
        int measured = energy_any_measured(&r.energy), shown = measured || r.energy.est_joules > 0;
        char w[32], e[32], es[32], vs[48] = "", ps[96] = "";
        fmt_energy(&r.energy, w, sizeof w, e, sizeof e);
        if (do_eval) snprintf(vs, sizeof vs, " | val %.4f", vl);
        if (size > 1)
          snprintf(ps, sizeof ps, " | bubble %.1f%% | exchange %.1f%%", 100.0 * lg[4] / busy, 100.0 * lg[5] / busy);
        metrics_printf(&r.out, "step %*ld/%ld | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%%%s | %s | %s | ETA %s\n",
                       (int)snprintf(NULL, 0, "%ld", tc->max_steps), steps_done, tc->max_steps, info.loss, vs, info.lr,
                       tps, 100.0 * mfu, ps, w, e, util_fmt_duration(eta, es, sizeof es));
        metrics_row row = {steps_done, info.loss, info.lr, info.grad_norm, 1e3 * lg[0] / lg[2], tps, mfu, vl,
                           !shown ? NAN : measured ? r.energy.watts : r.energy.est_watts,
                           !shown ? NAN : measured ? r.energy.joules : r.energy.est_joules,
                           energy_kind(&r.energy), lg[3] / busy, lg[4] / busy, lg[5] / busy,
                           bytes / lg[2]};
        metrics_csv_row(&r.out, &row);
      }
      memset(lg, 0, sizeof lg);
      bytes = 0.0;
    }
    /* checkpoints: by step count, by wall time, on a signal, at the end */
    int sig = train_signal, any_sig;
    MPI_Allreduce(&sig, &any_sig, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const cfg_checkpoint *ck = &cfg->checkpoint;
    int due_time = ck->every_minutes > 0 && util_now() - t_ckpt >= 60.0 * ck->every_minutes;
    MPI_Bcast(&due_time, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int stop = out_of_time || any_sig;
    if ((ck->every_steps > 0 && steps_done % ck->every_steps == 0) || due_time || ((stop || last) && ck->at_end) || any_sig) {
      ckpt_stats st;
      char cerr[1200];
      if (trainer_checkpoint(t, steps_done, tokens0 + tokens, &st, cerr, sizeof cerr) != 0) {
        if (rank == 0)
          metrics_printf(&r.out, "greenlm: error: %s\n  hint: check that &checkpoint dir is writable and has room; "
                                 "the older checkpoints are untouched\n", cerr);
        status = "checkpoint_failed";
        rc = 4;
        break;
      }
      t_ckpt = util_now();
      if (rank == 0)
        metrics_printf(&r.out, "checkpoint: %s, step %ld: %.3g GB in %.2f s (%.2f GB/s)\n", st.path, steps_done,
                       st.bytes / 1e9, st.seconds, st.bytes / 1e9 / st.seconds);
    }
    if (any_sig) {
      status = "signal";
      if (rank == 0)
        metrics_printf(&r.out, "stopping: signal %d (%s) at step %ld; continue with &checkpoint restart = 'latest'\n",
                       any_sig, any_sig == SIGTERM ? "SIGTERM" : any_sig == SIGUSR1 ? "SIGUSR1" : "?", steps_done);
      break;
    }
    if (out_of_time) {
      status = "time_limit";
      if (rank == 0) metrics_printf(&r.out, "stopping: &training max_minutes = %g reached\n", tc->max_minutes);
      break;
    }
  }
  size_t np;
  float *params = trainer_gather_params(t, &np);
  energy_sample(&r.energy); /* collective */
  if (rank == 0) {
    double wall = util_now() - t_start;
    json_t *v = verdict_json(&r, status, steps_done, wall, train_time, last_loss, val_loss, tokens0, tokens, params, np);
    double tps = json_real_value(json_object_get(v, "tokens_per_s")), mfu = json_real_value(json_object_get(v, "mfu"));
    metrics_printf(&r.out, "== verdict: %s ==\n", status);
    metrics_printf(&r.out, "steps %ld, tokens %.0f, wall %.1f s (training %.1f s) on %d rank%s\n", steps_done,
                   tokens0 + tokens, wall, train_time, size, size == 1 ? "" : "s");
    if (isfinite(val_loss))
      metrics_printf(&r.out, "loss: train %.4f, validation %.4f\n", last_loss, val_loss);
    else
      metrics_printf(&r.out, "loss: train %.4f (not evaluated)\n", last_loss);
    metrics_printf(&r.out, "figure of merit: %.1f tokens/s, MFU %.1f%% of %.1f GFLOP/s\n", tps, 100.0 * mfu,
                   r.peak_gflops);
    double flops = r.flops_per_token * tokens;
    energy_report_print(&r.energy, tokens, flops, print_to_out, &r.out);
    json_t *rep = energy_report_json(&r.energy, cfg, wall, tokens, flops, mfu, r.machine.cpu_model, r.machine.cores,
                                     r.machine.memory_gib);
    if (metrics_write_json(cfg->job.run_dir, "report.json", rep) != 0)
      metrics_printf(&r.out, "greenlm: warning: could not write %s/report.json: %s\n", cfg->job.run_dir, strerror(errno));
    json_decref(rep);
    if (metrics_write_json(cfg->job.run_dir, "verdict.json", v) != 0)
      metrics_printf(&r.out, "greenlm: warning: could not write %s/verdict.json: %s\n", cfg->job.run_dir, strerror(errno));
    json_decref(v);
  }
  free(params);
  if (rc == 0 && strcmp(status, "signal") != 0) write_sample(&r);
  if (rank == 0) metrics_close(&r.out);
  energy_close(&r.energy);
  trainer_close(t);
  nml_errors_free(&errs);
  return rc;
}
