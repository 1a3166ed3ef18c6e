/* grad: bucketed, overlapped gradient reduction (allreduce or ZeRO-1 reduce-scatter/all-gather). */
#include "parallel/grad.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/hier.h"
#include "parallel/psgd.h"
#include "parallel/qexch.h"
#include "base/util.h"

typedef struct {
  size_t b0, b1;  /* element range in the buffer */
  int t0, t1;     /* tensor range */
  int *counts, *displs; /* ZeRO-1: each replica's share of [b0, b1) */
  MPI_Request req;
} grad_bucket;

struct grad_exchange {
  gpt_model *model;
  const par_layout *lay;
  int D, rank, zero, tied; /* tied: this stage holds the tied embedding and P > 1 */
  MPI_Comm dp;
  size_t own_lo, own_hi;   /* this replica's piece of the buffer */
  grad_bucket *b;
  int nb, next;            /* buckets; the next to launch (they go out from nb - 1 down to 0) */
  unsigned char *final;    /* per tensor */
  float *recv;             /* ZeRO-1: where reduce-scatters land, (own_hi - own_lo) */
  comm_stage gs, ps, rs;   /* MPI's view of the gradients, the parameters and recv (comm.h) */
  int wte;                 /* index of the tied embedding in m->tensors, or -1 */
  qexch *qx;               /* the compressed exchange (&comm), or NULL; owned by hx where there is one */
  hier *hx;                /* the two-level exchange (&comm hierarchy = 'node'), or NULL */
  psgd *px;                /* PowerSGD (&comm method = 'powersgd'), or NULL */
  int two;                 /* PowerSGD in two levels (its warm-up steps are the flat fp32 exchange) */
  int spans;               /* the replicas sit on more than one node: the flat exchange's bytes leave nodes */
  long step, warmup;       /* the current step; compression starts at step warmup */
  grad_stats st;
  char holders[GRAD_HOLDERS_MAX]; /* which replicas' residuals cover which values (grad_residual_holders) */
};

/* Whether this step's buckets travel compressed. */
static int compressed(const grad_exchange *g) { return (g->qx || g->px) && g->D > 1 && g->step >= g->warmup; }

static int powersgd(const cfg_comm *c) { return c && cfg_comm_method_of(c) == CFG_COMM_POWERSGD; }

/* g->holders: in one level every replica's residual covers all its values; in two, each of the R
 * replicas of a node covers the pieces it leads, fixed by R and every stage's map (summed over the
 * stages' first replicas). The same text on every rank. Collective over lay->comm. */
static void describe_holders(grad_exchange *g) {
  uint64_t map = 0, mine, all;
  int R = g->hx ? hier_holders(g->hx, &map) : g->px ? psgd_holders(g->px, &map) : 1;
  mine = g->lay->replica == 0 ? map : 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, g->lay->comm);
  MPI_Allreduce(MPI_IN_PLACE, &R, 1, MPI_INT, MPI_MAX, g->lay->comm);
  if (R <= 1) grad_holders_one_level(g->D, g->holders, sizeof g->holders);
  else
    util_snprintf(g->holders, sizeof g->holders, "%d replicas, %d a node, each over the pieces it leads (map %016llx)", g->D,
                  R, (unsigned long long)all);
}


/* Backend bytes of the ZeRO-1 landing area of the flat fp32 exchange (the hierarchy has none; PowerSGD's
 * warm-up steps in two levels are the flat exchange). */
static size_t landing_bytes(size_t nparams, const par_layout *lay, const cfg_comm *c) {
  if (!lay->zero || lay->D == 1 || (c && hier_on(c, lay->D) && !powersgd(c))) return 0;
  /* the largest piece, the landing area of any replica: D pieces of par_piece are floor(n / D) or ceil(n / D) long */
  const size_t D = (size_t)lay->D, most = (nparams + D - 1) / D;
  return most * sizeof(float);
}

/* Buckets of whole tensors from the end of the buffer (the tied embedding wte alone; -1: none), in
 * buffer order (bucket 0 first) into b (nt at most); their number. */
