/* data: PnetCDF token datasets and the shuffled window loader. */
#include "text/data.h"

#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ncfile.h"
#include "base/progress.h"
#include "base/rng.h"
#include "base/util.h"
#include "text/fileid.h"

#define DATA_HINT_TEXT "make the dataset again with the 'prepare' task (&job task = 'prepare', 'train')"
static const char DATA_HINT[] = DATA_HINT_TEXT;

uint64_t data_checksum(const int32_t *v, size_t n, uint64_t first) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s += (uint64_t)(uint32_t)v[i] * (2 * (first + i) + 1);
  return s;
}

uint64_t data_checksum64(const int64_t *v, size_t n, uint64_t first) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s += (uint64_t)v[i] * (2 * (first + i) + 1);
  return s;
}

static long long att_int(int nc, const char *name, long long missing) {
  long long v = missing;
  if (ncmpi_get_att_longlong(nc, NC_GLOBAL, name, &v) != NC_NOERR) v = missing;
  return v;
}

/* A dimension's length, or -1. */
static int64_t dim_len(int nc, const char *name) {
  int dim;
  MPI_Offset n;
  if (ncmpi_inq_dimid(nc, name, &dim) != NC_NOERR || ncmpi_inq_dimlen(nc, dim, &n) != NC_NOERR) return -1;
  return (int64_t)n;
}

/* The variable `name` of one dimension `dim`, or -1. */
static int var_1d(int nc, const char *name, const char *dim) {
  int v, ndims, d, want;
  if (ncmpi_inq_varid(nc, name, &v) != NC_NOERR || ncmpi_inq_varndims(nc, v, &ndims) != NC_NOERR || ndims != 1 ||
      ncmpi_inq_vardimid(nc, v, &d) != NC_NOERR || ncmpi_inq_dimid(nc, dim, &want) != NC_NOERR || d != want)
    return -1;
  return v;
}

/* The header of an open dataset: what every later read relies on. Returns 0 or -1 after an error. */
static int read_header(data_file *f, err_list *errs) {
  int nc = f->ncid;
  char format[64];
  ncfile_get_text(nc, -1, "format", format, sizeof format);
  f->version = (int)att_int(nc, "format_version", 1);
  f->ntokens = dim_len(nc, DATA_DIM_TOKEN);
  f->ndocs = dim_len(nc, DATA_DIM_DOCUMENT);
  f->varid = var_1d(nc, DATA_VAR_TOKENS, DATA_DIM_TOKEN);
  f->doc_var = var_1d(nc, DATA_VAR_DOC_START, DATA_DIM_DOCUMENT);
  long long v = att_int(nc, "vocab_size", -1), eot = att_int(nc, "eot_id", -1);
  ncfile_get_text(nc, -1, "tokenizer_hash", f->tokenizer_hash, sizeof f->tokenizer_hash);
  nc_type type = NC_NAT;
  if (f->varid >= 0) ncmpi_inq_vartype(nc, f->varid, &type);
  if ((format[0] && strcmp(format, DATA_FORMAT) != 0) || f->varid < 0 || f->doc_var < 0 || f->ntokens < 0 ||
      f->ndocs < 0 || !f->tokenizer_hash[0] || (type != NC_USHORT && type != NC_UINT)) {
    err_add(errs, f->path, 0, 0, DATA_HINT, "not a greenlm token dataset (its format, tokens(token) of unsigned "
            "integers, doc_start(document) or tokenizer_hash is missing)");
    return -1;
  }
  if (f->version < 1 || f->version > DATA_FORMAT_VERSION) {
    err_add(errs, f->path, 0, 0, "use the greenlm that made it, or make the dataset again with this one",
            "dataset format version %d; this greenlm reads versions 1 to %d", f->version, DATA_FORMAT_VERSION);
    return -1;
  }
  if (v < 2 || v > TOK_MAX_VOCAB || (type == NC_USHORT && v > 65536) || eot < -1 || eot >= v) {
    err_add(errs, f->path, 0, 0, DATA_HINT, "damaged header: vocab_size %lld, eot_id %lld", v, eot);
    return -1;
  }
  f->vocab_size = (int)v;
  f->eot = (int)eot;
  f->tok_bytes = type == NC_USHORT ? 2 : 4;
  f->sum_var = -1;
  if (f->version >= 2) {
    f->nblocks = dim_len(nc, DATA_DIM_BLOCK);
    f->sum_var = var_1d(nc, DATA_VAR_BLOCK_SUM, DATA_DIM_BLOCK);
    int64_t want = (f->ntokens + DATA_BLOCK_TOKENS - 1) / DATA_BLOCK_TOKENS;
    if (f->sum_var < 0 || f->nblocks != want || att_int(nc, "block_tokens", -1) != DATA_BLOCK_TOKENS) {
      err_add(errs, f->path, 0, 0, DATA_HINT, "damaged header: %lld block checksums (block_tokens %lld) for %lld tokens",
              (long long)f->nblocks, att_int(nc, "block_tokens", -1), (long long)f->ntokens);
      return -1;
    }
  }
  return 0;
}

