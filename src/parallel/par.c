/* par: layout, balanced stage split and communicators. */
#include "parallel/par.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* Cost of a block and of the head, in FLOPs per token (6 x parameters + attention). */
static double block_cost(const gpt_shape *s, int T, int l) {
  double C = s->C, F = s->F, att = s->window[l] > 0 && s->window[l] < T ? s->window[l] : T;
  return 6.0 * (4.0 * C * C + 2.0 * C * F) + 12.0 * C * att;
}

static double head_cost(const gpt_shape *s) { return 6.0 * (double)s->V * s->C; }

/* Split L blocks into P consecutive non-empty groups minimising the most expensive group (the
 * head's cost added to the last): dynamic programming over prefixes, O(P L^2) for L blocks. */
static void balance(const gpt_shape *s, int T, int P, int *lo, double *cost) {
  const int nl = s->L;
  double *pre = util_calloc((size_t)nl + 1, sizeof(double), "split");
  for (int l = 0; l < nl; l++) pre[l + 1] = pre[l] + block_cost(s, T, l);
  double *best = util_malloc((size_t)(P + 1) * (nl + 1) * sizeof(double), "split");
  int *cut = util_calloc((size_t)(P + 1) * (nl + 1), sizeof(int), "split");
#define BEST(k, i) best[(size_t)(k) * (nl + 1) + (i)]
#define CUT(k, i) cut[(size_t)(k) * (nl + 1) + (i)]
  for (int k = 0; k <= P; k++)
    for (int i = 0; i <= nl; i++) BEST(k, i) = DBL_MAX;
  BEST(0, 0) = 0.0;
  for (int k = 1; k <= P; k++)
    for (int i = k; i <= nl - (P - k); i++) /* blocks [0, i) in k groups, leaving one per later group */
      for (int j = k - 1; j < i; j++) {
        if (BEST(k - 1, j) == DBL_MAX) continue;
        double c = pre[i] - pre[j] + (k == P ? head_cost(s) : 0.0);
        double v = BEST(k - 1, j) > c ? BEST(k - 1, j) : c;
        if (v < BEST(k, i)) BEST(k, i) = v, CUT(k, i) = j;
      }
  lo[P] = nl;
  for (int k = P, i = nl; k > 0; k--) {
    lo[k - 1] = CUT(k, i);
    i = lo[k - 1];
  }
  for (int k = 0; k < P; k++) cost[k] = pre[lo[k + 1]] - pre[lo[k]] + (k == P - 1 ? head_cost(s) : 0.0);
#undef BEST
#undef CUT
  free(pre), free(best), free(cut);
}

void par_plan(par_layout *lay, const cfg_config *cfg, int nranks, int rank) {
  memset(lay, 0, sizeof *lay);
  lay->comm = lay->tensor = lay->pipe = lay->dp = lay->embed = lay->node = MPI_COMM_NULL;
  lay->size = nranks;
  lay->rank = rank;
  lay->P = (int)cfg->parallel.pipeline_stages;
  lay->D = (int)cfg->parallel.data_parallel;
  lay->nmicro = (int)cfg->parallel.micro_batches;
  lay->zero = (int)cfg->parallel.zero_stage;
  lay->recompute = cfg->training.recompute;
  lay->tp = (int)cfg->parallel.tensor_parallel;
  UTIL_CHECK(lay->P * lay->tp * lay->D == nranks, NULL, "internal: layout %d x %d x %d for %d ranks", lay->P, lay->tp,
             lay->D, nranks);
  int group = rank / lay->tp; /* the tensor group's place among the P x D */
  lay->tp_rank = rank % lay->tp;
  lay->stages_adjacent = cfg_parallel_rank_order_of(&cfg->parallel) == CFG_ORDER_STAGES_ADJACENT;
  if (lay->stages_adjacent) {
    lay->stage = group % lay->P;
    lay->replica = group / lay->P;
  } else {
    lay->stage = group / lay->D;
    lay->replica = group % lay->D;
  }
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  lay->lo = util_malloc((size_t)(lay->P + 1) * sizeof(int), "layout");
  lay->cost = util_malloc((size_t)lay->P * sizeof(double), "layout");
  balance(&s, (int)cfg->training.seq_len, lay->P, lay->lo, lay->cost);
  gpt_shape_free(&s);
}

void par_create(par_layout *lay, const cfg_config *cfg, MPI_Comm comm) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  par_plan(lay, cfg, size, rank);
  lay->comm = comm;
  const int T = lay->tp, t = lay->tp_rank;
  MPI_Comm_split(comm, lay->stage * lay->D + lay->replica, t, &lay->tensor);
  MPI_Comm_split(comm, lay->replica * T + t, lay->stage, &lay->pipe);
  MPI_Comm_split(comm, lay->stage * T + t, lay->replica, &lay->dp);
  int ends = lay->P > 1 && (lay->stage == 0 || lay->stage == lay->P - 1);
  MPI_Comm_split(comm, ends ? lay->replica * T + t : MPI_UNDEFINED, lay->stage, &lay->embed);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &lay->node);
}

void par_free(par_layout *lay) {
  MPI_Comm *c[] = {&lay->tensor, &lay->pipe, &lay->dp, &lay->embed, &lay->node};
  for (int i = 0; i < 5; i++)
    if (*c[i] != MPI_COMM_NULL) MPI_Comm_free(c[i]);
  free(lay->lo);
  free(lay->cost);
  memset(lay, 0, sizeof *lay);
}

gpt_part par_stage_part(const par_layout *lay, int s) {
  int inflight = lay->P - s; /* 1F1B: stage s holds at most P - s micro-batches at once */
  return (gpt_part){lay->lo[s],  lay->lo[s + 1], s == 0, s == lay->P - 1, lay->nmicro < inflight ? lay->nmicro : inflight,
                    lay->recompute, 0, lay->tp, lay->tp_rank};
}

gpt_part par_part(const par_layout *lay) { return par_stage_part(lay, lay->stage); }

const char *par_describe(const par_layout *lay, char *buf, size_t len) {
  double total = 0;
  for (int s = 0; s < lay->P; s++) total += lay->cost[s];
  size_t o = 0;
  buf[0] = '\0';
  for (int s = 0; s < lay->P && o < len; s++) {
    char layers[48];
    if (lay->lo[s + 1] - lay->lo[s] == 1)
      snprintf(layers, sizeof layers, "layer %d", lay->lo[s]);
    else
      snprintf(layers, sizeof layers, "layers %d-%d", lay->lo[s], lay->lo[s + 1] - 1);
    int n = util_snprintf(buf + o, len - o, "%sstage %d: %s%s%s (%.0f%% of the FLOPs)", s ? "\n" : "", s, layers,
                          s == 0 ? " + embedding" : "", s == lay->P - 1 ? " + final LayerNorm and head" : "",
                          100.0 * lay->cost[s] / total);
    if (n < 0) break;
    o += (size_t)n;
  }
  return buf;
}
