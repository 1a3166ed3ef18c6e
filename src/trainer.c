/* trainer: one rank's part of a P x D training job: open, step, evaluate, checkpoint, restore. */
#include "trainer.h"

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
#include "io/hf.h"
#include "config.h"
#include "text/data.h"
#include "energy/energy.h"
#include "energy/metrics.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "parallel/comm.h"
#include "parallel/hier.h"
#include "parallel/par.h"
#include "parallel/qexch.h"
#include "model/sample.h"
#include "text/tok.h"
#include "parallel/topo.h"
#include "base/util.h"

/* ---- the trainer ---------------------------------------------------------------------------- */

trainer_memory trainer_plan_memory_of(const cfg_config *cfg, const backend *be, const gpt_shape *s, const par_layout *lay,
                                      int stage, int replica, const trainer_tensors *tt) {
  trainer_memory t;
  int B = (int)cfg->training.micro_batch_size, T = (int)cfg->training.seq_len;
  t.part = par_stage_part(lay, stage);
  t.model = gpt_plan_memory(s, be, B, T, t.part);
  t.adam = optim_bytes(grad_own_params(tt->n, lay, replica));
  t.exchange = grad_plan_device_bytes(cfg, tt->t, tt->nt, tt->n, lay, replica, be);
  t.mpi = grad_mpi_bytes(tt->t, tt->nt, cfg->parallel.bucket_mb, lay);
  t.pipe = pipe_bytes(s, t.part, B, T, backend_dtype_size(be->storage));
  t.total = t.model.total + t.adam + t.exchange + t.pipe;
  return t;
}

trainer_tensors trainer_tensors_of(const gpt_shape *s, gpt_part part) {
  trainer_tensors tt;
  tt.t = gpt_list_tensors(s, part, &tt.nt);
  tt.n = gpt_part_params(s, part);
  return tt;
}

trainer_memory trainer_plan_memory(const cfg_config *cfg, const backend *be, const par_layout *lay, int stage, int replica) {
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  trainer_tensors tt = trainer_tensors_of(&s, par_stage_part(lay, stage));
  trainer_memory t = trainer_plan_memory_of(cfg, be, &s, lay, stage, replica, &tt);
  free(tt.t);
  gpt_shape_free(&s);
  return t;
}

trainer_memory trainer_plan_fullest_of(const cfg_config *cfg, const backend *be, const gpt_shape *s, const par_layout *lay,
                                       int stage, const trainer_tensors *tt) {
  par_layout l = *lay; /* a copy whose tensor rank varies */
  trainer_memory most = {0};
  for (int r = 0; r < lay->tp; r++) {
    l.tp_rank = r;
    trainer_memory m = trainer_plan_memory_of(cfg, be, s, &l, stage, 0, &tt[r]);
    if (r == 0 || m.total > most.total) most = m;
  }
  return most;
}

trainer_memory trainer_plan_fullest(const cfg_config *cfg, const backend *be, const par_layout *lay, int stage) {
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  trainer_tensors *tt = util_malloc((size_t)lay->tp * sizeof *tt, "tensor lists");
  par_layout l = *lay;
  for (int r = 0; r < lay->tp; r++) l.tp_rank = r, tt[r] = trainer_tensors_of(&s, par_stage_part(&l, stage));
  trainer_memory most = trainer_plan_fullest_of(cfg, be, &s, lay, stage, tt);
  for (int r = 0; r < lay->tp; r++) free(tt[r].t);
  free(tt);
  gpt_shape_free(&s);
  return most;
}

/* Training micro-batch k of this replica: windows [replica * B * m + k * B, ... + B) of the step. */
static void train_batch(void *ctx, int k, int32_t *tokens, int32_t *targets) {
  trainer *t = ctx;
  data_read_train(&t->data, t->win + ((size_t)t->lay.replica * t->nmicro + (size_t)k) * t->B, t->B, tokens, targets);
}

/* The next step's windows of this replica read ahead into the page cache while this step runs, on
 * the ranks that read windows (the first and last stages). */