static int make_buckets(const gpt_tensor *ts, int nt, int wte, double bucket_mb, grad_bucket *b) {
  const size_t cap = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float));
  int nb = 0;
  for (int t1 = nt; t1 > 0;) {
    int t0 = t1 - 1;
    size_t n = ts[t0].numel;
    while (t0 > 0 && t0 - 1 != wte && t0 != wte && n + ts[t0 - 1].numel <= cap) n += ts[--t0].numel;
    b[nb++] = (grad_bucket){.t0 = t0, .t1 = t1, .b0 = ts[t0].offset, .b1 = ts[t1 - 1].offset + ts[t1 - 1].numel};
    t1 = t0;
  }
  for (int i = 0; i < nb / 2; i++) { /* made from the end */
    grad_bucket t = b[i];
    b[i] = b[nb - 1 - i];
    b[nb - 1 - i] = t;
  }
  return nb;
}

/* Values of the largest tensor one rank holds of the deck's model (tensor_parallel splits the
 * vocabulary rows, the heads and the MLP units). */
static double largest_tensor(const cfg_config *cfg) {
  const cfg_model *m = &cfg->model;
  double C = (double)m->n_embd, tp = (double)cfg->parallel.tensor_parallel;
  double F = m->n_inner ? (double)m->n_inner : 4 * C, most = (double)m->block_size * C; /* wpe */
  most = fmax(most, ceil((double)m->vocab_size / tp) * C);                             /* wte */
  return fmax(most, fmax(3 * C * C, F * C) / tp);                                      /* c_attn, c_fc */
}

int grad_check(const cfg_config *cfg, int D, err_list *errs) {
  if (D < 2) return 0;
  long n0 = err_count(errs);
  /* a bucket holds whole tensors up to bucket_mb, or one larger tensor alone */
  double values = fmax(cfg->parallel.bucket_mb * 1048576.0 / sizeof(float), largest_tensor(cfg));
  if (values >= 2147483648.0)
    cfg_error_at(cfg, errs, "parallel", "bucket_mb", "lower bucket_mb (a tensor larger than it travels alone)",
                 "a gradient bucket of %.0f values is beyond MPI's 32-bit counts", values);
  else if (!powersgd(&cfg->comm))
    qexch_check(cfg, D, values, errs);
  hier_check(cfg, errs);
  return (int)(err_count(errs) - n0);
}

size_t grad_mpi_bytes(const gpt_tensor *ts, int nt, double bucket_mb, const par_layout *lay) {
  if (lay->D == 1 || nt == 0) return 0;
  int wte = -1;
  for (int i = 0; i < nt; i++)
    if (ts[i].tied) wte = i;
  grad_bucket *b = util_calloc((size_t)nt, sizeof *b, "buckets");
  size_t most = 0; /* floats of the largest bucket */
  for (int i = 0, nb = make_buckets(ts, nt, wte, bucket_mb, b); i < nb; i++)
    if (b[i].b1 - b[i].b0 > most) most = b[i].b1 - b[i].b0;
  free(b);
  /* the temporaries of one bucket's MPI_Ireduce_scatter (ZeRO-1) or MPI_Iallreduce, measured on 2,
   * 4 and 8 ranks (doc/planning.md): MPICH takes a D-th of it or half of it; Open MPI's nonblocking
   * collectives (libnbc) the whole bucket, twice over on some ranks of a reduce-scatter beyond 2
   * replicas; any other MPI is planned as Open MPI */
#if defined(MPICH_VERSION)
  const double share = lay->zero ? 1.0 / lay->D : 0.5;
#else
  const double share = lay->zero && lay->D > 2 ? 2.0 : 1.0;
#endif
  return (size_t)(share * (double)most) * sizeof(float);
}

size_t grad_own_params(size_t nparams, const par_layout *lay, int replica) {
  if (!lay->zero) return nparams;
  return par_piece(nparams, lay->D, replica + 1) - par_piece(nparams, lay->D, replica);
}

/* g's buckets as the compressed exchange takes them (each carried whole); free() them. */
static qexch_bucket *qexch_buckets(const grad_exchange *g) {
  qexch_bucket *q = util_malloc((size_t)g->nb * sizeof *q, "buckets");
  for (int i = 0; i < g->nb; i++) {
    const grad_bucket *k = &g->b[i];
    q[i] = (qexch_bucket){.b0 = k->b0, .b1 = k->b1, .lo = k->b0, .hi = k->b1, .t0 = k->t0, .t1 = k->t1};
  }
  return q;
}

