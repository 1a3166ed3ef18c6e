/* plan: a training run predicted before launch, for every layout of the machine of &machine.
 *
 * A layout is pipeline stages P x tensor ranks T x replicas D, micro-batch B (m micro-batches per
 * step and replica for the deck's global batch), ZeRO-1 or not, recomputation or not, and the rank
 * order. For each: memory per rank from the same code as the dry run (trainer_plan_memory) plus the
 * rank's overhead; a step's time from the FLOPs of the busiest stage shared by its tp tensor ranks at
 * the machine's efficiency, the tensor ranks' all-reduces, the 1F1B bubble, the pipeline's and the
 * replicas' exchanges over alpha-beta links, the tied embedding's exchange and the optimizer's
 * memory traffic; then tokens/s, MFU, the time to the token budget, energy and CO2e with their
 * ranges. doc/planning.md has the formulas. */
#ifndef GREENLM_PLAN_H
#define GREENLM_PLAN_H

#include <mpi.h>
#include <stdio.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"
#include "plan/machine.h"

typedef struct {
  int P, tp, D, B, m, zero, recompute, stages_adjacent; /* tp: tensor ranks T per stage */
  double mem;          /* bytes of the fullest rank: planned buffers + overhead */
  double mem_planned;  /* the planned buffers alone (the dry run's figure) */
  int fits;
  /* seconds per step: computing passes of the busiest stage (m of them), the bubble, the tensor
   * ranks' all-reduces inside those passes, the pipeline's transfers outside the steady state,
   * exposed replica exchange, tied embedding, optimizer */
  double t_compute, t_bubble, t_tp, t_p2p, t_dp, t_embed, t_opt, t_step;
  double tokens_per_s, mfu;
  double seconds;             /* to the token budget */
  double kwh[3], co2_kg[3];   /* facility energy and CO2e: low, central, high */
} plan_layout;

typedef struct {
  machine_plan mach;
  double nparams, flops_per_token;
  int T;             /* tokens per sequence */
  long G;            /* sequences per step */
  plan_layout *v;
  int n, best;       /* best: index of the fastest layout that fits, or -1 */
  plan_layout deck;  /* the deck's own layout (&parallel, &training) on the machine's ranks */
  int has_deck;      /* 0 when it is not a layout of them (stages not dividing the ranks, ...) */
  int nodes_needed;  /* nothing fits: the node count at which something would (0: none up to nodes_tried) */
  int nodes_tried;   /* nothing fits: the most nodes tried (64x, or fewer where that passes PAR_MAX_RANKS ranks) */
  plan_layout alt;   /* its best layout */
} plan_result;

/* Plan every layout of the resolved machine for cfg (on a copy). A plan that takes long says how far
 * it is on progress (every few seconds; NULL: quiet), and so does the search for more nodes when
 * nothing fits. Returns the number of errors (a machine of more than PAR_MAX_RANKS ranks, a global
 * batch beyond the deck's range: at their keys). */
int plan_make(plan_result *r, const cfg_config *cfg, const backend *be, FILE *progress, err_list *errs);
void plan_free(plan_result *r);
/* Index of the fastest layout that fits with tp tensor ranks (0: any), or -1. */
int plan_fastest(const plan_result *r, int tp);
/* The tensor-rank counts among the layouts, ascending, into tps (at most max); returns how many. */
int plan_tp_values(const plan_result *r, int *tps, int max);

/* The layout's deck lines (&parallel and &training) into buf. */
const char *plan_deck_lines(const plan_result *r, const plan_layout *l, char *buf, size_t len);

/* The 'plan' task: plan, print the table and the recommendation, write run_dir/plan.json. Rank 0
 * of comm plans; the others wait. Returns 0, or 1 after adding errors. */
int plan_run(const cfg_config *cfg, MPI_Comm comm, err_list *errs);

#endif
