/* psgd: PowerSGD among the replicas of a stage (psgd.h). */
#include "parallel/psgd.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"
#include "parallel/comm.h"

int psgd_factored(const gpt_tensor *t, long r) {
  const double n = t->rows, m = t->cols;
  return t->rows > 1 && t->cols > 1 && (n + m) * (double)r * 2.0 <= n * m;
}

size_t psgd_q_floats(const gpt_tensor *t, int n, long r) {
  size_t q = 0;
  for (int i = 0; i < n; i++)
    if (psgd_factored(&t[i], r)) q += (size_t)t[i].cols * (size_t)r;
  return q;
}

/* The share of tensor i of t[n] in a node of R replicas: the replica whose share of the values holds
 * its middle (contiguous runs, each about a R-th of the values). */
static int owner_of(const gpt_tensor *t, int n, int R, int i) {
  double before = 0, total = 0;
  for (int j = 0; j < n; j++) total += (double)t[j].numel, before += j < i ? (double)t[j].numel : 0;
  const int l = (int)((double)R * (before + 0.5 * (double)t[i].numel) / (total > 0 ? total : 1));
  return l < R ? l : R - 1;
}

void psgd_owned(const gpt_tensor *t, int n, int R, int local, int *t0, int *t1) {
  *t0 = *t1 = 0;
  while (*t0 < n && owner_of(t, n, R, *t0) < local) (*t0)++;
  *t1 = *t0;
  while (*t1 < n && owner_of(t, n, R, *t1) == local) (*t1)++;
}

/* Floats of the first all-reduce: each factored tensor's P (rows x r), every other tensor whole. */
static size_t p_floats(const gpt_tensor *t, int n, long r) {
  size_t p = 0;
  for (int i = 0; i < n; i++) p += psgd_factored(&t[i], r) ? (size_t)t[i].rows * (size_t)r : t[i].numel;
  return p;
}

size_t psgd_plan_bytes(const cfg_comm *c, const gpt_tensor *t, int n) {
  return (p_floats(t, n, c->powersgd_rank) + psgd_q_floats(t, n, c->powersgd_rank)) * sizeof(float);
}

size_t psgd_plan_device_bytes(const cfg_comm *c, const gpt_tensor *t, int n, size_t nparams, const backend *be) {
  if (be->caps.host_memory) return 0;
  const size_t q = psgd_q_floats(t, n, c->powersgd_rank); /* the messages (P, Q), the warm start, the residual */
  return (p_floats(t, n, c->powersgd_rank) + 2 * q + nparams) * sizeof(float) + 2 * sizeof(double);
}

struct psgd {
  gpt_model *model;
  const backend *be;
  MPI_Comm intra, cross;
  int R, me, N;      /* replicas on a node, this one's place there, nodes */
  int t0, t1;        /* the tensors this replica leads */
  size_t *cut;       /* replica l of a node leads the values [cut[l], cut[l + 1]) of the buffer */
  MPI_Request *req;  /* the in-node collectives of a step */
  int r, dev;        /* the rank; whether the buffers are backend (device) memory */
  long error_every;
  size_t np, nq;     /* floats of the first message, of Q */
  float *p, *q, *qw; /* the messages P (with the fp32 tensors) and Q, the warm start (nq) */
  float *ef;         /* the residual (nparams) */
  float *ef_host, *qw_host; /* dev: their host copies, for checkpoints */
  double *acc;       /* two sums (||e||^2, ||D||^2) in backend memory */
  comm_stage stage;  /* host staging of the messages where MPI cannot read backend memory */
  comm_stage grads;  /* and of the gradients, for the sums inside a node */
};

static float *floats(const psgd *x, size_t n) {
  return x->dev ? x->be->alloc(x->be, (n ? n : 1) * sizeof(float)) : util_calloc(n ? n : 1, sizeof(float), "PowerSGD");
}
static void release(const psgd *x, void *p) {
  if (x->dev) x->be->free(x->be, p);
  else free(p);
}