/* Which data the file holds: the token count and the block checksums (version 2), or the token
 * count and the tokenizer (version 1). */
static void read_identity(data_file *f) {
  uint64_t h = util_hash64(&f->ntokens, sizeof f->ntokens, 0);
  if (f->sum_var < 0 || f->nblocks == 0) {
    f->identity = util_hash64(f->tokenizer_hash, strlen(f->tokenizer_hash), h);
    return;
  }
  unsigned long long *sums = util_malloc((size_t)f->nblocks * sizeof *sums, "block checksums");
  MPI_Offset start = 0, count = f->nblocks;
  if (ncmpi_get_vara_ulonglong(f->ncid, f->sum_var, &start, &count, sums) != NC_NOERR)
    memset(sums, 0, (size_t)f->nblocks * sizeof *sums); /* data_verify names the damage */
  f->identity = util_hash64(sums, (size_t)f->nblocks * sizeof *sums, h);
  free(sums);
}

/* Open one dataset and read its header. Returns 0, or -1 after adding an error. */
static int open_file(data_file *f, const char *path, err_list *errs) {
  memset(f, 0, sizeof *f);
  util_strlcpy(f->path, path, sizeof f->path);
  if (ncfile_open(MPI_COMM_SELF, path, MPI_INFO_NULL, "dataset", DATA_HINT, &f->ncid, errs) != 0) return -1;
  if (read_header(f, errs) != 0) {
    ncmpi_close(f->ncid);
    return -1;
  }
  ncmpi_begin_indep_data(f->ncid);
  read_identity(f);
  MPI_Offset off = 0;
  f->fd = ncmpi_inq_varoffset(f->ncid, f->varid, &off) == NC_NOERR ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  f->tok_off = (int64_t)off;
  return 0;
}

/* Dataset s's order of its epoch: the stream (seed, RNG_DATA, epoch + s 2^32), the first dataset's
 * that of the loader without a blend. */
static void shuffle_epoch(data_set *b, int s, uint64_t seed) {
  rng_state r;
  rng_seed(&r, seed, RNG_DATA, (uint64_t)b->epoch + ((uint64_t)s << 32));
  for (uint64_t i = 0; i < b->nwin; i++) b->perm[i] = (uint32_t)i;
  for (uint64_t i = b->nwin; i > 1; i--) {
    uint64_t j = rng_below(&r, i);
    uint32_t t = b->perm[i - 1];
    b->perm[i - 1] = b->perm[j];
    b->perm[j] = t;
  }
}

