/* hier: the two-level gradient exchange, fp32 inside a node, compressed between nodes (see hier.h).
 *
 * MPI wants the collectives of a communicator started in the same order on all its ranks, so each
 * phase starts its buckets in launch order: the in-node sums when the backward pass makes a bucket
 * final; the exchange between the nodes as soon as the in-node sums of that bucket and of every
 * bucket launched before it are done (found by testing whenever the backward pass hands over a
 * bucket, or waited for at the finish), so that no rank waits inside its backward pass; the
 * all-gather when the bucket is finished, in bucket order. */
#include "parallel/hier.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/rng.h"
#include "base/util.h"
#include "parallel/comm.h"

typedef struct {
  size_t b0, b1;
  int *cnt, *dis;    /* the R pieces: values and offsets from b0 */
  MPI_Request *req;  /* phase 1: the R in-node sums; phases 2 and 3: req[0] */
  int phase;         /* 0 idle, 1 summing in the node, 2 between the nodes, 3 done */
  int compress;
  long step;
  double decode_s;
} hbucket;

struct hier {
  gpt_model *m;
  int R, N, me;        /* replicas per node, nodes, this replica's place on its node (its piece) */
  MPI_Comm intra, cross;
  hbucket *b;
  int nb;
  int *order, launched, crossed; /* the buckets in launch order this step; how many launched, how many in phase 2 */
  qexch *qx;
  comm_stage gs;       /* MPI's view of the gradients (comm.h) */
  double intra_bytes, inter_bytes;
};

int hier_on(const cfg_comm *c, int D) { return D > 1 && cfg_comm_hierarchy_of(c) == CFG_HIER_NODE; }

void hier_piece(size_t b0, size_t b1, int R, int l, size_t *lo, size_t *hi) {
  *lo = b0 + par_piece(b1 - b0, R, l);
  *hi = b0 + par_piece(b1 - b0, R, l + 1);
}

/* Replica r of the stage (stage, t) of a P x tp x D layout: its node under ranks_per_node rpn. */
static long node_at(const par_layout *l, long rpn, int stage, int t, int r) {
  return par_rank_of(l->P, l->tp, l->D, l->stages_adjacent, stage, r, t) / rpn;
}

/* Replicas of (stage, t) on the node of replica r, and how many come before r there (the ranks of a
 * stage's replicas rise with the replica: each node holds a run of them). */
static int run_of(const par_layout *l, long rpn, int stage, int t, int r, int *before) {
  const long n = node_at(l, rpn, stage, t, r);
  int a = r, z = r;
  while (a > 0 && node_at(l, rpn, stage, t, a - 1) == n) a--;
  while (z + 1 < l->D && node_at(l, rpn, stage, t, z + 1) == n) z++;
  *before = r - a;
  return z - a + 1;
}

hier_shape hier_plan_shape(const cfg_comm *c, const par_layout *lay, int replica) {
  if (c->ranks_per_node <= 0) return (hier_shape){1, lay->D, 0, replica};
  hier_shape s;
  s.per_node = run_of(lay, c->ranks_per_node, lay->stage, lay->tp_rank, replica, &s.local);
  s.nodes = lay->D / s.per_node;
  s.node = replica / s.per_node;
  return s;
}

/* The error of a stage (-1: some stage) whose replicas sit unevenly on the nodes: count[0..n) per node
 * (the first of them: `more` says there are others). */
static void uneven(const cfg_config *cfg, err_list *errs, int stage, const int *count, int n, int more, const char *how) {
  char who[32] = "a stage";
  if (stage >= 0) snprintf(who, sizeof who, "stage %d", stage);
  char list[160] = "";
  for (int i = 0, o = 0; i < n && o < (int)sizeof list - 16; i++)
    o += snprintf(list + o, sizeof list - (size_t)o, "%s%d", i ? ", " : "", count[i]);
  cfg_error_at(cfg, errs, "comm", "hierarchy",
               "start whole nodes of each stage's replicas (data_parallel a multiple of the replicas a node holds, rank_order "
               "= 'replicas_adjacent' with pipelines), set ranks_per_node, or hierarchy = 'none'",
               "hierarchy = 'node' needs every node to hold as many of a stage's replicas; %s's %ld sit %s%s on "
               "their nodes (%s)", who, cfg->parallel.data_parallel, list, more ? ", ..." : "", how);
}

