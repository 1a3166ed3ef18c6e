/* corpus: text input for the tokenizer and prepare tasks, split into documents and across ranks.
 *
 * The inputs (files, directories or glob patterns, in the deck's order, each pattern's matches
 * sorted) form one byte stream. Documents are one per file, one per line, separated by blank
 * lines, or separated by lines equal to a separator; every file boundary ends a document too.
 * Separator lines (and, in 'line' mode, the newline) are not part of any document.
 *
 * Each rank takes a contiguous share of the stream. Shares start at "cut points" only: a document
 * boundary, or a line start where GPT-2's pre-tokenization is known to cut the same way as in the
 * whole text (the byte before the newline and the first byte of the line are both printable,
 * non-space ASCII). So tokenizing the shares separately gives exactly the tokens of the whole, for
 * any number of ranks. A document may be split across ranks; its parts arrive in rank order.
 *
 * Compressed files (gzip, zstd: reader.h) and JSON Lines (&prepare format) cannot be entered in the
 * middle: when the inputs hold any, each rank takes whole files instead, a contiguous run of them
 * balanced by their sizes on disk (with fewer files than ranks, the ranks beyond them have nothing
 * to do: the report says so). Files are decompressed as they are read and cut into pieces at the
 * same cut points. In JSON Lines every line is a record and its text field one document; a record
 * that is not a JSON object with that field as a string (jansson checks its UTF-8) is bad: counted
 * and skipped, or reported with its file and line (&prepare bad_records).
 *
 * No line longer than line_max bytes is held (&prepare buffer_mb / 4, at least 1024: a line's tokens
 * fit in the token buffer), however small its file is on disk: a longer line is a bad record (JSON
 * Lines) or a line of text left out, by the same rule, read through without being kept. Text around
 * a line left out goes on as if it were not there; a line start right after such a line is never a
 * cut point, so the shares agree on it for any number of ranks. */
#ifndef GREENLM_CORPUS_H
#define GREENLM_CORPUS_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "deck/nml.h"

/* Text is handed on in pieces of at most about this many bytes (more only where no cut point comes
 * sooner): a piece is at most this many tokens. */
enum { CORPUS_PIECE_TOKENS = 32 << 20 };

/* The tokens &prepare buffer_mb holds (int32 each), at least 1024: also the longest line read, in
 * bytes (a line makes at most as many tokens as it has bytes). */
static inline size_t corpus_buffer_tokens(double buffer_mb) {
  double t = buffer_mb * 1048576.0 / 4;
  return t < 1024 ? 1024 : (size_t)t;
}


typedef struct {
  int64_t n;       /* how many */
  char first[640]; /* the first: "path:line: why" */
} corpus_skips;

typedef struct {
  int nfiles;
  char **path;
  int64_t *bytes;  /* size of each file */
  int64_t *start;  /* offset of each file in the stream */
  int64_t total;
  cfg_prepare_documents mode;
  char separator[CFG_STR_LEN];
  /* this rank's share [lo, hi) of the stream */
  int64_t lo, hi;
  /* whole files per rank (compressed or JSON Lines inputs): this rank's files [flo, fhi) */
  int whole_files, flo, fhi;
  unsigned char *kind;  /* (nfiles) reader_kind */
  unsigned char *jsonl; /* (nfiles) 1: JSON Lines */
  char text_field[CFG_STR_LEN];
  int bad_fatal;        /* &prepare bad_records = 'fatal' */
  size_t line_max;      /* the longest line read, bytes without its newline: corpus_buffer_tokens */
  double buffer_mb;
  /* after corpus_each: this rank's JSON Lines records, those that were bad, lines of text too long */
  int64_t records;
  corpus_skips bad, long_lines;
  int lc_file;          /* line numbers in a shared file: counting resumes at byte lc_off, line lc_line */
  int64_t lc_off, lc_line;
} corpus_set;

/* Expand the inputs on rank 0 (every input must name at least one non-empty regular file; a
 * directory stands for the regular files in it, a glob pattern for those it matches: other entries,
 * such as FIFOs or subdirectories, are passed over; a path named itself that is not a regular file or
 * a directory is an error that says what it is) and share the list; documents divide as &prepare
 * documents and separator say. Problems are reported at the deck key `group.key` that lists the
 * inputs; returns the error count (same on all ranks). */
int corpus_open(corpus_set *c, const cfg_config *cfg, const char *group, const char *key, const cfg_strlist *inputs,
                MPI_Comm comm, err_list *errs);
void corpus_close(corpus_set *c);

/* Called for each piece of a document in this rank's share, in stream order. begins: the piece is
 * the start of its document (else it continues the previous rank's last document); ends: the
 * document ends with this piece. Empty documents are skipped. */
typedef void (*corpus_fn)(const char *text, size_t len, int begins, int ends, void *ctx);

/* Read this rank's share and call fn for its document pieces. Returns 0, or -1 after adding an
 * error when a file cannot be read or (bad_records = 'fatal') holds bad records or lines too long
 * (this rank only). */
int corpus_each(corpus_set *c, corpus_fn fn, void *ctx, err_list *errs);
/* After corpus_each: the job's JSON Lines records, bad ones and lines too long, with the first of
 * each (of the lowest rank that met one), printed by rank 0 as "TASK: ..." lines. Collective. */
void corpus_report(const corpus_set *c, MPI_Comm comm, const char *task);

/* Rank 0, before any task runs: whether a file a task will write (out, at the deck key
 * out_group.out_key; with nspill > 0 also its spill files out.spill-R, R < nspill) is one of the
 * inputs (inputs, at the deck key group.key) under any spelling (fileid.h), or out would be read as
 * one by a run of the deck (it is in an input directory or matches an input pattern). Returns 1 after
 * adding an error that names both, else 0. */
int corpus_clash(const cfg_config *cfg, const char *group, const char *key, const cfg_strlist *inputs, const char *out,
                 int nspill, const char *out_group, const char *out_key, err_list *errs);
/* "N files: gzip 3, zstd 2, plain 1; JSON Lines 5; whole files per rank (2 of 4 ranks have none)" into
 * buf, for the reports. */
const char *corpus_describe(const corpus_set *c, int nranks, char *buf, size_t len);

#endif
