/* infer: the whole model on every rank, from a checkpoint of any layout or a Hugging Face directory. */
#include "infer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/hf.h"
#include "parallel/par.h"
#include "parallel/topo.h"

/* The deck as a job of one pipeline stage and as many replicas as ranks: the layout a checkpoint
 * is read on when every rank holds the whole model. */
static cfg_config *whole_model_deck(const cfg_config *cfg, int size, int B, int T) {
  cfg_config *c = util_malloc(sizeof *c, "configuration");
  memcpy(c, cfg, sizeof *c);
  c->parallel.pipeline_stages = 1;
  c->parallel.data_parallel = size;
  c->parallel.micro_batches = 1;
  c->parallel.zero_stage = 0;
  c->training.micro_batch_size = B;
  c->training.seq_len = T;
  c->training.global_batch_size = (long)B * size;
  c->training.recompute = 0;
  return c;
}

/* The checkpoints to try, in order: &checkpoint restart, else 'latest'. Returns their count. */
static int checkpoints(const cfg_config *cfg, char (**paths)[CKPT_PATH_MAX]) {
  if (cfg->checkpoint.restart[0]) return ckpt_candidates(cfg, paths);
  cfg_config *c = util_malloc(sizeof *c, "configuration");
  memcpy(c, cfg, sizeof *c);
  util_strlcpy(c->checkpoint.restart, CFG_RESTART_LATEST, sizeof c->checkpoint.restart);
  int n = ckpt_candidates(c, paths);
  free(c);
  return n;
}

/* Read the newest readable checkpoint (a damaged one is skipped with a warning when it came from
 * 'latest' and &checkpoint fallback allows). Returns the errors added. */
static int read_checkpoint(infer_model *im, char (*paths)[CKPT_PATH_MAX], int n, err_list *errs) {
  const cfg_config *cfg = im->cfg;
  cfg_config *c = whole_model_deck(cfg, im->size, im->model.B, im->model.T);
  par_layout lay;
  par_create(&lay, c, im->comm);
  int nerr = 0;
  for (int i = 0; i < n; i++) {
    ckpt_state cs = {.cfg = c, .lay = &lay, .model = &im->model, .tokenizer_hash = im->tok.hash_hex, .loss_scale = 1.0};
    ckpt_stats st = {0};
    err_list mine = {0};
    nerr = ckpt_read(&cs, paths[i], &st, &mine);
    int more = i + 1 < n && strcmp(cfg->checkpoint.restart, paths[i]) != 0 && cfg->checkpoint.fallback;
    if (nerr && st.damaged && more) {
      if (im->rank == 0) fprintf(stderr, "greenlm: warning: checkpoint %s is damaged; reading %s instead\n", paths[i], paths[i + 1]);
      err_free(&mine);
      continue;
    }
    for (int k = 0; k < mine.n; k++)
      err_add(errs, mine.v[k].file, mine.v[k].line, mine.v[k].col, mine.v[k].hint[0] ? mine.v[k].hint : NULL, "%s", mine.v[k].msg);
    err_free(&mine);
    if (!nerr) {
      gpt_params_changed(&im->model, 0, im->model.nparams);
      im->step = cs.step;
      util_snprintf(im->source, sizeof im->source, "checkpoint %s (step %ld)", paths[i], cs.step);
    }
    break;
  }
  par_free(&lay);
  free(c);
  return nerr;
}

/* Every tensor from the Hugging Face directory &model init_from. Returns the errors (the same on
 * every rank: each rank reads the whole model). */
static int read_hf(infer_model *im, err_list *errs) {
  const char *dir = im->cfg->model.init_from;
  int bad = hf_load_model(dir, &im->cfg->model, &im->model, errs) != 0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, im->comm);
  if (any) return 1;
  im->step = -1;
  util_snprintf(im->source, sizeof im->source, "Hugging Face directory %s", dir);
  return 0;
}

