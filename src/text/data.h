/* data: token datasets and the shuffled window loader.
 *
 * Dataset format (one CDF-5 file per split, written collectively by the 'prepare' task; version 2):
 *   dimensions  token = number of tokens, document = number of documents,
 *               block = number of blocks of DATA_BLOCK_TOKENS tokens (the last may be shorter)
 *   variables   tokens(token)            ushort when the vocabulary fits in 16 bits, else uint
 *               doc_start(document)      int64, index of each document's first token
 *               block_checksum(block)    uint64, the checksum of each block's tokens
 *   attributes  title, format, format_version, split, tokenizer, tokenizer_dir, tokenizer_hash,
 *               vocab_size, eot_id, documents, separator, val_fraction, seed, source_count,
 *               source_files, source_bytes, token_count, document_count, block_tokens,
 *               greenlm_version, created; doc_start:checksum
 * A checksum sums, over the elements i (the index in the whole variable) of a range, the value
 * times (2i + 1) modulo 2^64, so a changed, swapped or zeroed value changes it and any rank can sum
 * any part (doc/formats.md). Documents are stored one after the other, each followed by
 * <|endoftext|> when the vocabulary has it (doc/data.md).
 *
 * A training example is a window of T+1 consecutive tokens (inputs: the first T, targets: the
 * last T). The training tokens are cut into non-overlapping windows; each epoch visits all of them
 * in a shuffle drawn from (seed, epoch). Each step takes the next G windows of that order (G =
 * sequences per global batch); a rank reads only the windows it is given, from the file. The
 * cursor (epoch, position) is all the state there is, so a restarted run continues exactly.
 *
 * A blend of several training datasets (doc/data.md): window n of the run (counted from step 0)
 * comes from the dataset s whose interval [c_s-1, c_s) of the cumulative normalised weights holds
 * u_n = rng_hash(seed, n) / 2^64, and is that dataset's next window in its own shuffle (seed, its
 * index, epoch). So the choice depends on (seed, n) only, the same on every rank for any layout,
 * and the windows drawn from each dataset (data_set.drawn) are all the state there is. One dataset
 * is never hashed: its windows are exactly those of the loader without a blend. Window ids number
 * the datasets' windows one dataset after the other (set s's first is data_set.first). Several
 * validation datasets are each scored on their own; the validation loss is the mean of theirs
 * weighted by their normalised weights: the expected loss of a window drawn from that blend.
 *
 * A blend lists each dataset once: two entries that are one file under two spellings (./a.nc, a
 * symbolic or hard link) are refused, as are weights whose sum overflows or whose share of a dataset
 * is 0 (data_check_weights).
 *
 * Nothing read from a dataset is trusted: the header is checked against the file's length, the
 * tokenizer and the model; data_verify reads every token once (shared among the ranks) against
 * the vocabulary and the block checksums; every window read is checked against the vocabulary. */
#ifndef GREENLM_DATA_H
#define GREENLM_DATA_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "deck/nml.h"
#include "text/tok.h"

#define DATA_FORMAT "greenlm token dataset"
#define DATA_FORMAT_VERSION 2
#define DATA_VAR_TOKENS "tokens"
#define DATA_VAR_DOC_START "doc_start"
#define DATA_VAR_BLOCK_SUM "block_checksum"
#define DATA_DIM_TOKEN "token"
#define DATA_DIM_DOCUMENT "document"
#define DATA_DIM_BLOCK "block"
enum { DATA_BLOCK_TOKENS = 1 << 20 };

typedef struct {
  char path[CFG_STR_LEN];
  int ncid, varid, doc_var, sum_var; /* sum_var -1: a version-1 dataset, without checksums */
  int64_t ntokens, ndocs, nblocks;
  int vocab_size, eot, version;
  char tokenizer_hash[32];
  uint64_t identity; /* hash of the token count and the block checksums: which data this is */
  int fd;            /* the file again, for read-ahead hints (data_prefetch), or -1 */
  int64_t tok_off;   /* byte offset of the tokens in the file, and bytes per token (2 or 4) */
  int tok_bytes;
} data_file;

