/* plan: layouts enumerated and predicted (the model of doc/planning.md). */
#include "plan/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/gpt.h"
#include "parallel/hier.h"
#include "parallel/par.h"
#include "parallel/qexch.h"
#include "parallel/tp.h"
#include "trainer.h"

/* What a layout's prediction reads: the deck (a scratch copy that takes the layout), the model,
 * the machine, the backend whose memory plan is used; and where the planning says how far it is. */
typedef struct {
  cfg_config *cfg;
  const backend *be;
  gpt_shape s;
  const machine_plan *m;
  int T;
  int B0;  /* the deck's micro-batch: the largest tried (cfg's changes with each layout) */
  long G;
  double flops_per_token;
  FILE *progress;     /* NULL: quiet */
  double t0, shown;   /* when planning began, when progress was last shown */
} plan_ctx;

/* What the layouts of P stages x tp tensor ranks x D replicas share whatever their micro-batch, ZeRO,
 * recomputation and rank order: the stage split, every rank's tensors, each stage's gradient bytes and
 * what one replica sends of them. Built once for all of those layouts. */
typedef struct {
  par_layout lay;      /* P, tp, D and the stage split; nmicro, zero, recompute are set per layout */
  trainer_tensors *tt; /* [P x tp]: stage s's tensor rank r at s * tp + r */
  double *fp32, *sent; /* [P]: bytes of stage s's fp32 gradients, and of one replica's message of them */
} plan_stages;

/* Seconds between the progress lines of a long plan. */
static const double PROGRESS_EVERY = 5.0;

/* Power draw of a busy GPU or core as a share of its board power: low, central, high. */
static const double UTIL_POWER[3] = {0.6, 0.8, 1.0};
/* The step-time tolerance the plan is checked to (doc/planning.md): the time's low and high. */
static const double TIME_RANGE[3] = {0.8, 1.0, 1.2};

/* Node of rank r: ranks fill the nodes in order. */
static int node_of(const plan_ctx *c, int r) { return r / c->m->per_node; }

/* Rank of tensor rank t of (stage, replica) in the layout's rank order (par.h): the tp tensor ranks of
 * a stage are consecutive, group = the (stage, replica)'s place. */
static int rank_of(const plan_layout *l, int stage, int replica, int t) {
  return (int)par_rank_of(l->P, l->tp, l->D, l->stages_adjacent, stage, replica, t);
}

/* Bandwidth and latency of the link between two ranks. */
static void link(const plan_ctx *c, int a, int b, double *bw, double *lat) {
  int same = node_of(c, a) == node_of(c, b);
  *bw = same ? c->m->intra_bw : c->m->inter_bw;
  *lat = same ? c->m->intra_lat : c->m->inter_lat;
}

/* Whether the ring of stage s's replicas of tensor rank t spans nodes; *here: whether it has a rank
 * on node n. Its ranks rise by a fixed stride with the replica (rank_of), so neither takes a loop. */
static int ring_spans(const plan_ctx *c, const plan_layout *l, int s, int t, int n, int *here) {
  const long pn = c->m->per_node, a = rank_of(l, s, 0, t), z = rank_of(l, s, l->D - 1, t);
  const long d = l->D > 1 ? rank_of(l, s, 1, t) - a : 1, lo = n * pn, hi = lo + pn; /* node n: ranks [lo, hi) */
  const long k = a >= lo ? 0 : (lo - a + d - 1) / d; /* the ring's first rank at or after lo: a + k d */
  *here = z >= lo && a + k * d < hi;
  return a / pn != z / pn;
}

/* The rings leaving the node asked about last (the nodes of the stages' rings come in order). */
typedef struct {
  int node, leaving;
} ring_memo;

/* Effective bandwidth of the ring of stage s's replicas of tensor rank t: within a node, or across
 * nodes where the node's network is shared by every ring (of any stage and tensor rank) leaving it. */