int hier_check(const cfg_config *cfg, err_list *errs) {
  const cfg_comm *c = &cfg->comm;
  if (!hier_on(c, (int)cfg->parallel.data_parallel) || c->ranks_per_node <= 0) return 0;
  par_layout l = {.P = (int)cfg->parallel.pipeline_stages, .tp = (int)cfg->parallel.tensor_parallel,
                  .D = (int)cfg->parallel.data_parallel,
                  .stages_adjacent = cfg_parallel_rank_order_of(&cfg->parallel) == CFG_ORDER_STAGES_ADJACENT};
  for (int s = 0; s < l.P; s++)
    for (int t = 0; t < l.tp; t++) {
      int count[8], n = 0, nodes = 0, even = 1, before;
      for (int r = 0; r < l.D; nodes++) {
        int R = run_of(&l, c->ranks_per_node, s, t, r, &before);
        even &= nodes == 0 || R == count[0];
        if (n < 8) count[n++] = R;
        r += R;
      }
      if (even) continue;
      char how[64];
      snprintf(how, sizeof how, "ranks_per_node = %ld", c->ranks_per_node);
      uneven(cfg, errs, s, count, n, nodes > n, how);
      return 1;
    }
  return 0;
}

/* This rank's node: a number shared by the ranks of one node (ranks_per_node, or the smallest rank
 * MPI_COMM_TYPE_SHARED groups with it). Collective over lay->node when ranks_per_node is 0 (or c NULL). */
static int node_key(const cfg_comm *c, const par_layout *lay) {
  if (c && c->ranks_per_node > 0) return (int)(lay->rank / c->ranks_per_node);
  int key;
  MPI_Allreduce(&lay->rank, &key, 1, MPI_INT, MPI_MIN, lay->node);
  return key;
}

int hier_check_nodes(const cfg_config *cfg, const par_layout *lay, err_list *errs) {
  const cfg_comm *c = &cfg->comm;
  if (!hier_on(c, lay->D) || c->ranks_per_node > 0) return 0;
  MPI_Comm intra;
  int R, lo_hi[2];
  MPI_Comm_split(lay->dp, node_key(c, lay), lay->replica, &intra);
  MPI_Comm_size(intra, &R);
  MPI_Comm_free(&intra);
  lo_hi[0] = -R, lo_hi[1] = R;
  MPI_Allreduce(MPI_IN_PLACE, lo_hi, 2, MPI_INT, MPI_MAX, lay->comm);
  if (-lo_hi[0] == lo_hi[1]) return 0;
  int count[2] = {-lo_hi[0], lo_hi[1]};
  uneven(cfg, errs, -1, count, 2, 0, "as few and as many as MPI_COMM_TYPE_SHARED reports; the stage may differ");
  return 1;
}

int hier_spans(const cfg_comm *c, const par_layout *lay) {
  int key = node_key(c, lay), lo_hi[2] = {-key, key};
  MPI_Allreduce(MPI_IN_PLACE, lo_hi, 2, MPI_INT, MPI_MAX, lay->dp);
  return -lo_hi[0] != lo_hi[1];
}

void hier_split(const cfg_comm *c, const par_layout *lay, MPI_Comm *intra, MPI_Comm *cross) {
  int me;
  MPI_Comm_split(lay->dp, node_key(c, lay), lay->replica, intra);
  MPI_Comm_rank(*intra, &me);
  MPI_Comm_split(lay->dp, me, lay->replica, cross);
}

hier *hier_create(gpt_model *m, const par_layout *lay, const cfg_comm *c, long adapt_period, uint64_t seed, int nb,
                  const qexch_bucket *b) {
  hier *h = util_calloc(1, sizeof *h, "hierarchical exchange");
  h->m = m;
  hier_split(c, lay, &h->intra, &h->cross);
  MPI_Comm_size(h->intra, &h->R);
  MPI_Comm_rank(h->intra, &h->me);
  MPI_Comm_size(h->cross, &h->N);
  h->nb = nb;
  h->order = util_malloc((size_t)nb * sizeof *h->order, "hierarchical buckets");
  h->b = util_calloc((size_t)nb, sizeof *h->b, "hierarchical buckets");
  qexch_bucket *piece = util_malloc((size_t)nb * sizeof *piece, "hierarchical buckets");
  for (int i = 0; i < nb; i++) {
    hbucket *k = &h->b[i];
    k->b0 = b[i].b0, k->b1 = b[i].b1;
    k->cnt = util_malloc((size_t)h->R * sizeof *k->cnt, "pieces");
    k->dis = util_malloc((size_t)h->R * sizeof *k->dis, "pieces");
    k->req = util_malloc((size_t)h->R * sizeof *k->req, "pieces");
    for (int l = 0; l < h->R; l++) {
      size_t lo, hi;
      hier_piece(k->b0, k->b1, h->R, l, &lo, &hi);
      k->cnt[l] = (int)(hi - lo), k->dis[l] = (int)(lo - k->b0), k->req[l] = MPI_REQUEST_NULL;
    }
    piece[i] = b[i];
    hier_piece(k->b0, k->b1, h->R, h->me, &piece[i].lo, &piece[i].hi);
  }
  if (h->N > 1) h->qx = qexch_create(c, adapt_period, seed, m, nb, piece, h->cross, lay->comm);
  free(piece);
  comm_stage_init(&h->gs, m->be, m->nparams, sizeof(float));
  return h;
}

