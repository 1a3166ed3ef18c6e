/* score: log-likelihoods of dataset windows and of benchmark continuations. */
#include "eval/score.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* ---- every window of a dataset ------------------------------------------------------------------ */

/* The dataset at path opened as the loader's validation split, for windows of T + 1 tokens. */
static int open_dataset(data_loader *d, const infer_model *im, const char *path, int T, err_list *errs) {
  cfg_config *c = util_malloc(sizeof *c, "configuration");
  memcpy(c, im->cfg, sizeof *c);
  util_strlcpy(c->data.train.v[0], path, sizeof c->data.train.v[0]);
  c->data.train.n = 1;
  c->data.train_weights.n = 0;
  util_strlcpy(c->data.val.v[0], path, sizeof c->data.val.v[0]);
  c->data.val.n = 1;
  c->data.val_weights.n = 0;
  int e0 = errs->n, n = data_open(d, c, &im->tok, T, errs);
  cfg_relocate(im->cfg, errs, e0, "eval", "val");
  free(c);
  return n;
}

/* Bytes of text the target tokens stand for: (N) ids; <|endoftext|> counts none. */
static double text_bytes(const tok_tokenizer *tok, const int32_t *ids, size_t n) {
  double b = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] != tok->eot) b += (double)(tok->off[ids[i] + 1] - tok->off[ids[i]]);
  return b;
}

/* Windows [lo, hi) of d, B at a time: each window's summed loss into nats[w - lo], the target bytes
 * into *bytes. */
static void score_windows(infer_model *im, data_loader *d, uint64_t lo, uint64_t hi, int B, int T, double *nats,
                          double *bytes) {
  gpt_model *m = &im->model;
  int32_t *tok = util_malloc((size_t)B * T * sizeof *tok, "tokens"), *tgt = util_malloc((size_t)B * T * sizeof *tgt, "targets");
  for (uint64_t w = lo; w < hi; w += (uint64_t)B) {
    int b = hi - w < (uint64_t)B ? (int)(hi - w) : B;
    for (int i = 0; i < b; i++) data_val_batch(d, 0, (int)(w + (uint64_t)i), 1, tok + (size_t)i * T, tgt + (size_t)i * T);
    gpt_set_batch(m, 0, tok, tgt, b, T);
    gpt_forward(m, 0, b, T);
    gpt_loss(m, 0, b, T, 0.0f);
    const float *loss = gpt_token_losses(m, b * T);
    for (int i = 0; i < b; i++) {
      double s = 0;
      for (int t = 0; t < T; t++) s += loss[(size_t)i * T + t];
      nats[w - lo + (uint64_t)i] = s;
    }
    *bytes += text_bytes(&im->tok, tgt, (size_t)b * T);
  }
  free(tok), free(tgt);
}

int score_dataset_run(infer_model *im, const char *path, int B, int T, score_dataset *out, err_list *errs) {
  memset(out, 0, sizeof *out);
  double t0 = util_now();
  data_loader d;
  int bad = open_dataset(&d, im, path, T, errs) != 0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, im->comm);
  if (any) {
    if (!bad) data_close(&d);
    return 1;
  }
  uint64_t nw = data_val_windows(&d, 0), lo = nw * (uint64_t)im->rank / (uint64_t)im->size,
           hi = nw * (uint64_t)(im->rank + 1) / (uint64_t)im->size;
  double *mine = util_malloc((hi - lo + 1) * sizeof *mine, "window losses"), bytes = 0;
  score_windows(im, &d, lo, hi, B, T, mine, &bytes);
  data_close(&d);
  /* rank 0 adds the windows in order: the same sum for any rank count */
  int *counts = util_malloc((size_t)im->size * sizeof *counts, "counts"), *displs = util_malloc((size_t)im->size * sizeof *displs, "displs");
  for (int r = 0; r < im->size; r++) {
    uint64_t a = nw * (uint64_t)r / (uint64_t)im->size, b = nw * (uint64_t)(r + 1) / (uint64_t)im->size;
    counts[r] = (int)(b - a), displs[r] = (int)a;
  }
  double *all = im->rank == 0 ? util_malloc((nw + 1) * sizeof *all, "window losses") : NULL;
  MPI_Gatherv(mine, (int)(hi - lo), MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, im->comm);
  MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_DOUBLE, MPI_SUM, im->comm);
  double nats = 0;
  if (im->rank == 0)
    for (uint64_t w = 0; w < nw; w++) nats += all[w];
  MPI_Bcast(&nats, 1, MPI_DOUBLE, 0, im->comm);
  free(mine), free(all), free(counts), free(displs);
  out->nats = nats, out->bytes = bytes, out->windows = nw, out->tokens = (double)nw * T;
  out->loss = nats / out->tokens;
  out->ppl = exp(out->loss);
  out->bpb = bytes > 0 ? nats / log(2.0) / bytes : NAN;
  out->seconds = util_now() - t0;
  return 0;
}

/* ---- continuations of contexts ------------------------------------------------------------------ */

/* Index of the largest of n logits (the first on ties). */
static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