static double ring_bw(const plan_ctx *c, const plan_layout *l, int s, int t, ring_memo *memo, double *lat) {
  const int n0 = node_of(c, rank_of(l, s, 0, t));
  int here;
  if (!ring_spans(c, l, s, t, n0, &here)) {
    *lat = c->m->intra_lat;
    return c->m->intra_bw;
  }
  if (memo->node != n0) { /* rings with a rank on node n0 that leave it */
    memo->node = n0, memo->leaving = 0;
    for (int u = 0; u < l->P; u++)
      for (int v = 0; v < l->tp; v++) memo->leaving += ring_spans(c, l, u, v, n0, &here) && here;
  }
  *lat = c->m->inter_lat;
  double bw = c->m->inter_bw / (memo->leaving > 0 ? memo->leaving : 1);
  return bw < c->m->intra_bw ? bw : c->m->intra_bw;
}

/* Seconds of stage s's exchange across its replicas per step (each tensor rank's ring moves its shard;
 * the slowest ring counts), and the part that stays exposed after the backward pass of the last
 * micro-batch (t_back) hides what it can. */
/* Replicas of the ring of stage s's tensor rank t on the node of its first (the hierarchy's R). */
static int ring_per_node(const plan_ctx *c, const plan_layout *l, int s, int t) {
  const int n0 = node_of(c, rank_of(l, s, 0, t));
  int R = 1;
  while (R < l->D && node_of(c, rank_of(l, s, R, t)) == n0) R++;
  return R;
}

/* Seconds of one exchange of stage s's tensor rank t among D replicas: a ring of the whole message
 * (sent, its fp32 bytes fp32) over its link; with &comm hierarchy = 'node' on whole nodes of R
 * replicas, fp32 sums and gathers inside the node (2 (R - 1) / R of the fp32 bytes) and the R-th
 * pieces between the N nodes, the R owners of a node sharing its network. nb buckets pay latencies. */
static double ring_seconds(const plan_ctx *c, const plan_layout *l, int s, int t, double fp32, double sent, double nb,
                           ring_memo *memo) {
  const int gather = sent < fp32 && cfg_comm_exchange_of(&c->cfg->comm) == CFG_EXCHANGE_ALLGATHER;
  double lat, bw = ring_bw(c, l, s, t, memo, &lat);
  const int R = hier_on(&c->cfg->comm, l->D) ? ring_per_node(c, l, s, t) : 1, N = l->D / R;
  if (R == 1 || R == l->D || l->D % R != 0) { /* one level */
    const double volume = gather ? (l->D - 1) * sent : 2.0 * (l->D - 1) / l->D * sent; /* bytes in per rank */
    return volume / bw + 2.0 * (l->D - 1) * lat * nb;
  }
  const double piece = sent / R, inter = gather ? (N - 1) * piece : 2.0 * (N - 1) / N * piece;
  const double intra = 2.0 * (R - 1) / R * fp32 / c->m->intra_bw + 2.0 * (R - 1) * c->m->intra_lat * nb;
  return intra + inter / (bw / R) + 2.0 * (N - 1) * lat * nb;
}

static double dp_exposed(const plan_ctx *c, const plan_stages *st, const plan_layout *l, int s, double t_back,
                         ring_memo *memo) {
  if (l->D == 1) return 0.0;
  const double fp32 = st->fp32[s], sent = st->sent[s];
  const double nb = ceil(fp32 / (c->cfg->parallel.bucket_mb * 1048576.0));
  double total = 0;
  for (int tr = 0; tr < l->tp; tr++) total = fmax(total, ring_seconds(c, l, s, tr, fp32, sent, nb, memo));
  /* ZeRO-1: the reduce-scatter half overlaps, the all-gather after the optimizer step does not */
  const double overlapped = l->zero ? total / 2 : total, after = total - overlapped;
  const double hidden = overlapped - t_back;
  return (hidden > overlapped / nb ? hidden : overlapped / nb) + after;
}

/* Seconds of one micro-batch's forward and backward computation on stage s: its FLOPs per token
 * (par's stage cost), the recomputed forward of its blocks, shared by its tp tensor ranks, at the
 * machine's efficiency. */
