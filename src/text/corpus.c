/* corpus: input expansion, rank shares at safe cut points, document pieces. */
#include "text/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/util.h"
#include "text/reader.h"

#define CORPUS_BLOCK ((int64_t)CORPUS_PIECE_TOKENS) /* bytes read and handed on at a time */

/* ---- input expansion (rank 0) ------------------------------------------------------------------ */

typedef struct {
  char **path;
  int64_t *bytes;
  int n, cap;
} file_list;

static void list_add(file_list *l, const char *path, int64_t bytes) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->path = util_realloc(l->path, (size_t)l->cap * sizeof *l->path, "file list");
    l->bytes = util_realloc(l->bytes, (size_t)l->cap * sizeof *l->bytes, "file list");
  }
  l->path[l->n] = util_strdup(path);
  l->bytes[l->n++] = bytes;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Where the inputs come from: errors about them are reported at that deck key. */
typedef struct {
  const cfg_config *cfg;
  const char *group, *key;
  err_list *errs;
} input_place;

#define input_error(at, hint, ...) cfg_error_at((at)->cfg, (at)->errs, (at)->group, (at)->key, hint, __VA_ARGS__)

/* Add one input (file, directory or glob pattern). Returns 0, or -1 after reporting it at `at`. */
static int expand_one(file_list *l, const char *in, const input_place *at) {
  if (strpbrk(in, "*?[")) {
    glob_t g;
    int rc = glob(in, 0, NULL, &g);
    if (rc != 0) {
      input_error(at, "check the pattern; it is expanded from the working directory", "no file matches '%s'", in);
      if (rc != GLOB_NOMATCH) globfree(&g);
      return -1;
    }
    int n0 = l->n;
    for (size_t i = 0; i < g.gl_pathc; i++) {
      struct stat st;
      if (stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) {
        if (st.st_size == 0) {
          input_error(at, "remove empty files from the input", "'%s' (from '%s') is empty", g.gl_pathv[i], in);
          globfree(&g);
          return -1;
        }
        list_add(l, g.gl_pathv[i], (int64_t)st.st_size);
      }
    }
    globfree(&g);
    if (l->n == n0) {
      input_error(at, "check the pattern", "'%s' matches no regular file", in);
      return -1;
    }
    return 0;
  }
  struct stat st;
  if (stat(in, &st) != 0) {
    input_error(at, "check the path (relative paths start at the working directory)", "cannot open '%s': %s", in, strerror(errno));
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(in);
    if (!d) {
      input_error(at, "check its permissions", "cannot read directory '%s': %s", in, strerror(errno));
      return -1;
    }
    file_list sub = {0};
    struct dirent *de;
    while ((de = readdir(d))) {
      if (de->d_name[0] == '.') continue;
      char p[4096];
      util_snprintf(p, sizeof p, "%s/%s", in, de->d_name);
      struct stat fs;
      if (stat(p, &fs) == 0 && S_ISREG(fs.st_mode) && fs.st_size > 0) list_add(&sub, p, (int64_t)fs.st_size);
    }
    closedir(d);
    if (sub.n == 0) {
      input_error(at, "point the input at files with text, or at a glob such as 'dir/*.txt'", "directory '%s' has no text (no non-empty regular files)", in);
      free(sub.path);
      free(sub.bytes);
      return -1;
    }
    /* sorted by name, carrying the sizes along */
    int *order = util_malloc((size_t)sub.n * sizeof(int), "order");
    char **names = util_malloc((size_t)sub.n * sizeof(char *), "order");
    memcpy(names, sub.path, (size_t)sub.n * sizeof(char *));
    qsort(names, (size_t)sub.n, sizeof(char *), cmp_str);
    for (int i = 0; i < sub.n; i++)
      for (int j = 0; j < sub.n; j++)
        if (names[i] == sub.path[j]) order[i] = j;
    for (int i = 0; i < sub.n; i++) list_add(l, sub.path[order[i]], sub.bytes[order[i]]);
    for (int i = 0; i < sub.n; i++) free(sub.path[i]);
    free(sub.path), free(sub.bytes), free(order), free(names);
    return 0;
  }
  if (!S_ISREG(st.st_mode)) {
    input_error(at, "give text files, directories of text files or glob patterns", "'%s' is not a regular file", in);
    return -1;
  }
  if (st.st_size == 0) {
    input_error(at, "give a file with text in it", "'%s' is empty", in);
    return -1;
  }
  list_add(l, in, (int64_t)st.st_size);
  return 0;
}

