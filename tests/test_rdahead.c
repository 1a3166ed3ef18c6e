/* test_rdahead: the reader thread delivers exactly the bytes of the extents, in order, whatever
 * their alignment, gaps and order, the window size and the sizes taken; straight from the disk and
 * through the page cache; a file that ends early is an error, not a hang; so is an offset outside
 * the extents; closing midway does not hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/rdahead.h"
#include "testing.h"

static unsigned char byte_at(int64_t i) { return (unsigned char)((uint64_t)i * 2654435761u >> 13); }

/* Take all extents in takes of varying sizes; returns the bytes that matched, -1 on an error. */
static int64_t take_all(rdahead *r, const rdahead_extent *ext, int n, unsigned seed, int *mismatch) {
  int64_t total = 0;
  *mismatch = 0;
  for (int e = 0; e < n; e++) {
    int64_t done = 0;
    while (done < ext[e].len) {
      seed = seed * 1103515245u + 12345u;
      size_t want = 4 * (1 + (seed >> 8) % 3000), got = 0;
      if (want > (size_t)(ext[e].len - done)) want = (size_t)(ext[e].len - done);
      int64_t off = ext[e].off + done;
      unsigned char *p = rdahead_take(r, off, want, &got);
      if (!p) return -1;
      if (got == 0 || got > want) {
        (*mismatch)++;
        return total;
      }
      for (size_t i = 0; i < got; i++)
        if (p[i] != byte_at(off + (int64_t)i)) (*mismatch)++;
      memset(p, 0, got); /* writable in place */
      done += (int64_t)got, total += (int64_t)got;
    }
  }
  return total;
}

int main(void) {
  const char *out = getenv("TEST_OUT");
  char path[512];
  snprintf(path, sizeof path, "%s", out ? out : "tests/out");
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/rdahead.bin", out ? out : "tests/out");
  const int64_t size = 3 * 1048576 + 4 * 1234; /* not a whole number of blocks */
  unsigned char *data = malloc((size_t)size);
  for (int64_t i = 0; i < size; i++) data[i] = byte_at(i);
  FILE *fp = fopen(path, "wb");
  T_CHECK(fp && fwrite(data, 1, (size_t)size, fp) == (size_t)size && fclose(fp) == 0, "cannot write %s", path);
  /* not overlapping (the caller converts in place); unaligned, tiny, adjacent, backwards, far and
   * near gaps, empty, spanning many windows, up to the file's last byte */
  const rdahead_extent ext[] = {{320000, 4 * 77777},          {0, 4},           {4, 4096 - 4},
                                {4096, 8192},                 {2 * 1048576 + 12, 1048576 - 12},
                                {1048576 - 4, 8},             {3 * 1048576, 4 * 1234},
                                {12288 + 12, 4 * 5},          {8192, 0},        {1048576 + 20000, 4 * 10},
                                {1048576 + 20000 + 40 + 400, 4 * 3000},          {640000, 4}};
  const int n = (int)(sizeof ext / sizeof ext[0]);
  int64_t want_total = 0;
  for (int e = 0; e < n; e++) want_total += ext[e].len;
  const size_t chunks[] = {1, 8192, 20000, 1 << 20, 64 << 20};
  for (int direct = 0; direct <= 1; direct++)
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
      rdahead *r = rdahead_open(path, ext, n, chunks[c], 1 + (int)c % 4, direct);
      T_CHECK(r != NULL, "rdahead_open(%s) failed", path);
      if (!r) continue;
      int bad = 0;
      int64_t got = take_all(r, ext, n, (unsigned)(7 + c), &bad);
      T_CHECK(got == want_total && !bad, "direct=%d chunk=%zu: %lld of %lld bytes, %d wrong", direct, chunks[c],
              (long long)got, (long long)want_total, bad);
      size_t k = 1;
      T_CHECK(rdahead_take(r, 1048576, 4, &k) == NULL && k == 0, "direct=%d: a take past the extents gave bytes", direct);
      if (direct == 0) T_CHECK(!rdahead_direct(r), "direct reads without asking for them");
      if (direct && c == 0) printf("direct reads %s on this file system\n", rdahead_direct(r) ? "taken" : "refused: page cache");
      rdahead_close(r);
    }
  /* an extent past the file's end: an error where the file ends, for both kinds of reads */
  const rdahead_extent past[] = {{0, 4096}, {size - 4096, 8192}};
  for (int direct = 0; direct <= 1; direct++) {
    rdahead *r = rdahead_open(path, past, 2, 8192, 2, direct);
    int bad = 0;
    T_CHECK(r && take_all(r, past, 2, 3, &bad) == -1, "direct=%d: reading past the end gave no error", direct);
    if (r) rdahead_close(r);
  }
  /* closing with the reader waiting for free buffers (the caller gave up) */
  rdahead *r = rdahead_open(path, ext, n, 8192, 3, 1);
  size_t k;
  T_CHECK(r && rdahead_take(r, ext[0].off, 4, &k) != NULL && k == 4, "the first take failed");
  if (r) rdahead_close(r);
  T_CHECK(rdahead_open("/nonexistent/rdahead.bin", ext, n, 8192, 1, 1) == NULL, "opened a file that does not exist");
  remove(path);
  free(data);
  return t_done("test_rdahead");
}