static double stage_seconds(const plan_ctx *c, const plan_layout *l, const par_layout *lay, int s) {
  double head = s == l->P - 1 ? 6.0 * c->s.V * (double)c->s.C : 0.0;
  double f = lay->cost[s] + (l->recompute ? (lay->cost[s] - head) / 3.0 : 0.0);
  return (double)l->B * c->T * f / (l->tp * c->m->peak * c->m->efficiency);
}

/* Seconds of stage s's tensor all-reduces per micro-batch, forward and backward (not overlapped with
 * the computation): tp_floats_per_micro's sums of N x C fp32 (N = B T tokens), each a ring of the T
 * ranks over their link: 2 (T - 1) / T of its bytes and 2 (T - 1) latencies. */
static double tp_seconds(const plan_ctx *c, const plan_layout *l, const par_layout *lay, int s) {
  if (l->tp == 1) return 0.0;
  const int N = l->B * c->T, k = l->tp;
  const double bytes = (double)N * c->s.C * sizeof(float);
  const double sums = tp_floats_per_micro(&c->s, par_stage_part(lay, s), N) / ((double)N * c->s.C);
  double bw, lat;
  link(c, rank_of(l, s, 0, 0), rank_of(l, s, 0, k - 1), &bw, &lat);
  return sums * (2.0 * (k - 1) / k * bytes / bw + 2.0 * (k - 1) * lat);
}

/* Seconds of one micro-batch's pass on stage s: its computation and its tensor all-reduces. */
static double pass_seconds(const plan_ctx *c, const plan_layout *l, const par_layout *lay, int s) {
  return stage_seconds(c, l, lay, s) + tp_seconds(c, l, lay, s);
}

/* Memory of the fullest rank (of every stage and tensor rank: their vocabulary pieces may differ by a
 * row), and the optimizer's time on it. */
static void predict_memory(const plan_ctx *c, const plan_stages *st, plan_layout *l, const par_layout *lay) {
  const double es = (double)backend_dtype_size(c->be->storage);
  double most = 0; /* with MPI's own temporaries: a CPU rank's memory (on a GPU they are the host's) */
  for (int s = 0; s < l->P; s++) {
    trainer_memory tm = trainer_plan_fullest_of(c->cfg, c->be, &c->s, lay, s, &st->tt[(size_t)s * l->tp]);
    if ((double)tm.total > l->mem_planned) l->mem_planned = (double)tm.total;
    if ((double)(tm.total + tm.mpi) > most) most = (double)(tm.total + tm.mpi);
    /* AdamW reads p, g, m, v and writes p, m, v (28 bytes), plus the compute copy below fp32 */
    double own = (double)grad_own_params(gpt_part_params(&c->s, tm.part), lay, 0);
    double t = own * (28.0 + (es < 4 ? es : 0)) / c->m->memory_bw;
    if (t > l->t_opt) l->t_opt = t;
  }
  l->mem = (c->m->cpu ? most : l->mem_planned) + c->m->overhead;
  l->fits = l->mem <= c->m->memory;
}

/* Seconds of the pipeline: m passes of the busiest stage and, filling and draining the pipeline
 * (1F1B), one pass of each other stage (balanced stages: (m + P - 1) passes), their computation in
 * t_compute and t_bubble, their tensor all-reduces in t_tp; the transfers of the warm-up and the
 * cool-down (every tensor rank sends its whole B x T x C activations); then the replicas' and the
 * tied embedding's exchanges (each tensor rank its vocabulary piece; none with an untied head). */
