/* prepare: tokenize a corpus in parallel and write the train/validation token datasets, holding at
 * most &prepare buffer_mb of tokens per rank (the rest waits in a spill file beside the output). */
#include "text/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "text/corpus.h"
#include "text/data.h"
#include "text/fileid.h"
#include "base/ncfile.h"
#include "base/hmap.h"
#include "base/rng.h"
#include "text/tok.h"
#include "base/util.h"

/* One rank's tokens, in the order of its share: positions [0, spilled) in the spill file (es bytes a
 * token), [spilled, spilled + ids.n) in memory. */
typedef struct {
  tok_tokenizer *tok;
  tok_ids ids;       /* the tokens not spilled yet */
  int64_t spilled;   /* tokens in the spill file */
  size_t budget;     /* tokens held in memory before they are spilled */
  int es;            /* bytes of a token in the spill file and the datasets: 2 or 4 */
  int fd;            /* the spill file, or -1 */
  char spill_path[UTIL_PATH_MAX + 32];
  int spill_errno;   /* a failed spill write: its errno (0: none) */
  int64_t *doc_at;   /* (ndoc + 1) position of each local document in the rank's tokens */
  int *doc_begins;   /* 1: the document begins on this rank; 0: it continues the previous rank's last */
  size_t ndoc, cap;
  double seconds;    /* spent encoding */
  int64_t bytes;     /* encoded */
} prep_ctx;

/* Tokens as the datasets store them (es bytes each) from int32 ids. */
static void narrow(void *dst, const int32_t *v, size_t n, int es) {
  for (size_t i = 0; i < n; i++)
    if (es == 2) ((unsigned short *)dst)[i] = (unsigned short)v[i];
    else ((unsigned int *)dst)[i] = (unsigned int)v[i];
}

/* The tokens held in memory to the end of the spill file (opened on the first spill). */
static void spill(prep_ctx *c) {
  if (c->ids.n == 0 || c->spill_errno) return;
  if (c->fd < 0 && (util_mkdir_parent(c->spill_path) != 0 ||
                    (c->fd = open(c->spill_path, O_RDWR | O_CREAT | O_TRUNC, 0600)) < 0)) {
    c->spill_errno = errno;
    return;
  }
  enum { CHUNK = 1 << 20 }; /* tokens narrowed and written at a time */
  void *b = util_malloc((size_t)CHUNK * (size_t)c->es, "spill");
  for (size_t t = 0; t < c->ids.n && !c->spill_errno; t += CHUNK) {
    size_t k = c->ids.n - t < CHUNK ? c->ids.n - t : CHUNK, n = k * (size_t)c->es, done = 0;
    narrow(b, c->ids.v + t, k, c->es);
    while (done < n && !c->spill_errno) {
      ssize_t w = pwrite(c->fd, (char *)b + done, n - done, (off_t)((c->spilled + (int64_t)t) * c->es + (int64_t)done));
      if (w <= 0) c->spill_errno = w < 0 ? errno : ENOSPC;
      else done += (size_t)w;
    }
  }
  free(b);
  c->spilled += (int64_t)c->ids.n;
  c->ids.n = 0;
}

static void on_piece(const char *text, size_t len, int begins, int ends, void *p) {
  prep_ctx *c = p;
  if (begins || c->ndoc == 0) {
    if (c->ndoc + 1 >= c->cap) {
      c->cap = c->cap ? 2 * c->cap : 1024;
      c->doc_at = util_realloc(c->doc_at, c->cap * sizeof *c->doc_at, "documents");
      c->doc_begins = util_realloc(c->doc_begins, c->cap * sizeof *c->doc_begins, "documents");
    }
    c->doc_at[c->ndoc] = c->spilled + (int64_t)c->ids.n;
    c->doc_begins[c->ndoc++] = begins;
  }
  double t0 = util_now();
  tok_encode(c->tok, text, len, 0, &c->ids);
  if (ends && c->tok->eot >= 0) tok_ids_push(&c->ids, c->tok->eot);
  c->seconds += util_now() - t0;
  c->bytes += (int64_t)len;
  if (c->ids.n >= c->budget) spill(c);
}

/* Tokens a writing round takes for n tokens of a split: the buffer's worth as int32, as read back and as
 * stored, or n when fewer (at least 1). */