/* The dataset against the tokenizer and the model: reported at the deck keys. */
static void check_fit(const data_file *f, const cfg_config *cfg, const tok_tokenizer *tok, int T, const char *key,
                      err_list *errs) {
  if (strcmp(f->tokenizer_hash, tok->hash_hex) != 0)
    cfg_error_at(cfg, errs, "data", key,
                 "prepare the dataset again with this deck's &tokenizer, or point &tokenizer at the one that made it",
                 "'%s' was made by another tokenizer (hash %s; the deck's %s has hash %s)", f->path, f->tokenizer_hash,
                 tok->desc, tok->hash_hex);
  else if (f->vocab_size > cfg->model.vocab_size)
    cfg_error_at(cfg, errs, "model", "vocab_size", "raise &model vocab_size to at least the tokenizer's vocabulary",
                 "the dataset '%s' has a vocabulary of %d tokens, more than the model's %ld", f->path, f->vocab_size,
                 cfg->model.vocab_size);
  else if (f->ntokens < (int64_t)T + 1)
    cfg_error_at(cfg, errs, "data", key, "give more text or lower &training seq_len",
                 "'%s' has %lld tokens, fewer than one window of seq_len + 1 = %d", f->path, (long long)f->ntokens, T + 1);
  else if ((uint64_t)(f->ntokens - 1) / (uint64_t)T > UINT32_MAX) /* the window order keeps 32-bit indices */
    cfg_error_at(cfg, errs, "data", key, "prepare the text as several datasets and train on their blend, or raise "
                 "&training seq_len", "'%s' has %llu windows of seq_len + 1 = %d tokens, more than 2^32 - 1 in one dataset",
                 f->path, (unsigned long long)((uint64_t)(f->ntokens - 1) / (uint64_t)T), T + 1);
}

/* Close what data_open opened and forget it. */
static void close_file(data_file *f) {
  if (!f->path[0]) return; /* it did not open */
  ncmpi_close(f->ncid);
  if (f->fd >= 0) close(f->fd);
}

static void close_files(data_loader *d) {
  for (int s = 0; s < d->nsets; s++) close_file(&d->set[s].file);
  for (int v = 0; v < d->nval; v++) close_file(&d->val[v].file);
  for (int s = 0; s < d->nsets; s++) free(d->set[s].perm);
  free(d->set);
  free(d->val);
  free(d->cum);
  memset(d, 0, sizeof *d);
}

/* Open dataset path as f, checked against the tokenizer and the model; errors at &data key. */
static int open_checked(data_file *f, const char *path, const cfg_config *cfg, const tok_tokenizer *tok, int T,
                        const char *key, err_list *errs) {
  int e0 = errs->n;
  if (open_file(f, path, errs) != 0) {
    memset(f, 0, sizeof *f);
    cfg_relocate(cfg, errs, e0, "data", key);
    return -1;
  }
  check_fit(f, cfg, tok, T, key, errs);
  return 0;
}

/* A blend's windows of T+1 tokens, numbering and normalised weights (the deck's w, or their windows);
 * cum (n) gets the cumulative weights when not NULL. Returns all their windows. */
static uint64_t set_weights(data_set *set, int n, int T, const cfg_reallist *w, double *cum) {
  double sum = 0, acc = 0;
  uint64_t all = 0;
  for (int s = 0; s < n; s++) {
    set[s].nwin = (uint64_t)(set[s].file.ntokens - 1) / (uint64_t)T;
    set[s].first = all;
    all += set[s].nwin;
    set[s].weight = w->n ? w->v[s] : (double)set[s].nwin;
    sum += set[s].weight;
  }
  for (int s = 0; s < n; s++) {
    set[s].weight /= sum;
    acc += set[s].weight;
    if (cum) cum[s] = s == n - 1 ? 1.0 : acc;
  }
  return all;
}

/* Two entries of a blend that are one file under two spellings (the same spelling twice is the deck's
 * error): a dataset blended with itself. */
