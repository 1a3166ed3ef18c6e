/* prepare: tokenize a corpus in parallel and write the train/validation token datasets. */
#include "text/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "text/corpus.h"
#include "text/data.h"
#include "base/rng.h"
#include "text/tok.h"
#include "base/util.h"

typedef struct {
  tok_tokenizer *tok;
  tok_ids ids;       /* this rank's tokens, document after document */
  int64_t *doc_at;   /* (ndoc + 1) token offset of each local document in ids */
  int *doc_begins;   /* 1: the document begins on this rank; 0: it continues the previous rank's last */
  size_t ndoc, cap;
  double seconds;    /* spent encoding */
  int64_t bytes;     /* encoded */
} prep_ctx;

static void on_piece(const char *text, size_t len, int begins, int ends, void *p) {
  prep_ctx *c = p;
  if (begins || c->ndoc == 0) {
    if (c->ndoc + 1 >= c->cap) {
      c->cap = c->cap ? 2 * c->cap : 1024;
      c->doc_at = util_realloc(c->doc_at, c->cap * sizeof *c->doc_at, "documents");
      c->doc_begins = util_realloc(c->doc_begins, c->cap * sizeof *c->doc_begins, "documents");
    }
    c->doc_at[c->ndoc] = (int64_t)c->ids.n;
    c->doc_begins[c->ndoc++] = begins;
  }
  double t0 = util_now();
  tok_encode(c->tok, text, len, 0, &c->ids);
  if (ends && c->tok->eot >= 0) tok_ids_push(&c->ids, c->tok->eot);
  c->seconds += util_now() - t0;
  c->bytes += (int64_t)len;
}