static size_t round_tokens(const prep_ctx *c, int64_t n) {
  size_t cap = c->budget * sizeof(int32_t) / (4 + 2 * (size_t)c->es);
  return n < (int64_t)cap ? (size_t)(n > 0 ? n : 1) : cap;
}

/* Tokens [a, a + n) of the rank's stream into v (from the spill file and memory). Returns 0 or errno. */
static int read_tokens(const prep_ctx *c, int64_t a, size_t n, int32_t *v, void *tmp) {
  size_t from_file = a < c->spilled ? (size_t)(c->spilled - a < (int64_t)n ? c->spilled - a : (int64_t)n) : 0;
  size_t bytes = from_file * (size_t)c->es, got = 0;
  while (got < bytes) {
    ssize_t r = pread(c->fd, (char *)tmp + got, bytes - got, (off_t)(a * c->es + (int64_t)got));
    if (r <= 0) return r < 0 ? errno : EIO;
    got += (size_t)r;
  }
  for (size_t i = 0; i < from_file; i++) v[i] = c->es == 2 ? ((unsigned short *)tmp)[i] : (int32_t)((unsigned int *)tmp)[i];
  if (n > from_file) memcpy(v + from_file, c->ids.v + (a + (int64_t)from_file - c->spilled), (n - from_file) * sizeof *v);
  return 0;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Which documents go to validation: the first nval of a seeded shuffle of all ndocs (a partial
 * Fisher-Yates whose touched places live in a hash map: memory for nval documents, not ndocs),
 * ascending in *val. */
static int64_t *val_docs(int64_t ndocs, int64_t nval, uint64_t seed) {
  int64_t *val = util_malloc((size_t)(nval ? nval : 1) * sizeof *val, "split");
  hmap_u64 perm; /* place -> document, where it differs from the place itself */
  hmap_u64_init(&perm, (size_t)(2 * nval + 16));
  rng_state r;
  rng_seed(&r, seed, RNG_DATA, 0x5e11c7ULL); /* a stream of its own, apart from the epochs' */
  for (int64_t i = 0; i < nval; i++) {
    int64_t j = i + (int64_t)rng_below(&r, (uint64_t)(ndocs - i));
    uint64_t *pi = hmap_u64_get(&perm, (uint64_t)i), *pj = hmap_u64_get(&perm, (uint64_t)j);
    int64_t vi = pi ? (int64_t)*pi : i, vj = pj ? (int64_t)*pj : j;
    *hmap_u64_put(&perm, (uint64_t)j, 0, NULL) = (uint64_t)vi;
    *hmap_u64_put(&perm, (uint64_t)i, 0, NULL) = (uint64_t)vj;
    val[i] = vj;
  }
  hmap_u64_free(&perm);
  qsort(val, (size_t)nval, sizeof *val, cmp_i64);
  return val;
}

/* Whether document g is among the ascending val[0, n). */
static int is_val_doc(const int64_t *val, int64_t n, int64_t g) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (val[mid] < g) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && val[lo] == g;
}

typedef struct {
  const char *name, *path;
  int64_t ntok, ndoc;       /* totals */
  int64_t tok_off, doc_off; /* this rank's offsets */
  int64_t *doc_start;       /* (my_doc) this rank's document starts (global token indices) */
  int64_t my_tok;
  size_t my_doc;
} split_out;

/* The whole job of the task on one rank. */
typedef struct {
  const cfg_config *cfg;
  MPI_Comm comm;
  int rank, P;
  tok_tokenizer tok;
  corpus_set cs;
  int have_tok, have_cs;
  prep_ctx c;
  double t_tok, t_write;    /* reading and encoding, writing */
  int64_t ndocs, nval;
  unsigned char *doc_split; /* (c.ndoc) the split of each local document: 0 train, 1 val */
  split_out sp[2];          /* train, val */
} prep_job;

static const char PREP_WRITE_HINT[] = "check that the directory is writable and the disk is not full";

/* The place of one PnetCDF error while writing `path`: 0 when rc is none. */
static int nc_fail(int rc, const char *what, const char *path, err_list *errs) {
  if (rc == NC_NOERR) return 0;
  err_add(errs, path, 0, 0, PREP_WRITE_HINT, "writing the dataset (%s): %s", what, ncmpi_strerror(rc));
  return -1;
}

