/* rdahead: a file's extents read in order by threads of their own, ahead of their use. */
#define _GNU_SOURCE /* O_DIRECT */
#include "io/rdahead.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

typedef struct {
  int64_t lo, hi, need; /* file bytes [lo, hi) to read, the extents' up to need */
} rdahead_window;

typedef struct {
  unsigned char *mem; /* (chunk) bytes, RDAHEAD_ALIGN-aligned */
  int64_t window;     /* the window in it, once read (-1: none yet) */
  int64_t hi;         /* as far as the read got */
  int err;            /* the read failed or ended before the extents' bytes */
} rdahead_buf;

struct rdahead {
  int fd, direct;
  size_t chunk;
  rdahead_window *win;
  int64_t nwin;
  rdahead_buf *buf; /* (nbuf) */
  pthread_t *thread; /* (nthread) */
  int nbuf, nthread; /* nthread: requests in flight, the readers' stride */
  int started;       /* readers running (to join) */
  int64_t cur;      /* the caller's window; windows before it are given back */
  int stop;         /* the caller closes: the readers leave */
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

/* Read bytes [lo, hi) of the file into mem. Returns the bytes read (short at the file's end) or
 * -1. A read refused with EINVAL (direct reads the file system does not take) turns the
 * descriptor, which the readers share, to page-cache reads and is tried once more. */
static int64_t read_at(rdahead *r, unsigned char *mem, int64_t lo, int64_t hi) {
  int64_t got = 0;
  int retried = 0;
  while (got < hi - lo) {
    ssize_t k = pread(r->fd, mem + got, (size_t)(hi - lo - got), (off_t)(lo + got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EINVAL && !retried) {
      pthread_mutex_lock(&r->mu);
      int fl = fcntl(r->fd, F_GETFL);
      if (fl >= 0 && (fl & O_DIRECT)) fcntl(r->fd, F_SETFL, fl & ~O_DIRECT);
      r->direct = 0;
      pthread_mutex_unlock(&r->mu);
      retried = 1;
      continue;
    }
    if (k < 0) return -1;
    if (k == 0) break;
    got += k;
  }
  return got;
}

/* The windows over the n extents, in order: each from the aligned block around byte p of extent e
 * on, up to `chunk` bytes, covering the following extents as long as they start at most
 * RDAHEAD_GAP after the previous one ends and within the window, to the end of an aligned block
 * (as direct reads need; page-cache reads take the same windows). Returns the count; *out to
 * free(). */
static int64_t make_windows(const rdahead_extent *ext, int n, size_t chunk, rdahead_window **out) {
  int64_t cap = 16, nw = 0;
  rdahead_window *w = util_malloc((size_t)cap * sizeof *w, "windows");
  int e = 0;
  while (e < n && ext[e].len == 0) e++;
  int64_t p = e < n ? ext[e].off : 0;
  while (e < n) {
    int64_t lo = p - p % RDAHEAD_ALIGN, limit = lo + (int64_t)chunk, end;
    for (;;) {
      int64_t stop = ext[e].off + ext[e].len;
      end = stop < limit ? stop : limit;
      if (end < stop) { /* the extent goes on in the next window */
        p = end;
        break;
      }
      while (++e < n && ext[e].len == 0) continue;
      p = e < n ? ext[e].off : 0;
      if (e == n || p < end || p - end > RDAHEAD_GAP || p >= limit) break;
    }
    if (nw == cap) w = util_realloc(w, (size_t)(cap *= 2) * sizeof *w, "windows");
    w[nw++] = (rdahead_window){lo, (end + RDAHEAD_ALIGN - 1) / RDAHEAD_ALIGN * RDAHEAD_ALIGN, end};
  }
  *out = w;
  return nw;
}

/* Reader t of T: windows t, t + T, ..., window w into buffer w % r->nbuf once the caller has
 * given back the window before it there. */
typedef struct {
  rdahead *r;
  int t;
} rdahead_arg;

static void *reader(void *arg) {
  rdahead *r = ((rdahead_arg *)arg)->r;
  int t = ((rdahead_arg *)arg)->t;
  free(arg);
  for (int64_t w = t; w < r->nwin; w += r->nthread) {
    rdahead_buf *b = &r->buf[w % r->nbuf];
    pthread_mutex_lock(&r->mu);
    while (w - r->nbuf >= r->cur && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    if (stop) break;
    const rdahead_window *x = &r->win[w];
    int64_t got = read_at(r, b->mem, x->lo, x->hi);
    pthread_mutex_lock(&r->mu);
    b->hi = got < 0 ? x->lo : x->lo + got, b->err = got < 0 || x->lo + got < x->need, b->window = w;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
  }
  return NULL;
}

rdahead *rdahead_open(const char *path, const rdahead_extent *ext, int n, size_t chunk, int requests, int direct) {
  int fd = direct ? open(path, O_RDONLY | O_DIRECT) : -1;
  if (fd < 0) fd = open(path, O_RDONLY), direct = 0;
  if (fd < 0) return NULL;
  rdahead *r = util_calloc(1, sizeof *r, "reader");
  r->fd = fd, r->direct = direct;
  /* a window never needs more than all the extents and their alignment */
  size_t most = 2 * RDAHEAD_ALIGN;
  for (int i = 0; i < n; i++) most += (size_t)ext[i].len + RDAHEAD_ALIGN;
  r->chunk = chunk < most ? chunk : most;
  r->chunk = (r->chunk + RDAHEAD_ALIGN - 1) / RDAHEAD_ALIGN * RDAHEAD_ALIGN;
  if (r->chunk < 2 * RDAHEAD_ALIGN) r->chunk = 2 * RDAHEAD_ALIGN; /* room for a block and its alignment */
  r->nwin = make_windows(ext, n, r->chunk, &r->win);
  int ok = 1;
  r->nthread = requests < 1 ? 1 : requests;
  if (r->nthread > r->nwin) r->nthread = r->nwin ? (int)r->nwin : 1;
  r->nbuf = 2 * r->nthread;
  r->buf = util_calloc((size_t)r->nbuf, sizeof *r->buf, "reader buffers");
  r->thread = util_calloc((size_t)r->nthread, sizeof *r->thread, "readers");
  for (int i = 0; i < r->nbuf; i++) {
    void *mem = NULL;
    if (posix_memalign(&mem, RDAHEAD_ALIGN, r->chunk) != 0) ok = 0;
    r->buf[i] = (rdahead_buf){.mem = mem, .window = -1};
  }
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  for (int t = 0; ok && t < r->nthread; t++) {
    rdahead_arg *a = util_malloc(sizeof *a, "reader");
    *a = (rdahead_arg){r, t};
    if (pthread_create(&r->thread[t], NULL, reader, a) != 0) free(a), ok = 0;
    else r->started++;
  }
  if (!ok) {
    rdahead_close(r);
    return NULL;
  }
  return r;
}

void *rdahead_take(rdahead *r, int64_t off, size_t want, size_t *got) {
  *got = 0;
  pthread_mutex_lock(&r->mu);
  rdahead_buf *b = NULL;
  while (r->cur < r->nwin) {
    const rdahead_window *x = &r->win[r->cur];
    if (off >= x->lo && off < x->need) { /* its window: wait for it */
      b = &r->buf[r->cur % r->nbuf];
      while (b->window != r->cur) pthread_cond_wait(&r->cv, &r->mu);
      break;
    }
    r->cur++; /* used up: its buffer goes back to the readers */
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
  if (!b || b->err || off >= b->hi) return NULL;
  const rdahead_window *x = &r->win[b->window];
  size_t k = (size_t)(x->need - off) < want ? (size_t)(x->need - off) : want;
  *got = k;
  return b->mem + (off - x->lo);
}

int rdahead_direct(rdahead *r) {
  pthread_mutex_lock(&r->mu);
  int d = r->direct;
  pthread_mutex_unlock(&r->mu);
  return d;
}

void rdahead_close(rdahead *r) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  for (int t = 0; t < r->started; t++) pthread_join(r->thread[t], NULL);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  for (int i = 0; i < r->nbuf; i++) free(r->buf[i].mem);
  close(r->fd);
  free(r->buf), free(r->thread), free(r->win);
  free(r);
}
