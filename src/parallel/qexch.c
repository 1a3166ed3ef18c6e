/* qexch: compressed all-gather of gradient buckets (see qexch.h). */
#include "parallel/qexch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"
#include "parallel/psgd.h"

/* A bucket's segments (quant_seg) are its tensors' quantization buckets and small tensors: values at
 * of the bucket, their random bits' id the tensor's place in the whole model and the first value's in
 * the tensor, the same on every stage that holds the tensor (the tied embedding). */
typedef struct {
  size_t b0, b1, lo, hi, bytes; /* the gradient bucket, the range this exchange carries, the message's bytes */
  quant_seg *seg;
  int nseg;
  uint8_t *send, *recv; /* all-gather: (bytes), (D x bytes) */
  /* where the backend's ops read and write: backend memory (the segments, a message, D + 1 messages)
   * when the gradients live on a device, else the host buffers above */
  quant_seg *dseg;
  uint8_t *dsend, *drecv;
  /* integer sum: the shared scale of each quantized segment, the integers of the quantized values,
   * the raw values; their counts; the raw values' all-reduce (the integers' is the caller's) */
  float *scale, *raw;
  int16_t *ints;
  int8_t *ints8; /* the integers in 8 bits, when D x s fits */
  size_t nscale, nint, nraw;
  MPI_Request raw_req;
  /* reduce-scatter/all-gather: owner r sums segments [own[r], own[r + 1]), whose bytes are
   * [off[r], off[r + 1]) of a message; cnt[r] their length */
  int *own, *cnt, *off;
  int *rcnt, *rdis; /* what this owner receives from each replica, and where */
  long step;        /* of the launch, for the owner's random bits */
} qbucket;

struct qexch {
  quant_scheme q;
  uint64_t seed;
  const gpt_model *m;
  MPI_Comm dp, all; /* the replicas; every rank of the job (the adaptive levels are the same on every stage) */
  int D, rank;
  qbucket *b;
  int nb;
  float *host; /* a bucket's values on the host, when the backend's memory is not host memory */
  size_t host_n;
  double encode_s;
  long error_every;
  int adaptive;      /* 1 alq, 2 amq: levels refitted on a schedule */
  long adapt_period;
  quant_hist *hist;  /* adaptive: this step's statistics, when it is a fitting step */
  int intsum;     /* &comm exchange = 'intsum' */
  int sra;        /* &comm exchange = 'sra' */
  int narrow;     /* intsum: the sums fit in int8 */
  qexch_error err;
  float *scratch; /* a quantization bucket decoded, for the error */
  size_t scratch_n;
  float *ef;      /* error feedback: this replica's residual, (nparams) of the stage's buffer, or NULL */
  int dev;        /* the gradients are on a device: encoded and decoded there (not the integer sum) */
  float *ef_host; /* dev: the residual's host copy, for checkpoints */
};

static void scheme_of(const cfg_comm *c, quant_scheme *q) {
  int bits = (int)c->bits;
  switch (cfg_comm_method_of(c)) {
  case CFG_COMM_NUQSGD: case CFG_COMM_ALQ: case CFG_COMM_AMQ: quant_exponential(q, bits, QUANT_L2); break;
  case CFG_COMM_QSGD: quant_uniform(q, bits, QUANT_L2); break;
  case CFG_COMM_QSGDINF: quant_uniform(q, bits, QUANT_MAX); break;
  case CFG_COMM_MINMAX: case CFG_COMM_NONE: case CFG_COMM_POWERSGD: quant_uniform(q, bits, QUANT_MINMAX); break;
  case CFG_COMM_TOPK: quant_topk(q, (uint32_t)llround(c->topk_fraction * 1e6)); break;
  }
}


/* What the segments of a range hold: their count, the quantized ones', the values quantized and
 * raw, and the byte message's bytes. */
typedef struct {
  size_t nseg, nquant, qvalues, raw, bytes;
} seg_count;

