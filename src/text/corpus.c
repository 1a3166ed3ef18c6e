/* corpus: input expansion, rank shares at safe cut points, document pieces. */
#include "text/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/util.h"
#include "text/fileid.h"
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

/* Where the inputs come from: errors about them are reported at that deck key. */
typedef struct {
  const cfg_config *cfg;
  const char *group, *key;
  err_list *errs;
} input_place;

#define input_error(at, hint, ...) cfg_error_at((at)->cfg, (at)->errs, (at)->group, (at)->key, hint, __VA_ARGS__)

static const char INPUT_HINT[] = "give text files, directories of text files or glob patterns";

/* The regular files a glob pattern matches, in glob's (sorted) order. Returns 0 or -1 after reporting. */
static int expand_glob(file_list *l, const char *in, const input_place *at) {
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
    if (stat(g.gl_pathv[i], &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_size == 0) {
      input_error(at, "remove empty files from the input", "'%s' (from '%s') is empty", g.gl_pathv[i], in);
      globfree(&g);
      return -1;
    }
    list_add(l, g.gl_pathv[i], (int64_t)st.st_size);
  }
  globfree(&g);
  if (l->n == n0) {
    input_error(at, "check the pattern", "'%s' matches no regular file", in);
    return -1;
  }
  return 0;
}

typedef struct {
  char *path;
  int64_t bytes;
} file_entry;

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const file_entry *)a)->path, ((const file_entry *)b)->path);
}

/* The non-empty regular files in directory in, sorted by name. Returns 0 or -1 after reporting. */
static int expand_dir(file_list *l, const char *in, const input_place *at) {
  DIR *d = opendir(in);
  if (!d) {
    input_error(at, "check its permissions", "cannot read directory '%s': %s", in, strerror(errno));
    return -1;
  }
  file_entry *e = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *de; (de = readdir(d));) {
    if (de->d_name[0] == '.') continue;
    char p[UTIL_PATH_MAX];
    util_snprintf(p, sizeof p, "%s/%s", in, de->d_name);
    struct stat fs;
    if (stat(p, &fs) != 0 || !S_ISREG(fs.st_mode) || fs.st_size == 0) continue;
    if (n == cap) e = util_realloc(e, (cap = cap ? 2 * cap : 64) * sizeof *e, "directory listing");
    e[n++] = (file_entry){util_strdup(p), (int64_t)fs.st_size};
  }
  closedir(d);
  if (n == 0)
    input_error(at, "point the input at files with text, or at a glob such as 'dir/*.txt'",
                "directory '%s' has no text (no non-empty regular files)", in);
  if (n) qsort(e, n, sizeof *e, cmp_entry); /* e is NULL when the directory had none */
  for (size_t i = 0; i < n; i++) list_add(l, e[i].path, e[i].bytes), free(e[i].path);
  free(e);
  return n ? 0 : -1;
}

/* Add one input (file, directory or glob pattern). Returns 0, or -1 after reporting it at `at`. */
static int expand_one(file_list *l, const char *in, const input_place *at) {
  if (strpbrk(in, "*?[")) return expand_glob(l, in, at);
  struct stat st;
  if (stat(in, &st) != 0) {
    input_error(at, "check the path (relative paths start at the working directory)", "cannot open '%s': %s", in, strerror(errno));
    return -1;
  }
  if (S_ISDIR(st.st_mode)) return expand_dir(l, in, at);
  const char *kind = util_file_kind(st.st_mode);
  if (kind) { /* named, never opened: a FIFO would wait for a writer */
    input_error(at, INPUT_HINT, "'%s' is %s, not a text file", in, kind);
    return -1;
  }
  if (st.st_size == 0) {
    input_error(at, "give a file with text in it", "'%s' is empty", in);
    return -1;
  }
  list_add(l, in, (int64_t)st.st_size);
  return 0;
}

/* ---- outputs that are inputs -------------------------------------------------------------------- */

/* Whether the glob pattern matches path by name: the directory parts the same directory and the last
 * parts matched by fnmatch (or, with wildcards in the directory part, the whole path). */