static void prefetch_next(trainer *t) {
  if (!t->cfg->data.prefetch || !(t->model.has_embed || t->model.has_head)) return;
  long per = (long)t->B * t->nmicro;
  data_prefetch_next(&t->data, t->G, t->lay.replica * per, per, t->next);
}

/* Validation: replica r takes batches r, r + D, r + 2D, ... of the eval_batches. */
static void eval_batch(void *ctx, int k, int32_t *tokens, int32_t *targets) {
  trainer *t = ctx;
  data_val_batch(&t->data, t->eval_set, t->lay.replica + k * t->lay.D, t->B, tokens, targets);
}

trainer *trainer_open(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs) {
  trainer *t = util_calloc(1, sizeof *t, "trainer");
  t->cfg = cfg;
  t->be = be;
  t->comm = comm;
  MPI_Comm_rank(comm, &t->rank);
  MPI_Comm_size(comm, &t->size);
  t->B = (int)cfg->training.micro_batch_size;
  t->T = (int)cfg->training.seq_len;
  t->nmicro = (int)cfg->parallel.micro_batches;
  par_create(&t->lay, cfg, comm);
  t->G = (long)t->B * t->nmicro * t->lay.D;
  /* inputs: every rank reads the same headers, so all find the same problems */
  long n0 = err_count(errs);
  int e0 = errs->n;
  hier_check_nodes(cfg, &t->lay, errs); /* the nodes MPI reports, where the deck does not say */
  if (tok_open(&t->tok, cfg_tokenizer_kind_of(&cfg->tokenizer), cfg->tokenizer.dir, errs) == 0) data_open(&t->data, cfg, &t->tok, t->T, errs);
  else cfg_relocate(cfg, errs, e0, "tokenizer", "dir");
  int bad = err_count(errs) > n0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (!any && cfg->data.verify && data_verify(&t->data, comm, errs) > 0) {
    data_close(&t->data);
    any = 1;
  }
  if (any) {
    if (t->tok.bytes) tok_free(&t->tok);
    par_free(&t->lay);
    free(t);
    return NULL;
  }
  gpt_shape_from_cfg(&t->shape, &cfg->model);
  gpt_init(&t->model, &t->shape, be, t->B, t->T, par_part(&t->lay), (uint64_t)cfg->job.seed);
  tp_open(&t->tpg, &t->model, t->lay.tensor, t->B, t->T);
  long period = cfg->comm.adapt_every ? cfg->comm.adapt_every : cfg->training.max_steps / 10;
  t->gx = grad_create(&t->model, &t->lay, cfg->parallel.bucket_mb, &cfg->comm, period, (uint64_t)cfg->job.seed);
  size_t lo, hi;
  grad_own_range(t->gx, &lo, &hi);
  optim_init(&t->opt, be, lo, hi);
  optim_scaler_init(&t->scaler, cfg_system_precision_of(&cfg->system) == CFG_PREC_FP16, cfg->system.loss_scale,
                    cfg->system.loss_scale_window);
  pipe_init(&t->pipe, &t->lay, &t->model, t->B, t->T);
  t->win = util_malloc((size_t)t->G * sizeof *t->win, "step windows");
  t->next = util_malloc((size_t)t->G * sizeof *t->next, "step windows");
  return t;
}

void trainer_close(trainer *t) {
  if (!t) return;
  pipe_free(&t->pipe);
  optim_free(&t->opt);
  grad_free(t->gx);
  tp_close(&t->tpg);
  gpt_free(&t->model);
  gpt_shape_free(&t->shape);
  data_close(&t->data);
  tok_free(&t->tok);
  par_free(&t->lay);
  free(t->win);
  free(t->next);
  free(t);
}