/* The segments of the values [lo, hi) of tensors t[0..n) (offsets in the stage's buffer): a tensor
 * of at least min_numel values in quantization buckets of qb values (q: their bytes) from its first
 * value in the range, a smaller one raw, in one segment; q NULL: every tensor raw. Counted, and with
 * seg (room for the count) written, `at` from b0, their random bits' id the tensor's place in the
 * whole model and the first value's in the tensor (the same on every stage that holds the tensor). */
static seg_count walk_segments(const quant_scheme *q, const gpt_tensor *t, int n, size_t lo, size_t hi, size_t qb,
                               size_t min_numel, size_t b0, quant_seg *seg) {
  seg_count c = {0};
  for (int i = 0; i < n; i++) {
    size_t end = t[i].offset + t[i].numel, a = t[i].offset > lo ? t[i].offset : lo, e = end < hi ? end : hi;
    if (e <= a) continue;
    if (!q || t[i].numel < min_numel) {
      if (seg) seg[c.nseg] = (quant_seg){.at = a - b0, .n = e - a, .off = c.bytes, .quantized = 0};
      c.nseg++, c.raw += e - a, c.bytes += (e - a) * sizeof(float);
      continue;
    }
    const size_t len = e - a, full = len / qb, rest = len % qb, nb = full + (rest > 0);
    for (size_t j = 0; seg && j < nb; j++)
      seg[c.nseg + j] = (quant_seg){.at = a - b0 + j * qb, .n = j < full ? qb : rest, .off = c.bytes + j * quant_bytes(q, qb),
                                    .quantized = 1, .id = (uint64_t)t[i].index << 40 | (a - t[i].offset + j * qb)};
    c.nseg += nb, c.nquant += nb, c.qvalues += len;
    c.bytes += full * quant_bytes(q, qb) + (rest ? quant_bytes(q, rest) : 0);
  }
  return c;
}

/* Whether the integer sums of D replicas fit in int8 containers. */
static int narrow_sums(const quant_scheme *q, int D) { return (long)D * (q->nlevels - 1) <= 127; }

/* Bytes of the integer sum's message of the segments counted in c: a scale per quantized segment, an
 * integer per quantized value, the raw values. */
static size_t intsum_bytes(const seg_count *c, int narrow) {
  return c->nquant * sizeof(float) + c->qvalues * (narrow ? 1 : 2) + c->raw * sizeof(float);
}

/* The message of the values [lo, hi) of tensors t (n) under &comm c with D replicas: its bytes (the
 * all-gather's; their fp32 bytes when c compresses nothing), its segments' count into *nseg. */
static size_t plan_message(const cfg_comm *c, const gpt_tensor *t, int n, size_t lo, size_t hi, int D, size_t *nseg) {
  quant_scheme q;
  int on = cfg_comm_compressed(c);
  if (on) scheme_of(c, &q);
  seg_count k = walk_segments(on ? &q : NULL, t, n, lo, hi, on ? (size_t)cfg_comm_bucket(c) : 1, (size_t)c->min_numel, 0, NULL);
  *nseg = k.nseg;
  return on && cfg_comm_exchange_of(c) == CFG_EXCHANGE_INTSUM ? intsum_bytes(&k, narrow_sums(&q, D)) : k.bytes;
}