/* The header of one split: dimensions, variables and every attribute that says what made it. */
static int define_split(int nc, const split_out *s, const prep_job *j, int64_t nblocks, uint64_t doc_sum, int *vtok,
                        int *vdoc, int *vsum, err_list *errs) {
  const cfg_config *cfg = j->cfg;
  const tok_tokenizer *tok = &j->tok;
  const char *tmp = s->path;
  int dtok, ddoc, dblk, rc = 0;
  nc_type type = tok->vocab_size <= 65536 ? NC_USHORT : NC_UINT;
  rc |= nc_fail(ncmpi_def_dim(nc, DATA_DIM_TOKEN, s->ntok, &dtok), "token dimension", tmp, errs);
  rc |= nc_fail(ncmpi_def_dim(nc, DATA_DIM_DOCUMENT, s->ndoc, &ddoc), "document dimension", tmp, errs);
  rc |= nc_fail(ncmpi_def_dim(nc, DATA_DIM_BLOCK, nblocks, &dblk), "block dimension", tmp, errs);
  rc |= nc_fail(ncmpi_def_var(nc, DATA_VAR_TOKENS, type, 1, &dtok, vtok), "tokens", tmp, errs);
  rc |= nc_fail(ncmpi_def_var(nc, DATA_VAR_DOC_START, NC_INT64, 1, &ddoc, vdoc), "doc_start", tmp, errs);
  rc |= nc_fail(ncmpi_def_var(nc, DATA_VAR_BLOCK_SUM, NC_UINT64, 1, &dblk, vsum), "block_checksum", tmp, errs);
  if (rc) return rc;
  unsigned long long dsum = doc_sum;
  rc |= nc_fail(ncmpi_put_att_ulonglong(nc, *vdoc, "checksum", NC_UINT64, 1, &dsum), "checksum", tmp, errs);
  char created[64], hash[32];
  time_t now = time(NULL);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  util_strlcpy(hash, tok->hash_hex, sizeof hash);
  const char *texts[][2] = {{"title", "greenlm token dataset"},
                            {"format", DATA_FORMAT},
                            {"split", s->name},
                            {"tokenizer", tok->kind == TOK_BPE ? "bpe" : "bytes"},
                            {"tokenizer_dir", tok->kind == TOK_BPE ? cfg->tokenizer.dir : ""},
                            {"tokenizer_hash", hash},
                            {"documents", cfg->prepare.documents},
                            {"separator", j->cs.mode == CFG_DOCS_SEPARATOR_LINE ? cfg->prepare.separator : ""},
                            {"greenlm_version", PACKAGE_VERSION},
                            {"created", created}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    rc |= nc_fail(ncmpi_put_att_text(nc, NC_GLOBAL, texts[i][0], (MPI_Offset)strlen(texts[i][1]), texts[i][1]),
                  texts[i][0], tmp, errs);
  const struct {
    const char *name;
    long long v;
  } ints[] = {{"format_version", DATA_FORMAT_VERSION}, {"vocab_size", tok->vocab_size}, {"eot_id", tok->eot},
              {"seed", cfg->job.seed}, {"source_count", j->cs.nfiles}, {"token_count", s->ntok},
              {"document_count", s->ndoc}, {"block_tokens", DATA_BLOCK_TOKENS}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    rc |= nc_fail(ncmpi_put_att_longlong(nc, NC_GLOBAL, ints[i].name, NC_INT64, 1, &ints[i].v), ints[i].name, tmp, errs);
  double frac = cfg->prepare.val_fraction;
  rc |= nc_fail(ncmpi_put_att_double(nc, NC_GLOBAL, "val_fraction", NC_DOUBLE, 1, &frac), "val_fraction", tmp, errs);
  size_t flen = 1;
  for (int i = 0; i < j->cs.nfiles; i++) flen += strlen(j->cs.path[i]) + 1;
  char *files = util_malloc(flen, "source list");
  files[0] = '\0';
  for (int i = 0, o = 0; i < j->cs.nfiles; i++) o += sprintf(files + o, "%s%s", i ? "\n" : "", j->cs.path[i]);
  rc |= nc_fail(ncmpi_put_att_text(nc, NC_GLOBAL, "source_files", (MPI_Offset)strlen(files), files), "source_files",
                tmp, errs);
  rc |= nc_fail(ncmpi_put_att_longlong(nc, NC_GLOBAL, "source_bytes", NC_INT64, j->cs.nfiles, (const long long *)j->cs.bytes),
                "source_bytes", tmp, errs);
  free(files);
  return rc;
}

/* The next tokens of split `which` in this rank's stream order into v (at most cap), from the document
 * cursor (*d, *in: a document and the tokens of it taken). Returns the count; *err an errno or 0. */
static size_t next_tokens(const prep_job *j, int which, size_t *d, int64_t *in, int32_t *v, size_t cap, void *tmp,
                          int *err) {
  const prep_ctx *c = &j->c;
  size_t n = 0;
  while (n < cap && *d < c->ndoc && !*err) {
    int64_t len = c->doc_at[*d + 1] - c->doc_at[*d];
    if (j->doc_split[*d] != which || *in == len) {
      ++*d, *in = 0;
      continue;
    }
    size_t k = (size_t)(len - *in) < cap - n ? (size_t)(len - *in) : cap - n;
    *err = read_tokens(c, c->doc_at[*d] + *in, k, v + n, tmp);
    n += k, *in += (int64_t)k;
  }
  return n;
}

/* Block checksums of tokens v (n) at global index g, added into mine (per block). */
static void add_checksums(uint64_t *mine, const int32_t *v, size_t n, uint64_t g) {
  for (size_t i = 0; i < n;) {
    uint64_t b = (g + i) / DATA_BLOCK_TOKENS, end = (b + 1) * DATA_BLOCK_TOKENS - g;
    size_t k = (end < n ? (size_t)end : n) - i;
    mine[b] += data_checksum(v + i, k, g + i);
    i += k;
  }
}

/* The split's tokens, this rank's in stream order, in rounds of collective writes of at most the
 * buffer's worth; every rank takes part in every round (an empty part once its tokens are out). The
 * block checksums are summed in *mine as the tokens pass. Returns 0, or -1 after adding an error. */
static int write_tokens(int nc, int vtok, const split_out *s, int which, const prep_job *j, uint64_t *mine, err_list *errs) {
  const prep_ctx *c = &j->c;
  const size_t cap = round_tokens(c, s->my_tok);
  int32_t *v = util_malloc(cap * sizeof *v, "token round");
  void *tmp = util_malloc(cap * (size_t)c->es, "token round"), *out = util_malloc(cap * (size_t)c->es, "token round");
  int64_t rounds = (s->my_tok + (int64_t)cap - 1) / (int64_t)cap, most, written = 0;
  MPI_Allreduce(&rounds, &most, 1, MPI_INT64_T, MPI_MAX, j->comm);
  size_t d = 0;
  int64_t in = 0;
  int rc = 0, err = 0;
  for (int64_t r = 0; r < most; r++) {
    size_t n = next_tokens(j, which, &d, &in, v, cap, tmp, &err);
    add_checksums(mine, v, n, (uint64_t)(s->tok_off + written));
    narrow(out, v, n, c->es);
    MPI_Offset start = s->tok_off + written, count = (MPI_Offset)n;
    int nrc = c->es == 2 ? ncmpi_put_vara_ushort_all(nc, vtok, &start, &count, out)
                         : ncmpi_put_vara_uint_all(nc, vtok, &start, &count, out);
    rc |= nc_fail(nrc, "tokens", s->path, errs);
    written += (int64_t)n;
  }
  if (err) err_add(errs, c->spill_path, 0, 0, PREP_WRITE_HINT, "cannot read the spilled tokens back: %s", strerror(err));
  free(v), free(tmp), free(out);
  return rc || err || written != s->my_tok ? -1 : 0;
}

/* The document starts (every rank its part) and the block checksums (rank 0), after the tokens. */
static int write_split_tail(int nc, const split_out *s, int vdoc, int vsum, int64_t nblocks, const uint64_t *blocks,
                            int rank, err_list *errs) {
  MPI_Offset start = s->doc_off, count = (MPI_Offset)s->my_doc;
  int rc = nc_fail(ncmpi_put_vara_longlong_all(nc, vdoc, &start, &count, (const long long *)s->doc_start), "doc_start",
                   s->path, errs);
  start = 0;
  count = rank == 0 ? nblocks : 0;
  rc |= nc_fail(ncmpi_put_vara_ulonglong_all(nc, vsum, &start, &count, (const unsigned long long *)blocks),
                "block_checksum", s->path, errs);
  return rc;
}

/* Write split `which` collectively into path.tmp, synced, then renamed to path (rank 0). Returns 0 or
 * -1 on every rank, the failing ranks having added their errors. */
static int write_split(const split_out *s, int which, const prep_job *j, err_list *errs) {
  MPI_Comm comm = j->comm;
  char tmp[UTIL_PATH_MAX + 8];
  util_snprintf(tmp, sizeof tmp, "%s.tmp", s->path);
  int nc, vtok, vdoc, vsum, rc = 0;
  if (j->rank == 0 && util_mkdir_parent(s->path) != 0) {
    err_add(errs, s->path, 0, 0, PREP_WRITE_HINT, "cannot create the dataset's directory: %s", strerror(errno));
    rc = -1;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  if (rc != 0) return -1;
  int64_t nblocks = (s->ntok + DATA_BLOCK_TOKENS - 1) / DATA_BLOCK_TOKENS;
  split_out named = *s;
  named.path = tmp; /* errors name the file being written */
  uint64_t *mine = util_calloc((size_t)(nblocks ? nblocks : 1), sizeof *mine, "block checksums");
  uint64_t *blocks = util_malloc((size_t)(nblocks ? nblocks : 1) * sizeof *blocks, "block checksums"), doc_sum;
  uint64_t dmine = data_checksum64(s->doc_start, s->my_doc, (uint64_t)s->doc_off);
  MPI_Allreduce(&dmine, &doc_sum, 1, MPI_UINT64_T, MPI_SUM, comm);
  rc = nc_fail(ncmpi_create(comm, tmp, NC_CLOBBER | NC_64BIT_DATA, MPI_INFO_NULL, &nc), "create", tmp, errs);
  if (rc == 0) {
    rc |= define_split(nc, &named, j, nblocks, doc_sum, &vtok, &vdoc, &vsum, errs);
    rc |= nc_fail(ncmpi_enddef(nc), "header", tmp, errs);
    int bad = rc != 0, any; /* every rank or none goes on to the collective writes */
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    if (!any) rc = write_tokens(nc, vtok, &named, which, j, mine, errs);
    MPI_Allreduce(mine, blocks, (int)nblocks, MPI_UINT64_T, MPI_SUM, comm);
    if (!any) rc |= write_split_tail(nc, &named, vdoc, vsum, nblocks, blocks, j->rank, errs);
    rc |= nc_fail(ncmpi_sync(nc), "sync", tmp, errs); /* every rank flushes what it wrote */
    rc |= nc_fail(ncmpi_close(nc), "close", tmp, errs);
  }
  free(blocks), free(mine);
  /* all ranks agree; then rank 0 gives the file its name */
  return ncfile_commit(comm, rc != 0, tmp, s->path, "dataset", PREP_WRITE_HINT, errs) ? -1 : 0;
}

/* ---- the task's phases: each returns 0, or 1 (on every rank) after errors were added ---------- */

static int open_inputs(prep_job *j, err_list *errs) {
  const cfg_config *cfg = j->cfg;
  const cfg_prepare *pc = &cfg->prepare;
  int e0 = errs->n, bad = tok_open(&j->tok, cfg_tokenizer_kind_of(&cfg->tokenizer), cfg->tokenizer.dir, errs) != 0, any;
  if (bad) cfg_relocate(cfg, errs, e0, "tokenizer", "dir");
  j->have_tok = !bad;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, j->comm);
  if (any) return 1;
  if (corpus_open(&j->cs, cfg, "prepare", "input", &pc->input, j->comm, errs)) return 1;
  j->have_cs = 1;
  return 0;
}

/* This rank's share of the text into tokens, document by document; beyond the buffer into the spill
 * file beside train_out (its room for the tokens is reserved once: no reallocation past the budget). */
static int encode_share(prep_job *j, err_list *errs) {
  double t0 = util_now();
  prep_ctx *c = &j->c;
  c->tok = &j->tok;
  c->es = j->tok.vocab_size <= 65536 ? 2 : 4;
  c->budget = corpus_buffer_tokens(j->cfg->prepare.buffer_mb);
  c->ids.cap = c->budget + CORPUS_PIECE_TOKENS + 1; /* a piece's tokens on top of a full buffer */
  c->ids.v = util_malloc(c->ids.cap * sizeof *c->ids.v, "token buffer");
  util_snprintf(c->spill_path, sizeof c->spill_path, "%s.spill-%d", j->sp[0].path, j->rank);
  int rc = corpus_each(&j->cs, on_piece, c, errs), any;
  if (rc == 0 && c->spill_errno) {
    err_add(errs, c->spill_path, 0, 0, "the spill files need about the datasets' size of free space beside train_out; "
            "free some or raise &prepare buffer_mb", "cannot spill tokens: %s", strerror(c->spill_errno));
    rc = -1;
  }
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MIN, j->comm);
  if (any != 0) return 1;
  if (c->ndoc == 0 || c->doc_at == NULL) { /* an empty share */
    c->doc_at = util_realloc(c->doc_at, sizeof *c->doc_at, "documents");
    c->doc_begins = util_realloc(c->doc_begins, sizeof *c->doc_begins, "documents");
  }
  c->doc_at[c->ndoc] = c->spilled + (int64_t)c->ids.n;
  /* the writing rounds' buffers come on top: when both would pass the budget, the rest is spilled too */
  if (c->ids.n * sizeof(int32_t) + round_tokens(c, c->spilled + (int64_t)c->ids.n) * (4 + 2 * (size_t)c->es) >
      c->budget * sizeof(int32_t)) {
    int64_t n = c->spilled + (int64_t)c->ids.n;
    spill(c);
    tok_ids_free(&c->ids);
    c->spilled = n;
  }
  j->t_tok = util_now() - t0;
  if (c->spill_errno) { /* a late spill failed */
    err_add(errs, c->spill_path, 0, 0, "free some space beside train_out or raise &prepare buffer_mb",
            "cannot spill tokens: %s", strerror(c->spill_errno));
    rc = -1;
  }
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MIN, j->comm);
  return any != 0;
}

