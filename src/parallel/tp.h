/* tp: the collectives of a tensor-parallel group (the tp ranks holding the shards of one stage of one
 * replica, par.h's `tensor` communicator), given to the model as its gpt_tp_comm.
 *
 * Per block and micro-batch the model sums (N,C) activations twice in the forward pass and twice in
 * the backward pass (Megatron's scheme: after each row-parallel projection, and before each
 * column-parallel layer's input gradient leaves it), in fp32, with MPI_Allreduce over backend memory
 * (staged through pinned host memory where MPI cannot read the device). The loss's parts and the
 * logits rows of sampling are all-gathered. */
#ifndef GREENLM_TP_H
#define GREENLM_TP_H

#include <mpi.h>
#include <stddef.h>

#include "model/gpt.h"
#include "parallel/comm.h"

typedef struct {
  MPI_Comm comm;
  comm_stage st;
  double bytes, wait_s; /* floats handed to the collectives (as bytes), time in them */
} tp_group;

/* The group of comm (the model's tensor ranks) for micro-batches of B x T tokens; gives the model its
 * collectives. Nothing is allocated without tensor parallelism. */
void tp_open(tp_group *g, gpt_model *m, MPI_Comm comm, int B, int T);
void tp_close(tp_group *g);
/* Floats a rank of a T-way group hands to the sums per micro-batch of N tokens, forward and backward, for
 * blocks [lo, hi), the embedding and the head it holds: (4 per block, 5 with recomputation, + 1 for the
 * embedding + 1 for the head) x N x C when tp > 1. */
double tp_floats_per_micro(const gpt_shape *s, gpt_part part, int N);

#endif