int qexch_check(const cfg_config *cfg, int D, double values, err_list *errs) {
  const cfg_comm *c = &cfg->comm;
  if (!cfg_comm_compressed(c) || D < 2) return 0;
  long n0 = err_count(errs);
  quant_scheme q;
  scheme_of(c, &q);
  if (cfg_comm_exchange_of(c) == CFG_EXCHANGE_INTSUM && (long)D * (q.nlevels - 1) > 32767) {
    int bits = (int)c->bits - 1; /* the widest that fits, if any */
    for (quant_scheme f; bits >= 2; bits--) {
      quant_uniform(&f, bits, q.norm);
      if ((long)D * (f.nlevels - 1) <= 32767) break;
    }
    char hint[160];
    if (bits >= 2) util_snprintf(hint, sizeof hint, "set &comm bits = %d or fewer, or exchange = 'allgather'", bits);
    else util_snprintf(hint, sizeof hint, "use fewer replicas, or exchange = 'allgather'");
    cfg_error_at(cfg, errs, "comm", "exchange", hint,
                 "exchange = 'intsum' with %d replicas: %d x %d levels overflow the 16-bit integer sums", D, D, q.nlevels - 1);
  }
  double qb = (double)cfg_comm_bucket(c), bytes = ceil(values / qb) * (double)quant_bytes(&q, (size_t)qb);
  if (bytes >= 2147483648.0)
    cfg_error_at(cfg, errs, "parallel", "bucket_mb", "lower bucket_mb, or raise &comm quant_bucket (fewer scales)",
                 "a compressed bucket of %.0f values would take %.3g bytes, beyond MPI's 32-bit counts", values, bytes);
  return (int)(err_count(errs) - n0);
}

size_t qexch_plan_bytes(const cfg_comm *c, const gpt_tensor *t, int n, int D) {
  if (cfg_comm_method_of(c) == CFG_COMM_POWERSGD) return psgd_plan_bytes(c, t, n); /* not a quantizer: psgd.h */
  size_t nseg, bytes = plan_message(c, t, n, 0, SIZE_MAX, D, &nseg);
  if (cfg_comm_compressed(c) && cfg_comm_exchange_of(c) == CFG_EXCHANGE_SRA && D > 0) bytes += bytes / (size_t)D; /* and a D-th of it, the sums */
  return bytes;
}

int qexch_residual_on_device(const cfg_comm *c, int D, const backend *be) {
  return !be->caps.host_memory && D > 1 && cfg_comm_compressed(c) && cfg_comm_exchange_of(c) != CFG_EXCHANGE_INTSUM;
}

size_t qexch_plan_device_bytes(const cfg_comm *c, const gpt_tensor *t, int n, size_t lo, size_t hi, int D, const backend *be) {
  if (!qexch_residual_on_device(c, D, be)) return 0; /* the messages are where the residual is */
  size_t nseg, bytes = plan_message(c, t, n, lo, hi, D, &nseg); /* segments, a message, D + 1 */
  return nseg * sizeof(quant_seg) + bytes * (size_t)(D + 2);
}

/* Reduce-scatter/all-gather: the segments cut into D contiguous ranges of about equal values, one
 * per owner; a send buffer for the whole message, one to receive the D replicas' parts of this
 * replica's range, and one for the all-gathered sums (a whole message again). */
static void plan_owners(qexch *x, qbucket *k) {
  const int D = x->D;
  k->own = util_malloc((size_t)(D + 1) * sizeof *k->own, "owners");
  k->cnt = util_malloc((size_t)D * sizeof *k->cnt, "owners");
  k->off = util_malloc((size_t)(D + 1) * sizeof *k->off, "owners");
  size_t total = k->hi - k->lo, seen = 0;
  int r = 0;
  k->own[0] = 0;
  for (int s = 0; s < k->nseg; s++) {
    while (r + 1 < D && seen >= total * (size_t)(r + 1) / (size_t)D) k->own[++r] = s;
    seen += k->seg[s].n;
  }
  while (r + 1 <= D) k->own[++r] = k->nseg;
  for (r = 0; r <= D; r++) k->off[r] = k->own[r] < k->nseg ? (int)k->seg[k->own[r]].off : (int)k->bytes;
  for (r = 0; r < D; r++) k->cnt[r] = k->off[r + 1] - k->off[r];
  size_t mine = (size_t)k->cnt[x->rank];
  k->rcnt = util_malloc((size_t)D * sizeof *k->rcnt, "owners");
  k->rdis = util_malloc((size_t)D * sizeof *k->rdis, "owners");
  for (r = 0; r < D; r++) k->rcnt[r] = (int)mine, k->rdis[r] = r * (int)mine;
  k->send = util_malloc(k->bytes + 1, "compressed message");
  k->recv = util_malloc(mine * (size_t)D + k->bytes + 1, "compressed parts and sums"); /* parts, then the sums */
}