/* Global document indices, the validation documents, and each split's part on this rank. */
static int split_documents(prep_job *j, err_list *errs) {
  const cfg_prepare *pc = &j->cfg->prepare;
  prep_ctx *c = &j->c;
  int64_t nbegin = 0, first = 0;
  for (size_t i = 0; i < c->ndoc; i++) nbegin += c->doc_begins[i];
  MPI_Exscan(&nbegin, &first, 1, MPI_INT64_T, MPI_SUM, j->comm);
  if (j->rank == 0) first = 0;
  MPI_Allreduce(&nbegin, &j->ndocs, 1, MPI_INT64_T, MPI_SUM, j->comm);
  int64_t ndocs = j->ndocs, nval = (int64_t)((double)ndocs * pc->val_fraction + 0.5);
  if (pc->val_fraction > 0 && nval == 0) nval = 1;
  if (nval >= ndocs) nval = ndocs - 1;
  j->nval = nval;
  if (ndocs < 1 || (pc->val_fraction > 0 && ndocs < 2)) {
    cfg_error_at(j->cfg, errs, "prepare", "documents",
                 "give more files, or divide the text into more documents (documents = 'line' or 'blank_line')",
                 "the input has %lld document%s; a validation split needs at least 2", (long long)ndocs,
                 ndocs == 1 ? "" : "s");
    return 1;
  }
  int64_t *val = val_docs(ndocs, nval, (uint64_t)j->cfg->job.seed);
  split_out *sp = j->sp;
  j->doc_split = util_malloc(c->ndoc ? c->ndoc : 1, "document splits");
  for (int s = 0; s < 2; s++) sp[s].doc_start = util_malloc((c->ndoc ? c->ndoc : 1) * sizeof(int64_t), "split documents");
  int64_t next = first;
  for (size_t i = 0; i < c->ndoc; i++) {
    int64_t g = c->doc_begins[i] ? next++ : first - 1; /* a continued document is the previous rank's last */
    int which = j->doc_split[i] = (unsigned char)is_val_doc(val, nval, g);
    split_out *s = &sp[which];
    if (c->doc_begins[i]) s->doc_start[s->my_doc++] = s->my_tok; /* local for now */
    s->my_tok += c->doc_at[i + 1] - c->doc_at[i];
  }
  free(val);
  for (int s = 0; s < 2; s++) {
    int64_t mine[2] = {sp[s].my_tok, (int64_t)sp[s].my_doc}, off[2] = {0, 0}, tot[2];
    MPI_Exscan(mine, off, 2, MPI_INT64_T, MPI_SUM, j->comm);
    if (j->rank == 0) off[0] = off[1] = 0;
    MPI_Allreduce(mine, tot, 2, MPI_INT64_T, MPI_SUM, j->comm);
    sp[s].tok_off = off[0], sp[s].doc_off = off[1], sp[s].ntok = tot[0], sp[s].ndoc = tot[1];
    for (size_t i = 0; i < sp[s].my_doc; i++) sp[s].doc_start[i] += off[0];
  }
  return 0;
}