int trainer_step(trainer *t, long step, trainer_step_info *info) {
  const cfg_training *tc = &t->cfg->training;
  double t0 = util_now();
  const double tokens = (double)t->G * t->T;
  data_next_windows(&t->data, t->G, t->win);
  prefetch_next(t);
  gpt_zero_grad(&t->model);
  gpt_sums_clear(&t->model);
  grad_begin(t->gx, step);
  /* fp16: the loss gradient is multiplied by the loss scale, so the gradients carry it (optim.h) */
  const double scale = t->scaler.scale;
  pipe_train_step(&t->pipe, t->nmicro, (float)(scale / tokens), train_batch, t, grad_hook, t->gx);
  grad_finish(t->gx);
  grad_sumsq(t->gx, t->model.sums + 1);
  /* {loss, sum of squares}: the loss lives on the last stages (tensor rank 0 counts it), the norm's pieces
   * everywhere. Several ranks sum them first; one rank's update is queued before the host reads them. */
  double sums[2];
  const int several = t->size > 1;
  if (several) {
    gpt_sums_read(&t->model, sums);
    if (t->lay.tp_rank != 0) sums[0] = 0.0;
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, t->comm);
    t->be->to_device(t->be, t->model.sums, sums, sizeof sums);
  }
  info->lr = optim_lr(tc, step);
  optim_adamw_step(&t->opt, &t->model, tc, step, info->lr, scale, t->model.sums); /* skipped unless finite */
  if (!several) gpt_sums_read(&t->model, sums);
  info->loss = sums[0] / tokens;
  info->grad_norm = sqrt(sums[1]) / scale;
  info->loss_scale = scale;
  /* 1: updated; 0: fp16 overflow, the step skipped and the scale halved; -1: diverged */
  int ok = optim_scaler_update(&t->scaler, isfinite(info->loss) && isfinite(info->grad_norm));
  info->skipped = ok == 0;
  if (ok > 0) grad_gather_params(t->gx);
  t->be->sync(t->be);
  info->step_s = util_now() - t0;
  info->pipe = pipe_take_stats(&t->pipe);
  info->grad = grad_take_stats(t->gx);
  info->tp_bytes = t->tpg.bytes, info->tp_s = t->tpg.wait_s;
  t->tpg.bytes = t->tpg.wait_s = 0.0;
  return ok < 0 ? -1 : 0;
}

double trainer_eval(trainer *t, double *losses) {
  long nb = t->cfg->training.eval_batches, D = t->lay.D;
  int mine = (int)(nb / D + (t->lay.replica < nb % D)), n = t->data.nval;
  double *loss = util_calloc((size_t)n, sizeof *loss, "validation losses"), mean = 0.0;
  for (t->eval_set = 0; t->eval_set < n; t->eval_set++) {
    double l = pipe_eval(&t->pipe, mine, eval_batch, t);
    loss[t->eval_set] = t->lay.tp_rank == 0 ? l : 0.0; /* every tensor rank has it */
  }
  pipe_take_stats(&t->pipe); /* evaluation is not part of the steps' figures */
  t->tpg.bytes = t->tpg.wait_s = 0.0;
  MPI_Allreduce(MPI_IN_PLACE, loss, n, MPI_DOUBLE, MPI_SUM, t->comm);
  for (int v = 0; v < n; v++) {
    loss[v] /= (double)nb * t->B * t->T;
    mean += t->data.val[v].weight * loss[v];
    if (losses) losses[v] = loss[v];
  }
  free(loss);
  return mean; /* one dataset: its weight is exactly 1 */
}

int trainer_init_from(trainer *t, err_list *errs) {
  int bad = hf_load_model(t->cfg->model.init_from, &t->cfg->model, &t->model, errs) != 0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, t->comm);
  return any;
}

/* The tensors of this rank's stage that the whole model's buffer takes from it, whole: all of them but
 * the last stage's copy of the tied embedding (the first stage's is the one). */
static int stage_gives(const trainer *t, const gpt_tensor *w) {
  return !(t->lay.P > 1 && t->lay.stage == t->lay.P - 1 && w->tied);
}