static void predict_time(const plan_ctx *c, const plan_stages *st, plan_layout *l, const par_layout *lay) {
  int busiest = 0;
  for (int s = 1; s < l->P; s++)
    if (pass_seconds(c, l, lay, s) > pass_seconds(c, l, lay, busiest)) busiest = s;
  double dp = 0;
  ring_memo memo = {-1, 0};
  for (int s = 0; s < l->P; s++) {
    const double k = s == busiest ? l->m : 1, t = stage_seconds(c, l, lay, s);
    if (s == busiest) l->t_compute = k * t;
    else l->t_bubble += t;
    l->t_tp += k * tp_seconds(c, l, lay, s);
    double e = dp_exposed(c, st, l, s, 2.0 / 3.0 * pass_seconds(c, l, lay, s), &memo);
    if (e > dp) dp = e;
  }
  const double es = (double)backend_dtype_size(c->be->storage);
  for (int s = 0; s + 1 < l->P; s++) {
    double bw, lat;
    link(c, rank_of(l, s, 0, 0), rank_of(l, s + 1, 0, 0), &bw, &lat);
    l->t_p2p += 2.0 * (lat + (double)l->B * c->T * c->s.C * es / bw);
  }
  l->t_dp = dp;
  if (l->P > 1 && c->s.tied) { /* an untied head has no copy on the first stage */
    double bw, lat;
    link(c, rank_of(l, 0, 0, 0), rank_of(l, l->P - 1, 0, 0), &bw, &lat);
    l->t_embed = lat + ceil((double)c->s.V / l->tp) * c->s.C * sizeof(float) / bw;
  }
  l->t_step = l->t_compute + l->t_bubble + l->t_tp + l->t_p2p + l->t_dp + l->t_embed + l->t_opt;
}

/* Throughput, the run's duration, energy and CO2e with their ranges. */
static void predict_run(const plan_ctx *c, plan_layout *l) {
  const machine_plan *m = c->m;
  l->tokens_per_s = (double)c->G * c->T / l->t_step;
  l->mfu = l->tokens_per_s * c->flops_per_token / (m->ranks * m->peak);
  l->seconds = m->tokens / l->tokens_per_s;
  for (int k = 0; k < 3; k++) {
    double watts = m->ranks * m->device_w * UTIL_POWER[k] + m->nodes * m->host_w;
    l->kwh[k] = watts * l->seconds * TIME_RANGE[k] * m->pue / 3.6e6;
    l->co2_kg[k] = l->kwh[k] * m->intensity / 1000.0;
  }
}

/* The deck copy set to layout l (what trainer_plan_memory reads of it). */
static void set_layout(plan_ctx *c, const plan_layout *l) {
  cfg_parallel *p = &c->cfg->parallel;
  p->pipeline_stages = l->P, p->tensor_parallel = l->tp, p->data_parallel = l->D, p->micro_batches = l->m;
  p->zero_stage = l->zero;
  util_strlcpy(p->rank_order, l->stages_adjacent ? "stages_adjacent" : "replicas_adjacent", sizeof p->rank_order);
  c->cfg->training.micro_batch_size = l->B;
  c->cfg->training.recompute = l->recompute;
  c->cfg->training.global_batch_size = c->G;
}

/* What the layouts of l's P x tp x D share (plan_stages), built. */
static void stages_open(plan_ctx *c, plan_stages *st, const plan_layout *l) {
  set_layout(c, l);
  par_plan(&st->lay, c->cfg, l->P * l->tp * l->D, 0);
  st->tt = util_malloc((size_t)l->P * l->tp * sizeof *st->tt, "stage tensors");
  st->fp32 = util_malloc((size_t)l->P * sizeof *st->fp32, "stage bytes");
  st->sent = util_malloc((size_t)l->P * sizeof *st->sent, "stage bytes");
  par_layout lay = st->lay;
  for (int s = 0; s < l->P; s++) {
    for (int r = 0; r < l->tp; r++) lay.tp_rank = r, st->tt[s * l->tp + r] = trainer_tensors_of(&c->s, par_stage_part(&lay, s));
    const trainer_tensors *t0 = &st->tt[s * l->tp]; /* a replica ring's message: tensor rank 0's shard */
    st->fp32[s] = (double)t0->n * sizeof(float);
    st->sent[s] = (double)qexch_plan_bytes(&c->cfg->comm, t0->t, t0->nt, l->D);
  }
}

