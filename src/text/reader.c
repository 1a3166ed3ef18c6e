/* reader: plain, gzip (zlib) and zstd (libzstd) input streams. */
#include "text/reader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "base/util.h"

struct reader {
  reader_kind kind;
  FILE *fp;        /* plain and zstd */
  gzFile gz;       /* gzip */
  ZSTD_DCtx *zd;   /* zstd: the decoder, its input buffer and how much of it is used */
  char *in;
  ZSTD_inBuffer zin;
  size_t in_cap;
  int frame_open;  /* zstd: inside a frame (a stream that ends here is cut off) */
};

int reader_detect(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return -1;
  unsigned char m[4] = {0};
  size_t n = fread(m, 1, 4, fp);
  fclose(fp);
  if (n >= 2 && m[0] == 0x1f && m[1] == 0x8b) return READER_GZIP;
  if (n == 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) return READER_ZSTD;
  return READER_PLAIN;
}

const char *reader_kind_name(reader_kind k) { return k == READER_GZIP ? "gzip" : k == READER_ZSTD ? "zstd" : "plain"; }

reader *reader_open(const char *path, char *why, size_t len) {
  int k = reader_detect(path);
  if (k < 0) {
    snprintf(why, len, "%s", strerror(errno));
    return NULL;
  }
  reader *r = util_calloc(1, sizeof *r, "input stream");
  r->kind = (reader_kind)k;
  if (r->kind == READER_GZIP) {
    r->gz = gzopen(path, "rb");
    if (r->gz) gzbuffer(r->gz, 1 << 20);
  } else {
    r->fp = fopen(path, "rb");
  }
  if (!r->gz && !r->fp) {
    snprintf(why, len, "%s", strerror(errno ? errno : ENOMEM));
    free(r);
    return NULL;
  }
  if (r->kind == READER_ZSTD) {
    r->zd = ZSTD_createDCtx();
    r->in_cap = ZSTD_DStreamInSize();
    r->in = util_malloc(r->in_cap, "zstd input");
    r->zin = (ZSTD_inBuffer){r->in, 0, 0};
  }
  return r;
}

/* zstd: decode into buf until it holds something, the input ends, or an error. */
static ssize_t read_zstd(reader *r, char *buf, size_t n, char *why, size_t len) {
  ZSTD_outBuffer out = {buf, n, 0};
  while (out.pos == 0) {
    if (r->zin.pos == r->zin.size) { /* refill the input */
      r->zin.size = fread(r->in, 1, r->in_cap, r->fp);
      r->zin.pos = 0;
      if (r->zin.size == 0) {
        if (ferror(r->fp)) return snprintf(why, len, "%s", strerror(errno)), -1;
        if (r->frame_open) return snprintf(why, len, "the zstd stream is cut off (its last frame is incomplete)"), -1;
        return 0;
      }
    }
    size_t rc = ZSTD_decompressStream(r->zd, &out, &r->zin);
    if (ZSTD_isError(rc)) return snprintf(why, len, "damaged zstd data: %s", ZSTD_getErrorName(rc)), -1;
    r->frame_open = rc != 0; /* 0: a frame ended and was flushed */
  }
  return (ssize_t)out.pos;
}

ssize_t reader_read(reader *r, char *buf, size_t n, char *why, size_t len) {
  if (n > (size_t)1 << 30) n = (size_t)1 << 30; /* gzread takes an unsigned count */
  if (r->kind == READER_ZSTD) return read_zstd(r, buf, n, why, len);
  if (r->kind == READER_GZIP) {
    int got = gzread(r->gz, buf, (unsigned)n);
    if (got < 0) {
      int e;
      snprintf(why, len, "damaged gzip data: %s", gzerror(r->gz, &e));
      return -1;
    }
    int e = Z_OK;
    if (got == 0) gzerror(r->gz, &e);
    if (got == 0 && (e == Z_BUF_ERROR || !gzeof(r->gz))) return snprintf(why, len, "the gzip stream is cut off"), -1;
    return got;
  }
  size_t got = fread(buf, 1, n, r->fp);
  if (got == 0 && ferror(r->fp)) return snprintf(why, len, "%s", strerror(errno)), -1;
  return (ssize_t)got;
}

void reader_close(reader *r) {
  if (!r) return;
  if (r->gz) gzclose(r->gz);
  if (r->fp) fclose(r->fp);
  if (r->zd) ZSTD_freeDCtx(r->zd);
  free(r->in);
  free(r);
}