static void check_twice(const cfg_strlist *list, const cfg_config *cfg, const char *key, err_list *errs) {
  fileid *id = util_calloc((size_t)list->n + 1, sizeof *id, "dataset identities");
  for (int s = 0; s < list->n; s++) {
    fileid_of(list->v[s], &id[s]);
    for (int r = 0; r < s; r++)
      if (id[s].exists && fileid_same(&id[r], &id[s]) && strcmp(list->v[r], list->v[s]) != 0)
        cfg_error_at(cfg, errs, "data", key, "list each dataset once; its weight sets its share",
                     "'%s' (entry %d) and '%s' (entry %d) are the same file: a dataset blended with itself", list->v[r],
                     r + 1, list->v[s], s + 1);
  }
  free(id);
}

/* The list of datasets at &data key into set (list->n), each checked; the errors are counted in errs. */
static data_set *open_list(const cfg_strlist *list, const cfg_config *cfg, const tok_tokenizer *tok, int T,
                           const char *key, err_list *errs) {
  data_set *set = util_calloc((size_t)list->n + 1, sizeof *set, "datasets");
  for (int s = 0; s < list->n; s++) /* every dataset of a blend against the tokenizer, by name */
    open_checked(&set[s].file, list->v[s], cfg, tok, T, key, errs);
  check_twice(list, cfg, key, errs);
  return set;
}

/* One blend's weights (&data wkey, for the datasets of &data key): their sum finite, and every
 * dataset's share above 0 (training: its interval of the cumulative weights not empty, so it can be
 * drawn). Returns the errors added. */
static int check_weights(const cfg_reallist *w, int train, const cfg_config *cfg, const char *wkey, err_list *errs) {
  static const char HINT[] = "only the weights' ratios matter: scale them to sizes near 1";
  double sum = 0, acc = 0, prev = 0;
  for (int s = 0; s < w->n; s++) sum += w->v[s];
  if (!isfinite(sum)) {
    cfg_error_at(cfg, errs, "data", wkey, HINT, "the weights sum to %g, beyond what a double holds: every share "
                 "would be 0", sum);
    return 1;
  }
  for (int s = 0; s < w->n; s++) {
    acc += w->v[s] / sum;
    double cum = s == w->n - 1 ? 1.0 : acc; /* as the loader draws */
    if (w->v[s] / sum > 0 && (!train || cum > prev)) {
      prev = cum;
      continue;
    }
    cfg_error_at(cfg, errs, "data", wkey, HINT, "weight %d (%g) of %g in all is a share of %g: %s", s + 1, w->v[s],
                 sum, w->v[s] / sum, train ? "its dataset would never be drawn" : "its dataset would not count");
    return 1;
  }
  return 0;
}

int data_check_weights(const cfg_config *cfg, err_list *errs) {
  return check_weights(&cfg->data.train_weights, 1, cfg, "train_weights", errs) +
         check_weights(&cfg->data.val_weights, 0, cfg, "val_weights", errs);
}

int data_open(data_loader *d, const cfg_config *cfg, const tok_tokenizer *tok, int T, err_list *errs) {
  memset(d, 0, sizeof *d);
  long n0 = err_count(errs);
  d->nsets = cfg->data.train.n;
  d->nval = cfg->data.val.n;
  d->cum = util_calloc((size_t)d->nsets + 1, sizeof *d->cum, "blend weights");
  if (d->nsets == 0)
    cfg_error_at(cfg, errs, "data", "train", "give a dataset from the 'prepare' task, e.g. train = 'runs/data/train.nc'",
                 "no training dataset");
  if (d->nval == 0)
    cfg_error_at(cfg, errs, "data", "val", "give a validation dataset, e.g. val = 'runs/data/val.nc'", "no validation dataset");
  data_check_weights(cfg, errs);
  d->set = open_list(&cfg->data.train, cfg, tok, T, "train", errs);
  d->val = open_list(&cfg->data.val, cfg, tok, T, "val", errs);
  if (err_count(errs) > n0) {
    close_files(d);
    return (int)(err_count(errs) - n0);
  }
  d->T = T;
  d->seed = (uint64_t)cfg->job.seed;
  d->nwin = set_weights(d->set, d->nsets, T, &cfg->data.train_weights, d->cum);
  set_weights(d->val, d->nval, T, &cfg->data.val_weights, NULL);
  for (int s = 0; s < d->nsets; s++) {
    d->set[s].perm = util_malloc(d->set[s].nwin * sizeof *d->set[s].perm, "window order");
    shuffle_epoch(&d->set[s], s, d->seed);
  }
  return 0;
}

