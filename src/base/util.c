/* util: errors, allocation, clocks, strings, crash-safe files. */
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int util_world_rank = 0;

int util_rank(void) { return util_world_rank; }
void util_set_rank(int rank) { util_world_rank = rank; }

void util_fatal_at(const char *file, int line, const char *hint, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* the form of err.h's reports, with the rank and the place in the source */
  fprintf(stderr, "greenlm: error: %s (rank %d, %s:%d)\n", msg, util_world_rank, file, line);
  if (hint && *hint) fprintf(stderr, "  hint: %s\n", hint);
  util_abort(1);
}

void util_abort(int status) {
  fflush(stdout);
  fflush(stderr);
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    /* the launcher forwards this process's output through a pipe that MPI_Abort may cut: give the
     * message a moment to get through */
    struct timespec pause = {0, 300000000};
    nanosleep(&pause, NULL);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  exit(status);
}

void util_mpi_init(int *argc, char ***argv) {
  int provided;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
}

void util_exit_all(int status) {
  fflush(stdout);
  fflush(stderr);
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
  exit(status);
}

void *util_malloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  UTIL_CHECK(p, "reduce the model or batch size in the deck", "out of memory allocating %zu bytes for %s",
             bytes, what);
  return p;
}

void *util_calloc(size_t n, size_t size, const char *what) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  UTIL_CHECK(p, "reduce the model or batch size in the deck", "out of memory allocating %zu x %zu bytes for %s",
             n, size, what);
  return p;
}

void *util_realloc(void *p, size_t bytes, const char *what) {
  void *q = realloc(p, bytes ? bytes : 1);
  UTIL_CHECK(q, NULL, "out of memory growing %s to %zu bytes", what, bytes);
  return q;
}

void *util_aligned_alloc(size_t bytes, const char *what) {
  void *p = NULL;
  size_t n = (bytes + 63) / 64 * 64;
  int rc = posix_memalign(&p, 64, n ? n : 64);
  UTIL_CHECK(rc == 0 && p, "reduce the model or batch size in the deck",
             "out of memory allocating %zu bytes for %s", bytes, what);
  return p;
}

char *util_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = util_malloc(n, "string");
  memcpy(d, s, n);
  return d;
}

double util_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double util_cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

double util_peak_rss(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return 1024.0 * (double)ru.ru_maxrss; /* KiB on Linux */
}

int util_strieq(const char *a, const char *b) {
  for (; *a && *b; a++, b++)
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
  return *a == *b;
}

void util_strlcpy(char *dst, const char *src, size_t size) {
  if (!size) return;
  size_t n = strlen(src);
  if (n >= size) n = size - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

int util_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int row[64];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j];
      int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      int best = diag + cost;
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

int util_read_line(const char *path, char *buf, size_t len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, len - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
  return 0;
}

const char *util_file_kind(mode_t mode) {
  if (S_ISREG(mode)) return NULL;
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/* The error of a path that is kind (a directory, ...) where a `what` file belongs ("a deck file";
 * a `what` that says "file" itself, "machine file", is not followed by another). */
static void not_regular(err_list *errs, const char *path, const char *kind, const char *what, const char *hint) {
  size_t n = strlen(what);
  int has_file = n >= 4 && strcmp(what + n - 4, "file") == 0;
  err_add(errs, path, 0, 0, hint, "%s, not a %s%s", kind, what, has_file ? "" : " file");
}

int util_open_regular(const char *path, const char *what, const char *hint, err_list *errs) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    err_add(errs, path, 0, 0, hint, "cannot open the %s: %s", what, strerror(errno));
    return -1;
  }
  struct stat st;
  const char *kind = fstat(fd, &st) != 0 ? "unreadable" : util_file_kind(st.st_mode);
  if (kind) {
    not_regular(errs, path, kind, what, hint);
    close(fd);
    return -1;
  }
  int fl = fcntl(fd, F_GETFL); /* a regular file: blocking reads from here on */
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

int util_check_regular(const char *path, const char *what, const char *hint, err_list *errs) {
  struct stat st;
  if (stat(path, &st) != 0) {
    err_add(errs, path, 0, 0, hint, "cannot open the %s: %s", what, strerror(errno));
    return -1;
  }
  const char *kind = util_file_kind(st.st_mode);
  if (kind) not_regular(errs, path, kind, what, hint);
  return kind ? -1 : 0;
}