static int pattern_names(const char *pattern, const char *path) {
  char pd[UTIL_PATH_MAX], od[UTIL_PATH_MAX];
  fileid_dirname(pattern, pd, sizeof pd);
  if (strpbrk(pd, "*?[")) {
    char abs[2 * UTIL_PATH_MAX], cwd[UTIL_PATH_MAX], canon[UTIL_PATH_MAX];
    if (pattern[0] == '/' || !getcwd(cwd, sizeof cwd)) util_strlcpy(abs, pattern, sizeof abs);
    else util_snprintf(abs, sizeof abs, "%s/%s", cwd, pattern);
    fileid_canonical(path, canon, sizeof canon);
    return fnmatch(abs, canon, FNM_PATHNAME | FNM_PERIOD) == 0;
  }
  fileid_dirname(path, od, sizeof od);
  const char *pb = strrchr(pattern, '/'), *ob = strrchr(path, '/');
  return fileid_same_path(pd, od) && fnmatch(pb ? pb + 1 : pattern, ob ? ob + 1 : path, FNM_PERIOD) == 0;
}

/* Whether the existing file m is out (id) or, nspill > 0, one of its spill files out.spill-R, R < nspill:
 * which, as "'out'" or "its spill file 'out.spill-R'", into what. A stat for most m (glob matches
 * may be many); the spill files' places only for names that fit. */
static int is_output(const char *m, const char *out, const fileid *id, int nspill, char *what, size_t len) {
  struct stat st;
  if (stat(m, &st) != 0) return 0;
  util_snprintf(what, len, "'%s'", out);
  if (id->exists && st.st_dev == id->dev && st.st_ino == id->ino) return 1;
  const char *mb = strrchr(m, '/'), *ob = strrchr(out, '/');
  mb = mb ? mb + 1 : m, ob = ob ? ob + 1 : out;
  size_t n = strlen(ob);
  if (nspill <= 0 || strncmp(mb, ob, n) != 0 || strncmp(mb + n, ".spill-", 7) != 0) return 0;
  char *end, spill[UTIL_PATH_MAX + 32];
  long r = strtol(mb + n + 7, &end, 10);
  if (*end || end == mb + n + 7 || r < 0 || r >= nspill) return 0;
  util_snprintf(spill, sizeof spill, "%s.spill-%ld", out, r);
  util_snprintf(what, len, "its spill file '%s'", spill);
  return fileid_same_path(m, spill);
}

/* Whether out (id: its identity; nspill: is_output) is read as the input `in` (a file, directory or
 * glob pattern of the deck key `where`): which file, how, and what writing it would do, into why. */
static int read_as_input(const char *in, const char *where, const char *out, const fileid *id, int nspill, char *why,
                         size_t len) {
  static const char READ[] = "the deck would read it as text";
  char what[UTIL_PATH_MAX + 64];
  if (strpbrk(in, "*?[")) {
    glob_t g;
    int hit = 0;
    if (glob(in, 0, NULL, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc && !hit; i++)
        if ((hit = is_output(g.gl_pathv[i], out, id, nspill, what, sizeof what)))
          util_snprintf(why, len, "%s is the input file '%s' (from the pattern '%s' of %s): writing it would destroy the "
                        "input", what, g.gl_pathv[i], in, where);
      globfree(&g);
    }
    if (!hit && (hit = pattern_names(in, out)))
      util_snprintf(why, len, "'%s' is matched by the input pattern '%s' of %s: %s", out, in, where, READ);
    return hit;
  }
  struct stat st;
  if (stat(in, &st) == 0 && S_ISDIR(st.st_mode)) {
    char dir[UTIL_PATH_MAX];
    fileid_dirname(out, dir, sizeof dir);
    if (!fileid_same_path(dir, in)) return 0;
    util_snprintf(why, len, "'%s' is in the input directory '%s' of %s: %s", out, in, where, READ);
    return 1;
  }
  if (!is_output(in, out, id, nspill, what, sizeof what)) return 0;
  util_snprintf(why, len, "%s is the input file '%s' of %s: writing it would destroy the input", what, in, where);
  return 1;
}