/* ---- verification ------------------------------------------------------------------------------- */

/* Tokens [a, a + n) of f into buf (n <= DATA_BLOCK_TOKENS): ids checked against the vocabulary and
 * their checksum returned through *sum. Returns 0 or -1 after an error naming the first bad id. */
static int verify_range(data_file *f, int64_t a, size_t n, unsigned int *buf, uint64_t *sum, err_list *errs) {
  MPI_Offset start = a, count = (MPI_Offset)n;
  int rc = ncmpi_get_vara_uint(f->ncid, f->varid, &start, &count, buf);
  if (rc != NC_NOERR) {
    err_add(errs, f->path, 0, 0, DATA_HINT, "cannot read tokens %lld to %lld: %s", (long long)a, (long long)(a + (int64_t)n),
            ncmpi_strerror(rc));
    return -1;
  }
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) {
    if (buf[i] >= (unsigned)f->vocab_size) {
      err_add(errs, f->path, 0, 0, DATA_HINT, "token %lld has id %u, outside the vocabulary of %d: the file is damaged",
              (long long)(a + (int64_t)i), buf[i], f->vocab_size);
      return -1;
    }
    s += (uint64_t)buf[i] * (2 * ((uint64_t)a + i) + 1);
  }
  *sum = s;
  return 0;
}

/* This rank's blocks of f (block b belongs to rank b mod P). Returns the errors found. */
static int verify_blocks(data_file *f, int rank, int P, err_list *errs) {
  int bad = 0;
  unsigned int *buf = util_malloc((size_t)DATA_BLOCK_TOKENS * sizeof *buf, "verification buffer");
  int64_t nblocks = (f->ntokens + DATA_BLOCK_TOKENS - 1) / DATA_BLOCK_TOKENS;
  for (int64_t b = rank; b < nblocks && bad < 3; b += P) {
    int64_t a = b * DATA_BLOCK_TOKENS;
    size_t n = (size_t)(f->ntokens - a < DATA_BLOCK_TOKENS ? f->ntokens - a : DATA_BLOCK_TOKENS);
    uint64_t sum;
    if (verify_range(f, a, n, buf, &sum, errs) != 0) {
      bad++;
      continue;
    }
    progress_mark(); /* a block verified (the watchdog's progress) */
    unsigned long long want = 0;
    MPI_Offset start = b, one = 1;
    if (f->sum_var >= 0 && (ncmpi_get_vara_ulonglong(f->ncid, f->sum_var, &start, &one, &want) != NC_NOERR || want != sum)) {
      err_add(errs, f->path, 0, 0, DATA_HINT, "tokens %lld to %lld do not match their checksum: the file is damaged",
              (long long)a, (long long)(a + (int64_t)n));
      bad++;
    }
  }
  free(buf);
  return bad;
}

/* The document starts: this rank's chunk of them summed, all ranks' sums against the attribute. */
static int verify_docs(data_file *f, int rank, int P, MPI_Comm comm, err_list *errs) {
  int64_t lo = f->ndocs * rank / P, hi = f->ndocs * (rank + 1) / P, bad = 0;
  uint64_t mine = 0, total = 0;
  long long *buf = util_malloc(((size_t)(hi - lo) + 1) * sizeof *buf, "document starts");
  MPI_Offset start = lo, count = hi - lo;
  if (hi > lo && ncmpi_get_vara_longlong(f->ncid, f->doc_var, &start, &count, buf) != NC_NOERR) bad = 1;
  for (int64_t i = 0; i < hi - lo && !bad; i++) {
    if (buf[i] < 0 || buf[i] >= f->ntokens) bad = 1;
    mine += (uint64_t)buf[i] * (2 * (uint64_t)(lo + i) + 1);
  }
  free(buf);
  MPI_Allreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, comm);
  unsigned long long want = 0;
  int has = ncmpi_get_att_ulonglong(f->ncid, f->doc_var, "checksum", &want) == NC_NOERR;
  if (rank == 0 && !bad && has && want != total) bad = 1;
  if (bad)
    err_add(errs, f->path, 0, 0, DATA_HINT,
            "the document starts (doc_start) are damaged: unreadable, out of range or not matching their checksum");
  return (int)bad;
}

