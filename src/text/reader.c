/* reader: plain, gzip (zlib's inflate, member by member) and zstd (libzstd) input streams. */
#include "text/reader.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "base/util.h"

enum { READER_IN = 1 << 20 }; /* compressed bytes read from the file at a time */

static const char READER_WHAT[] = "text input";
static const char READER_HINT[] = "give text files (plain, gzip or zstd), directories of them or glob patterns";
static const char DAMAGED_HINT[] = "the file is damaged or incomplete; fetch or compress it again";

struct reader {
  reader_kind kind;
  int fd;
  char *path;
  int64_t size;      /* the file's bytes */
  unsigned char *in; /* compressed input: in[pos, len) not decoded yet; in[0] is the file's byte off */
  size_t pos, len;
  int64_t off;
  z_stream z;        /* gzip */
  int z_ready;
  ZSTD_DCtx *zd;     /* zstd */
  int inside;        /* inside a member or frame: a file that ends here is cut off */
  int between;       /* a member or frame ended, and what follows has given no output yet */
  int64_t data_end;  /* the file offset where the last whole member or frame ended */
};

static int detect_fd(int fd) {
  unsigned char m[4] = {0};
  ssize_t n = pread(fd, m, 4, 0);
  if (n < 0) return -1;
  if (n >= 2 && m[0] == 0x1f && m[1] == 0x8b) return READER_GZIP;
  if (n == 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) return READER_ZSTD;
  return READER_PLAIN;
}

int reader_detect(const char *path, err_list *errs) {
  int fd = util_open_regular(path, READER_WHAT, READER_HINT, errs);
  if (fd < 0) return -1;
  int k = detect_fd(fd);
  if (k < 0) err_add(errs, path, 0, 0, "check the file's permissions", "cannot read: %s", strerror(errno));
  close(fd);
  return k;
}

const char *reader_kind_name(reader_kind k) { return k == READER_GZIP ? "gzip" : k == READER_ZSTD ? "zstd" : "plain"; }

reader *reader_open(const char *path, err_list *errs) {
  int fd = util_open_regular(path, READER_WHAT, READER_HINT, errs);
  if (fd < 0) return NULL;
  struct stat st;
  int k = fstat(fd, &st) == 0 ? detect_fd(fd) : -1;
  if (k < 0) {
    err_add(errs, path, 0, 0, "check the file's permissions", "cannot read: %s", strerror(errno));
    close(fd);
    return NULL;
  }
  reader *r = util_calloc(1, sizeof *r, "input stream");
  r->kind = (reader_kind)k;
  r->fd = fd;
  r->path = util_strdup(path);
  r->size = (int64_t)st.st_size;
  if (r->kind != READER_PLAIN) r->in = util_malloc(READER_IN, "compressed input");
  if (r->kind == READER_GZIP) {
    UTIL_CHECK(inflateInit2(&r->z, 16 + MAX_WBITS) == Z_OK, NULL, "zlib cannot start a gzip decoder (out of memory)");
    r->z_ready = 1;
  } else if (r->kind == READER_ZSTD) {
    r->zd = ZSTD_createDCtx();
    UTIL_CHECK(r->zd != NULL, NULL, "libzstd cannot create a decoder (out of memory)");
  }
  return r;
}

/* More compressed input once all of it is decoded: 1, 0 at the file's end, -1 after an error. */
static int refill(reader *r, err_list *errs) {
  if (r->pos < r->len) return 1;
  r->off += (int64_t)r->len;
  r->pos = r->len = 0;
  ssize_t got;
  do got = read(r->fd, r->in, READER_IN);
  while (got < 0 && errno == EINTR);
  if (got < 0) return err_add(errs, r->path, 0, 0, "check the file and its disk", "cannot read: %s", strerror(errno)), -1;
  r->len = (size_t)got;
  return got > 0;
}

static const char *unit_of(const reader *r) { return r->kind == READER_GZIP ? "gzip member" : "zstd frame"; }