char *util_read_file(const char *path, size_t max, size_t *len, const char *what, const char *hint, err_list *errs) {
  int fd = util_open_regular(path, what, hint, errs);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "rb");
  struct stat st;
  if (!fp || fstat(fd, &st) != 0) {
    err_add(errs, path, 0, 0, hint, "cannot read the %s: %s", what, strerror(errno));
    if (fp) fclose(fp); else close(fd);
    return NULL;
  }
  if ((size_t)st.st_size > max) {
    err_add(errs, path, 0, 0, hint, "%lld bytes: more than a %s can be (%zu bytes at most)", (long long)st.st_size, what, max);
    fclose(fp);
    return NULL;
  }
  size_t cap = ((size_t)st.st_size + 4096 < max ? (size_t)st.st_size + 4096 : max) + 1;
  char *buf = util_malloc(cap + 1, path);
  size_t n = fread(buf, 1, cap, fp); /* the file may grow meanwhile: never read past max + 1 */
  int bad = ferror(fp);
  fclose(fp);
  if (bad || n > max) {
    err_add(errs, path, 0, 0, hint, bad ? "cannot read the %s" : "the %s grew past %zu bytes while it was read", what, max);
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

int util_atomic_open(util_atomic_file *af, const char *path) {
  size_t n = strlen(path);
  af->path = util_strdup(path);
  af->tmp = util_malloc(n + 5, "temporary file name");
  memcpy(af->tmp, path, n);
  memcpy(af->tmp + n, ".tmp", 5);
  af->fp = fopen(af->tmp, "wb");
  if (!af->fp) {
    free(af->path);
    free(af->tmp);
    af->path = af->tmp = NULL;
    return -1;
  }
  return 0;
}

int util_atomic_close(util_atomic_file *af) {
  int rc = 0;
  if (fflush(af->fp) != 0 || ferror(af->fp) || fsync(fileno(af->fp)) != 0) rc = -1;
  if (fclose(af->fp) != 0) rc = -1;
  af->fp = NULL;
  if (rc == 0 && util_commit(af->tmp, af->path) != 0) rc = -1;
  if (rc != 0) {
    int e = errno;
    remove(af->tmp);
    errno = e;
  }
  free(af->path);
  free(af->tmp);
  af->path = af->tmp = NULL;
  return rc;
}

void util_atomic_abort(util_atomic_file *af) {
  if (af->fp) fclose(af->fp);
  if (af->tmp) remove(af->tmp);
  free(af->path);
  free(af->tmp);
  af->fp = NULL;
  af->path = af->tmp = NULL;
}

int util_commit(const char *tmp, const char *path) {
  if (rename(tmp, path) != 0) return -1;
  char dir[4096];
  util_strlcpy(dir, path, sizeof dir);
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = '\0';
  else if (slash) *slash = '\0';
  else strcpy(dir, ".");
  int fd = open(dir, O_RDONLY), rc = 0;
  if (fd < 0 || fsync(fd) != 0) rc = -1; /* the new name itself survives a crash */
  if (fd >= 0) {
    int e = errno;
    close(fd);
    errno = e;
  }
  return rc;
}

int util_mkdir_p(const char *path) {
  char buf[4096];
  util_strlcpy(buf, path, sizeof buf);
  size_t n = strlen(buf);
  if (n == 0) return 0;
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
      buf[i] = c;
    }
  }
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return -1;
  }
  return 0;
}

int util_mkdir_parent(const char *path) {
  char dir[UTIL_PATH_MAX];
  util_strlcpy(dir, path, sizeof dir);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = '\0';
  return util_mkdir_p(dir);
}

int util_snprintf(char *buf, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, len, fmt, ap);
  va_end(ap);
  return n;
}

const char *util_fmt_bytes(double bytes, char *buf, size_t len) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    u++;
  }
  snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

const char *util_fmt_duration(double s, char *buf, size_t len) {
  if (!(s >= 0) || s > 1e9) {
    snprintf(buf, len, "--");
  } else if (s >= 3600) {
    snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
  } else if (s >= 60) {
    snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
  } else {
    snprintf(buf, len, "%.1fs", s);
  }
  return buf;
}

uint64_t util_hash64(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = UTIL_HASH64_EMPTY ^ seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

uint64_t util_hash64_more(uint64_t h, const void *data, size_t len) { return util_hash64(data, len, h ^ UTIL_HASH64_EMPTY); }