/* The weights, from the first source that applies (infer.h). */
static int read_weights(infer_model *im, err_list *errs) {
  const cfg_config *cfg = im->cfg;
  char(*paths)[CKPT_PATH_MAX] = NULL;
  int n = checkpoints(cfg, &paths), rc;
  if (n > 0) rc = read_checkpoint(im, paths, n, errs);
  else if (cfg->model.init_from[0]) rc = read_hf(im, errs);
  else {
    char dir[CKPT_PATH_MAX];
    ckpt_dir(cfg, dir, sizeof dir);
    cfg_error_at(cfg, errs, "checkpoint", "restart", "train first (task = 'train', 'eval'), give a checkpoint's path in "
                 "&checkpoint restart, or a Hugging Face directory in &model init_from",
                 "no model to use: no checkpoint in %s and no &model init_from", dir);
    rc = 1;
  }
  free(paths);
  return rc;
}

int infer_open(infer_model *im, const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs) {
  memset(im, 0, sizeof *im);
  im->cfg = cfg;
  im->be = be;
  im->comm = comm;
  MPI_Comm_rank(comm, &im->rank);
  MPI_Comm_size(comm, &im->size);
  int e0 = errs->n, bad = tok_open(&im->tok, cfg_tokenizer_kind_of(&cfg->tokenizer), cfg->tokenizer.dir, errs) != 0, any;
  if (bad) cfg_relocate(cfg, errs, e0, "tokenizer", "dir");
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (any && im->tok.bytes) tok_free(&im->tok);
  if (!any) gpt_shape_from_cfg(&im->shape, &cfg->model);
  return any;
}

int infer_load(infer_model *im, int B, int T, err_list *errs) {
  gpt_part part = gpt_whole(&im->shape);
  part.inference = B == 0; /* weights only: generation plans its own buffers */
  gpt_init(&im->model, &im->shape, im->be, B ? B : 1, T ? T : 1, part, (uint64_t)im->cfg->job.seed);
  if (read_weights(im, errs) == 0) return 0;
  gpt_free(&im->model);
  memset(&im->model, 0, sizeof im->model);
  return 1;
}

void infer_close(infer_model *im) {
  if (im->metered) energy_close(&im->energy), MPI_Comm_free(&im->node);
  if (im->model.params) gpt_free(&im->model);
  if (im->shape.window) gpt_shape_free(&im->shape);
  if (im->tok.bytes) tok_free(&im->tok);
  memset(im, 0, sizeof *im);
}

const float *infer_host_params(const infer_model *im, float **owned) {
  *owned = NULL;
  if (im->be->caps.host_memory) return im->model.params;
  *owned = util_malloc(im->model.nparams * sizeof(float), "parameter copy");
  im->be->to_host(im->be, *owned, im->model.params, im->model.nparams * sizeof(float));
  return *owned;
}

int infer_meter(infer_model *im, err_list *errs) {
  topo_machine mach;
  topo_discover(&mach);
  MPI_Comm_split_type(im->comm, MPI_COMM_TYPE_SHARED, im->rank, MPI_INFO_NULL, &im->node);
  im->metered = 1; /* energy_close undoes a partial open too */
  const backend *be = im->be;
  return energy_open(&im->energy, &im->cfg->energy, im->comm, im->node, mach.cores, be->bus_id ? be->bus_id(be) : NULL, NULL, 0,
                     errs) != 0;
}

static void print_stdout(void *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(ctx, fmt, ap);
  va_end(ap);
}

void infer_meter_report(infer_model *im, double tokens, double flops, double *joules, int *measured) {
  energy_sample(&im->energy); /* collective */
  *measured = energy_any_measured(&im->energy);
  *joules = *measured ? im->energy.joules : im->energy.est_joules;
  if (im->rank == 0) energy_report_print(&im->energy, tokens, flops, print_stdout, stdout), fflush(stdout);
}
