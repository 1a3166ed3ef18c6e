/* pipe: the pipeline schedule of one optimizer step (1F1B) and forward-only passes.
 *
 * Stage s of P runs min(P - s - 1, m) forward passes (warm-up), then alternates one forward and
 * one backward pass (steady state), then runs the remaining backward passes (cool-down), over the
 * m micro-batches of the step. Activations go to stage s+1 and their gradients back to stage s-1
 * with non-blocking point-to-point messages on the replica's pipe communicator, tagged with the
 * micro-batch and the direction so nothing can be matched wrongly. Micro-batch k uses activation
 * slot k mod nslots; 1F1B keeps at most P - s micro-batches in flight at stage s. */
#ifndef GREENLM_PIPE_H
#define GREENLM_PIPE_H

#include <stdint.h>

#include "parallel/comm.h"
#include "model/gpt.h"
#include "parallel/par.h"

enum { PIPE_BATCH_BUFS = 8 }; /* micro-batches whose tokens may be on their way to the device at once */

typedef struct {
  double compute_s; /* forward and backward passes (one stage: the whole schedule, with the batches' reading) */
  double wait_s;    /* waiting for neighbours' activations or gradients (the bubble) */
  double bytes;     /* payload bytes sent to neighbours */
} pipe_stats;

/* Fills micro-batch k's tokens and targets (B,T) on the stages that need them. */
typedef void (*pipe_batch_fn)(void *ctx, int k, int32_t *tokens, int32_t *targets);

typedef struct {
  const par_layout *lay;
  gpt_model *model;
  int B, T;
  int32_t *tokens, *targets; /* pinned host (PIPE_BATCH_BUFS,B,T): a micro-batch's buffer stays unchanged while its
                                copy to the device is queued */
  int nfilled;               /* buffers filled since the last wait for the device */
  float *bsend;              /* backend (B,T,C): gradient sent to the previous stage */
  MPI_Request *fsend;        /* (nslots) activation sends in flight */
  MPI_Request bsend_req;
  comm_stage fst, rst, bst;  /* MPI's view of the sent activations (per slot), of what is received, of bsend */
  MPI_Datatype row;          /* one row of C elements in the storage type: messages count rows (B*T), so no
                                byte count of B*T*C elements need fit an int */
  pipe_stats st;
} pipe_state;

void pipe_init(pipe_state *p, const par_layout *lay, gpt_model *m, int B, int T);
/* Backend bytes pipe_init allocates for a stage (the buffer of gradients sent back). */
size_t pipe_bytes(const gpt_shape *s, gpt_part part, int B, int T, size_t esize);
void pipe_free(pipe_state *p);

/* Forward and backward passes of the step's nmicro micro-batches (1F1B). The loss gradient is scaled by
 * dscale; `hook` is passed to the backward pass of the last micro-batch (gradient exchange). The last stage adds
 * the sum of token losses of this replica to model->sums[0] (backend memory). A single stage queues the whole
 * schedule and waits once at its end; pipeline stages wait after each pass, for the bubble's figure. */
void pipe_train_step(pipe_state *p, int nmicro, float dscale, pipe_batch_fn batch, void *bctx, gpt_hook hook,
                     void *hctx);

/* Forward passes only, of n micro-batches of (B,T) (evaluation; model->sums is cleared first). Returns the sum of
 * token losses on the last stage, 0 elsewhere. */
double pipe_eval(pipe_state *p, int n, pipe_batch_fn batch, void *bctx);

/* One forward pass of a single sequence of t tokens (sampling): on the last stage the logits of
 * its last position are copied into logits (host, V). tokens: host (t) on the first stage. */
void pipe_forward_one(pipe_state *p, const int32_t *tokens, int t, float *logits);

/* Statistics since the last call. */
pipe_stats pipe_take_stats(pipe_state *p);

#endif