int data_verify(data_loader *d, MPI_Comm comm, err_list *errs) {
  int rank, P, bad = 0, any;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  for (int s = 0; s < d->nsets + d->nval; s++) {
    data_file *f = s < d->nsets ? &d->set[s].file : &d->val[s - d->nsets].file;
    bad += verify_blocks(f, rank, P, errs);
    bad += verify_docs(f, rank, P, comm, errs);
  }
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, comm);
  return any;
}

void data_close(data_loader *d) { close_files(d); }

void data_seek(data_loader *d, int s, long epoch, uint64_t pos) {
  data_set *b = &d->set[s];
  b->epoch = epoch;
  b->pos = pos;
  shuffle_epoch(b, s, d->seed);
}

uint64_t data_drawn(const data_loader *d, int s) {
  return (uint64_t)d->set[s].epoch * d->set[s].nwin + d->set[s].pos;
}

uint64_t data_drawn_all(const data_loader *d) {
  uint64_t n = 0;
  for (int s = 0; s < d->nsets; s++) n += data_drawn(d, s);
  return n;
}

uint64_t data_identity(const data_loader *d) {
  if (d->nsets == 1) return d->set[0].file.identity;
  uint64_t h = 0x626c656e64ULL; /* "blend" */
  for (int s = 0; s < d->nsets; s++) {
    h = util_hash64(&d->set[s].file.identity, sizeof d->set[s].file.identity, h);
    h = util_hash64(&d->set[s].weight, sizeof d->set[s].weight, h);
  }
  return h;
}

int64_t data_train_tokens(const data_loader *d) {
  int64_t n = 0;
  for (int s = 0; s < d->nsets; s++) n += d->set[s].file.ntokens;
  return n;
}

