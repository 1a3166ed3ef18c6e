/* rdahead: a file's extents read in order by a thread of its own, ahead of their use, where
 * possible straight from the disk into a ring of buffers (O_DIRECT: no page cache, no kernel copy).
 *
 * The reader reads extent after extent, in the order given, in pieces of at most `chunk` bytes,
 * into RDAHEAD_BUFS buffers; the caller takes the bytes in the same order (rdahead_take), each
 * piece writable in place (to convert it) until the next take. Direct reads cover whole aligned
 * blocks (RDAHEAD_ALIGN) around each piece; where the file system refuses them (open or read
 * fails with EINVAL, as on tmpfs) the reader goes on through the page cache. The thread makes no
 * MPI calls. */
#ifndef GREENLM_RDAHEAD_H
#define GREENLM_RDAHEAD_H

#include <stddef.h>
#include <stdint.h>

enum { RDAHEAD_BUFS = 3, RDAHEAD_ALIGN = 4096 };

typedef struct {
  int64_t off, len; /* bytes of the file */
} rdahead_extent;

typedef struct rdahead rdahead;

/* Start reading the n extents (copied) of path in order, directly from the disk if `direct`.
 * chunk: bytes per buffer (rounded up to RDAHEAD_ALIGN). Returns NULL if the file cannot be
 * opened or the thread not started. */
rdahead *rdahead_open(const char *path, const rdahead_extent *ext, int n, size_t chunk, int direct);

/* The next bytes in order: at most `want`, contiguous, within one extent; *got says how many and
 * *off where they lie in the file. Valid, and writable, until the next call. NULL on a read error
 * or a file that ends early (*got = 0). Waits for the reader when it has not got there yet. */
void *rdahead_take(rdahead *r, size_t want, size_t *got, int64_t *off);

/* Whether the reads bypass the page cache (O_DIRECT took). */
int rdahead_direct(rdahead *r);

/* Stop the reader (wherever it is) and free everything. */
void rdahead_close(rdahead *r);

#endif