psgd *psgd_create(gpt_model *m, const cfg_comm *c, uint64_t seed, MPI_Comm intra, MPI_Comm cross) {
  psgd *x = util_calloc(1, sizeof *x, "PowerSGD");
  x->model = m, x->be = m->be, x->intra = intra, x->cross = cross, x->r = (int)c->powersgd_rank;
  x->error_every = c->error_every;
  MPI_Comm_size(intra, &x->R), MPI_Comm_rank(intra, &x->me), MPI_Comm_size(cross, &x->N);
  x->cut = util_malloc(((size_t)x->R + 1) * sizeof *x->cut, "PowerSGD");
  size_t nreq = 0;
  x->cut[0] = 0;
  for (int l = 0; l < x->R; l++) { /* the runs follow one another through the buffer (a run may be empty) */
    int a, b;
    psgd_owned(m->tensors, m->ntensors, x->R, l, &a, &b);
    x->cut[l + 1] = a < b ? m->tensors[b - 1].offset + m->tensors[b - 1].numel : x->cut[l];
    nreq += (x->cut[l + 1] - x->cut[l]) / COMM_CHUNK + 1;
    if (l == x->me) x->t0 = a, x->t1 = b;
  }
  x->req = util_malloc(nreq * sizeof *x->req, "PowerSGD requests");
  x->dev = !m->be->caps.host_memory;
  const gpt_tensor *own = m->tensors + x->t0;
  x->np = p_floats(own, x->t1 - x->t0, x->r), x->nq = psgd_q_floats(own, x->t1 - x->t0, x->r);
  x->p = floats(x, x->np), x->q = floats(x, x->nq), x->qw = floats(x, x->nq), x->ef = floats(x, m->nparams);
  x->qw_host = util_calloc(x->nq ? x->nq : 1, sizeof(float), "PowerSGD warm start");
  size_t at = 0; /* the first Q: normal values from (seed, RNG_LOWRANK, the tensor's index) */
  for (int i = x->t0; i < x->t1; i++) {
    const gpt_tensor *t = &m->tensors[i];
    if (!psgd_factored(t, x->r)) continue;
    rng_state g;
    rng_seed(&g, seed, RNG_LOWRANK, (uint64_t)t->index);
    for (size_t k = 0; k < (size_t)t->cols * (size_t)x->r; k++) x->qw_host[at + k] = (float)rng_normal(&g);
    at += (size_t)t->cols * (size_t)x->r;
  }
  if (x->dev) {
    x->ef_host = util_calloc(m->nparams, sizeof(float), "error-feedback residual");
    x->be->to_device(x->be, x->qw, x->qw_host, x->nq * sizeof(float));
  } else {
    memcpy(x->qw, x->qw_host, x->nq * sizeof(float));
  }
  x->acc = x->dev ? x->be->alloc(x->be, 2 * sizeof(double)) : util_calloc(2, sizeof(double), "PowerSGD");
  comm_stage_init(&x->stage, x->be, x->np > x->nq ? x->np : x->nq, sizeof(float));
  comm_stage_init(&x->grads, x->be, x->R > 1 ? m->nparams : 0, sizeof(float));
  return x;
}

void psgd_free(psgd *x) {
  if (!x) return;
  release(x, x->p), release(x, x->q), release(x, x->qw), release(x, x->ef), release(x, x->acc);
  free(x->ef_host), free(x->qw_host), free(x->cut), free(x->req);
  comm_stage_free(&x->stage);
  comm_stage_free(&x->grads);
  MPI_Comm_free(&x->intra), MPI_Comm_free(&x->cross);
  free(x);
}

/* buf (n floats of backend memory) summed over the replicas, in place. */
static void allreduce(psgd *x, float *buf, size_t n) {
  if (n == 0) return;
  float *h = comm_stage_send(&x->stage, 0, buf, n);
  comm_allreduce_sum(h, n, x->cross);
  comm_stage_done(&x->stage, 0, buf, n);
}

/* *sum += the sum of squares of v (n), in double, by the backend's reduce_sum into x->acc[k]. */
static void sumsq(psgd *x, int k, const float *v, size_t n, double *sum) {
  double host = 0;
  x->be->zero(x->be, x->acc + k, sizeof(double));
  x->be->reduce_sum(x->be, x->acc + k, v, n, 1);
  x->be->to_host(x->be, &host, x->acc + k, sizeof host);
  *sum += host;
}

/* P_i = (G_i + e_i) Q into each factored tensor's slot of the first message, the others copied in. */
static void left(psgd *x, int measure, psgd_stats *st) {
  const gpt_model *m = x->model;
  size_t at = 0, qa = 0;
  for (int i = x->t0; i < x->t1; i++) {
    const gpt_tensor *t = &m->tensors[i];
    float *g = m->grads + t->offset;
    if (!psgd_factored(t, x->r)) {
      x->be->copy(x->be, x->p + at, g, t->numel * sizeof(float));
      at += t->numel;
      continue;
    }
    x->be->lowrank_left(x->be, x->p + at, g, x->ef + t->offset, x->qw + qa, (size_t)t->rows, (size_t)t->cols, x->r);
    if (measure) sumsq(x, 1, g, t->numel, &st->norm2);
    at += (size_t)t->rows * (size_t)x->r, qa += (size_t)t->cols * (size_t)x->r;
  }
}

/* With the summed P: P^ orthonormal, Q_i = D_i^T P^, e_i = D_i - P^ Q_i^T; the fp32 tensors' sums back. */
static void right(psgd *x, int measure, psgd_stats *st) {
  const gpt_model *m = x->model;
  size_t at = 0, qa = 0;
  for (int i = x->t0; i < x->t1; i++) {
    const gpt_tensor *t = &m->tensors[i];
    float *g = m->grads + t->offset, *e = x->ef + t->offset;
    if (!psgd_factored(t, x->r)) {
      x->be->copy(x->be, g, x->p + at, t->numel * sizeof(float));
      at += t->numel;
      continue;
    }
    const size_t n = (size_t)t->rows, c = (size_t)t->cols;
    x->be->lowrank_orth(x->be, x->p + at, n, x->r);
    x->be->lowrank_right(x->be, x->q + qa, g, x->p + at, n, c, x->r);
    x->be->copy(x->be, e, g, t->numel * sizeof(float));
    x->be->lowrank_expand(x->be, e, x->p + at, x->q + qa, n, c, x->r, 1);
    if (measure) sumsq(x, 0, e, t->numel, &st->err2);
    at += n * (size_t)x->r, qa += c * (size_t)x->r;
  }
}