/* ---- byte access and cut points ---------------------------------------------------------------- */

static int file_of(const corpus_set *c, int64_t pos) {
  int lo = 0, hi = c->nfiles - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (c->start[mid] <= pos) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Read n bytes of file f at file offset off. Returns bytes read or -1. */
static ssize_t read_at(const corpus_set *c, int f, int64_t off, char *buf, size_t n) {
  int fd = open(c->path[f], O_RDONLY);
  if (fd < 0) return -1;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + (int64_t)got));
    if (r < 0) {
      close(fd);
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  return (ssize_t)got;
}

static int printable(unsigned char x) { return x > 0x20 && x < 0x7f; }

/* Is file offset p (a line start, 0 < p) of a file whose bytes around p are in buf (buf[i] is byte
 * base + i) a document boundary? */
static int boundary_in(const corpus_set *c, const char *buf, int64_t base, int64_t p) {
  const char *b = buf - base; /* b[x] is file byte x */
  size_t sl = strlen(c->separator);
  switch (c->mode) {
  case CFG_DOCS_LINE: return 1;
  case CFG_DOCS_BLANK_LINE: return p >= 2 && b[p - 2] == '\n' ? 1 : p == 1;
  case CFG_DOCS_SEPARATOR_LINE:
    if (p - 1 < (int64_t)sl) return 0;
    if (memcmp(b + p - 1 - (int64_t)sl, c->separator, sl) != 0) return 0;
    return p - 1 == (int64_t)sl || b[p - 2 - (int64_t)sl] == '\n';
  case CFG_DOCS_FILE: return 0;
  }
  return 0;
}

/* Smallest cut point >= pos (a document boundary or a safe line start), or the stream end. */
static int64_t find_cut(const corpus_set *c, int64_t pos, int *is_boundary) {
  *is_boundary = 1;
  if (pos >= c->total) return c->total;
  int f = file_of(c, pos);
  if (pos == c->start[f]) return pos;
  const int64_t look = (int64_t)strlen(c->separator) + 2, win = 1 << 20;
  char *buf = util_malloc((size_t)(look + win + 1), "cut search");
  int64_t fsize = c->bytes[f], p = pos - c->start[f]; /* file offsets from here on */
  int64_t found = -1;
  while (found < 0 && p < fsize) {
    int64_t base = p - look > 0 ? p - look : 0, end = p + win < fsize ? p + win : fsize;
    ssize_t n = read_at(c, f, base, buf, (size_t)(end - base));
    if (n < 0) break;
    for (int64_t q = p; q < end; q++) {
      if (buf[q - 1 - base] != '\n') continue; /* not a line start */
      if (boundary_in(c, buf, base, q)) {
        found = q;
        break;
      }
      if (q >= 2 && q < fsize && printable((unsigned char)buf[q - 2 - base]) && printable((unsigned char)buf[q - base])) {
        found = q;
        *is_boundary = 0;
        break;
      }
    }
    p = end;
  }
  free(buf);
  if (found >= 0) return c->start[f] + found;
  *is_boundary = 1;
  return f + 1 < c->nfiles ? c->start[f + 1] : c->total;
}

/* ---- compressed and JSON Lines inputs ------------------------------------------------------------ */

/* Whether a file's name says JSON Lines: .jsonl, .ndjson or .json, before a .gz or .zst. */
static int jsonl_name(const char *path) {
  char b[UTIL_PATH_MAX];
  util_strlcpy(b, path, sizeof b);
  size_t n = strlen(b);
  if (n > 3 && !strcmp(b + n - 3, ".gz")) b[n -= 3] = '\0';
  else if (n > 4 && !strcmp(b + n - 4, ".zst")) b[n -= 4] = '\0';
  const char *dot = strrchr(b, '.');
  return dot && (!strcmp(dot, ".jsonl") || !strcmp(dot, ".ndjson") || !strcmp(dot, ".json"));
}

/* Each file's compression (by its first bytes, on rank 0) and format, shared; whole files per rank
 * when any is compressed or JSON Lines. Returns the error count (the same on every rank). */