size_t grad_plan_device_bytes(const cfg_config *cfg, const gpt_tensor *ts, int nt, size_t nparams, const par_layout *lay,
                              int replica, const backend *be) {
  const cfg_comm *c = &cfg->comm;
  if (powersgd(c) && lay->D > 1) { /* the tensors this replica leads on its node */
    const hier_shape h = hier_on(c, lay->D) ? hier_plan_shape(c, lay, replica) : (hier_shape){lay->D, 1, replica, 0};
    int t0, t1;
    psgd_owned(ts, nt, h.per_node, h.local, &t0, &t1);
    return landing_bytes(nparams, lay, c) + psgd_plan_device_bytes(c, ts + t0, t1 - t0, nparams, be);
  }
  if (!hier_on(c, lay->D))
    return landing_bytes(nparams, lay, c) + qexch_plan_device_bytes(c, ts, nt, 0, SIZE_MAX, lay->D, be) +
           (qexch_residual_on_device(c, lay->D, be) ? qexch_plan_residual_bytes(c, nparams, lay->D) : 0);
  const hier_shape h = hier_plan_shape(c, lay, replica); /* between the nodes: the pieces of the buckets */
  if (h.nodes == 1 || !qexch_residual_on_device(c, h.nodes, be)) return 0;
  int wte = -1;
  for (int i = 0; i < nt; i++)
    if (ts[i].tied) wte = i;
  grad_bucket *b = util_calloc((size_t)(nt ? nt : 1), sizeof *b, "buckets");
  size_t bytes = qexch_plan_residual_bytes(c, nparams, h.nodes);
  for (int i = 0, nb = make_buckets(ts, nt, wte, cfg->parallel.bucket_mb, b); i < nb; i++) {
    size_t lo, hi;
    hier_piece(b[i].b0, b[i].b1, h.per_node, h.local, &lo, &hi);
    bytes += qexch_plan_device_bytes(c, ts + b[i].t0, b[i].t1 - b[i].t0, lo, hi, h.nodes, be);
  }
  free(b);
  return bytes;
}