static void stages_close(plan_stages *st) {
  for (int i = 0; i < st->lay.P * st->lay.tp; i++) free(st->tt[i].t);
  free(st->tt), free(st->fp32), free(st->sent);
  par_free(&st->lay);
}

/* Predict layout l (P, T, D, B, m, zero, recompute, order set) of the stages st; its memory is
 * same_memory's where that layout differs from it in the rank order alone (NULL: computed). */
static void predict(plan_ctx *c, const plan_stages *st, plan_layout *l, const plan_layout *same_memory) {
  set_layout(c, l);
  par_layout lay = st->lay;
  lay.nmicro = l->m, lay.zero = l->zero, lay.recompute = l->recompute;
  if (same_memory) {
    l->mem = same_memory->mem, l->mem_planned = same_memory->mem_planned, l->fits = same_memory->fits;
    l->t_opt = same_memory->t_opt;
  } else {
    predict_memory(c, st, l, &lay);
  }
  predict_time(c, st, l, &lay);
  predict_run(c, l);
}

static void push(plan_result *r, const plan_layout *l, int *cap) {
  if (r->n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    r->v = util_realloc(r->v, (size_t)*cap * sizeof *r->v, "layouts");
  }
  r->v[r->n++] = *l;
}

/* Whether tp tensor ranks split the model: heads and MLP units evenly, a vocabulary row each at
 * least (the deck's check of &parallel tensor_parallel). */
static int tp_splits(const gpt_shape *s, int T) {
  return s->H % T == 0 && s->Hkv % T == 0 && s->F % T == 0 && s->V >= T;
}

/* Whether B sequences a micro-batch on D replicas make a layout of the global batch whose counts the
 * deck's ranges take (&parallel data_parallel, micro_batches): the layout's deck lines must load. */
static int micro_fits(const plan_ctx *c, int B, int D) {
  return c->G % ((long)B * D) == 0 && D <= cfg_key_max("parallel", "data_parallel") &&
         c->G / ((long)B * D) <= cfg_key_max("parallel", "micro_batches");
}

/* The layouts of P stages x tp tensor ranks x D replicas into r->v, unpredicted: micro-batches from the
 * deck's down to 1 that divide the global batch, ZeRO-1 and the rank order where there are replicas,
 * recomputation or not (the rank order innermost: those layouts share their memory). */
static void enumerate_micro(plan_ctx *c, plan_result *r, int P, int T, int D, int *cap) {
  for (int B = c->B0; B >= 1; B /= 2) {
    if (!micro_fits(c, B, D)) continue;
    for (int zero = 0; zero <= (D > 1); zero++)
      for (int rc = 0; rc <= 1; rc++)
        for (int order = 0; order <= (P > 1 && D > 1); order++) {
          plan_layout l = {.P = P, .tp = T, .D = D, .B = B, .m = (int)(c->G / ((long)B * D)), .zero = zero,
                           .recompute = rc, .stages_adjacent = order};
          push(r, &l, cap);
        }
  }
}

/* A progress line when the last was PROGRESS_EVERY seconds ago. */
static void show_progress(plan_ctx *c, int R, int done, int n) {
  const double now = util_now();
  if (!c->progress || now - c->shown < PROGRESS_EVERY) return;
  fprintf(c->progress, "plan: %d ranks: %d of %d layouts predicted (%.0f s so far)\n", R, done, n, now - c->t0);
  fflush(c->progress);
  c->shown = now;
}

/* Every layout of R ranks into r->v, predicted: tensor ranks T dividing the ranks of a node (a stage's
 * tensor ranks share it) and splitting the model, stages P (at most one layer each) with P x tp
 * dividing R, D = R / (P T) replicas. The layouts of one P x T share their stages' tensors. */
