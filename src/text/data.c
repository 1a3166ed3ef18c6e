/* data: PnetCDF token datasets and the shuffled window loader. */
#include "text/data.h"

#include <mpi.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"

/* Open one dataset and read its identity. Returns 0, or -1 with err. */
static int open_file(data_file *f, const char *path, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  util_strlcpy(f->path, path, sizeof f->path);
  int rc = ncmpi_open(MPI_COMM_SELF, path, NC_NOWRITE, MPI_INFO_NULL, &f->ncid);
  if (rc != NC_NOERR) {
    util_snprintf(err, errlen, "cannot open dataset '%s': %s", path, ncmpi_strerror(rc));
    return -1;
  }
  int dim;
  MPI_Offset n = 0, nd = 0;
  long long v = 0;
  MPI_Offset hl = 0;
  if (ncmpi_inq_varid(f->ncid, DATA_VAR_TOKENS, &f->varid) != NC_NOERR ||
      ncmpi_inq_dimid(f->ncid, DATA_DIM_TOKEN, &dim) != NC_NOERR || ncmpi_inq_dimlen(f->ncid, dim, &n) != NC_NOERR ||
      ncmpi_inq_dimid(f->ncid, DATA_DIM_DOCUMENT, &dim) != NC_NOERR || ncmpi_inq_dimlen(f->ncid, dim, &nd) != NC_NOERR ||
      ncmpi_get_att_longlong(f->ncid, NC_GLOBAL, "vocab_size", &v) != NC_NOERR ||
      ncmpi_inq_attlen(f->ncid, NC_GLOBAL, "tokenizer_hash", &hl) != NC_NOERR || hl >= (MPI_Offset)sizeof f->tokenizer_hash ||
      ncmpi_get_att_text(f->ncid, NC_GLOBAL, "tokenizer_hash", f->tokenizer_hash) != NC_NOERR) {
    util_snprintf(err, errlen, "'%s' is not a greenlm token dataset (no tokens variable, token dimension, "
                               "vocab_size or tokenizer_hash)", path);
    ncmpi_close(f->ncid);
    return -1;
  }
  f->tokenizer_hash[hl] = '\0';
  f->ntokens = (int64_t)n;
  f->ndocs = (int64_t)nd;
  f->vocab_size = (int)v;
  long long eot = -1;
  ncmpi_get_att_longlong(f->ncid, NC_GLOBAL, "eot_id", &eot);
  f->eot = (int)eot;
  ncmpi_begin_indep_data(f->ncid);
  return 0;
}

static void shuffle_epoch(data_loader *d) {
  rng_state r;
  rng_seed(&r, d->seed, RNG_DATA, (uint64_t)d->epoch);
  for (uint64_t i = 0; i < d->nwin; i++) d->perm[i] = i;
  for (uint64_t i = d->nwin; i > 1; i--) {
    uint64_t j = rng_below(&r, i), t = d->perm[i - 1];
    d->perm[i - 1] = d->perm[j];
    d->perm[j] = t;
  }
}