/* Split tensor i of this rank's stage, whole, into host memory `whole` (its grows x gcols floats) on
 * tensor rank 0: every tensor rank's shard put in place. Collective over the tensor group (T > 1);
 * `shard` is host scratch of the largest shard's floats. */
static void whole_tensor(trainer *t, int i, float *whole, float *shard) {
  const gpt_model *m = &t->model;
  const gpt_tensor *w = &m->tensors[i];
  enum { TAG_WHOLE = 9 };
  if (t->lay.tp_rank > 0) {
    t->be->to_host(t->be, shard, m->params + w->offset, w->numel * sizeof(float));
    comm_send_floats(shard, w->numel, 0, TAG_WHOLE, t->lay.tensor);
    return;
  }
  gpt_part part = par_part(&t->lay);
  for (int r = 0; r < t->lay.tp; r++) {
    int nr;
    part.tp_rank = r;
    gpt_tensor *theirs = gpt_list_tensors(&t->shape, part, &nr), *tr = &theirs[i];
    if (r > 0) comm_recv_floats(shard, tr->numel, r, TAG_WHOLE, t->lay.tensor);
    else t->be->to_host(t->be, shard, m->params + w->offset, w->numel * sizeof(float));
    for (size_t e = 0, run; e < tr->numel; e += run) {
      size_t g = gpt_tensor_global(tr, e, &run);
      memcpy(whole + g, shard + e, run * sizeof(float));
    }
    free(theirs);
  }
}

/* Where streamed floats go (host memory, n of them). */
typedef void (*stage_sink)(void *ctx, const float *x, size_t n);

/* Whether tensor w is put together by appending the tensor ranks' shards in order (blocks of whole rows,
 * one group): no whole copy is needed. */
static int appended(const gpt_tensor *w) { return w->split == GPT_SPLIT_ROWS && w->groups == 1; }

/* Whole-tensor floats this stage gives, the largest tensor put together whole (a column block or
 * grouped rows) and the largest shard of such a tensor on any tensor rank. */
static size_t stage_count(const trainer *t, size_t *most_whole, size_t *most_shard) {
  const gpt_model *m = &t->model;
  size_t c = 0;
  *most_whole = *most_shard = 1;
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *w = &m->tensors[i];
    size_t g = (size_t)w->grows * (size_t)w->gcols;
    if (stage_gives(t, w)) c += g;
    if (w->split == GPT_SPLIT_NONE || appended(w)) continue;
    if (g > *most_whole) *most_whole = g;
    if (w->numel > *most_shard) *most_shard = w->numel;
  }
  return c;
}

enum { TAG_STAGE = 7, TAG_ROWS = 10, STAGE_CAP = 1 << 24, ROWS_CAP = 1 << 20 }; /* floats a message carries */

/* Floats [0, n) of backend memory p to put in pieces of at most `cap` (host memory read in place, else
 * through buf). */
static void put_backend(const trainer *t, const float *p, size_t n, float *buf, size_t cap, stage_sink put, void *ctx) {
  for (size_t a = 0; a < n; a += cap) {
    size_t k = n - a < cap ? n - a : cap;
    const float *x = p + a;
    if (!t->be->caps.host_memory) t->be->to_host(t->be, buf, x, k * sizeof(float)), x = buf;
    put(ctx, x, k);
  }
}

static void send_rows(void *ctx, const float *x, size_t n) {
  trainer *t = ctx;
  MPI_Send(x, (int)n, MPI_FLOAT, 0, TAG_ROWS, t->lay.tensor);
}

/* A tensor cut into blocks of rows, streamed whole: tensor rank 0 puts its rows, then every other
 * rank's as they arrive, in pieces of ROWS_CAP floats. Collective over the tensor group. */