grad_exchange *grad_create(gpt_model *m, const par_layout *lay, double bucket_mb, const cfg_comm *comm, long adapt_period,
                           uint64_t seed) {
  grad_exchange *g = util_calloc(1, sizeof *g, "gradient exchange");
  g->model = m;
  g->lay = lay;
  g->D = lay->D;
  g->zero = lay->zero;
  g->dp = lay->dp;
  MPI_Comm_rank(lay->dp, &g->rank);
  g->wte = -1;
  for (int i = 0; i < m->ntensors; i++)
    if (m->tensors[i].tied) g->wte = i;
  g->tied = lay->P > 1 && g->wte >= 0;
  g->own_lo = par_piece(m->nparams, g->D, g->rank);
  g->own_hi = par_piece(m->nparams, g->D, g->rank + 1);
  g->final = util_calloc((size_t)m->ntensors, 1, "gradient flags");
  g->b = util_calloc((size_t)m->ntensors, sizeof *g->b, "buckets");
  g->nb = make_buckets(m->tensors, m->ntensors, g->wte, bucket_mb, g->b);
  for (int i = 0; i < g->nb; i++) {
    grad_bucket *k = &g->b[i];
    k->req = MPI_REQUEST_NULL;
    k->counts = util_malloc((size_t)g->D * sizeof(int), "bucket counts");
    k->displs = util_malloc((size_t)g->D * sizeof(int), "bucket counts");
    for (int r = 0; r < g->D; r++) {
      size_t lo = par_piece(m->nparams, g->D, r), hi = par_piece(m->nparams, g->D, r + 1);
      size_t a = k->b0 > lo ? k->b0 : lo, e = k->b1 < hi ? k->b1 : hi;
      UTIL_CHECK(k->b1 - k->b0 < (size_t)1 << 31, NULL, "internal: a bucket of %zu floats (grad_check)", k->b1 - k->b0);
      k->counts[r] = e > a ? (int)(e - a) : 0;
      k->displs[r] = e > a ? (int)(a - k->b0) : 0;
    }
  }
  const size_t land = landing_bytes(m->nparams, lay, comm);
  if (land) g->recv = m->be->alloc(m->be, land);
  /* host staging (where MPI cannot use backend memory) of what the exchanges touch */
  const int two = comm && hier_on(comm, g->D) && !powersgd(comm); /* the two-level exchange stages its own */
  comm_stage_init(&g->gs, m->be, g->D > 1 && !two ? m->nparams : g->tied ? m->tensors[g->wte].offset + m->tensors[g->wte].numel : 0,
                  sizeof(float));
  comm_stage_init(&g->ps, m->be, g->zero && g->D > 1 ? m->nparams : 0, sizeof(float));
  comm_stage_init(&g->rs, m->be, land / sizeof(float), sizeof(float));
  if (powersgd(comm) && g->D > 1) {
    MPI_Comm intra, cross;
    if (hier_on(comm, g->D)) hier_split(comm, lay, &intra, &cross);
    else MPI_Comm_dup(MPI_COMM_SELF, &intra), MPI_Comm_dup(g->dp, &cross);
    g->px = psgd_create(m, comm, seed, intra, cross);
    g->two = hier_on(comm, g->D);
  } else if (comm && g->D > 1) {
    qexch_bucket *q = qexch_buckets(g);
    if (two) g->hx = hier_create(m, lay, comm, adapt_period, seed, g->nb, q), g->qx = hier_qexch(g->hx);
    else g->qx = qexch_create(comm, adapt_period, seed, m, g->nb, q, g->dp, lay->comm);
    free(q);
  }
  if (g->D > 1 && !two) g->spans = hier_spans(comm, lay); /* the flat exchange's (fp32 steps') bytes between nodes */
  g->warmup = comm ? comm->warmup_steps : 0;
  describe_holders(g);
  return g;
}

void grad_free(grad_exchange *g) {
  if (!g) return;
  if (g->hx) hier_free(g->hx);
  else qexch_free(g->qx);
  psgd_free(g->px);
  for (int i = 0; i < g->nb; i++) free(g->b[i].counts), free(g->b[i].displs);
  free(g->b);
  free(g->final);
  if (g->recv) g->model->be->free(g->model->be, g->recv);
  comm_stage_free(&g->gs);
  comm_stage_free(&g->ps);
  comm_stage_free(&g->rs);
  free(g);
}

void grad_own_range(const grad_exchange *g, size_t *lo, size_t *hi) {
  *lo = g->zero ? g->own_lo : 0;
  *hi = g->zero ? g->own_hi : g->model->nparams;
}

void grad_begin(grad_exchange *g, long step) {
  memset(g->final, 0, (size_t)g->model->ntensors);
  g->next = g->nb - 1;
  g->step = step;
}

/* ZeRO-1: where bucket k's share of this replica lands in g->recv, in floats (0 for no share). */
static size_t landing_at(const grad_exchange *g, const grad_bucket *k) {
  return k->counts[g->rank] ? k->b0 + (size_t)k->displs[g->rank] - g->own_lo : 0;
}
static float *landing(const grad_exchange *g, const grad_bucket *k) { return g->recv + landing_at(g, k); }

static void launch(grad_exchange *g, grad_bucket *k) {
  if (g->D == 1) return;
  if (g->hx) {
    hier_launch(g->hx, (int)(k - g->b), g->step, compressed(g));
    g->st.fp32_bytes += (double)(k->b1 - k->b0) * sizeof(float);
    return;
  }
  if (compressed(g) && g->px) { /* after the backward pass, in grad_finish */
    g->st.fp32_bytes += (double)(k->b1 - k->b0) * sizeof(float);
    return;
  }
  if (compressed(g)) {
    int i = (int)(k - g->b);
    qexch_launch(g->qx, i, g->step, &k->req);
    g->st.bytes += (double)qexch_message_bytes(g->qx, i);
    g->st.fp32_bytes += (double)qexch_fp32_bytes(g->qx, i);
    if (g->spans) g->st.inter_bytes += (double)qexch_message_bytes(g->qx, i);
    return;
  }
  int n = (int)(k->b1 - k->b0);
  float *buf = comm_stage_send(&g->gs, k->b0, g->model->grads + k->b0, (size_t)n);
  if (g->zero)
    MPI_Ireduce_scatter(buf, comm_stage_recv(&g->rs, landing_at(g, k), landing(g, k)), k->counts,
                        MPI_FLOAT, MPI_SUM, g->dp, &k->req);
  else
    MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, g->dp, &k->req);
  g->st.bytes += (double)n * sizeof(float);
  g->st.fp32_bytes += (double)n * sizeof(float);
  if (g->spans) g->st.inter_bytes += (double)n * sizeof(float);
}

