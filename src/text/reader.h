/* reader: the bytes of an input file as a stream, decompressed when the file is gzip or zstd.
 *
 * The kind is told by the file's first bytes, not by its name: 1f 8b is gzip (RFC 1952; members
 * one after another are read as one stream), 28 b5 2f fd is a zstd frame (frames one after another,
 * as `zstd` and the Pile's .jsonl.zst files have them); anything else is read as it is. */
#ifndef GREENLM_READER_H
#define GREENLM_READER_H

#include <stddef.h>
#include <sys/types.h>

typedef enum { READER_PLAIN, READER_GZIP, READER_ZSTD } reader_kind;

/* The kind of the file at path; -1 with errno when it cannot be read. */
int reader_detect(const char *path);
/* "plain", "gzip", "zstd". */
const char *reader_kind_name(reader_kind k);

typedef struct reader reader;

/* Open path as a stream of its kind; NULL with the reason in why. */
reader *reader_open(const char *path, char *why, size_t len);
/* Up to n bytes of the stream into buf: the count, 0 at its end, -1 with the reason in why (a read
 * error, a damaged or cut-off compressed stream). */
ssize_t reader_read(reader *r, char *buf, size_t n, char *why, size_t len);
void reader_close(reader *r);

#endif