static int write_splits(prep_job *j, err_list *errs) {
  double t1 = util_now();
  for (int s = 0; s < 2; s++) {
    if (s == 1 && j->nval == 0) break; /* no validation split asked for */
    int e0 = errs->n;
    if (write_split(&j->sp[s], s, j, errs) != 0) {
      cfg_relocate(j->cfg, errs, e0, "prepare", s ? "val_out" : "train_out");
      return 1;
    }
  }
  j->t_write = util_now() - t1;
  return 0;
}

/* Throughput: bytes encoded per second of encoding, per rank and for the job (printed by rank 0). */
static void report(const prep_job *j) {
  const prep_ctx *c = &j->c;
  double sec[2] = {c->seconds, c->seconds}, sec_out[2];
  int64_t bytes = c->bytes, bytes_all;
  MPI_Reduce(sec, sec_out, 1, MPI_DOUBLE, MPI_MAX, 0, j->comm);
  MPI_Reduce(sec + 1, sec_out + 1, 1, MPI_DOUBLE, MPI_SUM, 0, j->comm);
  MPI_Reduce(&bytes, &bytes_all, 1, MPI_INT64_T, MPI_SUM, 0, j->comm);
  double rss = util_peak_rss(), rss_most;
  MPI_Reduce(&rss, &rss_most, 1, MPI_DOUBLE, MPI_MAX, 0, j->comm);
  char b1[32], kinds[256];
  int P = j->P;
  if (j->rank == 0)
    printf("prepare: %s, %s, %lld document%s (%lld train, %lld validation), tokenizer %s\n",
           corpus_describe(&j->cs, P, kinds, sizeof kinds), util_fmt_bytes((double)j->cs.total, b1, sizeof b1),
           (long long)j->ndocs, j->ndocs == 1 ? "" : "s", (long long)(j->ndocs - j->nval), (long long)j->nval, j->tok.desc);
  corpus_report(&j->cs, j->comm, "prepare");
  if (j->rank != 0) return;
  printf("prepare: %s: %lld tokens; %s: %lld tokens\n", j->sp[0].path, (long long)j->sp[0].ntok,
         j->nval ? j->sp[1].path : "(no validation split)", (long long)j->sp[1].ntok);
  printf("prepare: encoded %.2f MB in %.2f s on %d rank%s: %.2f MB/s per rank, %.2f MB/s in all "
         "(reading and splitting %.2f s, writing %.2f s)\n",
         bytes_all / 1e6, sec_out[0], P, P == 1 ? "" : "s", bytes_all / 1e6 / (sec_out[1] > 0 ? sec_out[1] : 1e-9),
         bytes_all / 1e6 / (sec_out[0] > 0 ? sec_out[0] : 1e-9), j->t_tok - sec_out[0] > 0 ? j->t_tok - sec_out[0] : 0.0,
         j->t_write);
  printf("prepare: peak resident memory %s (%.0f bytes) on the rank that used the most; &prepare buffer_mb = %g\n",
         util_fmt_bytes(rss_most, b1, sizeof b1), rss_most, j->cfg->prepare.buffer_mb);
  fflush(stdout);
}