/* Bucket k's segments (walk_segments over its range) and its buffers. */
static void plan_bucket(qexch *x, qbucket *k, const gpt_model *m, const qexch_bucket *b, size_t qb, size_t min_numel) {
  const gpt_tensor *t = m->tensors + b->t0;
  const int nt = b->t1 - b->t0;
  seg_count c = walk_segments(&x->q, t, nt, b->lo, b->hi, qb, min_numel, b->b0, NULL);
  k->seg = util_calloc(c.nseg ? c.nseg : 1, sizeof *k->seg, "compressed segments");
  walk_segments(&x->q, t, nt, b->lo, b->hi, qb, min_numel, b->b0, k->seg);
  k->nseg = (int)c.nseg, k->bytes = c.bytes;
  UTIL_CHECK(k->bytes < (size_t)1 << 31, NULL, "internal: a compressed bucket of %zu bytes (qexch_check)", k->bytes);
  if (x->sra) {
    plan_owners(x, k);
    return;
  }
  if (!x->intsum) {
    k->send = util_malloc(k->bytes ? k->bytes : 1, "compressed message");
    k->recv = util_malloc(k->bytes * (size_t)x->D + 1, "compressed messages received");
    return;
  }
  k->nscale = c.nquant, k->nint = c.qvalues, k->nraw = c.raw;
  k->bytes = intsum_bytes(&c, x->narrow);
  k->scale = util_malloc(k->nscale * sizeof(float) + 4, "shared scales");
  k->raw = util_malloc(k->nraw * sizeof(float) + 4, "uncompressed values");
  k->ints = util_malloc(k->nint * sizeof(int16_t) + 2, "integer codes");
  k->ints8 = util_malloc(k->nint + 1, "integer codes");
  k->raw_req = MPI_REQUEST_NULL;
}

/* Where the backend's ops work on bucket k: with the gradients on a device, backend memory for its
 * segments, a message and D + 1 messages (the all-gather's D, or the reduce-scatter's parts and sums);
 * else the host buffers themselves. */
static void device_buffers(qexch *x, qbucket *k) {
  const backend *be = x->m->be;
  if (!x->dev) {
    k->dseg = k->seg, k->dsend = k->send, k->drecv = k->recv;
    return;
  }
  k->dseg = be->alloc(be, (size_t)k->nseg * sizeof *k->seg);
  be->to_device(be, k->dseg, k->seg, (size_t)k->nseg * sizeof *k->seg);
  k->dsend = be->alloc(be, k->bytes);
  k->drecv = be->alloc(be, k->bytes * (size_t)(x->D + 1));
}

