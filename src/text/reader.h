/* reader: the bytes of an input file as a stream, decompressed when the file is gzip or zstd.
 *
 * The kind is told by the file's first bytes, not by its name: 1f 8b is gzip (RFC 1952), 28 b5 2f fd
 * a zstd frame; anything else is read as it is. Members (gzip) or frames (zstd) one after another,
 * as `cat a.gz b.gz`, `pigz` and the Pile's .jsonl.zst files have them, are read as one stream. The
 * whole file must be compressed data: bytes after the last member or frame that do not start another
 * one (trailing garbage, zero padding) are an error naming the file and the byte offset where the
 * compressed data ended, as are damaged data (a wrong checksum: the offset near the damage) and a
 * file that ends inside a member or frame.
 *
 * Only regular files are read: a directory, a FIFO, a device is refused by name when it is opened
 * (util_open_regular; a FIFO's open never waits for a writer). */
#ifndef GREENLM_READER_H
#define GREENLM_READER_H

#include <stddef.h>
#include <sys/types.h>

#include "base/err.h"

typedef enum { READER_PLAIN, READER_GZIP, READER_ZSTD } reader_kind;

/* The kind of the file at path, or -1 after adding an error at path (not a regular file, unreadable). */
int reader_detect(const char *path, err_list *errs);
/* "plain", "gzip", "zstd". */
const char *reader_kind_name(reader_kind k);

typedef struct reader reader;

/* Open path as a stream of its kind; NULL after adding an error at path. */
reader *reader_open(const char *path, err_list *errs);
/* Up to n bytes of the stream into buf: the count, 0 at its end, -1 after adding an error at the
 * file (a read error; damaged, cut-off or trailing data, with the byte offset in the file). */
ssize_t reader_read(reader *r, char *buf, size_t n, err_list *errs);
void reader_close(reader *r);

#endif