/* Bytes after the last whole member or frame that do not start another one. */
static ssize_t trailing(const reader *r, err_list *errs) {
  long long end = (long long)r->data_end, n = (long long)(r->size - r->data_end);
  char hint[200];
  util_snprintf(hint, sizeof hint, "the file was damaged or appended to; keep its first %lld bytes (head -c %lld) or "
                "compress the text again", end, end);
  err_add(errs, r->path, 0, 0, hint, "trailing garbage: %lld byte%s after the %s data (from byte %lld of %lld) do not "
          "start another %s", n, n == 1 ? "" : "s", reader_kind_name(r->kind), end, (long long)r->size, unit_of(r));
  return -1;
}

/* The decoder refused the data (why). */
static ssize_t damaged(const reader *r, const char *why, err_list *errs) {
  if (r->between) return trailing(r, errs);
  err_add(errs, r->path, 0, 0, DAMAGED_HINT, "damaged %s data near byte %lld of %lld: %s", reader_kind_name(r->kind),
          (long long)(r->off + (int64_t)r->pos), (long long)r->size, why);
  return -1;
}

/* The file ended inside a member or frame. */
static ssize_t cut_off(const reader *r, err_list *errs) {
  if (r->between) return trailing(r, errs);
  err_add(errs, r->path, 0, 0, DAMAGED_HINT, "the %s data is cut off: the file ends inside a %s (at byte %lld)",
          reader_kind_name(r->kind), unit_of(r), (long long)r->size);
  return -1;
}

/* A member or frame decoded so far: whether it ended, and whether it gave output. */
static void progress(reader *r, int ended, int produced) {
  if (produced) r->between = 0;
  if (ended) {
    r->inside = 0, r->between = 1;
    r->data_end = r->off + (int64_t)r->pos;
  } else {
    r->inside = 1;
  }
}

static ssize_t read_gzip(reader *r, char *buf, size_t n, err_list *errs) {
  r->z.next_out = (Bytef *)buf;
  r->z.avail_out = (uInt)n;
  while (r->z.avail_out == n) {
    int more = refill(r, errs);
    if (more <= 0) return more < 0 ? -1 : r->inside ? cut_off(r, errs) : 0;
    r->z.next_in = r->in + r->pos;
    r->z.avail_in = (uInt)(r->len - r->pos);
    uInt before = r->z.avail_out;
    int rc = inflate(&r->z, Z_NO_FLUSH);
    r->pos = r->len - r->z.avail_in;
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) return damaged(r, r->z.msg ? r->z.msg : zError(rc), errs);
    progress(r, rc == Z_STREAM_END, r->z.avail_out != before);
    if (rc == Z_STREAM_END) inflateReset(&r->z); /* another member may follow */
  }
  return (ssize_t)(n - r->z.avail_out);
}

static ssize_t read_zstd(reader *r, char *buf, size_t n, err_list *errs) {
  ZSTD_outBuffer out = {buf, n, 0};
  while (out.pos == 0) {
    int more = refill(r, errs);
    if (more <= 0) return more < 0 ? -1 : r->inside ? cut_off(r, errs) : 0;
    ZSTD_inBuffer in = {r->in, r->len, r->pos};
    size_t rc = ZSTD_decompressStream(r->zd, &out, &in);
    r->pos = in.pos;
    if (ZSTD_isError(rc)) return damaged(r, ZSTD_getErrorName(rc), errs);
    progress(r, rc == 0, out.pos > 0); /* 0: a frame ended and was flushed */
  }
  return (ssize_t)out.pos;
}

ssize_t reader_read(reader *r, char *buf, size_t n, err_list *errs) {
  if (n > (size_t)1 << 30) n = (size_t)1 << 30; /* zlib takes an unsigned count */
  if (n == 0) return 0;
  if (r->kind == READER_GZIP) return read_gzip(r, buf, n, errs);
  if (r->kind == READER_ZSTD) return read_zstd(r, buf, n, errs);
  ssize_t got;
  do got = read(r->fd, buf, n);
  while (got < 0 && errno == EINTR);
  if (got < 0) err_add(errs, r->path, 0, 0, "check the file and its disk", "cannot read: %s", strerror(errno));
  return got;
}

void reader_close(reader *r) {
  if (!r) return;
  close(r->fd);
  if (r->z_ready) inflateEnd(&r->z);
  if (r->zd) ZSTD_freeDCtx(r->zd);
  free(r->in);
  free(r->path);
  free(r);
}