qexch *qexch_create(const cfg_comm *c, long adapt_period, uint64_t seed, const gpt_model *m, int nb, const qexch_bucket *b,
                    MPI_Comm dp, MPI_Comm all) {
  if (!cfg_comm_compressed(c)) return NULL;
  qexch *x = util_calloc(1, sizeof *x, "compressed exchange");
  scheme_of(c, &x->q);
  x->seed = seed;
  x->m = m;
  x->dp = dp;
  x->all = all;
  MPI_Comm_size(dp, &x->D);
  MPI_Comm_rank(dp, &x->rank);
  x->nb = nb;
  x->error_every = c->error_every;
  cfg_comm_method method = cfg_comm_method_of(c);
  x->adaptive = method == CFG_COMM_ALQ ? 1 : method == CFG_COMM_AMQ ? 2 : 0;
  x->adapt_period = adapt_period > 0 ? adapt_period : 1;
  if (x->adaptive) x->hist = util_calloc(1, sizeof *x->hist, "level statistics");
  x->intsum = cfg_comm_exchange_of(c) == CFG_EXCHANGE_INTSUM;
  x->sra = cfg_comm_exchange_of(c) == CFG_EXCHANGE_SRA;
  if (x->intsum) { /* D integers of at most s each must add up without overflow */
    long most = (long)x->D * (x->q.nlevels - 1);
    UTIL_CHECK(most <= 32767, NULL, "internal: %d replicas x %d levels overflow 16-bit sums (qexch_check)", x->D,
               x->q.nlevels - 1);
    x->narrow = narrow_sums(&x->q, x->D);
  }
  const backend *be = m->be;
  x->dev = qexch_residual_on_device(c, x->D, be);
  x->b = util_calloc((size_t)nb, sizeof *x->b, "compressed buckets");
  size_t qb = (size_t)cfg_comm_bucket(c);
  for (int i = 0; i < nb; i++) {
    x->b[i].b0 = b[i].b0, x->b[i].b1 = b[i].b1, x->b[i].lo = b[i].lo, x->b[i].hi = b[i].hi;
    plan_bucket(x, &x->b[i], m, &b[i], qb, (size_t)c->min_numel);
    device_buffers(x, &x->b[i]);
    if (b[i].b1 - b[i].b0 > x->host_n) x->host_n = b[i].b1 - b[i].b0;
  }
  if (!be->caps.host_memory) x->host = util_malloc(x->host_n * sizeof(float) + 1, "bucket on the host");
  x->scratch_n = (size_t)cfg_comm_bucket(c);
  x->scratch = util_malloc(x->scratch_n * sizeof(float), "decoded bucket");
  size_t np = m->nparams ? m->nparams : 1;
  if (c->error_feedback && x->dev) x->ef = be->alloc(be, np * sizeof(float)), x->ef_host = util_calloc(np, sizeof(float), "residual");
  else if (c->error_feedback) x->ef = util_calloc(np, sizeof(float), "error-feedback residual");
  return x;
}

void qexch_free(qexch *x) {
  if (!x) return;
  const backend *be = x->m->be;
  for (int i = 0; i < x->nb; i++) {
    qbucket *k = &x->b[i];
    if (x->dev) be->free(be, k->dseg), be->free(be, k->dsend), be->free(be, k->drecv);
    free(k->seg), free(k->send), free(k->recv), free(k->scale), free(k->raw), free(k->ints), free(k->ints8);
    free(k->own), free(k->cnt), free(k->off), free(k->rcnt), free(k->rdis);
  }
  free(x->b);
  free(x->host);
  free(x->scratch);
  if (x->dev && x->ef) be->free(be, x->ef);
  else free(x->ef);
  free(x->ef_host);
  free(x->hist);
  free(x);
}

size_t qexch_message_bytes(const qexch *x, int i) {
  /* reduce-scatter/all-gather: the whole message to the owners, then this replica's sums */
  return x->b[i].bytes + (x->sra ? (size_t)x->b[i].cnt[x->rank] : 0);
}
size_t qexch_fp32_bytes(const qexch *x, int i) { return (x->b[i].hi - x->b[i].lo) * sizeof(float); }

size_t qexch_host_bytes(const qexch *x) {
  size_t n = x->host ? x->host_n * sizeof(float) : 0;
  for (int i = 0; i < x->nb; i++)
    n += x->intsum ? x->b[i].bytes + x->b[i].nint * 2
       : x->sra   ? x->b[i].bytes * 2 + (size_t)x->b[i].cnt[x->rank] * (size_t)x->D
                  : x->b[i].bytes * (size_t)(1 + x->D);
  return n;
}