static void stream_rows(trainer *t, int i, float *buf, stage_sink put, void *ctx) {
  const gpt_tensor *w = &t->model.tensors[i];
  if (t->lay.tp_rank > 0) {
    put_backend(t, t->model.params + w->offset, w->numel, buf, ROWS_CAP, send_rows, t);
    return;
  }
  put_backend(t, t->model.params + w->offset, w->numel, buf, ROWS_CAP, put, ctx);
  gpt_part part = par_part(&t->lay);
  for (int r = 1; r < t->lay.tp; r++) {
    int nr;
    part.tp_rank = r;
    gpt_tensor *theirs = gpt_list_tensors(&t->shape, part, &nr);
    for (size_t a = 0, n = theirs[i].numel; a < n; a += ROWS_CAP) {
      int k = (int)(n - a < ROWS_CAP ? n - a : ROWS_CAP);
      MPI_Recv(buf, k, MPI_FLOAT, r, TAG_ROWS, t->lay.tensor, MPI_STATUS_IGNORE);
      put(ctx, buf, (size_t)k);
    }
    free(theirs);
  }
}

/* Stream this rank's stage as the whole model's buffer holds it to `put` on tensor rank 0 of the stage,
 * tensor by tensor: straight from the stage's buffer without tensor parallelism (host memory read in
 * place, else through STAGE_CAP floats); with it, blocks of rows appended rank after rank, the other
 * split tensors put together whole on tensor rank 0. Collective over the tensor group. */
static void stream_stage(trainer *t, stage_sink put, void *ctx) {
  const gpt_model *m = &t->model;
  size_t mw, ms;
  stage_count(t, &mw, &ms);
  const int T = t->lay.tp, first = t->lay.tp_rank == 0;
  float *whole = T > 1 && first ? util_malloc(mw * sizeof(float), "whole tensor") : NULL;
  float *shard = T > 1 ? util_malloc(ms * sizeof(float), "shard") : NULL;
  size_t cap = T > 1 ? ROWS_CAP : STAGE_CAP;
  float *buf = T > 1 || !t->be->caps.host_memory ? util_malloc(cap * sizeof(float), "parameter staging") : NULL;
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *w = &m->tensors[i];
    if (!stage_gives(t, w)) continue;
    if (T > 1 && appended(w)) {
      stream_rows(t, i, buf, put, ctx);
    } else if (T > 1 && w->split != GPT_SPLIT_NONE) {
      whole_tensor(t, i, whole, shard);
      if (whole) put(ctx, whole, (size_t)w->grows * (size_t)w->gcols);
    } else if (first) { /* whole on this rank */
      put_backend(t, m->params + w->offset, w->numel, buf, cap, put, ctx);
    }
  }
  free(whole), free(shard), free(buf);
}

/* A later stage's tensor rank 0 sends its floats to stage 0 in messages of at most STAGE_CAP. */
static void send_to_first(void *ctx, const float *x, size_t n) {
  trainer *t = ctx;
  for (size_t a = 0; a < n; a += STAGE_CAP)
    MPI_Send(x + a, (int)(n - a < STAGE_CAP ? n - a : STAGE_CAP), MPI_FLOAT, 0, TAG_STAGE, t->lay.pipe);
}

/* Stage 0 receives stage s's `count` floats, handing each message to put. */
static void recv_stage(trainer *t, int s, size_t count, float *buf, stage_sink put, void *ctx) {
  for (size_t got = 0; got < count;) {
    MPI_Status st;
    int k;
    MPI_Recv(buf, STAGE_CAP, MPI_FLOAT, s, TAG_STAGE, t->lay.pipe, &st);
    MPI_Get_count(&st, MPI_FLOAT, &k);
    put(ctx, buf, (size_t)k);
    got += (size_t)k;
  }
}

/* Stage by stage, in order, the whole model's floats to put on comm rank 0. Collective over replica 0. */
static void stream_model(trainer *t, stage_sink put, void *ctx) {
  size_t mw, ms, count = stage_count(t, &mw, &ms);
  if (t->lay.stage > 0) {
    uint64_t c = count;
    if (t->lay.tp_rank == 0) MPI_Send(&c, 1, MPI_UINT64_T, 0, TAG_STAGE, t->lay.pipe);
    stream_stage(t, send_to_first, t);
    return;
  }
  stream_stage(t, put, ctx);
  if (t->lay.tp_rank != 0 || t->lay.P == 1) return;
  float *buf = util_malloc((size_t)STAGE_CAP * sizeof(float), "stage messages");
  for (int s = 1; s < t->lay.P; s++) {
    uint64_t c;
    MPI_Recv(&c, 1, MPI_UINT64_T, s, TAG_STAGE, t->lay.pipe, MPI_STATUS_IGNORE);
    recv_stage(t, s, (size_t)c, buf, put, ctx);
  }
  free(buf);
}

