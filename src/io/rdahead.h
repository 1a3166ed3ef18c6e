/* rdahead: a file's extents read in order by threads of their own, ahead of their use, where
 * possible straight from the disk into a ring of buffers (O_DIRECT: no page cache, no kernel copy).
 *
 * The extents, in the order given, are cut into windows: one read of at most `chunk` bytes covers
 * as many consecutive extents as fit, reading through gaps of up to RDAHEAD_GAP bytes between
 * them (a large extent takes several windows). `requests` reader threads read windows w, w +
 * requests, ... each, so that many reads are in flight; window w goes to buffer w % (2 x requests)
 * once the caller has given back the window that was there. Direct reads cover whole aligned
 * blocks (RDAHEAD_ALIGN) around each window; where the file system refuses them (open or read
 * fails with EINVAL) the readers go on through the page cache. The caller takes the bytes by file
 * offset, in the order of the extents (rdahead_take), each piece writable in place (to convert
 * it) until the next take; so extents must not overlap. The threads make no MPI calls. */
#ifndef GREENLM_RDAHEAD_H
#define GREENLM_RDAHEAD_H

#include <stddef.h>
#include <stdint.h>

enum { RDAHEAD_ALIGN = 4096, RDAHEAD_GAP = 1 << 20 };

typedef struct {
  int64_t off, len; /* bytes of the file */
} rdahead_extent;

typedef struct rdahead rdahead;

/* Start reading the n extents of path in order, directly from the disk if `direct`, with
 * `requests` reads in flight (reader threads; 2 x requests buffers). chunk: bytes per window and
 * buffer (rounded up to RDAHEAD_ALIGN; no more than the extents need). Returns NULL if the file
 * cannot be opened, the buffers not allocated or the readers not started. */
rdahead *rdahead_open(const char *path, const rdahead_extent *ext, int n, size_t chunk, int requests, int direct);

/* The bytes at file offset `off` onwards: at most `want`, contiguous; *got says how many. `off` is
 * the next byte of the extents the caller needs (later than the previous take's, or in a later
 * extent). Valid, and writable, until the next call. NULL (*got = 0) on a read error, a file that
 * ends early, or an offset no window to come holds. Waits for the reader when it is behind. */
void *rdahead_take(rdahead *r, int64_t off, size_t want, size_t *got);

/* Whether the reads bypass the page cache (O_DIRECT took). */
int rdahead_direct(rdahead *r);

/* Stop the reader (wherever it is) and free everything. */
void rdahead_close(rdahead *r);

#endif
