/* psgd: PowerSGD (&comm method = 'powersgd'), the low-rank gradient exchange of Vogels et al. 2019
 * (the form of PyTorch's DDP hook), among the D replicas of a stage after the backward pass.
 *
 * A matrix gradient G (n,m) whose rank-r factors take at most half its values (psgd_factored) is
 * sent as factors; every other tensor (vectors, small matrices) is summed in fp32. With Q (m,r) the
 * warm start (the last step's summed Q; at step 0 normal values from the seed, the same on every
 * replica), each replica r_i, with its error-feedback residual e_i:
 *   D_i = G_i + e_i,  P_i = D_i Q           all-reduce: P = sum P_i, with the fp32 tensors
 *   P^ = P with orthonormal columns         (the same bits on every replica)
 *   Q_i = D_i^T P^,  e_i = D_i - P^ Q_i^T   all-reduce: Q = sum Q_i
 *   G = P^ Q^T  (= sum_i P^ Q_i^T: the sum of the replicas' approximations), Q kept for the next step.
 * Two all-reduces per step carry (n + m) r values per matrix instead of n m. The factors are the
 * backend's lowrank ops (lowrank_core.h: bit for bit the same on the CPU and a GPU), on the
 * gradients where they are; messages go through host staging where MPI cannot read that memory.
 *
 * In two levels (&comm hierarchy = 'node', R replicas on each of N nodes) the tensors are dealt out
 * to the R replicas of a node in contiguous runs of about equal values (psgd_owned); each tensor is
 * summed in fp32 onto its owner inside the node (MPI_Reduce), the owners of the same run on the N
 * nodes (the cross group) exchange it as above, and the owner broadcasts the result inside its
 * node (MPI_Bcast). Only the factors leave a node, once per node. */
#ifndef GREENLM_PSGD_H
#define GREENLM_PSGD_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "model/gpt.h"

/* Whether tensor t travels as rank-r factors: a matrix whose (rows + cols) r values are at most half its own. */
int psgd_factored(const gpt_tensor *t, long r);
/* Floats of the warm-start Q of tensors t[n] at rank r: cols x r of each factored one. */
size_t psgd_q_floats(const gpt_tensor *t, int n, long r);
/* The tensors [*t0, *t1) of t[n] that replica `local` of the R on a node leads (all of them for R = 1). */
void psgd_owned(const gpt_tensor *t, int n, int R, int local, int *t0, int *t1);
/* Bytes one replica hands to the two all-reduces of a step, for tensors t[n]. */
size_t psgd_plan_bytes(const cfg_comm *c, const gpt_tensor *t, int n);
/* Backend bytes the exchange allocates where the gradients are not host memory (else 0): the
 * messages and Q of the tensors t[n] this replica leads, and the residual (nparams values). */
size_t psgd_plan_device_bytes(const cfg_comm *c, const gpt_tensor *t, int n, size_t nparams, const backend *be);

typedef struct psgd psgd;

/* The exchange of m's gradients among the replicas: inside the node over intra (R ranks; one: the flat
 * exchange), between the nodes over cross (the stage's replicas at this one's place on their nodes);
 * seed keys the first Q. */
psgd *psgd_create(gpt_model *m, const cfg_comm *c, uint64_t seed, MPI_Comm intra, MPI_Comm cross);
void psgd_free(psgd *x);

typedef struct {
  double bytes;              /* handed to the collectives */
  double cross;              /* of bytes: those of the all-reduces between the nodes (cross) */
  double encode_s, decode_s; /* the factors (P, Q, the residual), and the approximation */
  double err2, norm2;        /* on measured steps (&comm error_every): ||e||^2 of the factored tensors, ||D||^2 */
} psgd_stats;

/* The step's exchange: afterwards m's gradients on every replica are the sum above. */
void psgd_exchange(psgd *x, long step, psgd_stats *st);
/* Checkpoint state in host memory: the residual (indexed as the stage's parameter buffer) and the Q of
 * the tensors [*t0, *t1) this replica leads (psgd_q_floats of them, in order; *writes: it is the one
 * whose Q a checkpoint keeps, on the first node); brought up to date (to_host) or copied back. */
float *psgd_residual(psgd *x);
/* Which values this replica's residual covers: returns R, the replicas a node (1: all of them), and
 * *map, a hash of the runs of tensors the replicas of a node lead. */
int psgd_holders(const psgd *x, uint64_t *map);
float *psgd_q(psgd *x, int *t0, int *t1, int *writes);
void psgd_sync(psgd *x, int to_host);

#endif