/* The dataset window n of the run comes from: where u_n falls among the cumulative weights. */
static int blend_pick(const data_loader *d, uint64_t n) {
  if (d->nsets == 1) return 0;
  double u = (double)(rng_hash(rng_hash(d->seed, 0x626c656e64ULL), n) >> 11) * 0x1p-53;
  int lo = 0, hi = d->nsets - 1;
  while (lo < hi) { /* the first s with u < cum[s] */
    int mid = (lo + hi) / 2;
    if (u < d->cum[mid]) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

void data_next_windows(data_loader *d, long G, uint64_t *win) {
  uint64_t n = data_drawn_all(d);
  for (long i = 0; i < G; i++) {
    int s = blend_pick(d, n + (uint64_t)i);
    data_set *b = &d->set[s];
    if (b->pos == b->nwin) {
      b->epoch++;
      b->pos = 0;
      shuffle_epoch(b, s, d->seed);
    }
    win[i] = b->first + b->perm[b->pos++];
  }
}

long data_peek_windows(const data_loader *d, long G, uint64_t *win) {
  uint64_t n = data_drawn_all(d), *pos = util_malloc((size_t)d->nsets * sizeof *pos, "cursors");
  for (int s = 0; s < d->nsets; s++) pos[s] = d->set[s].pos;
  long i = 0;
  for (; i < G; i++) {
    int s = blend_pick(d, n + (uint64_t)i);
    if (pos[s] == d->set[s].nwin) break; /* its next epoch's order is not drawn yet */
    win[i] = d->set[s].first + d->set[s].perm[pos[s]++];
  }
  free(pos);
  return i;
}

int data_window_set(const data_loader *d, uint64_t w) {
  int s = d->nsets - 1;
  while (s > 0 && w < d->set[s].first) s--;
  return s;
}

void data_prefetch(const data_loader *d, const uint64_t *win, long n) {
  for (long i = 0; i < n; i++) {
    const data_set *b = &d->set[data_window_set(d, win[i])];
    const data_file *f = &b->file;
    if (f->fd < 0) continue;
    off_t at = (off_t)f->tok_off + (off_t)((win[i] - b->first) * (uint64_t)d->T) * f->tok_bytes;
    posix_fadvise(f->fd, at, (off_t)(d->T + 1) * f->tok_bytes, POSIX_FADV_WILLNEED);
  }
}

void data_prefetch_next(const data_loader *d, long G, long lo, long n, uint64_t *scratch) {
  long got = data_peek_windows(d, G, scratch);
  if (got > lo) data_prefetch(d, scratch + lo, (got < lo + n ? got : lo + n) - lo);
}

/* Read windows w[0..n) of f: T+1 tokens from token w*T each, split into inputs and targets. One
 * independent read per window: windows overlap by a token, and PnetCDF 1.12 mis-reads overlapping
 * nonblocking requests gathered into one wait. */
static void read_windows(data_file *f, const uint64_t *w, int n, int T, int32_t *tokens, int32_t *targets) {
  int32_t *buf = util_malloc((size_t)n * (T + 1) * sizeof(int32_t), "window buffer");
  for (int i = 0; i < n; i++) {
    MPI_Offset start = (MPI_Offset)(w[i] * (uint64_t)T), count = T + 1;
    int32_t *x = buf + (size_t)i * (T + 1);
    int rc = ncmpi_get_vara_int(f->ncid, f->varid, &start, &count, x);
    UTIL_CHECK(rc == NC_NOERR || rc == NC_ERANGE, "the dataset changed or is damaged since it was opened: " DATA_HINT_TEXT,
               "%s: cannot read tokens %lld to %lld: %s", f->path, (long long)start, (long long)(start + count),
               ncmpi_strerror(rc));
    for (int k = 0; k <= T; k++) /* never an id the embedding does not have */
      UTIL_CHECK(rc == NC_NOERR && x[k] >= 0 && x[k] < f->vocab_size,
                 "the dataset changed or is damaged since it was opened: " DATA_HINT_TEXT,
                 "%s: token %lld has id %d, outside the vocabulary of %d", f->path, (long long)start + k, x[k],
                 f->vocab_size);
  }
  for (int i = 0; i < n; i++) {
    memcpy(tokens + (size_t)i * T, buf + (size_t)i * (T + 1), (size_t)T * sizeof(int32_t));
    memcpy(targets + (size_t)i * T, buf + (size_t)i * (T + 1) + 1, (size_t)T * sizeof(int32_t));
  }
  free(buf);
}

void data_read_train(data_loader *d, const uint64_t *win, int n, int32_t *tokens, int32_t *targets) {
  uint64_t w;
  for (int i = 0; i < n; i++) { /* window by window: a step's windows come from any of the datasets */
    int s = data_window_set(d, win[i]);
    w = win[i] - d->set[s].first;
    read_windows(&d->set[s].file, &w, 1, d->T, tokens + (size_t)i * d->T, targets + (size_t)i * d->T);
  }
}

uint64_t data_val_windows(const data_loader *d, int v) { return d->val[v].nwin; }

void data_val_batch(data_loader *d, int v, int k, int B, int32_t *tokens, int32_t *targets) {
  uint64_t nw = data_val_windows(d, v);
  uint64_t *w = util_malloc((size_t)B * sizeof *w, "windows");
  for (int b = 0; b < B; b++) w[b] = ((uint64_t)k * (uint64_t)B + (uint64_t)b) % nw;
  read_windows(&d->val[v].file, w, B, d->T, tokens, targets);
  free(w);
}
