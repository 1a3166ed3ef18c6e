/* qexch: the compressed exchange of one gradient bucket across the data-parallel replicas (&comm),
 * on behalf of grad.c.
 *
 * A bucket (whole tensors, [b0, b1) of the stage's gradient buffer) becomes one message of a size
 * every replica knows in advance: each tensor of at least &comm min_numel values is cut into
 * quantization buckets of &comm quant_bucket values (never across tensors) encoded with quant.h; smaller
 * tensors (LayerNorm parameters, biases) are copied as fp32. The messages are all-gathered
 * (MPI_Iallgather, bytes), and every replica decodes the D messages and sums them in rank order,
 * so that the summed gradient is the same bit for bit on every replica. With &comm exchange = 'sra'
 * (reduce-scatter/all-gather) each replica owns about a D-th of every bucket (whole quantization
 * buckets): the messages' parts go to their owners (MPI_Ialltoallv), each owner sums the D parts of
 * its range in rank order, quantizes the sum again with its own random bits and all-gathers it, and
 * every replica decodes the sums: a replica receives about 2 messages' worth instead of D. With &comm exchange =
 * 'intsum' (uniform levels) the replicas first agree on each quantization bucket's scale (the
 * largest of theirs, a small MPI_Allreduce MAX), round to integers in [-s, s] and sum them with
 * MPI_Iallreduce in int8 (when D s <= 127) or int16 containers: no decoding of D messages, fewer
 * bytes received, a container of 8 or 16 bits per value instead of b. Encoding and decoding run
 * through the backend's ops (quant_encode, quant_decode) where the gradients are: on a device only
 * the messages cross the bus (the integer sum, the error measurement and the adaptive levels'
 * statistics still copy the values to the host, the last two on their steps only).
 *
 * The rounding of replica r at step s draws its random bits from a key made of (&job seed, r, s)
 * and the quantization bucket's place in the whole model (tensor, offset): reproducible runs,
 * independent errors across replicas (their average has 1/D of one replica's variance), and the
 * same rounding of the tied embedding on the first and the last pipeline stage.
 *
 * Error feedback (&comm error_feedback): each replica adds the residual of its previous messages to
 * the quantized tensors' values before encoding and keeps what the encoding dropped (quant.h); the
 * byte messages are scaled to a contraction (quant_encode_contract), the integer sum's are not; with
 * 'sra' it covers the first rounding (the owners' second rounding of the sums is not fed back). */
#ifndef GREENLM_QEXCH_H
#define GREENLM_QEXCH_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "model/gpt.h"
#include "base/quant.h"

typedef struct qexch qexch;

/* A gradient bucket: the values [b0, b1) of the stage's buffer, its tensors t0..t1-1, of which the
 * exchange carries [lo, hi) (the whole bucket, or a node's piece of it: grad.h's hierarchy). A tensor
 * of at least &comm min_numel values is cut into quantization buckets from its first value in the
 * range; the message of a range is the same on every replica. */
typedef struct {
  size_t b0, b1, lo, hi;
  int t0, t1;
} qexch_bucket;

/* The compressed exchange of the buckets b[0..nb) of model m across the replicas dp (all: every
 * rank of the job, which fit the adaptive levels together), or NULL when &comm method is 'none' or
 * bits = 32 (the fp32 exchange runs). */
qexch *qexch_create(const cfg_comm *c, long adapt_period, uint64_t seed, const gpt_model *m, int nb, const qexch_bucket *b,
                    MPI_Comm dp, MPI_Comm all);
void qexch_free(qexch *x);

/* What &comm cannot exchange among D replicas in buckets of at most `values` values (the integer
 * sum's overflow, a message of 2^31 bytes or more): 0, or the number of errors added at the deck
 * keys. grad_check calls it. */
int qexch_check(const cfg_config *cfg, int D, double values, err_list *errs);

/* Bytes of the message of tensors t (n of them) under &comm c with D replicas: what one replica
 * hands to the collectives for them per step (their fp32 bytes when c compresses nothing; PowerSGD's
 * two all-reduces with method = 'powersgd'). For the dry run. */
size_t qexch_plan_bytes(const cfg_comm *c, const gpt_tensor *t, int n, int D);
/* Backend memory the exchange of the values [lo, hi) of tensors t (n of them, one bucket, or a
 * stage's whole buffer) allocates on backend be with D replicas: with the gradients on a device, the
 * segment tables, a message and D + 1 messages; 0 where they are host memory or for the integer sum
 * (host buffers). With error feedback the residual (qexch_plan_residual_bytes) comes on top. */
size_t qexch_plan_device_bytes(const cfg_comm *c, const gpt_tensor *t, int n, size_t lo, size_t hi, int D, const backend *be);
/* Whether the error-feedback residual of &comm c with D replicas lives in backend memory on be. */
int qexch_residual_on_device(const cfg_comm *c, int D, const backend *be);

/* Bytes of bucket i's message (what one replica sends), and of its fp32 equivalent. */
size_t qexch_message_bytes(const qexch *x, int i);
size_t qexch_fp32_bytes(const qexch *x, int i);
/* Host memory the exchange holds (messages, their receive buffers, the host copy of a bucket). */
size_t qexch_host_bytes(const qexch *x);

/* Encode bucket i of m's gradients for step `step` and start its all-gather into *req. */
void qexch_launch(qexch *x, int i, long step, MPI_Request *req);

/* This replica's quantization error over the steps measured since the last call (every &comm
 * error_every steps): sums of ||Q(g) - g||^2 as sent, of its exact expectation, and of ||g||^2. */
typedef struct {
  double measured, expected, norm2;
} qexch_error;
qexch_error qexch_take_error(qexch *x);
/* After *req completed: the sum of the D decoded messages into m's gradients [b0, b1). Returns the
 * seconds spent decoding. */
double qexch_finish(qexch *x, int i);
/* After step `step`'s buckets: with adaptive levels (&comm method alq, amq) on a fitting step (after
 * steps 0, 100, 2000 and every adapt_period), the replicas' statistics of this step are summed and
 * the levels refitted, the same on every replica, for the next steps. Collective over the replicas. */
void qexch_end_step(qexch *x, long step);
/* The adaptive levels in use (for checkpoints): their count, 0 without adaptive levels. */
int qexch_levels(const qexch *x, float *level);
/* Levels from a checkpoint. Returns -1 (ignored) when x has no adaptive levels of that count. */
int qexch_set_levels(qexch *x, const float *level, int n);

/* Error feedback (&comm error_feedback): this replica's residual, host memory indexed as the stage's
 * gradient buffer (nparams floats; zero outside the quantized tensors), or NULL without it. With the
 * gradients on a device the residual lives there, and this is its host copy: qexch_residual_sync
 * copies it there (to_host, before a checkpoint is written) or back (after one is read). */
float *qexch_residual(qexch *x);
void qexch_residual_sync(qexch *x, int to_host);
/* Host bytes of the residual for a stage of nparams under &comm c with D replicas (0 without it). */
size_t qexch_plan_residual_bytes(const cfg_comm *c, size_t nparams, int D);

/* Seconds spent encoding since the last call. */
double qexch_take_encode_s(qexch *x);

#endif
