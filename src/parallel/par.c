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
 * head's cost added to the last): dynamic programming over prefixes, O(P L^2). */
static void balance(const gpt_shape *s, int T, int P, int *lo, double *cost) {
  const int L = s->L;
  double *pre = util_calloc((size_t)L + 1, sizeof(double), "split");
  for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + block_cost(s, T, l);
  double *best = util_malloc((size_t)(P + 1) * (L + 1) * sizeof(double), "split");
  int *cut = util_calloc((size_t)(P + 1) * (L + 1), sizeof(int), "split");
#define BEST(k, i) best[(size_t)(k) * (L + 1) + (i)]
#define CUT(k, i) cut[(size_t)(k) * (L + 1) + (i)]
  for (int k = 0; k <= P; k++)
    for (int i = 0; i <= L; i++) BEST(k, i) = DBL_MAX;
  BEST(0, 0) = 0.0;
  for (int k = 1; k <= P; k++)
    for (int i = k; i <= L - (P - k); i++) /* blocks [0, i) in k groups, leaving one per later group */
      for (int j = k - 1; j < i; j++) {
        if (BEST(k - 1, j) == DBL_MAX) continue;
        double c = pre[i] - pre[j] + (k == P ? head_cost(s) : 0.0);
        double v = BEST(k - 1, j) > c ? BEST(k - 1, j) : c;
        if (v < BEST(k, i)) BEST(k, i) = v, CUT(k, i) = j;
      }
  lo[P] = L;
  for (int k = P, i = L; k > 0; k--) {
    lo[k - 1] = CUT(k, i);
    i = lo[k - 1];
  }
  for (int k = 0; k < P; k++) cost[k] = pre[lo[k + 1]] - pre[lo[k]] + (k == P - 1 ? head_cost(s) : 0.0);
#undef BEST
#undef CUT
  free(pre), free(best), free(cut);
}

void par_plan(par_layout *L, const cfg_config *cfg, int nranks, int rank) {
  memset(L, 0, sizeof *L);
  L->comm = L->pipe = L->dp = L->embed = L->node = MPI_COMM_NULL;
  L->size = nranks;
  L->rank = rank;
  L->P = (int)cfg->parallel.pipeline_stages;
  L->D = (int)cfg->parallel.data_parallel;
  L->m = (int)cfg->parallel.micro_batches;
  L->zero = (int)cfg->parallel.zero_stage;
  L->recompute = cfg->training.recompute;
  UTIL_CHECK(L->P * L->D == nranks, NULL, "internal: layout %d x %d for %d ranks", L->P, L->D, nranks);
  if (strcmp(cfg->parallel.rank_order, "stages_adjacent") == 0) {
    L->stage = rank % L->P;
    L->replica = rank / L->P;
  } else {
    L->stage = rank / L->D;
    L->replica = rank % L->D;
  }
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  L->lo = util_malloc((size_t)(L->P + 1) * sizeof(int), "layout");
  L->cost = util_malloc((size_t)L->P * sizeof(double), "layout");
  balance(&s, (int)cfg->training.seq_len, L->P, L->lo, L->cost);
  gpt_shape_free(&s);
}

void par_create(par_layout *L, const cfg_config *cfg, MPI_Comm comm) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  par_plan(L, cfg, size, rank);
  L->comm = comm;
  MPI_Comm_split(comm, L->replica, L->stage, &L->pipe);
  MPI_Comm_split(comm, L->stage, L->replica, &L->dp);
  int ends = L->P > 1 && (L->stage == 0 || L->stage == L->P - 1);
  MPI_Comm_split(comm, ends ? L->replica : MPI_UNDEFINED, L->stage, &L->embed);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &L->node);
}

void par_free(par_layout *L) {
  MPI_Comm *c[] = {&L->pipe, &L->dp, &L->embed, &L->node};
  for (int i = 0; i < 4; i++)
    if (*c[i] != MPI_COMM_NULL) MPI_Comm_free(c[i]);
  free(L->lo);
  free(L->cost);
  memset(L, 0, sizeof *L);
}

gpt_part par_stage_part(const par_layout *L, int s) {
  int inflight = L->P - s; /* 1F1B: stage s holds at most P - s micro-batches at once */
  return (gpt_part){L->lo[s], L->lo[s + 1], s == 0, s == L->P - 1, L->m < inflight ? L->m : inflight, L->recompute};
}

gpt_part par_part(const par_layout *L) { return par_stage_part(L, L->stage); }

const char *par_describe(const par_layout *L, char *buf, size_t len) {
  double total = 0;
  for (int s = 0; s < L->P; s++) total += L->cost[s];
  size_t o = 0;
  buf[0] = '\0';
  for (int s = 0; s < L->P && o < len; s++) {
    char layers[48];
    if (L->lo[s + 1] - L->lo[s] == 1)
      snprintf(layers, sizeof layers, "layer %d", L->lo[s]);
    else
      snprintf(layers, sizeof layers, "layers %d-%d", L->lo[s], L->lo[s + 1] - 1);
    int n = util_snprintf(buf + o, len - o, "%sstage %d: %s%s%s (%.0f%% of the FLOPs)", s ? "\n" : "", s, layers,
                          s == 0 ? " + embedding" : "", s == L->P - 1 ? " + final LayerNorm and head" : "",
                          100.0 * L->cost[s] / total);
    if (n < 0) break;
    o += (size_t)n;
  }
  return buf;
}