static void close_job(prep_job *j) {
  for (int s = 0; s < 2; s++) free(j->sp[s].doc_start);
  free(j->doc_split);
  if (j->c.fd >= 0) close(j->c.fd), unlink(j->c.spill_path);
  free(j->c.doc_at), free(j->c.doc_begins);
  tok_ids_free(&j->c.ids);
  if (j->have_cs) corpus_close(&j->cs);
  if (j->have_tok) tok_free(&j->tok);
}

/* ---- before any task runs ------------------------------------------------------------------------ */

/* Whether the output at &prepare key exists as something other than a regular file. */
static int not_a_file(const cfg_config *cfg, const char *path, const char *key, err_list *errs) {
  struct stat st;
  const char *kind = stat(path, &st) == 0 ? util_file_kind(st.st_mode) : NULL;
  if (kind)
    cfg_error_at(cfg, errs, "prepare", key, "give the path of a file to write, e.g. 'runs/data/train.nc'",
                 "'%s' is %s, not a dataset file", path, kind);
  return kind != NULL;
}

/* Whether out (at &prepare key) is one of the files of &tokenizer dir, which the task reads. */
static int tokenizer_file(const cfg_config *cfg, const char *out, const char *key, err_list *errs) {
  static const char *const names[] = {"encoder.json", "vocab.bpe", "vocab.json", "merges.txt", "tokenizer.json", TOK_MANIFEST};
  if (cfg_tokenizer_kind_of(&cfg->tokenizer) != CFG_TOK_BPE) return 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char p[UTIL_PATH_MAX + 32];
    util_snprintf(p, sizeof p, "%s/%s", cfg->tokenizer.dir, names[i]);
    if (!fileid_same_path(p, out)) continue;
    cfg_error_at(cfg, errs, "prepare", key, "write the datasets elsewhere", "'%s' is the tokenizer's file '%s' "
                 "(&tokenizer dir): writing it would destroy the tokenizer", out, p);
    return 1;
  }
  return 0;
}

