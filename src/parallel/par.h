/* par: the MPI decomposition of a training job: P pipeline stages x tp tensor ranks x D data-parallel
 * replicas.
 *
 * Each rank holds one tensor rank's shard (gpt.h, GPT_SPLIT_*) of one stage of one replica. The layers are split into P consecutive groups
 * balanced by cost (FLOPs per token of each block; the tied head counts for the last stage); the
 * first stage also holds the embedding, the last the final LayerNorm and the head, and both hold
 * the tied token embedding, whose gradients they sum every step.
 *
 * Communicators, all split from the job's communicator:
 *   tensor the tp ranks of one stage of one replica, ranked by tensor rank (the layers' sums)
 *   pipe   the P ranks of one replica and tensor rank, ranked by stage (activations go to stage +- 1)
 *   dp     the D ranks of one stage and tensor rank, ranked by replica (gradients are reduced here)
 *   embed  the first and the last stage of one replica and tensor rank (the tied embedding), when P > 1
 *   node   the ranks sharing this node's memory (MPI_COMM_TYPE_SHARED), for topology
 * Rank order: the tp tensor ranks of a stage are consecutive (tensor rank = rank % tp, so they share a
 * node whenever T divides the ranks per node); of the groups, 'replicas_adjacent' puts the D replicas of
 * a stage next to each other (stage = group / D), 'stages_adjacent' a pipeline's stages (stage = group % P). */
#ifndef GREENLM_PAR_H
#define GREENLM_PAR_H

#include <mpi.h>
#include <stddef.h>

#include "base/util.h"
#include "deck/cfg.h"
#include "model/gpt.h"

/* The most ranks a layout is planned for (greenlm --dry-run --ranks, the machines of the 'plan' task):
 * far beyond any machine, and every count and product of a layout's stays an int. */
enum { PAR_MAX_RANKS = 1 << 24 };

typedef struct {
  int size, rank;  /* in the job's communicator */
  int P, D, nmicro, zero; /* stages, replicas, micro-batches per step and replica, ZeRO stage */
  int tp, tp_rank; /* tensor ranks T per stage, this rank's place among them */
  int recompute;   /* &training recompute: blocks' inner activations recomputed in the backward pass */
  int stage, replica;
  int stages_adjacent; /* &parallel rank_order = 'stages_adjacent' (par_rank_of) */
  int *lo;         /* (P + 1) layer boundaries: stage s holds blocks [lo[s], lo[s+1]) */
  double *cost;    /* (P) relative cost of each stage */
  MPI_Comm comm, tensor, pipe, dp, embed, node;
} par_layout;

/* The layout of a job of nranks ranks for this (resolved) deck, without communicators: sizes and
 * the stage split. The rank is taken as `rank` (the dry run plans rank 0). */
void par_plan(par_layout *lay, const cfg_config *cfg, int nranks, int rank);
/* par_plan for this rank of comm, plus the communicators. Collective over comm. */
void par_create(par_layout *lay, const cfg_config *cfg, MPI_Comm comm);
void par_free(par_layout *lay);

/* Start of replica r's piece of a stage buffer of n elements, in D equal pieces (the ZeRO-1 pieces
 * and the checkpoints' pieces): piece r is [par_piece(n, D, r), par_piece(n, D, r + 1)); the model's
 * tensor shards are cut the same way (util_piece). */
static inline size_t par_piece(size_t n, int D, int r) { return util_piece(n, D, r); }

/* The job's rank of tensor rank t of (stage, replica) in a layout of P stages x tp x D (the rank order
 * above): the tp tensor ranks of a stage are consecutive; group is the (stage, replica)'s place. */
static inline long par_rank_of(int P, int tp, int D, int stages_adjacent, int stage, int replica, int t) {
  long group = stages_adjacent ? (long)replica * P + stage : (long)stage * D + replica;
  return group * tp + t;
}

/* What this rank's stage holds (with its activation slots: min(nmicro, P - stage) for 1F1B). */
gpt_part par_part(const par_layout *lay);
/* The same for stage s. */
gpt_part par_stage_part(const par_layout *lay, int s);

/* "stage 0: layers 0-5 + embedding (cost 31%) ..." lines, into buf. */
const char *par_describe(const par_layout *lay, char *buf, size_t len);

#endif