/* The bucket's values on the host: the gradients themselves, or a copy. */
static float *host_values(qexch *x, const qbucket *k, int fetch) {
  const backend *be = x->m->be;
  if (be->caps.host_memory) return x->m->grads + k->b0;
  if (fetch) be->to_host(be, x->host, x->m->grads + k->b0, (k->b1 - k->b0) * sizeof(float));
  return x->host;
}

/* The error of this replica's message of bucket k against its values v, and its expectation. */
static void measure_error(qexch *x, const qbucket *k, const float *v) {
  if (x->intsum) return; /* the shared scale is known only after the agreement: not measured */
  for (int s = 0; s < k->nseg; s++) {
    const quant_seg *g = &k->seg[s];
    if (!g->quantized) continue;
    quant_decode(&x->q, k->send + g->off, g->n, x->scratch, 0);
    for (size_t j = 0; j < g->n; j++) {
      double d = (double)x->scratch[j] - v[g->at + j];
      x->err.measured += d * d;
      x->err.norm2 += (double)v[g->at + j] * v[g->at + j];
    }
    x->err.expected += quant_expected(&x->q, v + g->at, g->n);
  }
}

qexch_error qexch_take_error(qexch *x) {
  qexch_error e = x->err;
  memset(&x->err, 0, sizeof x->err);
  return e;
}

/* Integer sum: agree on each segment's scale (the replicas' largest), round to integers, and start
 * their all-reduce (in *req) and the raw values' (in the bucket). */
static void launch_intsum(qexch *x, qbucket *k, const float *v, uint64_t key, MPI_Request *req) {
  size_t a = 0, b = 0, c = 0;
  for (int s = 0; s < k->nseg; s++)
    if (k->seg[s].quantized) k->scale[a++] = quant_scale(&x->q, v + k->seg[s].at, k->seg[s].n);
  MPI_Allreduce(MPI_IN_PLACE, k->scale, (int)k->nscale, MPI_FLOAT, MPI_MAX, x->dp);
  a = 0;
  for (int s = 0; s < k->nseg; s++) {
    const quant_seg *g = &k->seg[s];
    if (!g->quantized) {
      memcpy(k->raw + c, v + g->at, g->n * sizeof(float)), c += g->n;
      continue;
    }
    quant_int_encode(&x->q, v + g->at, g->n, k->scale[a], rng_hash(key, g->id), k->ints + b);
    if (x->ef) quant_int_feedback_take(&x->q, k->ints + b, k->scale[a], v + g->at, g->n, x->ef + k->b0 + g->at);
    a++, b += g->n;
  }
  if (x->narrow)
    for (size_t j = 0; j < k->nint; j++) k->ints8[j] = (int8_t)k->ints[j];
  MPI_Iallreduce(MPI_IN_PLACE, x->narrow ? (void *)k->ints8 : (void *)k->ints, (int)k->nint,
                 x->narrow ? MPI_INT8_T : MPI_INT16_T, MPI_SUM, x->dp, req);
  MPI_Iallreduce(MPI_IN_PLACE, k->raw, (int)k->nraw, MPI_FLOAT, MPI_SUM, x->dp, &k->raw_req);
}

/* Integer sum: the sums back to values, into out. */
static void finish_intsum(qexch *x, qbucket *k, float *out) {
  MPI_Wait(&k->raw_req, MPI_STATUS_IGNORE);
  const float s = (float)(x->q.nlevels - 1);
  size_t a = 0, b = 0, c = 0;
  for (int g = 0; g < k->nseg; g++) {
    const quant_seg *e = &k->seg[g];
    if (!e->quantized) {
      memcpy(out + e->at, k->raw + c, e->n * sizeof(float)), c += e->n;
      continue;
    }
    const float unit = k->scale[a++] / s;
    for (size_t j = 0; j < e->n; j++) out[e->at + j] = (float)(x->narrow ? k->ints8[b + j] : k->ints[b + j]) * unit;
    b += e->n;
  }
}