/* Launch, in order, every bucket whose tensors are all final. */
static void launch_ready(grad_exchange *g) {
  while (g->next >= 0) {
    grad_bucket *k = &g->b[g->next];
    for (int t = k->t0; t < k->t1; t++)
      if (!g->final[t]) return;
    launch(g, k);
    g->next--;
  }
}

void grad_hook(void *ctx, int what) {
  grad_exchange *g = ctx;
  gpt_model *m = g->model;
  for (int t = 0; t < m->ntensors; t++) {
    const gpt_tensor *x = &m->tensors[t];
    if (t == g->wte) continue; /* final after the tied sum, in grad_finish */
    if (x->layer == what) g->final[t] = 1; /* a block, GPT_HOOK_HEAD or GPT_HOOK_EMBED */
  }
  launch_ready(g);
  /* let the collectives already under way progress */
  for (int i = g->nb - 1; i > g->next; i--) {
    int done;
    if (g->hx) hier_test(g->hx, i);
    else if (g->b[i].req != MPI_REQUEST_NULL) MPI_Test(&g->b[i].req, &done, MPI_STATUS_IGNORE);
  }
}

void grad_finish(grad_exchange *g) {
  gpt_model *m = g->model;
  double t0 = util_now();
  if (g->tied) {
    const gpt_tensor *w = &m->tensors[g->wte];
    float *buf = comm_stage_send(&g->gs, w->offset, m->grads + w->offset, w->numel);
    comm_allreduce_sum(buf, w->numel, g->lay->embed);
    comm_stage_done(&g->gs, w->offset, m->grads + w->offset, w->numel);
    g->st.bytes += (double)w->numel * sizeof(float);
  }
  memset(g->final, 1, (size_t)m->ntensors);
  launch_ready(g);
  if (compressed(g) && g->px) {
    psgd_stats ps = {0};
    psgd_exchange(g->px, g->step, &ps);
    g->st.bytes += ps.bytes, g->st.encode_s += ps.encode_s, g->st.decode_s += ps.decode_s;
    g->st.q_measured += ps.err2, g->st.q_expected += ps.err2, g->st.q_norm2 += ps.norm2;
    g->st.inter_bytes += g->two ? ps.cross : g->spans ? ps.bytes : 0;
    g->st.wait_s += util_now() - t0;
    return;
  }
  for (int i = 0; i < g->nb; i++) {
    grad_bucket *k = &g->b[i];
    if (k->req != MPI_REQUEST_NULL) MPI_Wait(&k->req, MPI_STATUS_IGNORE);
    if (g->D == 1) continue;
    if (g->hx) { /* the whole bucket summed on every replica, as with compression */
      g->st.decode_s += hier_finish(g->hx, i);
    } else if (compressed(g)) { /* the whole bucket summed: a ZeRO-1 replica then reads its piece of it */
      g->st.decode_s += qexch_finish(g->qx, i);
    } else if (!g->zero) {
      comm_stage_done(&g->gs, k->b0, m->grads + k->b0, k->b1 - k->b0);
    } else if (k->counts[g->rank]) {
      size_t n = (size_t)k->counts[g->rank];
      comm_stage_done(&g->rs, landing_at(g, k), landing(g, k), n);
      m->be->copy(m->be, m->grads + k->b0 + k->displs[g->rank], landing(g, k), n * sizeof(float));
    }
  }
  if (compressed(g)) qexch_end_step(g->qx, g->step);
  g->st.wait_s += util_now() - t0;
}