/* The files of one split (&prepare key): the dataset, its .tmp and, nspill > 0, the ranks' spill files. */
static int check_split_out(const cfg_config *cfg, const char *path, const char *key, int nspill, err_list *errs) {
  char tmp[UTIL_PATH_MAX + 8];
  util_snprintf(tmp, sizeof tmp, "%s.tmp", path);
  const cfg_strlist *in = &cfg->prepare.input;
  return not_a_file(cfg, path, key, errs) || corpus_clash(cfg, "prepare", "input", in, path, nspill, "prepare", key, errs) ||
         corpus_clash(cfg, "prepare", "input", in, tmp, 0, "prepare", key, errs) || tokenizer_file(cfg, path, key, errs);
}

int prepare_preflight(const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  int rank, P, bad = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  const cfg_prepare *pc = &cfg->prepare;
  int val = pc->val_fraction > 0; /* a validation split is written */
  if (rank == 0) {
    bad = check_split_out(cfg, pc->train_out, "train_out", P, errs);
    if (val) bad |= check_split_out(cfg, pc->val_out, "val_out", 0, errs);
    if (val && fileid_same_path(pc->train_out, pc->val_out)) {
      cfg_error_at(cfg, errs, "prepare", "val_out", "give the validation split a file of its own, or val_fraction = 0 "
                   "for none", "'%s' is the same file as &prepare train_out '%s': one split would replace the other",
                   pc->val_out, pc->train_out);
      bad = 1;
    }
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  return bad;
}

int prepare_run(const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  prep_job j = {.cfg = cfg, .comm = comm, .c = {.fd = -1}};
  MPI_Comm_rank(comm, &j.rank);
  MPI_Comm_size(comm, &j.P);
  j.sp[0] = (split_out){.name = "train", .path = cfg->prepare.train_out};
  j.sp[1] = (split_out){.name = "val", .path = cfg->prepare.val_out};
  int rc = open_inputs(&j, errs) || encode_share(&j, errs) || split_documents(&j, errs) || write_splits(&j, errs);
  if (rc == 0) report(&j);
  close_job(&j);
  return rc;
}