/* G = P^ Q^T with the summed Q, which is also the next step's warm start. */
static void expand(psgd *x) {
  const gpt_model *m = x->model;
  size_t at = 0, qa = 0;
  for (int i = x->t0; i < x->t1; i++) {
    const gpt_tensor *t = &m->tensors[i];
    if (!psgd_factored(t, x->r)) {
      at += t->numel;
      continue;
    }
    x->be->lowrank_expand(x->be, m->grads + t->offset, x->p + at, x->q + qa, (size_t)t->rows, (size_t)t->cols, x->r, 0);
    at += (size_t)t->rows * (size_t)x->r, qa += (size_t)t->cols * (size_t)x->r;
  }
  x->be->copy(x->be, x->qw, x->q, x->nq * sizeof(float));
}

/* Inside the node: each replica's run of tensors [cut[l], cut[l + 1]) summed onto it (to_leader), or
 * its results to the others; in place, chunk by chunk (MPI counts are ints), every collective started
 * before any is waited for (MPICH 4.0's blocking MPI_Reduce in place at a root other than 0 crashes
 * on large messages over ch4:ucx). */
static void in_node(psgd *x, int to_leader, psgd_stats *st) {
  const gpt_model *m = x->model;
  const size_t lo = x->cut[x->me], hi = x->cut[x->me + 1];
  /* MPI's view of the gradients: all of them to sum, or (this replica's results brought there) to broadcast */
  float *buf = to_leader ? comm_stage_send(&x->grads, 0, m->grads, m->nparams)
                         : (float *)comm_stage_send(&x->grads, lo, m->grads + lo, hi - lo) - lo;
  int nreq = 0;
  for (int l = 0; l < x->R; l++)
    for (size_t k = 0, at = x->cut[l]; at < x->cut[l + 1]; k++) {
      const int n = comm_chunk(x->cut[l + 1] - x->cut[l], k);
      if (to_leader) MPI_Ireduce(l == x->me ? MPI_IN_PLACE : buf + at, buf + at, n, MPI_FLOAT, MPI_SUM, l, x->intra, &x->req[nreq++]);
      else MPI_Ibcast(buf + at, n, MPI_FLOAT, l, x->intra, &x->req[nreq++]);
      at += (size_t)n;
    }
  for (int i = 0; i < nreq; i++) MPI_Wait(&x->req[i], MPI_STATUS_IGNORE);
  st->bytes += (double)(to_leader ? m->nparams : hi - lo) * sizeof(float);
  if (to_leader) comm_stage_done(&x->grads, lo, m->grads + lo, hi - lo); /* the node's sums this replica factors */
  else comm_stage_done(&x->grads, 0, m->grads, m->nparams);
}

void psgd_exchange(psgd *x, long step, psgd_stats *st) {
  const int measure = x->error_every > 0 && step % x->error_every == 0;
  if (x->R > 1) in_node(x, 1, st);
  if (x->N > 1 || x->R == 1) { /* one node of several replicas: its sums are the result */
    double t0 = util_now();
    left(x, measure, st);
    double t1 = util_now();
    allreduce(x, x->p, x->np);
    double t2 = util_now();
    right(x, measure, st);
    double t3 = util_now();
    allreduce(x, x->q, x->nq);
    double t4 = util_now();
    expand(x);
    x->be->sync(x->be);
    st->encode_s += (t1 - t0) + (t3 - t2);
    st->decode_s += util_now() - t4;
    st->bytes += (double)(x->np + x->nq) * sizeof(float), st->cross += (double)(x->np + x->nq) * sizeof(float);
  }
  if (x->R > 1) in_node(x, 0, st);
}

float *psgd_residual(psgd *x) { return x->dev ? x->ef_host : x->ef; }

int psgd_holders(const psgd *x, uint64_t *map) {
  *map = rng_hash((uint64_t)x->R, 0);
  for (int l = 0; l <= x->R; l++) *map = rng_hash(*map ^ x->cut[l], (uint64_t)l + 1);
  return x->R;
}

float *psgd_q(psgd *x, int *t0, int *t1, int *writes) {
  int node;
  MPI_Comm_rank(x->cross, &node);
  *t0 = x->t0, *t1 = x->t1, *writes = node == 0;
  return x->dev ? x->qw_host : x->qw;
}

void psgd_sync(psgd *x, int to_host) {
  if (!x->dev) return;
  const size_t ne = x->model->nparams * sizeof(float), nq = x->nq * sizeof(float);
  if (to_host) x->be->to_host(x->be, x->ef_host, x->ef, ne), x->be->to_host(x->be, x->qw_host, x->qw, nq);
  else x->be->to_device(x->be, x->ef, x->ef_host, ne), x->be->to_device(x->be, x->qw, x->qw_host, nq);
}