static void enumerate(plan_ctx *c, plan_result *r, int R) {
  int cap = 0;
  for (int T = 1; T <= c->m->per_node; T++) {
    if (c->m->per_node % T || !tp_splits(&c->s, T)) continue;
    for (int P = 1; P * T <= R && P <= c->s.L; P++)
      if (R % (P * T) == 0) enumerate_micro(c, r, P, T, R / (P * T), &cap);
  }
  plan_stages st;
  for (int i = 0; i < r->n; i++) {
    plan_layout *l = &r->v[i], *prev = i > 0 ? &r->v[i - 1] : NULL;
    const int same_stages = prev && prev->P == l->P && prev->tp == l->tp;
    if (!same_stages && prev) stages_close(&st);
    if (!same_stages) stages_open(c, &st, l);
    const int order_only = same_stages && prev->B == l->B && prev->zero == l->zero && prev->recompute == l->recompute;
    predict(c, &st, l, order_only ? prev : NULL);
    show_progress(c, R, i + 1, r->n);
  }
  if (r->n) stages_close(&st);
}

/* Whether a is better than b among layouts that fit: faster; on a tie the larger micro-batch
 * (larger GEMMs than the plan's one efficiency assumes), then the smaller memory. */
static int better(const plan_layout *a, const plan_layout *b) {
  if (a->t_step < b->t_step * (1 - 1e-9)) return 1;
  if (a->t_step > b->t_step * (1 + 1e-9)) return 0;
  return a->B != b->B ? a->B > b->B : a->mem < b->mem;
}

int plan_fastest(const plan_result *r, int tp) {
  int best = -1;
  for (int i = 0; i < r->n; i++)
    if (r->v[i].fits && (!tp || r->v[i].tp == tp) && (best < 0 || better(&r->v[i], &r->v[best]))) best = i;
  return best;
}

int plan_tp_values(const plan_result *r, int *tps, int max) {
  int n = 0;
  for (int i = 0; i < r->n; i++) {
    int k = 0;
    while (k < n && tps[k] < r->v[i].tp) k++;
    if ((k < n && tps[k] == r->v[i].tp) || n == max) continue;
    memmove(tps + k + 1, tps + k, (size_t)(n - k) * sizeof *tps);
    tps[k] = r->v[i].tp, n++;
  }
  return n;
}

/* The deck's own layout on R ranks, predicted; 0 when it is not one. */
static int deck_layout(plan_ctx *c, const cfg_config *cfg, int R, plan_layout *l) {
  const cfg_parallel *p = &cfg->parallel;
  const int P = (int)p->pipeline_stages, T = (int)p->tensor_parallel, B = (int)cfg->training.micro_batch_size;
  if (R % (P * T) || P > c->s.L || !tp_splits(&c->s, T)) return 0;
  const int D = R / (P * T);
  if (!micro_fits(c, B, D)) return 0;
  *l = (plan_layout){.P = P, .tp = T, .D = D, .B = B, .m = (int)(c->G / ((long)B * D)), .zero = (int)p->zero_stage,
                     .recompute = cfg->training.recompute, .stages_adjacent = cfg_parallel_rank_order_of(p) == CFG_ORDER_STAGES_ADJACENT};
  if (l->D == 1) l->zero = 0;
  plan_stages st;
  stages_open(c, &st, l);
  predict(c, &st, l, NULL);
  stages_close(&st);
  return 1;
}

/* Nothing fits: the smallest node count, doubling up to 64x (and to the ranks and nodes a plan takes),
 * at which a layout would; each count said as it is tried. */
static void more_nodes(plan_ctx *c, plan_result *r) {
  machine_plan m = *c->m;
  const machine_plan *keep = c->m;
  c->m = &m;
  r->nodes_tried = keep->nodes;
  for (int k = 2; k <= 64 && !r->nodes_needed; k *= 2) {
    const long nodes = (long)keep->nodes * k;
    if (nodes > cfg_key_max("machine", "nodes") || nodes * keep->per_node > PAR_MAX_RANKS) break;
    m.nodes = (int)nodes, m.ranks = m.nodes * m.per_node;
    if (c->progress) fprintf(c->progress, "plan: nothing fits on %d node%s; trying %d nodes (%d ranks)\n", r->nodes_tried,
                             r->nodes_tried == 1 ? "" : "s", m.nodes, m.ranks), fflush(c->progress);
    plan_result t = {0};
    enumerate(c, &t, m.ranks);
    int b = plan_fastest(&t, 0);
    if (b >= 0) r->nodes_needed = m.nodes, r->alt = t.v[b];
    r->nodes_tried = m.nodes;
    plan_free(&t);
  }
  c->m = keep;
}