int corpus_clash(const cfg_config *cfg, const char *group, const char *key, const cfg_strlist *inputs, const char *out,
                 int nspill, const char *out_group, const char *out_key, err_list *errs) {
  fileid id;
  fileid_of(out, &id);
  char where[2 * CFG_STR_LEN], why[UTIL_PATH_MAX + 512];
  util_snprintf(where, sizeof where, "&%s %s", group, key);
  for (int i = 0; i < inputs->n; i++) {
    if (!read_as_input(inputs->v[i], where, out, &id, nspill, why, sizeof why)) continue;
    cfg_error_at(cfg, errs, out_group, out_key, "write the outputs where no input is read from", "%s", why);
    return 1;
  }
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

/* Read n bytes of file f at file offset off. Returns bytes read or -1 (never waiting: should the
 * file have become a FIFO since it was listed, the read fails). */
static ssize_t read_at(const corpus_set *c, int f, int64_t off, char *buf, size_t n) {
  int fd = open(c->path[f], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
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

/* Newlines in buf[0, n). */
static int64_t count_lines(const char *buf, size_t n) {
  int64_t k = 0;
  for (const char *p = buf, *e = buf + n; (p = memchr(p, '\n', (size_t)(e - p))); p++) k++;
  return k;
}

enum { FAR_BACK = -2 }; /* prev_newline: no newline within the look-back */

/* The last newline of file f before offset p, looking back at most limit bytes through buf (win
 * bytes; the first look 4 KiB): its offset, -1 when the file's start comes first, FAR_BACK when
 * neither does. */
static int64_t prev_newline(const corpus_set *c, int f, int64_t p, int64_t limit, char *buf, int64_t win) {
  int64_t stop = p - limit > 0 ? p - limit : 0;
  for (int64_t w = 4096; p > stop; w = 2 * w < win ? 2 * w : win) {
    int64_t a = p - w > stop ? p - w : stop;
    if (read_at(c, f, a, buf, (size_t)(p - a)) != p - a) return FAR_BACK;
    for (int64_t i = p - a - 1; i >= 0; i--)
      if (buf[i] == '\n') return a + i;
    p = a;
  }
  return stop == 0 ? -1 : FAR_BACK;
}

/* Smallest cut point >= pos (a document boundary or a safe line start, never the start of the line
 * after one longer than line_max), or the stream end. */
static int64_t find_cut(const corpus_set *c, int64_t pos, int *is_boundary) {
  *is_boundary = 1;
  if (pos >= c->total) return c->total;
  int f = file_of(c, pos);
  if (pos == c->start[f]) return pos;
  const int64_t look = (int64_t)strlen(c->separator) + 2, win = 1 << 20, max = (int64_t)c->line_max;
  char *buf = util_malloc((size_t)(look + win + 1), "cut search");
  int64_t fsize = c->bytes[f], p = pos - c->start[f]; /* file offsets from here on */
  int64_t found = -1, nl = prev_newline(c, f, p - 1, max + 1, buf, win); /* the newline before the line p - 1 is in */
  while (found < 0 && p < fsize) {
    int64_t base = p - look > 0 ? p - look : 0, end = p + win < fsize ? p + win : fsize;
    ssize_t n = read_at(c, f, base, buf, (size_t)(end - base));
    if (n < 0) break;
    for (int64_t q = p; q < end; q++) {
      if (buf[q - 1 - base] != '\n') continue; /* not a line start */
      int after_long = nl == FAR_BACK || q - 2 - nl > max;
      nl = q - 1;
      if (after_long) continue;
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
    int k = reader_detect(c->path[i], errs);
    bad += k < 0;
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
  c->buffer_mb = cfg->prepare.buffer_mb;
  c->line_max = corpus_buffer_tokens(c->buffer_mb);
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

/* Split one block [b0, b1) of file f (text in buf) into document pieces. Returns whether the next
 * piece begins a document (0: one is open). */
static int split_block(const corpus_set *c, const char *buf, int64_t b0, int64_t b1, int begins_at_b0, int ends_at_b1,
                       corpus_fn fn, void *ctx) {
  size_t n = (size_t)(b1 - b0), sl = strlen(c->separator);
  if (c->mode == CFG_DOCS_FILE) {
    fn(buf, n, begins_at_b0, ends_at_b1, ctx);
    return ends_at_b1;
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
  if (c->mode == CFG_DOCS_LINE) return n == 0 ? begins_at_b0 : buf[n - 1] == '\n' || ends_at_b1;
  if (doc < n) fn(buf + doc, n - doc, doc_begins, ends_at_b1, ctx);
  return doc < n ? ends_at_b1 : doc_begins;
}

/* The last cut point q in (lo, n) of buf (decompressed bytes of one file, buf[i] its byte base + i)
 * with the look-back boundary_in needs inside buf: 0 when there is none. */
static size_t last_cut(const corpus_set *c, const char *buf, size_t n, size_t lo, int64_t base, int *is_boundary) {
  const size_t look = strlen(c->separator) + 2;
  if (n <= look + 1) return 0;
  for (size_t q = n - 1; q > look && q > lo; q--) {
    if (buf[q - 1] != '\n') continue;
    if ((*is_boundary = boundary_in(c, buf, base, base + (int64_t)q))) return q;
    if (printable((unsigned char)buf[q - 2]) && printable((unsigned char)buf[q])) return q;
  }
  return 0;
}

/* ---- bad records and lines too long ------------------------------------------------------------ */

static const char LONG_HINT[] = "split the line, raise &prepare buffer_mb (a line may have a quarter of it, in bytes), or "
                                "set &prepare bad_records = 'skip' to leave such lines out";

/* A bad record or line at path:line: counted in s, the first named; with bad_records = 'fatal' an
 * error "what: why". */
static void skipped(corpus_set *c, corpus_skips *s, const char *path, long line, const char *what, const char *why,
                    const char *hint, err_list *errs) {
  if (s->n++ == 0) util_snprintf(s->first, sizeof s->first, "%s:%ld: %s", path, line, why);
  if (c->bad_fatal) err_add(errs, path, (int)(line < INT32_MAX ? line : 0), 0, hint, "%s: %s", what, why);
}

/* A bad JSON Lines record at path:line. */
static void bad_record(corpus_set *c, const char *path, long line, err_list *errs, const char *why) {
  skipped(c, &c->bad, path, line, "bad JSON Lines record", why, "fix or drop the record, or set &prepare bad_records = 'skip'",
          errs);
}

/* Line `line` of file f is longer than line_max: a bad record (JSON Lines) or a line left out. */
static void line_too_long(corpus_set *c, int f, long line, err_list *errs) {
  char why[200];
  util_snprintf(why, sizeof why, "a line of more than %zu bytes, the most &prepare buffer_mb = %g allows", c->line_max,
                c->buffer_mb);
  if (c->jsonl[f]) c->records++;
  skipped(c, c->jsonl[f] ? &c->bad : &c->long_lines, c->path[f], line, c->jsonl[f] ? "bad JSON Lines record" : "line too long",
          why, LONG_HINT, errs);
}

/* The first line longer than max among the lines of buf [from, n), *ls the start of the line
 * buf[from] is in: 1 when one ends in buf (*le after its newline), 2 when it runs on to buf's end
 * (*le = n), with *ls its start; else 0, with *ls the start of buf's last line. */
static int long_line(const char *buf, size_t from, size_t n, size_t max, size_t *ls, size_t *le) {
  for (size_t i = from; i <= n;) {
    const char *nl = memchr(buf + i, '\n', n - i);
    size_t e = nl ? (size_t)(nl - buf) : n;
    if (e - *ls > max) {
      *le = nl ? e + 1 : n;
      return nl ? 1 : 2;
    }
    if (!nl) break;
    *ls = i = e + 1;
  }
  return 0;
}

/* The number of the line that starts at byte off of file f: counted on from the last such count when
 * that was in the same file and not past off (a rank's over-long lines come in order). */
static long line_of(corpus_set *c, int f, int64_t off) {
  if (c->lc_file != f || c->lc_off > off) c->lc_file = f, c->lc_off = 0, c->lc_line = 1;
  enum { WIN = 1 << 20 };
  char *buf = util_malloc(WIN, "line count");
  while (c->lc_off < off) {
    ssize_t n = read_at(c, f, c->lc_off, buf, (size_t)(off - c->lc_off < WIN ? off - c->lc_off : WIN));
    if (n <= 0) break;
    c->lc_line += count_lines(buf, (size_t)n);
    c->lc_off += n;
  }
  free(buf);
  return (long)c->lc_line;
}

/* ---- whole files through their readers (compressed or JSON Lines inputs) ----------------------- */

/* One file read whole: the bytes not handed on yet are buf[0, n), the stream's from base on; buf[0]
 * starts a line, and buf[ls] starts its last line. */
typedef struct {
  corpus_set *c;
  int f;
  corpus_fn fn;
  void *ctx;
  err_list *errs;
  char *buf;
  size_t n, cap, ls;
  int64_t base;
  long line;    /* lines before buf[0] (JSON Lines: records begun) */
  int begins;   /* the next piece begins a document */
  int skipping; /* the rest of a line too long is dropped as it arrives */
} file_stream;

/* Drop buf[0, k). */
static void consume(file_stream *s, size_t k) {
  memmove(s->buf, s->buf + k, s->n - k);
  s->n -= k;
  s->ls = s->ls > k ? s->ls - k : 0;
  s->base += (int64_t)k;
}

/* Dropping a line too long: its bytes up to its newline, as they arrive. */
static void skip_rest(file_stream *s) {
  const char *nl = memchr(s->buf, '\n', s->n);
  s->skipping = nl == NULL;
  consume(s, nl ? (size_t)(nl - s->buf) + 1 : s->n);
}

/* buf[0, used) handed on as text pieces, the last ending its document when ends. */
static void stream_pieces(file_stream *s, size_t used, int ends) {
  if (used == 0) return;
  s->begins = split_block(s->c, s->buf, s->base, s->base + (int64_t)used, s->begins, ends, s->fn, s->ctx);
  s->line += (long)count_lines(s->buf, used);
  consume(s, used);
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

/* JSON Lines: the whole records of buf (all of it at the stream's end), one too long dropped. */
static void stream_records(file_stream *s, int end) {
  size_t at = 0;
  for (;;) {
    const char *nl = memchr(s->buf + at, '\n', s->n - at);
    size_t e = nl ? (size_t)(nl - s->buf) : s->n;
    int too_long = e - at > s->c->line_max;
    if (!nl && (at == s->n || (!end && !too_long))) break; /* nothing left, or a record still arriving */
    ++s->line;
    if (too_long) line_too_long(s->c, s->f, s->line, s->errs);
    else json_record(s->c, s->c->path[s->f], s->line, s->buf + at, e - at, s->fn, s->ctx, s->errs);
    at = nl ? e + 1 : s->n;
    s->skipping = too_long && !nl && !end;
  }
  consume(s, at);
}

/* Text: lines too long dropped (the text before each handed on first, the document going on), then
 * the text up to the last cut point, or all of it at the stream's end. old: bytes of buf looked at
 * before. */
static void stream_text(file_stream *s, int end, size_t old) {
  size_t le;
  for (int k; (k = long_line(s->buf, old > s->ls ? old : s->ls, s->n, s->c->line_max, &s->ls, &le));) {
    size_t ls = s->ls;
    stream_pieces(s, ls, 0);
    line_too_long(s->c, s->f, ++s->line, s->errs);
    consume(s, le - ls);
    s->ls = old = 0;
    s->skipping = k == 2 && !end;
    if (s->skipping) return;
  }
  int isb = 1;
  size_t used = end ? s->n : last_cut(s->c, s->buf, s->n, old > 2 ? old - 2 : 0, s->base, &isb);
  stream_pieces(s, used, end || isb);
}

/* File f whole, through its reader. */
static int stream_file(corpus_set *c, int f, corpus_fn fn, void *ctx, err_list *errs) {
  reader *r = reader_open(c->path[f], errs);
  if (!r) return -1;
  file_stream s = {.c = c, .f = f, .fn = fn, .ctx = ctx, .errs = errs, .cap = (size_t)CORPUS_BLOCK, .begins = 1};
  s.buf = util_malloc(s.cap, "input block");
  int rc = 0;
  for (int end = 0; !end;) {
    if (s.cap - s.n < (size_t)CORPUS_BLOCK / 2) s.buf = util_realloc(s.buf, s.cap *= 2, "input block");
    size_t old = s.n;
    ssize_t got = reader_read(r, s.buf + s.n, s.cap - s.n, errs);
    if (got < 0) {
      rc = -1;
      break;
    }
    end = got == 0;
    s.n += (size_t)got;
    if (s.skipping) skip_rest(&s), old = 0;
    if (s.skipping) continue;
    if (c->jsonl[f]) stream_records(&s, end);
    else stream_text(&s, end, old);
  }
  if (rc == 0 && !s.begins) fn(s.buf, 0, 0, 1, ctx); /* the file's end ends its last document */
  free(s.buf);
  reader_close(r);
  return rc;
}

/* Whole files [flo, fhi): every one read to its end, whatever its records hold. */
static int each_whole_file(corpus_set *c, corpus_fn fn, void *ctx, err_list *errs) {
  int rc = 0;
  for (int f = c->flo; f < c->fhi && rc == 0; f++) rc = stream_file(c, f, fn, ctx, errs);
  return rc;
}

/* ---- a contiguous share of plain text files ------------------------------------------------------ */

typedef struct {
  corpus_set *c;
  corpus_fn fn;
  void *ctx;
  err_list *errs;
  char *buf; /* a block of text */
  size_t cap;
  int begins; /* the next piece begins a document */
} share_state;

/* Bytes [a, b) of file f into s->buf. Returns 0, or -1 after an error. */
static int read_block(share_state *s, int f, int64_t a, int64_t b) {
  size_t n = (size_t)(b - a);
  if (n > s->cap) s->buf = util_realloc(s->buf, s->cap = n, "corpus block");
  errno = 0;
  if (read_at(s->c, f, a, s->buf, n) == (ssize_t)n) return 0;
  err_add(s->errs, s->c->path[f], 0, 0, "leave the input files alone while greenlm reads them", "cannot read: %s",
          errno ? strerror(errno) : "the file shrank");
  return -1;
}

/* The first line longer than line_max in [pos, b1) of file f (pos a line start), read in windows
 * of 1 MiB: 1 with its start and end (after its newline, or b1), else 0. */
static int scan_long_line(share_state *s, int f, int64_t pos, int64_t b1, int64_t *ls, int64_t *le) {
  enum { WIN = 1 << 20 };
  char *w = util_malloc(WIN, "line search");
  int64_t start = pos, max = (int64_t)s->c->line_max; /* start: the line in progress */
  int found = 0;
  for (int64_t a = pos; a < b1; a += WIN) {
    size_t n = (size_t)(b1 - a < WIN ? b1 - a : WIN);
    if (read_at(s->c, f, a, w, n) != (ssize_t)n) break;
    for (size_t i = 0; i < n;) {
      const char *nl = memchr(w + i, '\n', n - i);
      int64_t e = a + (nl ? nl - w : (int64_t)n); /* where the line ends, or the window */
      found |= e - start > max;
      if (!nl) break;
      if (found) {
        free(w);
        *ls = start, *le = e + 1;
        return 1;
      }
      start = e + 1;
      i = (size_t)(nl - w) + 1;
    }
  }
  free(w);
  *ls = start, *le = b1;
  return found;
}

/* The block [pos, b1) of file f (file offsets; pos a line start) handed on, the last piece ending its document
 * when ends; when a line in it is longer than line_max only the text before that line is, the line
 * is counted (or an error) and left out. Returns where to go on (b1, or the end of the line left out),
 * or -1 after an error. */
static int64_t share_block(share_state *s, int f, int64_t pos, int64_t b1, int ends) {
  corpus_set *c = s->c;
  int64_t ls, le;
  size_t bls = 0, ble;
  int found;
  if (b1 - pos <= CORPUS_BLOCK + (int64_t)c->line_max) { /* in memory: the block is bounded */
    if (read_block(s, f, pos, b1) != 0) return -1;
    found = long_line(s->buf, 0, (size_t)(b1 - pos), c->line_max, &bls, &ble) != 0;
    ls = pos + (int64_t)bls, le = pos + (int64_t)ble;
  } else { /* a long stretch without a cut point: look for the line first */
    found = scan_long_line(s, f, pos, b1, &ls, &le);
    if (read_block(s, f, pos, found ? ls : b1) != 0) return -1;
  }
  int64_t to = found ? ls : b1;
  if (to > pos) s->begins = split_block(c, s->buf, pos, to, s->begins, found ? 0 : ends, s->fn, s->ctx);
  if (!found) return b1;
  line_too_long(c, f, line_of(c, f, ls), s->errs);
  if (le == c->bytes[f]) { /* the file ends: so does its document */
    if (!s->begins) s->fn(s->buf, 0, 0, 1, s->ctx);
    s->begins = 1;
  }
  return le;
}

int corpus_each(corpus_set *c, corpus_fn fn, void *ctx, err_list *errs) {
  c->records = 0;
  memset(&c->bad, 0, sizeof c->bad);
  memset(&c->long_lines, 0, sizeof c->long_lines);
  c->lc_file = -1;
  int rc = 0;
  if (c->whole_files) {
    rc = each_whole_file(c, fn, ctx, errs);
    return rc == 0 && c->bad_fatal && (c->bad.n || c->long_lines.n) ? -1 : rc;
  }
  share_state s = {c, fn, ctx, errs, NULL, 0, 1};
  int64_t pos = c->lo;
  if (pos < c->hi) {
    /* does the share start a document? */
    int f = file_of(c, pos);
    if (pos != c->start[f]) {
      int64_t p = pos - c->start[f], look = (int64_t)strlen(c->separator) + 2, base = p - look > 0 ? p - look : 0;
      char buf[CFG_STR_LEN + 8];
      ssize_t n = read_at(c, f, base, buf, (size_t)(p - base + 1));
      s.begins = n > 0 && boundary_in(c, buf, base, p);
    }
  }
  while (pos < c->hi && rc == 0) {
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
    int64_t next = share_block(&s, f, pos - c->start[f], b1 - c->start[f], ends);
    rc = next < 0 ? -1 : 0;
    pos = c->start[f] + next;
  }
  free(s.buf);
  return rc == 0 && c->bad_fatal && c->long_lines.n ? -1 : rc;
}

/* ---- the report ---------------------------------------------------------------------------------- */

/* The first of s of the lowest rank that has one, into first (sizeof s->first) on every rank. */
static void first_of(const corpus_skips *s, MPI_Comm comm, char *first) {
  int rank, P, lowest;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  int who = s->n > 0 ? rank : P;
  MPI_Allreduce(&who, &lowest, 1, MPI_INT, MPI_MIN, comm);
  memcpy(first, s->first, sizeof s->first);
  if (lowest < P) MPI_Bcast(first, (int)sizeof s->first, MPI_CHAR, lowest, comm);
}

void corpus_report(const corpus_set *c, MPI_Comm comm, const char *task) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  int64_t mine[3] = {c->records, c->bad.n, c->long_lines.n}, all[3];
  MPI_Allreduce(mine, all, 3, MPI_INT64_T, MPI_SUM, comm);
  char bad[sizeof c->bad.first], lng[sizeof c->long_lines.first];
  first_of(&c->bad, comm, bad);
  first_of(&c->long_lines, comm, lng);
  if (rank != 0) return;
  if (all[0] > 0)
    printf("%s: JSON Lines: %lld records, %lld bad and skipped%s%s\n", task, (long long)all[0], (long long)all[1],
           all[1] ? " (bad_records = 'skip'); the first: " : "", all[1] ? bad : "");
  if (all[2] > 0)
    printf("%s: %lld line%s of text longer than %zu bytes left out (bad_records = 'skip'); the first: %s\n", task,
           (long long)all[2], all[2] == 1 ? "" : "s", c->line_max, lng);
  fflush(stdout);
}