/* Reduce-scatter/all-gather, second half: the owner sums the D parts of its range in rank order,
 * quantizes the sum again (its own random bits) and all-gathers it; every replica decodes the sums.
 * out: the bucket's values where the backend's ops work. */
static void finish_sra(qexch *x, qbucket *k, float *out, uint64_t key) {
  const backend *be = x->m->be;
  const int me = x->rank, s0 = k->own[me], s1 = k->own[me + 1];
  const size_t mine = (size_t)k->cnt[me], base = (size_t)k->off[me];
  if (x->dev) be->to_device(be, k->drecv, k->recv, mine * (size_t)x->D);
  for (int r = 0; r < x->D; r++) be->quant_decode(be, out, k->drecv + (size_t)r * mine, base, k->dseg + s0, s1 - s0, &x->q, r > 0);
  /* into its place in the message buffer, free again */
  be->quant_encode(be, k->dsend, out, NULL, k->dseg + s0, s1 - s0, &x->q, rng_hash(key, 0x5eedULL));
  if (x->dev) be->to_host(be, k->send + base, k->dsend + base, mine);
  uint8_t *sums = k->recv + mine * (size_t)x->D;
  MPI_Allgatherv(k->send + base, (int)mine, MPI_BYTE, sums, k->cnt, k->off, MPI_BYTE, x->dp);
  if (x->dev) be->to_device(be, k->drecv + mine * (size_t)x->D, sums, k->bytes);
  be->quant_decode(be, out, k->drecv + mine * (size_t)x->D, 0, k->dseg, k->nseg, &x->q, 0);
}

/* Whether the adaptive levels are fitted to this step's gradients (after steps 0, 100, 2000 and
 * every adapt_period). */
static int fitting(const qexch *x, long step) {
  return x->adaptive && (step == 0 || step == 100 || step == 2000 || step % x->adapt_period == 0);
}

void qexch_end_step(qexch *x, long step) {
  if (!fitting(x, step)) return;
  quant_hist *h = x->hist; /* every stage's statistics: one set of levels, the tied embedding's included */
  MPI_Allreduce(MPI_IN_PLACE, h, (int)(sizeof *h / sizeof(double)), MPI_DOUBLE, MPI_SUM, x->all);
  float lv[QUANT_MAX_LEVELS], ratio;
  const int n = 1 << (x->q.bits - 1);
  if (x->adaptive == 1) quant_fit_alq(h, n, 30, lv);
  else quant_fit_amq(h, n, lv, &ratio);
  MPI_Bcast(lv, n, MPI_FLOAT, 0, x->all); /* the same levels on every rank, whatever the sums' rounding */
  quant_levels(&x->q, x->q.bits, QUANT_L2, lv, n);
  quant_hist_clear(h);
}

int qexch_levels(const qexch *x, float *level) {
  if (!x || !x->adaptive) return 0;
  memcpy(level, x->q.level, (size_t)x->q.nlevels * sizeof *level);
  return x->q.nlevels;
}

int qexch_set_levels(qexch *x, const float *level, int n) {
  if (!x || !x->adaptive || n != x->q.nlevels) return -1;
  return quant_levels(&x->q, x->q.bits, QUANT_L2, level, n);
}

/* Error feedback of the integer sum: the residual added to the quantized segments' values. */
static void feedback_add(const qbucket *k, float *v, const float *e) {
  for (int s = 0; s < k->nseg; s++)
    if (k->seg[s].quantized) quant_feedback_add(v + k->seg[s].at, e + k->seg[s].at, k->seg[s].n);
}

/* The key of replica r's random bits at step `step`. */
static uint64_t step_key(const qexch *x, long step) {
  return rng_hash(rng_hash(x->seed ^ 0x51ed270b2f7d4c3bULL, (uint64_t)x->rank), (uint64_t)step);
}

/* The statistics and the error, which the host computes: from the values v (where the ops work) and
 * the message on the host. */