/* Whether tensor i's gradients count in the norm on this rank: the first stage counts the tied
 * embedding, tensor rank 0 the tensors every tensor rank holds. */
static int counted(const grad_exchange *g, int i) {
  if (g->tied && i == g->wte && g->lay->stage == g->lay->P - 1) return 0;
  return gpt_tensor_owned(g->model, &g->model->tensors[i]);
}

void grad_sumsq(const grad_exchange *g, double *acc) {
  const gpt_model *m = g->model;
  for (int i = 0; i < m->ntensors;) { /* runs of counted tensors, clipped to this rank's own range */
    int j = i;
    while (j < m->ntensors && counted(g, j) == counted(g, i)) j++;
    size_t lo = m->tensors[i].offset, hi = m->tensors[j - 1].offset + m->tensors[j - 1].numel;
    lo = lo > g->own_lo ? lo : g->own_lo;
    hi = hi < g->own_hi ? hi : g->own_hi;
    if (counted(g, i) && hi > lo) m->be->reduce_sum(m->be, acc, m->grads + lo, hi - lo, 1);
    i = j;
  }
}

void grad_gather_params(grad_exchange *g) {
  if (!g->zero || g->D == 1) return;
  double t0 = util_now();
  MPI_Request *req = util_malloc((size_t)g->nb * sizeof *req, "all-gather requests");
  for (int i = 0; i < g->nb; i++) {
    grad_bucket *k = &g->b[i];
    size_t mine = k->b0 + (size_t)k->displs[g->rank]; /* this replica's updated piece goes out */
    comm_stage_send(&g->ps, mine, g->model->params + mine, (size_t)k->counts[g->rank]);
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, comm_stage_recv(&g->ps, k->b0, g->model->params + k->b0), k->counts,
                    k->displs, MPI_FLOAT, g->dp, &req[i]);
    g->st.bytes += (double)k->counts[g->rank] * sizeof(float);
    if (g->spans) g->st.inter_bytes += (double)k->counts[g->rank] * sizeof(float);
  }
  for (int i = 0; i < g->nb; i++) {
    MPI_Wait(&req[i], MPI_STATUS_IGNORE);
    comm_stage_done(&g->ps, g->b[i].b0, g->model->params + g->b[i].b0, g->b[i].b1 - g->b[i].b0);
    gpt_params_changed(g->model, g->b[i].b0, g->b[i].b1); /* the other replicas' pieces */
  }
  free(req);
  g->st.wait_s += util_now() - t0;
}

grad_stats grad_take_stats(grad_exchange *g) {
  if (g->hx) {
    double intra, inter;
    hier_take_bytes(g->hx, &intra, &inter);
    g->st.bytes += intra + inter, g->st.inter_bytes += inter;
  }
  grad_stats s = g->st;
  if (g->qx) {
    qexch_error e = qexch_take_error(g->qx);
    s.encode_s = qexch_take_encode_s(g->qx);
    s.q_measured = e.measured, s.q_expected = e.expected, s.q_norm2 = e.norm2;
  }
  memset(&g->st, 0, sizeof g->st);
  return s;
}

float *grad_residual(grad_exchange *g) { return g->px ? psgd_residual(g->px) : qexch_residual(g->qx); }
const char *grad_residual_holders(const grad_exchange *g) { return g->holders; }
void grad_holders_one_level(long long D, char *buf, size_t len) {
  util_snprintf(buf, len, "%lld replicas, each over all its values", D);
}
float *grad_lowrank_q(grad_exchange *g, int *t0, int *t1, int *writes) {
  *t0 = *t1 = *writes = 0;
  return g->px ? psgd_q(g->px, t0, t1, writes) : NULL;
}

void grad_residual_sync(grad_exchange *g, int to_host) {
  if (g->px) psgd_sync(g->px, to_host);
  else qexch_residual_sync(g->qx, to_host);
}

int grad_levels(const grad_exchange *g, float *level) { return g->qx ? qexch_levels(g->qx, level) : 0; }

void grad_set_levels(grad_exchange *g, const float *level, int n) {
  if (g->qx) qexch_set_levels(g->qx, level, n);
}