void hier_free(hier *h) {
  if (!h) return;
  for (int i = 0; i < h->nb; i++) free(h->b[i].cnt), free(h->b[i].dis), free(h->b[i].req);
  free(h->b), free(h->order);
  qexch_free(h->qx);
  comm_stage_free(&h->gs);
  MPI_Comm_free(&h->intra);
  MPI_Comm_free(&h->cross);
  free(h);
}

qexch *hier_qexch(hier *h) { return h->qx; }

int hier_holders(const hier *h, uint64_t *map) {
  *map = rng_hash((uint64_t)h->R, (uint64_t)h->nb);
  for (int i = 0; i < h->nb; i++) *map = rng_hash(*map ^ h->b[i].b0, h->b[i].b1);
  return h->R;
}

/* Phase 1 done (waited for): this replica's piece, summed over its node, goes between the nodes. */
static void start_inter(hier *h, int i) {
  hbucket *k = &h->b[i];
  for (int l = 0; l < h->R; l++) MPI_Wait(&k->req[l], MPI_STATUS_IGNORE);
  const size_t at = k->b0 + (size_t)k->dis[h->me], n = (size_t)k->cnt[h->me];
  float *g = h->m->grads + at;
  if (k->compress) {
    comm_stage_done(&h->gs, at, g, n); /* the node's sums where the encoder reads them */
    qexch_launch(h->qx, i, k->step, &k->req[0]);
    h->inter_bytes += (double)qexch_message_bytes(h->qx, i);
  } else {
    MPI_Iallreduce(MPI_IN_PLACE, comm_stage_recv(&h->gs, at, g), (int)n, MPI_FLOAT, MPI_SUM, h->cross, &k->req[0]);
    if (h->N > 1) h->inter_bytes += (double)n * sizeof(float);
  }
  k->phase = 2;
}

/* Start the exchanges between the nodes of the launched buckets, in launch order, while their in-node
 * sums are done (wait: all of them, waiting for the sums). */
static void cross_ready(hier *h, int wait) {
  while (h->crossed < h->launched) {
    hbucket *k = &h->b[h->order[h->crossed]];
    int done = 1;
    for (int l = 0; l < h->R && !wait; l++) {
      int d;
      MPI_Test(&k->req[l], &d, MPI_STATUS_IGNORE);
      done &= d;
    }
    if (!done) return;
    start_inter(h, h->order[h->crossed++]);
  }
}

void hier_launch(hier *h, int i, long step, int compress) {
  hbucket *k = &h->b[i];
  k->step = step, k->compress = compress && h->qx, k->decode_s = 0;
  float *buf = comm_stage_send(&h->gs, k->b0, h->m->grads + k->b0, k->b1 - k->b0);
  for (int l = 0; l < h->R; l++) { /* piece l summed onto replica l, in place */
    float *p = buf + k->dis[l];
    MPI_Ireduce(l == h->me ? MPI_IN_PLACE : p, l == h->me ? p : NULL, k->cnt[l], MPI_FLOAT, MPI_SUM, l, h->intra, &k->req[l]);
  }
  if (h->R > 1) h->intra_bytes += (double)(k->b1 - k->b0) * sizeof(float);
  k->phase = 1;
  h->order[h->launched++] = i;
  cross_ready(h, 0);
}

void hier_test(hier *h, int i) {
  hbucket *k = &h->b[i];
  int done;
  if (k->phase == 2) MPI_Test(&k->req[0], &done, MPI_STATUS_IGNORE);
  cross_ready(h, 0);
}

double hier_finish(hier *h, int i) {
  cross_ready(h, 1); /* at the first bucket's finish: every launched bucket goes between the nodes */
  h->launched = h->crossed = 0;
  hbucket *k = &h->b[i];
  if (k->phase == 0) return 0;
  MPI_Wait(&k->req[0], MPI_STATUS_IGNORE);
  const size_t at = k->b0 + (size_t)k->dis[h->me], n = (size_t)k->cnt[h->me];
  float *g = h->m->grads;
  if (k->compress) {
    k->decode_s += qexch_finish(h->qx, i);
    comm_stage_send(&h->gs, at, g + at, n); /* the decoded sums, where MPI reads them */
  }
  MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, comm_stage_recv(&h->gs, k->b0, g + k->b0), k->cnt, k->dis, MPI_FLOAT,
                  h->intra, &k->req[0]);
  MPI_Wait(&k->req[0], MPI_STATUS_IGNORE);
  comm_stage_done(&h->gs, k->b0, g + k->b0, k->b1 - k->b0);
  if (h->R > 1) h->intra_bytes += (double)n * sizeof(float);
  k->phase = 3;
  return k->decode_s;
}

void hier_take_bytes(hier *h, double *intra, double *inter) {
  *intra = h->intra_bytes, *inter = h->inter_bytes;
  h->intra_bytes = h->inter_bytes = 0;
}