/* Which documents go to validation: the first nval of a seeded shuffle of all ndocs. */
static unsigned char *val_flags(int64_t ndocs, int64_t nval, uint64_t seed) {
  unsigned char *is_val = util_calloc((size_t)ndocs ? (size_t)ndocs : 1, 1, "split");
  int64_t *perm = util_malloc((size_t)(ndocs ? ndocs : 1) * sizeof *perm, "split");
  for (int64_t i = 0; i < ndocs; i++) perm[i] = i;
  rng_state r;
  rng_seed(&r, seed, RNG_DATA, 0x5e11c7ULL); /* a stream of its own, apart from the epochs' */
  for (int64_t i = 0; i < nval; i++) { /* partial Fisher-Yates: the first nval places */
    int64_t j = i + (int64_t)rng_below(&r, (uint64_t)(ndocs - i)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
    is_val[perm[i]] = 1;
  }
  free(perm);
  return is_val;
}

typedef struct {
  const char *name, *path;
  int64_t ntok, ndoc;       /* totals */
  int64_t tok_off, doc_off; /* this rank's offsets */
  int32_t *tok;             /* this rank's tokens of the split */
  int64_t *doc_start;       /* this rank's document starts (global token indices) */
  size_t my_tok, my_doc;
} split_out;

static int nc_fail(int rc, const char *what, const char *path, char *err, size_t errlen) {
  if (rc == NC_NOERR) return 0;
  util_snprintf(err, errlen, "writing '%s' (%s): %s", path, what, ncmpi_strerror(rc));
  return -1;
}

/* Write one split collectively into path.tmp, then rename it to path. */
static int write_split(const split_out *s, const cfg_config *cfg, const tok_tokenizer *tok, const corpus_set *cs,
                       MPI_Comm comm, char *err, size_t errlen) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  char tmp[CFG_STR_LEN + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", s->path);
  int rc = 0;
  if (rank == 0) {
    char dir[CFG_STR_LEN];
    util_strlcpy(dir, s->path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
      *slash = '\0';
      if (util_mkdir_p(dir) != 0) {
        util_snprintf(err, errlen, "cannot create directory '%s': %s", dir, strerror(errno));
        rc = -1;
      }
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  if (rc != 0) {
    MPI_Bcast(err, (int)errlen, MPI_CHAR, 0, comm);
    return -1;
  }
  int nc, dtok, ddoc, vtok, vdoc;
  nc_type type = tok->vocab_size <= 65536 ? NC_USHORT : NC_UINT;
  rc = nc_fail(ncmpi_create(comm, tmp, NC_CLOBBER | NC_64BIT_DATA, MPI_INFO_NULL, &nc), "create", tmp, err, errlen);
  if (rc != 0) return -1;
  rc |= nc_fail(ncmpi_def_dim(nc, DATA_DIM_TOKEN, s->ntok, &dtok), "token dimension", tmp, err, errlen);
  rc |= nc_fail(ncmpi_def_dim(nc, DATA_DIM_DOCUMENT, s->ndoc, &ddoc), "document dimension", tmp, err, errlen);
  rc |= nc_fail(ncmpi_def_var(nc, DATA_VAR_TOKENS, type, 1, &dtok, &vtok), "tokens", tmp, err, errlen);
  rc |= nc_fail(ncmpi_def_var(nc, DATA_VAR_DOC_START, NC_INT64, 1, &ddoc, &vdoc), "doc_start", tmp, err, errlen);
  /* attributes: what made the file, from what */
  char created[64], hash[32];
  time_t now = time(NULL);
  strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  util_strlcpy(hash, tok->hash_hex, sizeof hash);
  const char *texts[][2] = {{"title", "greenlm token dataset"},
                            {"split", s->name},
                            {"tokenizer", tok->kind == TOK_BPE ? "bpe" : "bytes"},
                            {"tokenizer_dir", tok->kind == TOK_BPE ? cfg->tokenizer.dir : ""},
                            {"tokenizer_hash", hash},
                            {"documents", cfg->prepare.documents},
                            {"separator", cs->mode == CORPUS_DOC_SEPARATOR_LINE ? cfg->prepare.separator : ""},
                            {"greenlm_version", PACKAGE_VERSION},
                            {"created", created}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    rc |= nc_fail(ncmpi_put_att_text(nc, NC_GLOBAL, texts[i][0], (MPI_Offset)strlen(texts[i][1]), texts[i][1]),
                  texts[i][0], tmp, err, errlen);
  long long ints[][1] = {{tok->vocab_size}, {tok->eot}, {cfg->job.seed}, {cs->nfiles}, {s->ntok}, {s->ndoc}};
  const char *int_names[] = {"vocab_size", "eot_id", "seed", "source_count", "token_count", "document_count"};
  for (int i = 0; i < 6; i++)
    rc |= nc_fail(ncmpi_put_att_longlong(nc, NC_GLOBAL, int_names[i], NC_INT64, 1, ints[i]), int_names[i], tmp, err,
                  errlen);
  double frac = cfg->prepare.val_fraction;
  rc |= nc_fail(ncmpi_put_att_double(nc, NC_GLOBAL, "val_fraction", NC_DOUBLE, 1, &frac), "val_fraction", tmp, err,
                errlen);
  size_t flen = 0;
  for (int i = 0; i < cs->nfiles; i++) flen += strlen(cs->path[i]) + 1;
  char *files = util_malloc(flen + 1, "source list");
  files[0] = '\0';
  for (int i = 0, o = 0; i < cs->nfiles; i++) o += sprintf(files + o, "%s%s", i ? "\n" : "", cs->path[i]);
  rc |= nc_fail(ncmpi_put_att_text(nc, NC_GLOBAL, "source_files", (MPI_Offset)strlen(files), files), "source_files",
                tmp, err, errlen);
  rc |= nc_fail(ncmpi_put_att_longlong(nc, NC_GLOBAL, "source_bytes", NC_INT64, cs->nfiles, (const long long *)cs->bytes),
                "source_bytes", tmp, err, errlen);
  free(files);
  rc |= nc_fail(ncmpi_enddef(nc), "header", tmp, err, errlen);
  /* data */
  MPI_Offset start = s->tok_off, count = (MPI_Offset)s->my_tok;
  if (type == NC_USHORT) {
    unsigned short *u = util_malloc((s->my_tok ? s->my_tok : 1) * sizeof *u, "tokens");
    for (size_t i = 0; i < s->my_tok; i++) u[i] = (unsigned short)s->tok[i];
    rc |= nc_fail(ncmpi_put_vara_ushort_all(nc, vtok, &start, &count, u), "tokens", tmp, err, errlen);
    free(u);
  } else {
    unsigned int *u = util_malloc((s->my_tok ? s->my_tok : 1) * sizeof *u, "tokens");
    for (size_t i = 0; i < s->my_tok; i++) u[i] = (unsigned int)s->tok[i];
    rc |= nc_fail(ncmpi_put_vara_uint_all(nc, vtok, &start, &count, u), "tokens", tmp, err, errlen);
    free(u);
  }
  start = s->doc_off;
  count = (MPI_Offset)s->my_doc;
  rc |= nc_fail(ncmpi_put_vara_longlong_all(nc, vdoc, &start, &count, (const long long *)s->doc_start), "doc_start",
                tmp, err, errlen);
  rc |= nc_fail(ncmpi_sync(nc), "sync", tmp, err, errlen); /* every rank flushes what it wrote */
  rc |= nc_fail(ncmpi_close(nc), "close", tmp, err, errlen);
  /* all ranks agree; then rank 0 gives the file its name */
  int bad = rc != 0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (rank == 0) {
    if (!any && util_commit(tmp, s->path) != 0) {
      util_snprintf(err, errlen, "cannot finish '%s': %s", s->path, strerror(errno));
      any = 1;
    }
    if (any) remove(tmp);
  }
  MPI_Bcast(&any, 1, MPI_INT, 0, comm);
  if (any) {
    /* the first failing rank's message */
    int who = bad ? rank : 1 << 30, first;
    MPI_Allreduce(&who, &first, 1, MPI_INT, MPI_MIN, comm);
    MPI_Bcast(err, (int)errlen, MPI_CHAR, first < (1 << 30) ? first : 0, comm);
    return -1;
  }
  return 0;
}

int prepare_run(const cfg_config *cfg, MPI_Comm comm) {
  int rank, P;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  const cfg_prepare *pc = &cfg->prepare;
  nml_errors errs = {0};
  char err[2048] = "";
  tok_tokenizer tok;
  if (tok_open(&tok, cfg->tokenizer.kind, cfg->tokenizer.dir, err, sizeof err) != 0) {
    cfg_error_at(cfg, &errs, "tokenizer", "dir", "run the 'tokenizer' task first, or point dir at GPT-2's files", "%s",
                 err);
    if (rank == 0) nml_errors_print(&errs, 20);
    nml_errors_free(&errs);
    return 1;
  }
  corpus_set cs;
  if (corpus_open(&cs, cfg, "prepare", "input", &pc->input, pc->documents, pc->separator, comm, &errs)) {
    if (rank == 0) nml_errors_print(&errs, 20);
    nml_errors_free(&errs);
    tok_free(&tok);
    return 1;
  }
  double t0 = util_now();
  prep_ctx c = {.tok = &tok};
  int rc = corpus_each(&cs, on_piece, &c, err, sizeof err), any;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MIN, comm);
  if (any != 0) {
    if (rc != 0) fprintf(stderr, "greenlm: error: %s\n", err);
    corpus_close(&cs);
    tok_free(&tok);
    return 1;
  }
  if (c.ndoc == 0 || c.doc_at == NULL) { /* an empty share */
    c.doc_at = util_realloc(c.doc_at, sizeof *c.doc_at, "documents");
    c.doc_begins = util_realloc(c.doc_begins, sizeof *c.doc_begins, "documents");
  }
  c.doc_at[c.ndoc] = (int64_t)c.ids.n;
  double t_tok = util_now() - t0;

  /* global document indices and the split */
  int64_t nbegin = 0, first = 0, ndocs = 0;
  for (size_t i = 0; i < c.ndoc; i++) nbegin += c.doc_begins[i];
  MPI_Exscan(&nbegin, &first, 1, MPI_INT64_T, MPI_SUM, comm);
  if (rank == 0) first = 0;
  MPI_Allreduce(&nbegin, &ndocs, 1, MPI_INT64_T, MPI_SUM, comm);
  int64_t nval = (int64_t)((double)ndocs * pc->val_fraction + 0.5);
  if (pc->val_fraction > 0 && nval == 0) nval = 1;
  if (nval >= ndocs) nval = ndocs - 1;
  if (ndocs < 1 || (pc->val_fraction > 0 && ndocs < 2)) {
    cfg_error_at(cfg, &errs, "prepare", "documents",
                 "give more files, or divide the text into more documents (documents = 'line' or 'blank_line')",
                 "the input has %lld document%s; a validation split needs at least 2", (long long)ndocs,
                 ndocs == 1 ? "" : "s");
    if (rank == 0) nml_errors_print(&errs, 20);
    nml_errors_free(&errs);
    corpus_close(&cs);
    tok_free(&tok);
    return 1;
  }
  unsigned char *is_val = val_flags(ndocs, nval, (uint64_t)cfg->job.seed);
  split_out sp[2] = {{.name = "train", .path = pc->train_out}, {.name = "val", .path = pc->val_out}};
  for (int s = 0; s < 2; s++) {
    sp[s].tok = util_malloc((c.ids.n ? c.ids.n : 1) * sizeof(int32_t), "split tokens");
    sp[s].doc_start = util_malloc((c.ndoc ? c.ndoc : 1) * sizeof(int64_t), "split documents");
  }
  int64_t next = first;
  for (size_t i = 0; i < c.ndoc; i++) {
    int64_t g = c.doc_begins[i] ? next++ : first - 1; /* a continued document is the previous rank's last */
    split_out *s = &sp[is_val[g]];
    size_t n = (size_t)(c.doc_at[i + 1] - c.doc_at[i]);
    if (c.doc_begins[i]) s->doc_start[s->my_doc++] = (int64_t)s->my_tok; /* local for now */
    memcpy(s->tok + s->my_tok, c.ids.v + c.doc_at[i], n * sizeof(int32_t));
    s->my_tok += n;
  }
  free(is_val);
  for (int s = 0; s < 2; s++) {
    int64_t mine[2] = {(int64_t)sp[s].my_tok, (int64_t)sp[s].my_doc}, off[2] = {0, 0}, tot[2];
    MPI_Exscan(mine, off, 2, MPI_INT64_T, MPI_SUM, comm);
    if (rank == 0) off[0] = off[1] = 0;
    MPI_Allreduce(mine, tot, 2, MPI_INT64_T, MPI_SUM, comm);
    sp[s].tok_off = off[0], sp[s].doc_off = off[1], sp[s].ntok = tot[0], sp[s].ndoc = tot[1];
    for (size_t i = 0; i < sp[s].my_doc; i++) sp[s].doc_start[i] += off[0];
  }
  double t1 = util_now();
  rc = 0;
  for (int s = 0; s < 2 && rc == 0; s++) {
    if (s == 1 && nval == 0) break; /* no validation split asked for */
    rc = write_split(&sp[s], cfg, &tok, &cs, comm, err, sizeof err);
    if (rc != 0) cfg_error_at(cfg, &errs, "prepare", s ? "val_out" : "train_out",
                              "check that the directory is writable and the disk is not full", "%s", err);
  }
  double t_write = util_now() - t1;
  /* throughput: bytes encoded per second of encoding, per rank and for the job */
  double sec[2] = {c.seconds, c.seconds}, sec_out[2];
  int64_t bytes = c.bytes, bytes_all;
  MPI_Reduce(sec, sec_out, 1, MPI_DOUBLE, MPI_MAX, 0, comm);
  MPI_Reduce(sec + 1, sec_out + 1, 1, MPI_DOUBLE, MPI_SUM, 0, comm);
  MPI_Reduce(&bytes, &bytes_all, 1, MPI_INT64_T, MPI_SUM, 0, comm);
  if (rank == 0) {
    if (rc != 0) {
      nml_errors_print(&errs, 20);
    } else {
      char b1[32];
      printf("prepare: %d file%s, %s, %lld document%s (%lld train, %lld validation), tokenizer %s\n", cs.nfiles,
             cs.nfiles == 1 ? "" : "s", util_fmt_bytes((double)cs.total, b1, sizeof b1), (long long)ndocs, ndocs == 1 ? "" : "s",
             (long long)(ndocs - nval), (long long)nval, tok.desc);
      printf("prepare: %s: %lld tokens; %s: %lld tokens\n", sp[0].path, (long long)sp[0].ntok,
             nval ? sp[1].path : "(no validation split)", (long long)sp[1].ntok);
      printf("prepare: encoded %.2f MB in %.2f s on %d rank%s: %.2f MB/s per rank, %.2f MB/s in all "
             "(reading and splitting %.2f s, writing %.2f s)\n",
             bytes_all / 1e6, sec_out[0], P, P == 1 ? "" : "s", bytes_all / 1e6 / (sec_out[1] > 0 ? sec_out[1] : 1e-9),
             bytes_all / 1e6 / (sec_out[0] > 0 ? sec_out[0] : 1e-9), t_tok - sec_out[0] > 0 ? t_tok - sec_out[0] : 0.0,
             t_write);
      fflush(stdout);
    }
  }
  for (int s = 0; s < 2; s++) free(sp[s].tok), free(sp[s].doc_start);
  free(c.doc_at), free(c.doc_begins);
  tok_ids_free(&c.ids);
  nml_errors_free(&errs);
  corpus_close(&cs);
  tok_free(&tok);
  return rc != 0;
}
