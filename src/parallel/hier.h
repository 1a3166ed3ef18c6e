/* hier: the two-level exchange of gradient buckets over a cluster's nodes (&comm hierarchy = 'node'),
 * on behalf of grad.c.
 *
 * The D replicas of a stage sit on N nodes, R on each (ZeRO++'s hierarchical partitioning, the
 * two-level all-reduce of NCCL and of MPI libraries). Each bucket [b0, b1) is cut into R pieces of
 * about equal values (par_piece); replica l of a node owns piece l:
 *
 *   1. inside the node, the R replicas sum each piece in fp32 onto its owner (R MPI_Ireduce, in
 *      place at the owner: together a reduce-scatter over the node's fast links);
 *   2. between the nodes, the owners of piece l (one per node, the 'cross' group) exchange it:
 *      compressed as &comm method and exchange say (qexch.h, D = N; its error feedback and
 *      adaptive levels apply to the pieces), or summed in fp32 (MPI_Iallreduce) where nothing is
 *      compressed (method 'none', the warm-up steps);
 *   3. inside the node, the owners all-gather the summed pieces (MPI_Iallgatherv, in place).
 *
 * Each piece's sum is formed once, by one owner, and every replica gets its bits: the replicas stay
 * bit-identical. Only step 2 leaves the node; it carries a R-th of the bucket per replica. The
 * phases of a bucket advance as their collectives complete (hier_test, called while the backward
 * pass goes on) and hier_finish drives the rest.
 *
 * The node shape: &comm ranks_per_node > 0 puts ranks r with the same r / ranks_per_node on one
 * node (known at deck time, checked there); 0 takes the ranks MPI_COMM_TYPE_SHARED groups (checked
 * when the run starts). Every node must hold the same number of a stage's replicas. */
#ifndef GREENLM_HIER_H
#define GREENLM_HIER_H

#include <mpi.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "model/gpt.h"
#include "parallel/par.h"
#include "parallel/qexch.h"

/* A stage's replicas on the nodes: N nodes of R replicas each; this replica's node and place (local)
 * on it. */
typedef struct {
  int nodes, per_node, node, local;
} hier_shape;

/* Whether &comm hierarchy = 'node' applies to D replicas. */
int hier_on(const cfg_comm *c, int D);

/* Deck time, &comm ranks_per_node > 0 (the layout resolved in cfg): every stage's replicas must
 * fill whole nodes alike. 0, or the number of errors added at the deck keys. */
int hier_check(const cfg_config *cfg, err_list *errs);
/* Run time, ranks_per_node = 0: the same check on the nodes MPI reports. Collective over lay->comm;
 * every rank adds the same errors. 0, or the number added. */
int hier_check_nodes(const cfg_config *cfg, const par_layout *lay, err_list *errs);

/* The shape of replica r's stage (stage, tensor rank of lay) from the deck's ranks_per_node; with
 * ranks_per_node = 0 (the nodes unknown before the run) the replicas are taken as one node. */
hier_shape hier_plan_shape(const cfg_comm *c, const par_layout *lay, int replica);
/* Whether the replicas of this rank's stage span nodes (the inter-node byte counts of the flat
 * exchange). Collective over lay->dp. */
int hier_spans(const cfg_comm *c, const par_layout *lay);

/* The stage's replicas (lay->dp) split into the ranks of this rank's node (intra, ranked by replica)
 * and the replicas of the other nodes at the same place on theirs (cross, ranked by node). Collective
 * over lay->dp (and lay->node with ranks_per_node = 0). */
void hier_split(const cfg_comm *c, const par_layout *lay, MPI_Comm *intra, MPI_Comm *cross);

/* Piece l of R of a bucket [b0, b1): [*lo, *hi). */
void hier_piece(size_t b0, size_t b1, int R, int l, size_t *lo, size_t *hi);

typedef struct hier hier;

/* The two-level exchange of the buckets b[0..nb) (their lo, hi ignored) of m's gradients. Collective
 * over lay->dp. */
hier *hier_create(gpt_model *m, const par_layout *lay, const cfg_comm *c, long adapt_period, uint64_t seed, int nb,
                  const qexch_bucket *b);
void hier_free(hier *h);
/* The compressed exchange between the nodes (owned by h), or NULL (nothing compressed, or one node). */
qexch *hier_qexch(hier *h);
/* Which values this replica's residual covers: returns R, the replicas a node (1: all of them), and
 * *map, a hash of the buckets' bounds, which with R fixes the pieces each replica leads. */
int hier_holders(const hier *h, uint64_t *map);
/* Start bucket i's exchange of step `step`; compress: between the nodes through hier_qexch. */
void hier_launch(hier *h, int i, long step, int compress);
/* Advance bucket i's phases whose collectives have completed, without waiting. */
void hier_test(hier *h, int i);
/* Finish bucket i: its summed gradients on every replica. Returns the seconds spent decoding. */
double hier_finish(hier *h, int i);

/* Bytes this replica handed to the collectives inside its node and between nodes since the last call. */
void hier_take_bytes(hier *h, double *intra, double *inter);

#endif