static void host_statistics(qexch *x, const qbucket *k, const float *v, long step) {
  int fit = fitting(x, step), measure = x->error_every > 0 && step % x->error_every == 0;
  if (!fit && !measure) return;
  const float *h = v;
  if (x->dev) { /* the values, as encoded (with the residual added) */
    x->m->be->to_host(x->m->be, x->host, v, (k->b1 - k->b0) * sizeof(float));
    h = x->host;
  }
  for (int s = 0; fit && s < k->nseg; s++)
    if (k->seg[s].quantized) quant_hist_add(x->hist, h + k->seg[s].at, k->seg[s].n);
  if (measure) measure_error(x, k, h);
}

void qexch_launch(qexch *x, int i, long step, MPI_Request *req) {
  qbucket *k = &x->b[i];
  const backend *be = x->m->be;
  double t0 = util_now();
  uint64_t key = step_key(x, step);
  if (x->intsum) {
    float *v = host_values(x, k, 1);
    if (x->ef) feedback_add(k, v, x->ef + k->b0);
    launch_intsum(x, k, v, key, req);
    x->encode_s += util_now() - t0;
    return;
  }
  float *v = x->dev ? x->m->grads + k->b0 : host_values(x, k, 1);
  be->quant_encode(be, k->dsend, v, x->ef ? x->ef + k->b0 : NULL, k->dseg, k->nseg, &x->q, key);
  if (x->dev) be->to_host(be, k->send, k->dsend, k->bytes);
  x->encode_s += util_now() - t0;
  host_statistics(x, k, v, step);
  k->step = step;
  if (x->sra) { /* each owner receives every replica's part of its range */
    MPI_Ialltoallv(k->send, k->cnt, k->off, MPI_BYTE, k->recv, k->rcnt, k->rdis, MPI_BYTE, x->dp, req);
    return;
  }
  MPI_Iallgather(k->send, (int)k->bytes, MPI_BYTE, k->recv, (int)k->bytes, MPI_BYTE, x->dp, req);
}

double qexch_finish(qexch *x, int i) {
  qbucket *k = &x->b[i];
  const backend *be = x->m->be;
  double t0 = util_now();
  float *out = x->dev ? x->m->grads + k->b0 : host_values(x, k, 0);
  if (x->intsum) {
    finish_intsum(x, k, out);
  } else if (x->sra) {
    finish_sra(x, k, out, step_key(x, k->step));
  } else { /* in rank order: the same sum on every replica */
    if (x->dev) be->to_device(be, k->drecv, k->recv, k->bytes * (size_t)x->D);
    for (int r = 0; r < x->D; r++) be->quant_decode(be, out, k->drecv + (size_t)r * k->bytes, 0, k->dseg, k->nseg, &x->q, r > 0);
  }
  if (!be->caps.host_memory && !x->dev) be->to_device(be, x->m->grads + k->b0, out, (k->b1 - k->b0) * sizeof(float));
  return util_now() - t0;
}

float *qexch_residual(qexch *x) { return !x ? NULL : x->dev ? x->ef_host : x->ef; }

void qexch_residual_sync(qexch *x, int to_host) {
  if (!x || !x->dev || !x->ef) return;
  const backend *be = x->m->be;
  size_t bytes = (x->m->nparams ? x->m->nparams : 1) * sizeof(float);
  if (to_host) be->to_host(be, x->ef_host, x->ef, bytes);
  else be->to_device(be, x->ef, x->ef_host, bytes);
}

size_t qexch_plan_residual_bytes(const cfg_comm *c, size_t nparams, int D) {
  int on = cfg_comm_compressed(c) && D > 1;
  return on && c->error_feedback ? (nparams ? nparams : 1) * sizeof(float) : 0;
}

double qexch_take_encode_s(qexch *x) {
  double s = x->encode_s;
  x->encode_s = 0.0;
  return s;
}