/* Python's str.isspace() of code point c. */
static int py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Bytes of s[0 .. n-1] left by Python's str.rstrip(): UTF-8 characters that are white space taken
 * off the end (a byte that does not end a well-formed character ends the stripping). */
static size_t py_rstrip(const char *s, size_t n) {
  while (n > 0) {
    size_t k = 1;
    while (k < 4 && k < n && ((unsigned char)s[n - k] & 0xC0) == 0x80) k++;
    unsigned char lead = (unsigned char)s[n - k];
    size_t len = lead < 0x80 ? 1 : lead >= 0xC0 && lead < 0xE0 ? 2 : lead >= 0xE0 && lead < 0xF0 ? 3 : lead >= 0xF0 && lead < 0xF8 ? 4 : 0;
    if (len != k) break;
    uint32_t c = len == 1 ? lead : lead & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) c = c << 6 | ((unsigned char)s[n - k + i] & 0x3Fu);
    if (!py_isspace(c)) break;
    n -= k;
  }
  return n;
}

/* all = prefix token, then all's tokens. */
static void push_front(tok_ids *all, int32_t prefix) {
  tok_ids_push(all, prefix);
  memmove(all->v + 1, all->v, (all->n - 1) * sizeof *all->v);
  all->v[0] = prefix;
}

size_t score_encode(tok_tokenizer *tok, const char *context, const char *continuation, tok_ids *all) {
  const int32_t prefix = tok->eot >= 0 ? tok->eot : 0;
  size_t nctx = strlen(context), ncont = strlen(continuation), kept = py_rstrip(context, nctx);
  all->n = 0;
  if (nctx == 0) { /* lm-eval: the prefix token as context, unless the continuation starts with it */
    tok_encode(tok, continuation, ncont, 1, all);
    if (all->n == 0 || all->v[0] != prefix) push_front(all, prefix);
    return 1;
  }
  char *whole = util_malloc(nctx + ncont + 1, "request text");
  memcpy(whole, context, nctx);
  memcpy(whole + nctx, continuation, ncont + 1);
  tok_ids w = {0};
  tok_encode(tok, whole, nctx + ncont, 1, &w);
  size_t skip = 0; /* tokens of the whole text that the context's stand for */
  if (kept > 0) tok_encode(tok, context, kept, 1, all), skip = all->n;
  else tok_ids_push(all, prefix); /* white space only (score.h) */
  size_t n = all->n;
  for (size_t i = skip; i < w.n; i++) tok_ids_push(all, w.v[i]);
  tok_ids_free(&w);
  free(whole);
  return n;
}

void score_one(gpt_model *m, tok_tokenizer *tok, const score_request *q, score_result *r) {
  tok_ids all = {0};
  size_t nctx = score_encode(tok, q->context, q->continuation, &all);
  int ncont = (int)(all.n - nctx), maxT = m->T;
  /* inputs: the last maxT tokens before the final one; targets: the tokens after each */
  size_t start = all.n - 1 > (size_t)maxT ? all.n - 1 - (size_t)maxT : 0;
  int T = (int)(all.n - 1 - start);
  memset(r, 0, sizeof *r);
  r->ntokens = ncont;
  r->truncated = start > 0;
  r->inputs = T;
  r->greedy_ok = 1; /* of no continuation token too (lm-eval: all() of none) */
  /* a continuation longer than the window is scored on the tokens the window predicts */
  int first = T > ncont ? T - ncont : 0;
  if (ncont > 0 && T >= 1) {
    float *row = q->greedy ? util_malloc((size_t)m->s.V * sizeof *row, "logits row") : NULL;
    gpt_set_batch(m, 0, all.v + start, all.v + start + 1, 1, T);
    gpt_forward(m, 0, 1, T);
    for (int t = first; q->greedy && t < T; t++) {
      gpt_logits_row(m, 0, (size_t)t, row);
      if (argmax(row, m->s.V) != all.v[start + (size_t)t + 1]) r->greedy_ok = 0;
    }
    gpt_loss(m, 0, 1, T, 0.0f);
    const float *loss = gpt_token_losses(m, T);
    for (int t = first; t < T; t++) r->loglik -= loss[t];
    free(row);
  }
  tok_ids_free(&all);
}

void score_requests(gpt_model *m, tok_tokenizer *tok, MPI_Comm comm, const score_request *req, long n, score_result *res) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  enum { K = 5 }; /* values per result */
  double *v = util_calloc((size_t)n * K + 1, sizeof *v, "results");
  for (long i = rank; i < n; i += size) {
    score_result r;
    score_one(m, tok, &req[i], &r);
    double *x = v + K * i;
    x[0] = r.loglik, x[1] = r.ntokens, x[2] = r.greedy_ok, x[3] = r.truncated, x[4] = r.inputs;
  }
  /* every entry comes from one rank, zeros from the others: the sum is exact */
  MPI_Allreduce(MPI_IN_PLACE, v, (int)(K * n), MPI_DOUBLE, MPI_SUM, comm);
  for (long i = 0; i < n; i++) {
    const double *x = v + K * i;
    res[i] = (score_result){x[0], (int)x[1], (int)x[2], (int)x[3], (int)x[4]};
  }
  free(v);
}
