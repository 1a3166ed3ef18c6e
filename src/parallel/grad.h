/* grad: the exchange of gradients across the data-parallel replicas of a stage.
 *
 * The parameter buffer of a stage is cut into buckets of whole tensors (about &parallel
 * bucket_mb each; the tied token embedding is a bucket of its own). During the backward pass of
 * a step's last micro-batch, gpt_backward calls grad_hook as each block's gradients become final;
 * a bucket whose tensors are all final is reduced at once with a non-blocking collective, while
 * the backward pass goes on. Buckets start in one fixed order (from the end of the buffer) on every
 * replica.
 *
 * Without ZeRO each bucket is summed with MPI_Iallreduce and every replica updates all parameters.
 * With ZeRO-1 (&parallel zero_stage = 1) the stage's buffer is cut into D contiguous pieces,
 * replica r owns piece r: buckets are reduce-scattered (MPI_Ireduce_scatter), each replica keeps
 * AdamW state for its piece only and updates it, and grad_gather_params all-gathers the updated
 * parameters (MPI_Iallgatherv).
 *
 * The tied embedding's gradients are summed between the first and the last stage (P > 1) before
 * its bucket goes out. This module is the one place where gradient bytes move. With &comm
 * compression (from step &comm warmup_steps on, D > 1) each bucket travels compressed instead
 * (qexch.h: all-gathered messages, decoded and summed in rank order on every replica). With &comm
 * hierarchy = 'node' each bucket is summed in fp32 inside the node first and only each node's piece
 * travels between the nodes, compressed (hier.h); every replica then holds the whole summed bucket. */
#ifndef GREENLM_GRAD_H
#define GREENLM_GRAD_H

#include <stddef.h>

#include "deck/cfg.h"
#include "model/gpt.h"
#include "parallel/par.h"

typedef struct {
  double wait_s;     /* time spent waiting for exchanges (not hidden behind computation) */
  double bytes;      /* payload bytes this rank handed to collectives */
  double fp32_bytes; /* what the flat fp32 exchange would have handed them */
  double inter_bytes; /* of bytes: what went to collectives among ranks of more than one node (&comm ranks_per_node) */
  double encode_s, decode_s; /* compressed exchange: time spent encoding and decoding */
  double q_measured, q_expected, q_norm2; /* compressed exchange: the quantization error (qexch_error) */
} grad_stats;

typedef struct grad_exchange grad_exchange;

/* What the gradient exchange among D replicas cannot do on the deck's model: a bucket beyond MPI's
 * 32-bit counts, and what the compressed exchange cannot (qexch_check). 0, or the number of errors
 * added at the deck keys; checked once the layout is known, before anything is read. */
int grad_check(const cfg_config *cfg, int D, err_list *errs);

/* comm (may be NULL: fp32), adapt_period (steps between fits of adaptive levels) and seed choose
 * and key the compressed exchange (qexch.h). */
grad_exchange *grad_create(gpt_model *m, const par_layout *lay, double bucket_mb, const cfg_comm *comm, long adapt_period,
                           uint64_t seed);
/* Backend bytes the exchange allocates for replica `replica` of a stage of tensors ts[nt] (nparams
 * parameters): the ZeRO-1 landing area of the fp32 exchange, and with the gradients on a device the
 * compressed exchange's buffers and residual (of the pieces, with &comm hierarchy). */
size_t grad_plan_device_bytes(const cfg_config *cfg, const gpt_tensor *ts, int nt, size_t nparams, const par_layout *lay,
                              int replica, const backend *be);
/* Host bytes this build's MPI library takes for itself while the fp32 exchange of the stage's
 * tensors ts[nt] (gpt_list_tensors) is in flight: the temporaries of its largest bucket. */
size_t grad_mpi_bytes(const gpt_tensor *ts, int nt, double bucket_mb, const par_layout *lay);
/* Parameters whose optimizer state a replica keeps: all of them, or its ZeRO-1 piece. */
size_t grad_own_params(size_t nparams, const par_layout *lay, int replica);
void grad_free(grad_exchange *g);

/* The part of the parameter buffer this rank's optimizer updates: [*lo, *hi). */
void grad_own_range(const grad_exchange *g, size_t *lo, size_t *hi);

/* A new step (0-based): no gradient is final yet. */
void grad_begin(grad_exchange *g, long step);
/* gpt_hook for the backward pass of the step's last micro-batch. */
void grad_hook(void *g, int what);
/* Reduce what is left and wait: afterwards this rank's own range holds the summed gradients. */
void grad_finish(grad_exchange *g);
/* *acc (one double in backend memory) += the sum of squares of this rank's piece of the summed gradients; summed
 * over all ranks of the job, it counts every parameter of the model once (the tied embedding once). */
void grad_sumsq(const grad_exchange *g, double *acc);
/* After the optimizer step: with ZeRO-1, all-gather the updated parameters. */
void grad_gather_params(grad_exchange *g);
/* The compressed exchange's adaptive levels (checkpoints): their count (0: none), and restoring them. */
int grad_levels(const grad_exchange *g, float *level);
void grad_set_levels(grad_exchange *g, const float *level, int n);
/* The compressed exchange's error-feedback residual (checkpoints): host memory indexed as the
 * stage's parameter buffer, or NULL. */
float *grad_residual(grad_exchange *g);
/* The longest words of grad_residual_holders, with their terminating zero. */
#define GRAD_HOLDERS_MAX 112
/* Which replicas' residuals cover which values, in words ("4 replicas, 2 a node, each over the pieces
 * it leads (map ...)"): a residual is restored only where this is the checkpoint's. */
const char *grad_residual_holders(const grad_exchange *g);
/* The words of grad_residual_holders for D replicas in one level (a checkpoint without them). */
void grad_holders_one_level(long long D, char *buf, size_t len);
/* PowerSGD's warm-start Q (checkpoints): host memory, that of the stage's tensors [*t0, *t1) (psgd_q),
 * or NULL; *writes: this rank's Q is the one a checkpoint keeps. */
float *grad_lowrank_q(grad_exchange *g, int *t0, int *t1, int *writes);
/* Where the residual (and PowerSGD's Q) lives on a device: its host copy brought up to date (to_host, before a checkpoint
 * is written), or copied back (after one is read). Nothing otherwise. */
void grad_residual_sync(grad_exchange *g, int to_host);
/* Statistics since the last call. */
grad_stats grad_take_stats(grad_exchange *g);

#endif