/* One dataset of a blend; a training dataset with its own shuffle and cursor. */
typedef struct {
  data_file file;
  double weight;     /* normalised share of the windows drawn from it (validation: of the loss) */
  uint64_t nwin;     /* its windows of T+1 tokens */
  uint64_t first;    /* id of its first window in the blend's numbering */
  long epoch;        /* cursor: its epoch and position in that epoch's order */
  uint64_t pos;
  uint32_t *perm;    /* its windows in this epoch's order (nwin < 2^32: 4 bytes a window); NULL for validation */
} data_set;

typedef struct {
  data_set *set; /* the training datasets (nsets), in the deck's order */
  int nsets;
  data_set *val; /* the validation datasets (nval), in the deck's order */
  int nval;
  int T;
  uint64_t seed;
  uint64_t nwin;  /* all datasets' windows */
  double *cum;    /* cumulative weights (nsets), the last 1 */
} data_loader;

/* Open the deck's datasets for windows of T+1 tokens and check their headers against the file
 * lengths, the tokenizer (its hash) and the model (vocabulary). Not collective. Problems are
 * reported at the files or the deck keys; returns the error count. */
int data_open(data_loader *d, const cfg_config *cfg, const tok_tokenizer *tok, int T, err_list *errs);
void data_close(data_loader *d);
/* The blend weights of the deck (&data train_weights, val_weights): their sum finite and every
 * dataset's share above 0 (a training dataset's large enough to be drawn at all). Errors at the deck
 * keys with the values; data_open checks them too. Returns the errors added. Not collective. */
int data_check_weights(const cfg_config *cfg, err_list *errs);

/* Read both datasets once, their blocks shared among the ranks of comm, and check every token id
 * against the dataset's vocabulary and every block and the document starts against their
 * checksums. Collective. Returns the number of errors (the same on every rank; each rank adds
 * those it found). */
int data_verify(data_loader *d, MPI_Comm comm, err_list *errs);

/* The checksum of n values whose first has index `first` in its variable (see above). */
uint64_t data_checksum(const int32_t *v, size_t n, uint64_t first);
uint64_t data_checksum64(const int64_t *v, size_t n, uint64_t first);

/* Move dataset s's cursor to (epoch, pos): the state a checkpoint keeps. */
void data_seek(data_loader *d, int s, long epoch, uint64_t pos);
/* Windows drawn from dataset s since step 0 (epoch x its windows + position), and from all. */
uint64_t data_drawn(const data_loader *d, int s);
uint64_t data_drawn_all(const data_loader *d);
/* Which training data this is: the dataset's identity, or for a blend a hash of every dataset's
 * identity and weight; and the training tokens of all datasets. */
uint64_t data_identity(const data_loader *d);
int64_t data_train_tokens(const data_loader *d);

/* The ids of the next G training windows (the whole global batch of a step), advancing the cursor
 * into the next epoch when this one runs out. */
void data_next_windows(data_loader *d, long G, uint64_t *win);
/* The ids of the next G training windows without drawing them (the cursors stay): as many as the
 * datasets' current epochs still hold. Returns that count (G, unless an epoch ends within them). */
long data_peek_windows(const data_loader *d, long G, uint64_t *win);
/* Ask the operating system to read training windows win[0..n) into the page cache now, in the
 * background (posix_fadvise WILLNEED on their bytes), so that data_read_train finds them there. A
 * hint only: nothing is read into the loader, and a file system that ignores it changes nothing. */
void data_prefetch(const data_loader *d, const uint64_t *win, long n);
/* The read-ahead of one rank: the next G windows peeked into scratch (G), and those of them in
 * [lo, lo + n) (the rank's share of the step) handed to data_prefetch. */
void data_prefetch_next(const data_loader *d, long G, long lo, long n, uint64_t *scratch);
/* The training dataset (its index in the loader's sets) window id w of the blend's numbering belongs
 * to; w - d->set[s].first is the window within it. */
int data_window_set(const data_loader *d, uint64_t w);
/* Read n training windows: tokens and targets (n, T), host memory. */
void data_read_train(data_loader *d, const uint64_t *win, int n, int32_t *tokens, int32_t *targets);
/* Batch k (0-based) of B windows of validation dataset v, in order, wrapping around it. */
void data_val_batch(data_loader *d, int v, int k, int B, int32_t *tokens, int32_t *targets);
uint64_t data_val_windows(const data_loader *d, int v);

#endif
