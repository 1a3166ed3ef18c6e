/* rdahead: a file's extents read in order by a thread of its own, ahead of their use. */
#define _GNU_SOURCE /* O_DIRECT */
#include "rdahead.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

typedef struct {
  unsigned char *mem;  /* (chunk) bytes, RDAHEAD_ALIGN-aligned */
  unsigned char *data; /* the piece's first byte in mem */
  int64_t off;         /* its place in the file */
  size_t len;          /* its bytes; 0 with err */
  int err;
} rdahead_buf;

struct rdahead {
  int fd, direct;
  rdahead_extent *ext;
  int n;
  size_t chunk;
  rdahead_buf buf[RDAHEAD_BUFS];
  int head, count; /* buffers filled and not yet given back: buf[head], ... (count of them) */
  size_t taken;    /* bytes of buf[head] already taken */
  int stop;        /* the caller closes: the reader leaves */
  int done;        /* the reader has left: no more pieces come */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

/* Read bytes [lo, hi) of the file into mem (lo aligned for direct reads), at least `need` of them
 * (a direct read of the file's last block ends at its end). Returns 0, or -1 (errno). A direct
 * read the file system refuses (EINVAL) turns the descriptor to page-cache reads, and retries. */
static int read_at(rdahead *r, unsigned char *mem, int64_t lo, int64_t hi, size_t need) {
  size_t got = 0, want = (size_t)(hi - lo);
  while (got < want) {
    ssize_t k = pread(r->fd, mem + got, want - got, (off_t)(lo + (int64_t)got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EINVAL && r->direct && got == 0) {
      int fl = fcntl(r->fd, F_GETFL);
      if (fl < 0 || fcntl(r->fd, F_SETFL, fl & ~O_DIRECT) < 0) return -1;
      pthread_mutex_lock(&r->mu);
      r->direct = 0; /* the aligned blocks are read through the page cache instead */
      pthread_mutex_unlock(&r->mu);
      continue;
    }
    if (k <= 0) break;
    got += (size_t)k;
  }
  return got >= need ? 0 : -1;
}

/* The thread: every extent in order, in pieces that fill one buffer each. */
static void *reader(void *arg) {
  rdahead *r = arg;
  int slot = 0;
  for (int e = 0; e < r->n; e++) {
    int64_t p = r->ext[e].off, end = p + r->ext[e].len;
    while (p < end) {
      pthread_mutex_lock(&r->mu);
      while (r->count == RDAHEAD_BUFS && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
      int stop = r->stop;
      pthread_mutex_unlock(&r->mu);
      if (stop) return NULL;
      rdahead_buf *b = &r->buf[slot];
      /* direct: the aligned blocks around [p, p + m), m ending on a block boundary unless at the
       * extent's end; page cache: [p, p + m) itself */
      int64_t lo = r->direct ? p - p % RDAHEAD_ALIGN : p, m = end - p;
      if (m > lo + (int64_t)r->chunk - p) m = lo + (int64_t)r->chunk - p;
      int64_t hi = r->direct ? (p + m + RDAHEAD_ALIGN - 1) / RDAHEAD_ALIGN * RDAHEAD_ALIGN : p + m;
      int rc = read_at(r, b->mem, lo, hi, (size_t)(p + m - lo));
      b->data = b->mem + (p - lo), b->off = p, b->len = rc ? 0 : (size_t)m, b->err = rc != 0;
      pthread_mutex_lock(&r->mu);
      r->count++;
      pthread_cond_broadcast(&r->cv);
      pthread_mutex_unlock(&r->mu);
      if (rc) return NULL; /* the caller stops at this piece */
      slot = (slot + 1) % RDAHEAD_BUFS, p += m;
    }
  }
  pthread_mutex_lock(&r->mu);
  r->done = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

rdahead *rdahead_open(const char *path, const rdahead_extent *ext, int n, size_t chunk, int direct) {
  int fd = direct ? open(path, O_RDONLY | O_DIRECT) : -1;
  if (fd < 0) fd = open(path, O_RDONLY), direct = 0;
  if (fd < 0) return NULL;
  rdahead *r = util_calloc(1, sizeof *r, "reader");
  r->fd = fd, r->direct = direct, r->n = n;
  r->chunk = (chunk + RDAHEAD_ALIGN - 1) / RDAHEAD_ALIGN * RDAHEAD_ALIGN;
  if (r->chunk < 2 * RDAHEAD_ALIGN) r->chunk = 2 * RDAHEAD_ALIGN; /* room for a piece and its alignment */
  r->ext = util_malloc((size_t)(n ? n : 1) * sizeof *ext, "extents");
  if (n) memcpy(r->ext, ext, (size_t)n * sizeof *ext);
  int ok = 1;
  for (int i = 0; i < RDAHEAD_BUFS; i++) {
    void *mem = NULL;
    if (posix_memalign(&mem, RDAHEAD_ALIGN, r->chunk) != 0) ok = 0;
    r->buf[i].mem = mem;
  }
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  if (!ok || pthread_create(&r->thread, NULL, reader, r) != 0) {
    r->thread = pthread_self(); /* nothing to join */
    r->stop = 1;
    rdahead_close(r);
    return NULL;
  }
  return r;
}

void *rdahead_take(rdahead *r, size_t want, size_t *got, int64_t *off) {
  pthread_mutex_lock(&r->mu);
  if (r->count && r->taken == r->buf[r->head].len && !r->buf[r->head].err) { /* the last piece is used up */
    r->head = (r->head + 1) % RDAHEAD_BUFS, r->count--, r->taken = 0;
    pthread_cond_broadcast(&r->cv);
  }
  while (r->count == 0 && !r->done) pthread_cond_wait(&r->cv, &r->mu);
  int none = r->count == 0; /* asked for more than the extents hold */
  rdahead_buf *b = &r->buf[r->head];
  pthread_mutex_unlock(&r->mu);
  *got = 0, *off = none ? -1 : b->off + (int64_t)r->taken;
  if (none || b->err) return NULL;
  size_t k = b->len - r->taken < want ? b->len - r->taken : want;
  unsigned char *p = b->data + r->taken;
  r->taken += k, *got = k;
  return p;
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
  if (!pthread_equal(r->thread, pthread_self())) pthread_join(r->thread, NULL);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  for (int i = 0; i < RDAHEAD_BUFS; i++) free(r->buf[i].mem);
  close(r->fd);
  free(r->ext);
  free(r);
}