/* The global batch: the deck's, or a micro-batch per rank; within &training global_batch_size's range
 * (0 and an error otherwise). */
static long global_batch(const cfg_config *cfg, int ranks, err_list *errs) {
  const long B = cfg->training.micro_batch_size, G = cfg->training.global_batch_size > 0 ? cfg->training.global_batch_size
                                                                                          : B * ranks;
  const double most = cfg_key_max("training", "global_batch_size");
  if (G <= most) return G;
  cfg_error_at(cfg, errs, "training", "global_batch_size", "give &training global_batch_size, or plan for fewer ranks",
               "0 plans a micro-batch per rank: micro_batch_size x ranks = %ld x %d = %ld sequences, more than %.0f", B,
               ranks, G, most);
  return 0;
}

int plan_make(plan_result *r, const cfg_config *cfg, const backend *be, FILE *progress, err_list *errs) {
  memset(r, 0, sizeof *r);
  plan_ctx c = {.cfg = util_malloc(sizeof *cfg, "deck copy"), .be = be, .T = (int)cfg->training.seq_len,
                .B0 = (int)cfg->training.micro_batch_size, .progress = progress, .t0 = util_now()};
  c.shown = c.t0;
  *c.cfg = *cfg;
  gpt_shape_from_cfg(&c.s, &cfg->model);
  r->nparams = (double)gpt_count_params(&c.s);
  const backend_shape ops = {.B = c.B0, .T = c.T, .C = c.s.C, .H = c.s.H, .Hkv = c.s.Hkv, .F = c.s.F, .V = c.s.V};
  int rc = machine_resolve(&r->mach, cfg, be, r->nparams, &ops, errs);
  if (rc == 0 && (c.G = global_batch(cfg, r->mach.ranks, errs)) == 0) rc = 1;
  if (rc == 0) {
    c.m = &r->mach;
    c.flops_per_token = gpt_flops_per_token(&c.s, c.T);
    r->T = c.T, r->G = c.G, r->flops_per_token = c.flops_per_token;
    enumerate(&c, r, r->mach.ranks);
    if (r->n == 0) {
      cfg_error_at(cfg, errs, "machine", "devices_per_node",
                   "pipeline stages x tensor ranks must divide the ranks (at most one stage per layer, tensor ranks "
                   "dividing a node's) and micro_batch_size x replicas the global_batch_size: choose another rank count "
                   "or global batch",
                   "no layout of %d ranks for this deck (global batch %ld sequences, %d layers)", r->mach.ranks, c.G, c.s.L);
      rc = 1;
    }
    r->best = plan_fastest(r, 0);
    r->has_deck = deck_layout(&c, cfg, r->mach.ranks, &r->deck);
    if (r->best < 0 && r->n > 0) more_nodes(&c, r);
  }
  gpt_shape_free(&c.s);
  free(c.cfg);
  return rc;
}

void plan_free(plan_result *r) {
  free(r->v);
  r->v = NULL;
  r->n = 0;
}

const char *plan_deck_lines(const plan_result *r, const plan_layout *l, char *buf, size_t len) {
  util_snprintf(buf, len,
                "&parallel pipeline_stages = %d, tensor_parallel = %d, data_parallel = %d, micro_batches = %d, "
                "zero_stage = %d, rank_order = '%s' /\n&training micro_batch_size = %d, global_batch_size = %ld, "
                "recompute = %s /",
                l->P, l->tp, l->D, l->m, l->zero, l->stages_adjacent ? "stages_adjacent" : "replicas_adjacent", l->B, r->G,
                l->recompute ? ".true." : ".false.");
  return buf;
}