typedef struct {
  float *all;
  size_t n, at;
  uint64_t h;
} model_sink;

static void append_floats(void *ctx, const float *x, size_t n) {
  model_sink *k = ctx;
  UTIL_CHECK(k->at + n <= k->n, NULL, "internal: the stages give more than the model's %zu parameters", k->n);
  memcpy(k->all + k->at, x, n * sizeof(float));
  k->at += n;
}

static void hash_floats(void *ctx, const float *x, size_t n) {
  model_sink *k = ctx;
  k->h = util_hash64_more(k->h, x, n * sizeof(float));
  k->at += n;
}

float *trainer_gather_params(trainer *t, size_t *n) {
  *n = gpt_count_params(&t->shape);
  if (t->lay.replica != 0) return NULL;
  model_sink k = {t->rank == 0 ? util_malloc(*n * sizeof(float), "whole model") : NULL, *n, 0, 0};
  stream_model(t, append_floats, &k);
  return k.all;
}

uint64_t trainer_params_hash(trainer *t, size_t *n) {
  *n = gpt_count_params(&t->shape);
  if (t->lay.replica != 0) return 0;
  model_sink k = {NULL, *n, 0, UTIL_HASH64_EMPTY};
  stream_model(t, hash_floats, &k);
  return t->rank == 0 ? k.h : 0;
}

/* The checkpoint's view of this rank. */
static ckpt_state ckpt_view(trainer *t, long step, double tokens) {
  ckpt_state cs = {.cfg = t->cfg, .lay = &t->lay, .model = &t->model, .opt = &t->opt, .data = &t->data,
                   .tokenizer_hash = t->tok.hash_hex, .step = step, .tokens = tokens, .loss_scale = t->scaler.scale};
  cs.comm_nlevels = grad_levels(t->gx, cs.comm_levels);
  cs.comm_residual = grad_residual(t->gx);
  cs.comm_residual_holders = grad_residual_holders(t->gx);
  cs.comm_lowrank_q = grad_lowrank_q(t->gx, &cs.comm_lowrank_t0, &cs.comm_lowrank_t1, &cs.comm_lowrank_writes);
  cs.comm_lowrank_rank = t->cfg->comm.powersgd_rank;
  return cs;
}

const char *trainer_residual_holders(const trainer *t) { return grad_residual_holders(t->gx); }

int trainer_checkpoint(trainer *t, long step, double tokens, ckpt_stats *st, err_list *errs) {
  grad_residual_sync(t->gx, 1);
  ckpt_state cs = ckpt_view(t, step, tokens);
  return ckpt_write(&cs, st, errs);
}

int trainer_restore(trainer *t, const char *path, long *step, double *tokens, ckpt_stats *st, err_list *errs) {
  ckpt_state cs = ckpt_view(t, 0, 0.0);
  int n = ckpt_read(&cs, path, st, errs);
  if (n == 0) gpt_params_changed(&t->model, 0, t->model.nparams);
  if (n == 0 && cs.comm_nlevels > 0) grad_set_levels(t->gx, cs.comm_levels, cs.comm_nlevels);
  if (n == 0) grad_residual_sync(t->gx, 0);
  /* fp16 continues with the saved loss scale; a checkpoint without scaling (1) keeps the deck's */
  if (n == 0 && t->scaler.enabled && cs.loss_scale != 1.0) t->scaler.scale = cs.loss_scale;
  *step = cs.step;
  *tokens = cs.tokens;
  return n;
}