int data_open(data_loader *d, const cfg_config *cfg, const tok_tokenizer *tok, int T, nml_errors *errs) {
  memset(d, 0, sizeof *d);
  int n0 = errs->n;
  char err[1200];
  const char *key[2] = {"train", "val"};
  data_file *f[2] = {&d->train, &d->val};
  const char *path[2] = {cfg->data.train, cfg->data.val};
  int opened[2] = {0, 0};
  for (int s = 0; s < 2; s++) {
    if (open_file(f[s], path[s], err, sizeof err) != 0) {
      cfg_error_at(cfg, errs, "data", key[s], "make it with the 'prepare' task (&job task = 'prepare', 'train')", "%s",
                   err);
      continue;
    }
    opened[s] = 1;
    if (strcmp(f[s]->tokenizer_hash, tok->hash_hex) != 0)
      cfg_error_at(cfg, errs, "data", key[s],
                   "prepare the dataset again with this deck's &tokenizer, or point &tokenizer at the one that made it",
                   "'%s' was made by another tokenizer (hash %s; the deck's %s has hash %s)", path[s],
                   f[s]->tokenizer_hash, tok->desc, tok->hash_hex);
    else if (f[s]->vocab_size > cfg->model.vocab_size)
      cfg_error_at(cfg, errs, "model", "vocab_size", "raise &model vocab_size to at least the tokenizer's vocabulary",
                   "the dataset '%s' has a vocabulary of %d tokens, more than the model's %ld", path[s],
                   f[s]->vocab_size, cfg->model.vocab_size);
    else if (f[s]->ntokens < (int64_t)T + 1)
      cfg_error_at(cfg, errs, "data", key[s], "give more text or lower &training seq_len",
                   "'%s' has %lld tokens, fewer than one window of seq_len + 1 = %d", path[s],
                   (long long)f[s]->ntokens, T + 1);
  }
  if (errs->n > n0) {
    for (int s = 0; s < 2; s++)
      if (opened[s]) ncmpi_close(f[s]->ncid);
    memset(d, 0, sizeof *d);
    return errs->n - n0;
  }
  d->T = T;
  d->seed = (uint64_t)cfg->job.seed;
  d->nwin = (uint64_t)(d->train.ntokens - 1) / (uint64_t)T;
  d->perm = util_malloc(d->nwin * sizeof *d->perm, "window order");
  shuffle_epoch(d);
  return 0;
}

void data_close(data_loader *d) {
  if (d->perm) {
    ncmpi_close(d->train.ncid);
    ncmpi_close(d->val.ncid);
  }
  free(d->perm);
  memset(d, 0, sizeof *d);
}

void data_seek(data_loader *d, long epoch, uint64_t pos) {
  d->epoch = epoch;
  d->pos = pos;
  shuffle_epoch(d);
}

void data_next_windows(data_loader *d, long G, uint64_t *win) {
  for (long i = 0; i < G; i++) {
    if (d->pos == d->nwin) {
      d->epoch++;
      d->pos = 0;
      shuffle_epoch(d);
    }
    win[i] = d->perm[d->pos++];
  }
}

/* Read windows w[0..n) of f: T+1 tokens from token w*T each, split into inputs and targets. One
 * independent read per window: windows overlap by a token, and PnetCDF 1.12 mis-reads overlapping
 * nonblocking requests gathered into one wait. */
static void read_windows(data_file *f, const uint64_t *w, int n, int T, int32_t *tokens, int32_t *targets) {
  int32_t *buf = util_malloc((size_t)n * (T + 1) * sizeof(int32_t), "window buffer");
  for (int i = 0; i < n; i++) {
    MPI_Offset start = (MPI_Offset)(w[i] * (uint64_t)T), count = T + 1;
    int rc = ncmpi_get_vara_int(f->ncid, f->varid, &start, &count, buf + (size_t)i * (T + 1));
    UTIL_CHECK(rc == NC_NOERR, "check that the dataset is complete and readable", "reading %s: %s", f->path,
               ncmpi_strerror(rc));
  }
  for (int i = 0; i < n; i++) {
    memcpy(tokens + (size_t)i * T, buf + (size_t)i * (T + 1), (size_t)T * sizeof(int32_t));
    memcpy(targets + (size_t)i * T, buf + (size_t)i * (T + 1) + 1, (size_t)T * sizeof(int32_t));
  }
  free(buf);
}

void data_read_train(data_loader *d, const uint64_t *win, int n, int32_t *tokens, int32_t *targets) {
  read_windows(&d->train, win, n, d->T, tokens, targets);
}

uint64_t data_val_windows(const data_loader *d) { return (uint64_t)(d->val.ntokens - 1) / (uint64_t)d->T; }

void data_val_batch(data_loader *d, int k, int B, int32_t *tokens, int32_t *targets) {
  uint64_t nw = data_val_windows(d);
  uint64_t *w = util_malloc((size_t)B * sizeof *w, "windows");
  for (int b = 0; b < B; b++) w[b] = ((uint64_t)k * (uint64_t)B + (uint64_t)b) % nw;
  read_windows(&d->val, w, B, d->T, tokens, targets);
  free(w);
}