static int detect_kinds(corpus_set *c, const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  int rank, bad = 0;
  MPI_Comm_rank(comm, &rank);
  const cfg_prepare *pc = &cfg->prepare;
  c->kind = util_calloc((size_t)c->nfiles + 1, 1, "input kinds");
  c->jsonl = util_calloc((size_t)c->nfiles + 1, 1, "input kinds");
  util_strlcpy(c->text_field, pc->text_field, sizeof c->text_field);
  c->bad_fatal = cfg_prepare_bad_records_of(pc) == CFG_BAD_FATAL;
  cfg_prepare_format format = cfg_prepare_format_of(pc);
  for (int i = 0; rank == 0 && i < c->nfiles; i++) {
    int k = reader_detect(c->path[i]);
    if (k < 0 && ++bad) err_add(errs, c->path[i], 0, 0, "check the file's permissions", "cannot read: %s", strerror(errno));
    c->kind[i] = (unsigned char)(k < 0 ? READER_PLAIN : k);
    c->jsonl[i] = format == CFG_FORMAT_JSONL || (format == CFG_FORMAT_AUTO && jsonl_name(c->path[i]));
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  MPI_Bcast(c->kind, c->nfiles, MPI_UNSIGNED_CHAR, 0, comm);
  MPI_Bcast(c->jsonl, c->nfiles, MPI_UNSIGNED_CHAR, 0, comm);
  for (int i = 0; i < c->nfiles; i++) c->whole_files |= c->kind[i] != READER_PLAIN || c->jsonl[i];
  return bad;
}

/* Rank r takes the files that start in [r total / P, (r + 1) total / P) of the stream: contiguous,
 * in order, balanced by size on disk. */
static void whole_file_shares(corpus_set *c, int rank, int P) {
  c->flo = c->fhi = 0;
  for (int i = 0; i < c->nfiles; i++) {
    int r = (int)((double)c->start[i] * P / (double)(c->total > 0 ? c->total : 1));
    if (r < rank) c->flo = i + 1;
    if (r <= rank) c->fhi = i + 1;
  }
  if (c->fhi < c->flo) c->fhi = c->flo;
  c->lo = c->start[c->flo], c->hi = c->start[c->fhi];
}

const char *corpus_describe(const corpus_set *c, int nranks, char *buf, size_t len) {
  int n[3] = {0, 0, 0}, nj = 0, busy = 0;
  for (int i = 0; i < c->nfiles; i++) n[c->kind[i] < 3 ? c->kind[i] : 0]++, nj += c->jsonl[i];
  int o = util_snprintf(buf, len, "%d file%s", c->nfiles, c->nfiles == 1 ? "" : "s");
  for (int k = 0; k < 3 && o >= 0; k++)
    if (n[k] && n[k] < c->nfiles) o += util_snprintf(buf + o, len - (size_t)o, ", %s %d", reader_kind_name((reader_kind)k), n[k]);
    else if (n[k]) o += util_snprintf(buf + o, len - (size_t)o, ", %s", reader_kind_name((reader_kind)k));
  if (nj && o >= 0) o += util_snprintf(buf + o, len - (size_t)o, nj == c->nfiles ? ", JSON Lines" : ", JSON Lines %d", nj);
  if (!c->whole_files || o < 0) return buf;
  for (int r = 0; r < nranks; r++) { /* ranks that take at least one file */
    int first = -1;
    for (int i = 0; i < c->nfiles && first < 0; i++)
      if ((int)((double)c->start[i] * nranks / (double)(c->total > 0 ? c->total : 1)) == r) first = i;
    busy += first >= 0;
  }
  util_snprintf(buf + o, len - (size_t)o, "; whole files per rank");
  if (busy < nranks)
    util_snprintf(buf + strlen(buf), len - strlen(buf), " (%d of %d ranks have none: give at least as many files as ranks)",
                  nranks - busy, nranks);
  return buf;
}

/* ---- open / close ------------------------------------------------------------------------------ */

int corpus_open(corpus_set *c, const cfg_config *cfg, const char *group, const char *key, const cfg_strlist *inputs,
                MPI_Comm comm, err_list *errs) {
  memset(c, 0, sizeof *c);
  int rank, P;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  c->mode = cfg_prepare_documents_of(&cfg->prepare);
  util_strlcpy(c->separator, c->mode == CFG_DOCS_SEPARATOR_LINE ? cfg->prepare.separator : "", sizeof c->separator);
  int nerr = 0;
  file_list l = {0};
  if (rank == 0) {
    if (inputs->n == 0) {
      cfg_error_at(cfg, errs, group, key, "list text files, directories or glob patterns, e.g. 'data/*.txt'",
                   "no input given");
      nerr = 1;
    }
    input_place at = {cfg, group, key, errs};
    for (int i = 0; i < inputs->n; i++)
      if (expand_one(&l, inputs->v[i], &at) != 0) nerr++;
  }
  MPI_Bcast(&nerr, 1, MPI_INT, 0, comm);
  if (nerr) {
    for (int i = 0; i < l.n; i++) free(l.path[i]);
    free(l.path), free(l.bytes);
    return nerr;
  }
  int nf = l.n; /* l holds the list on rank 0 only */
  MPI_Bcast(&nf, 1, MPI_INT, 0, comm);
  c->nfiles = nf;
  c->path = util_calloc((size_t)nf, sizeof(char *), "corpus");
  c->bytes = util_calloc((size_t)nf, sizeof(int64_t), "corpus");
  c->start = util_calloc((size_t)nf + 1, sizeof(int64_t), "corpus");
  if (rank == 0) memcpy(c->bytes, l.bytes, (size_t)nf * sizeof(int64_t));
  MPI_Bcast(c->bytes, nf, MPI_INT64_T, 0, comm);
  for (int i = 0; i < nf; i++) {
    int len = rank == 0 ? (int)strlen(l.path[i]) : 0;
    MPI_Bcast(&len, 1, MPI_INT, 0, comm);
    c->path[i] = util_malloc((size_t)len + 1, "corpus path");
    if (rank == 0) memcpy(c->path[i], l.path[i], (size_t)len + 1);
    MPI_Bcast(c->path[i], len + 1, MPI_CHAR, 0, comm);
    c->start[i + 1] = c->start[i] + c->bytes[i];
  }
  c->total = c->start[nf];
  for (int i = 0; i < l.n; i++) free(l.path[i]);
  free(l.path), free(l.bytes);
  if (detect_kinds(c, cfg, comm, errs) != 0) return 1;
  if (c->whole_files) {
    whole_file_shares(c, rank, P);
    return 0;
  }
  /* shares: from the first cut point at or after r * total / P */
  int isb;
  int64_t lo = rank == 0 ? 0 : find_cut(c, (int64_t)((double)c->total * rank / P), &isb);
  int64_t *los = util_malloc((size_t)P * sizeof(int64_t), "shares");
  MPI_Allgather(&lo, 1, MPI_INT64_T, los, 1, MPI_INT64_T, comm);
  c->lo = lo;
  c->hi = rank + 1 < P ? los[rank + 1] : c->total;
  if (c->hi < c->lo) c->hi = c->lo; /* a later rank found the same cut: this share is empty */
  free(los);
  return 0;
}

void corpus_close(corpus_set *c) {
  for (int i = 0; i < c->nfiles; i++) free(c->path[i]);
  free(c->path), free(c->bytes), free(c->start), free(c->kind), free(c->jsonl);
  memset(c, 0, sizeof *c);
}

/* ---- document pieces --------------------------------------------------------------------------- */

/* Split one block [b0, b1) of file f (text in buf) into document pieces. */
static void split_block(const corpus_set *c, const char *buf, int64_t b0, int64_t b1, int begins_at_b0,
                        int ends_at_b1, corpus_fn fn, void *ctx) {
  size_t n = (size_t)(b1 - b0), sl = strlen(c->separator);
  if (c->mode == CFG_DOCS_FILE) {
    fn(buf, n, begins_at_b0, ends_at_b1, ctx);
    return;
  }
  size_t doc = 0; /* start of the current document piece */
  int doc_begins = begins_at_b0;
  for (size_t i = 0; i < n;) {
    const char *nl = memchr(buf + i, '\n', n - i);
    size_t line_end = nl ? (size_t)(nl - buf) : n, next = nl ? line_end + 1 : n;
    size_t len = line_end - i;
    int is_sep = c->mode == CFG_DOCS_LINE ? 1
               : c->mode == CFG_DOCS_BLANK_LINE ? len == 0
                                                   : len == sl && memcmp(buf + i, c->separator, sl) == 0;
    if (c->mode == CFG_DOCS_LINE) {
      /* the line itself is the document, without its newline */
      if (len) fn(buf + i, len, doc_begins, nl != NULL || ends_at_b1, ctx);
      doc_begins = 1;
    } else if (is_sep && (nl || ends_at_b1)) {
      /* an empty piece still closes a document that began on an earlier block or rank */
      if (i > doc || !doc_begins) fn(buf + doc, i - doc, doc_begins, 1, ctx);
      doc_begins = 1;
      doc = next;
    }
    i = next;
  }
  if (c->mode != CFG_DOCS_LINE && doc < n) fn(buf + doc, n - doc, doc_begins, ends_at_b1, ctx);
}

/* The last cut point q in (lo, n) of buf (decompressed bytes of one file, buf[i] its byte base + i)
 * with the look-back boundary_in needs inside buf: 0 when there is none. */
static size_t last_cut(const corpus_set *c, const char *buf, size_t n, size_t lo, int64_t base, int *is_boundary) {
  const size_t look = strlen(c->separator) + 2;
  for (size_t q = n - 1; q > look && q > lo; q--) {
    if (buf[q - 1] != '\n') continue;
    if ((*is_boundary = boundary_in(c, buf, base, base + (int64_t)q))) return q;
    if (printable((unsigned char)buf[q - 2]) && printable((unsigned char)buf[q])) return q;
  }
  return 0;
}

/* A bad JSON Lines record at path:line: counted; the first named; with bad_records = 'fatal' an error. */
static void bad_record(corpus_set *c, const char *path, long line, err_list *errs, const char *why) {
  if (c->bad++ == 0) snprintf(c->first_bad, sizeof c->first_bad, "%s:%ld: %s", path, line, why);
  if (c->bad_fatal)
    err_add(errs, path, (int)(line < INT32_MAX ? line : 0), 0, "fix or drop the record, or set &prepare bad_records = 'skip'",
            "bad JSON Lines record: %s", why);
}

/* One JSON Lines record (a line without its newline) to fn as a document. */
static void json_record(corpus_set *c, const char *path, long line, const char *rec, size_t n, corpus_fn fn, void *ctx,
                        err_list *errs) {
  while (n && (rec[n - 1] == '\r' || rec[n - 1] == ' ' || rec[n - 1] == '\t')) n--;
  size_t i = 0;
  while (i < n && (rec[i] == ' ' || rec[i] == '\t')) i++;
  if (i == n) return; /* a blank line is no record */
  c->records++;
  json_error_t je;
  json_t *o = json_loadb(rec + i, n - i, 0, &je);
  json_t *v = json_is_object(o) ? json_object_get(o, c->text_field) : NULL;
  char why[400];
  if (!o && (strstr(je.text, "UTF-8") || strstr(je.text, "decode")))
    snprintf(why, sizeof why, "invalid UTF-8 (column %d)", je.column);
  else if (!o) snprintf(why, sizeof why, "not JSON (column %d: %s)", je.column, je.text);
  else if (!json_is_object(o)) snprintf(why, sizeof why, "not a JSON object");
  else if (!v) snprintf(why, sizeof why, "no field '%.300s'", c->text_field);
  else if (!json_is_string(v)) snprintf(why, sizeof why, "the field '%.300s' is not a string", c->text_field);
  if (!json_is_string(v)) bad_record(c, path, line, errs, why);
  else if (json_string_length(v)) fn(json_string_value(v), json_string_length(v), 1, 1, ctx);
  json_decref(o);
}

/* Whole lines of buf [0, n) as records (all of it at the stream's end); returns the bytes used. */
static size_t json_lines(corpus_set *c, const char *path, long *line, const char *buf, size_t n, int end, corpus_fn fn,
                         void *ctx, err_list *errs) {
  size_t at = 0;
  for (;;) {
    const char *nl = memchr(buf + at, '\n', n - at);
    if (!nl && !(end && at < n)) return at;
    size_t e = nl ? (size_t)(nl - buf) : n;
    ++*line;
    json_record(c, path, *line, buf + at, e - at, fn, ctx, errs);
    at = nl ? e + 1 : n;
  }
}

/* File f whole, through its reader: JSON Lines records, or text cut into pieces at cut points. */
static int stream_file(corpus_set *c, int f, corpus_fn fn, void *ctx, err_list *errs) {
  char why[256];
  reader *r = reader_open(c->path[f], why, sizeof why);
  if (!r) return err_add(errs, c->path[f], 0, 0, "check the file's permissions", "cannot read: %s", why), -1;
  size_t cap = (size_t)CORPUS_BLOCK, n = 0;
  char *buf = util_malloc(cap, "input block");
  int64_t base = 0; /* file offset (decompressed) of buf[0] */
  int begins = 1, rc = 0;
  long line = 0;
  for (;;) {
    if (cap - n < (size_t)CORPUS_BLOCK / 2) buf = util_realloc(buf, cap *= 2, "input block");
    ssize_t got = reader_read(r, buf + n, cap - n, why, sizeof why);
    if (got < 0) {
      err_add(errs, c->path[f], 0, 0, "the file is damaged or cut off; fetch it again", "cannot read: %s", why);
      rc = -1;
      break;
    }
    size_t old = n, used;
    int isb = 1, end = got == 0;
    n += (size_t)got;
    if (c->jsonl[f]) {
      used = json_lines(c, c->path[f], &line, buf, n, end, fn, ctx, errs);
    } else {
      used = end ? n : last_cut(c, buf, n, old > 2 ? old - 2 : 0, base, &isb);
      if (used) split_block(c, buf, base, base + (int64_t)used, begins, end || isb, fn, ctx), begins = end || isb;
    }
    memmove(buf, buf + used, n - used);
    n -= used, base += (int64_t)used;
    if (end) break;
  }
  free(buf);
  reader_close(r);
  return rc;
}

/* Whole files [flo, fhi): every one read to its end, whatever its records hold. */
static int each_whole_file(corpus_set *c, corpus_fn fn, void *ctx, err_list *errs) {
  int rc = 0;
  c->records = c->bad = 0;
  c->first_bad[0] = '\0';
  for (int f = c->flo; f < c->fhi && rc == 0; f++) rc = stream_file(c, f, fn, ctx, errs);
  return rc == 0 && c->bad_fatal && c->bad ? -1 : rc;
}

int corpus_each(corpus_set *c, corpus_fn fn, void *ctx, err_list *errs) {
  if (c->whole_files) return each_whole_file(c, fn, ctx, errs);
  int64_t pos = c->lo;
  int begins = 1;
  if (pos < c->hi) {
    /* does the share start a document? */
    int f = file_of(c, pos);
    if (pos != c->start[f]) {
      int64_t p = pos - c->start[f], look = (int64_t)strlen(c->separator) + 2, base = p - look > 0 ? p - look : 0;
      char buf[CFG_STR_LEN + 8];
      ssize_t n = read_at(c, f, base, buf, (size_t)(p - base + 1));
      begins = n > 0 && boundary_in(c, buf, base, p);
    }
  }
  char *buf = NULL;
  size_t cap = 0;
  while (pos < c->hi) {
    int f = file_of(c, pos);
    int64_t fend = c->start[f] + c->bytes[f], stop = c->hi < fend ? c->hi : fend;
    int isb = 1;
    int64_t b1 = pos + CORPUS_BLOCK < stop ? find_cut(c, pos + CORPUS_BLOCK, &isb) : stop;
    if (b1 > stop) b1 = stop, isb = 1;
    int ends = b1 == fend || isb;
    if (b1 == stop && stop == c->hi && stop != fend) { /* the share ends inside the file: at a cut point */
      int tmp;
      ends = find_cut(c, stop, &tmp) == stop && tmp;
    }
    size_t n = (size_t)(b1 - pos);
    if (n > cap) buf = util_realloc(buf, cap = n, "corpus block");
    if (read_at(c, f, pos - c->start[f], buf, n) != (ssize_t)n) {
      err_add(errs, c->path[f], 0, 0, "leave the input files alone while greenlm reads them", "cannot read: %s",
              errno ? strerror(errno) : "the file shrank");
      free(buf);
      return -1;
    }
    split_block(c, buf, pos, b1, begins, ends, fn, ctx);
    begins = ends;
    pos = b1;
  }
  free(buf);
  return 0;
}
