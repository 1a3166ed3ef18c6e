/* infer: the model a trained-model task works on (eval, sample, export), whole on every rank of the
 * job, read from a checkpoint written on any layout or from a Hugging Face model directory.
 *
 * Where the weights come from, the first that applies:
 *   1. &checkpoint restart: a checkpoint's path, or 'latest' (the newest in &checkpoint dir);
 *   2. the newest checkpoint in &checkpoint dir (after a 'train' task of the same job, its last);
 *   3. &model init_from: a Hugging Face directory (config.json checked against &model).
 * A checkpoint's tokenizer must be the deck's (its hash is compared). */
#ifndef GREENLM_INFER_H
#define GREENLM_INFER_H

#include <mpi.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "energy/energy.h"
#include "io/ckpt.h"
#include "model/backend.h"
#include "model/gpt.h"
#include "text/tok.h"

typedef struct {
  const cfg_config *cfg;
  const backend *be;
  MPI_Comm comm;
  int rank, size;
  gpt_shape shape;
  gpt_model model; /* all layers, micro-batches up to (B, T) */
  tok_tokenizer tok;
  char source[CKPT_PATH_MAX + 64]; /* "checkpoint PATH (step N)" or "Hugging Face directory DIR" */
  long step;                       /* of the checkpoint; -1 for a Hugging Face directory */
  energy_meter energy;             /* the task's energy (infer_meter), when metered */
  int metered;
  MPI_Comm node;
} infer_model;

/* Open the deck's tokenizer (first, so that a task can size its work in tokens). Collective over
 * comm. Returns the number of errors added (the same on every rank); on errors nothing is open. */
int infer_open(infer_model *im, const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs);
/* Then the model for micro-batches up to (B, T), its weights read; B = 0: the weights only (for the
 * generator, which plans its own buffers). Collective. Returns the errors
 * added (the same on every rank); on errors the model is freed (infer_close still closes the rest). */
int infer_load(infer_model *im, int B, int T, err_list *errs);
void infer_close(infer_model *im);

/* Start measuring the task's energy (&energy: RAPL, NVML, estimates; no energy.csv). Collective.
 * Returns 0, or 1 (every rank) after errors. */
int infer_meter(infer_model *im, err_list *errs);
/* The energy so far (collective), printed on rank 0 as the training verdict prints it, for `tokens`
 * tokens of `flops` model FLOPs. *joules receives the measured IT energy (or the estimate when
 * nothing is measured; 0 when neither) and *measured whether it is measured. */
void infer_meter_report(infer_model *im, double tokens, double flops, double *joules, int *measured);

/* The whole model's parameters (fp32, in gpt_list_tensors order) in host memory: the model's own
 * buffer on a backend in host memory, else a copy that *owned receives (free() it; NULL otherwise). */
const float *infer_host_params(const infer_model *im, float **owned);

#endif
