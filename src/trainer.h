/* trainer: one rank's part of a training job laid out as P pipeline stages x D data-parallel
 * replicas (par.c): its model stage, optimizer shard, gradient exchange, pipeline schedule,
 * tokenizer and data loader. The training task around it (reports, checkpoints when due, the
 * step loop) is train.c. */
#ifndef GREENLM_TRAINER_H
#define GREENLM_TRAINER_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "deck/cfg.h"
#include "io/ckpt.h"
#include "parallel/grad.h"
#include "model/gpt.h"
#include "parallel/par.h"
#include "deck/nml.h"
#include "parallel/pipe.h"
#include "parallel/tp.h"

typedef struct trainer {
  const cfg_config *cfg;
  const backend *be;
  MPI_Comm comm;
  int rank, size;
  par_layout lay;
  gpt_shape shape;
  gpt_model model;
  optim_state opt;
  optim_scaler scaler; /* dynamic loss scaling of precision = 'fp16'; scale 1 otherwise */
  grad_exchange *gx;
  tp_group tpg;   /* the tensor-parallel group's collectives (T > 1) */
  pipe_state pipe;
  tok_tokenizer tok;
  data_loader data;
  int B, T, nmicro; /* sequences per micro-batch, tokens per sequence, micro-batches per step */
  long G;        /* sequences (windows) per global batch: B x m x D */
  uint64_t *win; /* (G) the windows of the current step */
  uint64_t *next; /* (G) the next step's, for the read-ahead hints (&data prefetch) */
  int eval_set;  /* the validation dataset being scored */
} trainer;

/* Backend memory of one rank of a layout (replica 0 of stage `stage`): the model, the AdamW
 * state it keeps, the exchange and pipeline buffers. trainer_open allocates exactly this. */
typedef struct {
  gpt_memory model;
  gpt_part part;
  size_t adam, exchange, pipe;
  size_t total;
  size_t mpi; /* not in total: host memory the MPI library takes for itself during the exchange */
} trainer_memory;

trainer_memory trainer_plan_memory(const cfg_config *cfg, const backend *be, const par_layout *lay, int stage, int replica);
/* The same for stage `stage`'s fullest tensor rank of replica 0 (their vocabulary rows may differ by one). */
trainer_memory trainer_plan_fullest(const cfg_config *cfg, const backend *be, const par_layout *lay, int stage);

/* A rank's tensors (gpt_list_tensors of its part) and their parameter count: what its memory plan
 * reads that neither the batch, the replicas nor the micro-batches change, so that a planner trying
 * many layouts of the same stages and tensor ranks lists them once. free(tt.t) after use. */
typedef struct {
  gpt_tensor *t;
  int nt;
  size_t n;
} trainer_tensors;
trainer_tensors trainer_tensors_of(const gpt_shape *s, gpt_part part);
/* trainer_plan_memory and trainer_plan_fullest from the model's shape s and the listed tensors of the
 * stage's rank (tt: its tensor rank's), or of each of its tensor ranks (tt[lay->tp]). */
trainer_memory trainer_plan_memory_of(const cfg_config *cfg, const backend *be, const gpt_shape *s, const par_layout *lay,
                                      int stage, int replica, const trainer_tensors *tt);
trainer_memory trainer_plan_fullest_of(const cfg_config *cfg, const backend *be, const gpt_shape *s, const par_layout *lay,
                                       int stage, const trainer_tensors *tt);

typedef struct {
  double loss;      /* mean token loss of the global batch */
  double grad_norm; /* before clipping */
  double lr;
  double step_s;    /* wall time of the step on this rank */
  double loss_scale; /* the loss scale the step used (precision = 'fp16'; 1 otherwise) */
  int skipped;       /* fp16: the gradients overflowed; no update was made and the scale was halved */
  pipe_stats pipe;  /* this rank's */
  grad_stats grad;  /* this rank's */
  double tp_bytes, tp_s; /* this rank's tensor-parallel sums and gathers: bytes handed to them, seconds in them */
} trainer_step_info;

/* Collective over comm, whose size must be the layout's (cfg_resolve_layout). Returns NULL after
 * reporting bad input (datasets, tokenizer) on comm rank 0. */
trainer *trainer_open(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs);
void trainer_close(trainer *t);

/* One optimizer step (0-based). Returns 0, or -1 when the loss or the gradient norm is not finite
 * (then no update was made); with fp16 loss scaling an overflow instead skips the update
 * (info->skipped) and returns 0 until the scale would fall below 1. The same on every rank. */
int trainer_step(trainer *t, long step, trainer_step_info *info);
/* The validation loss: each validation dataset's mean over &training eval_batches micro-batches of
 * it into losses (nval; may be NULL), and their mean weighted by the datasets' weights returned.
 * The same on every rank. */
double trainer_eval(trainer *t, double *losses);
/* Which replicas' error-feedback residuals cover which values, in words (grad_residual_holders). */
const char *trainer_residual_holders(const trainer *t);
/* Write a checkpoint of the run at `step` (steps done) after `tokens` tokens (ckpt.c). Collective.
 * Returns 0, or -1 (on every rank) after adding errors where they happened. */
int trainer_checkpoint(trainer *t, long step, double tokens, ckpt_stats *st, err_list *errs);
/* Continue from the checkpoint at path: *step and *tokens receive its counters. Collective.
 * Returns the number of errors added to errs. */
int trainer_restore(trainer *t, const char *path, long *step, double *tokens, ckpt_stats *st, err_list *errs);

/* Start from the Hugging Face directory &model init_from instead of the random initialisation: its
 * config.json checked against the deck, each rank reading the tensors it holds. Collective:
 * 0, or 1 on every rank after some rank added errors (err.h). */
int trainer_init_from(trainer *t, err_list *errs);

/* All parameters in the whole model's layout (wte, wpe, blocks, ln_f) on comm rank 0, NULL
 * elsewhere; *n receives their count. free() the result. Collective. For tests: rank 0 holds a
 * copy of the whole model. */
float *trainer_gather_params(trainer *t, size_t *n);
/* util_hash64 of the same parameters' bytes (what hashing trainer_gather_params' buffer gives) on
 * comm rank 0, 0 elsewhere; *n receives their count. No rank holds more than its own stage, its
 * largest tensor whole (tensor shards are put together on tensor rank 0) and a 64 MiB buffer: the
 * whole model's copy would not fit beside a 13B stage. Collective. */
uint64_t trainer_params_hash(trainer *t, size_t *n);

#endif
