/* data: token datasets and the shuffled window loader.
 *
 * Dataset format (one CDF-5 file per split, written collectively by the 'prepare' task):
 *   dimensions  token = number of tokens, document = number of documents
 *   variables   tokens(token)        ushort when the vocabulary fits in 16 bits, else uint
 *               doc_start(document)  int64, index of each document's first token
 *   attributes  title, split, tokenizer, tokenizer_dir, tokenizer_hash, vocab_size, eot_id,
 *               documents, separator, val_fraction, seed, source_count, source_files,
 *               source_bytes, token_count, document_count, greenlm_version, created
 * Documents are stored one after the other, each followed by <|endoftext|> when the vocabulary
 * has it (doc/data.md).
 *
 * A training example is a window of T+1 consecutive tokens (inputs: the first T, targets: the
 * last T). The training tokens are cut into non-overlapping windows; each epoch visits all of them
 * in a shuffle drawn from (seed, epoch). Each step takes the next G windows of that order (G =
 * sequences per global batch); a rank reads only the windows it is given, from the file. The
 * cursor (epoch, position) is all the state there is, so a restarted run continues exactly. */
#ifndef GREENLM_DATA_H
#define GREENLM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "deck/nml.h"
#include "text/tok.h"

#define DATA_VAR_TOKENS "tokens"
#define DATA_VAR_DOC_START "doc_start"
#define DATA_DIM_TOKEN "token"
#define DATA_DIM_DOCUMENT "document"

typedef struct {
  char path[CFG_STR_LEN];
  int ncid, varid;
  int64_t ntokens, ndocs;
  int vocab_size, eot;
  char tokenizer_hash[32];
} data_file;

typedef struct {
  data_file train, val;
  int T;
  uint64_t seed;
  /* cursor */
  long epoch;
  uint64_t pos;
  /* windows of the current epoch, shuffled */
  uint64_t nwin;
  uint64_t *perm;
} data_loader;

/* Open the deck's datasets for windows of T+1 tokens and check them against the tokenizer (its
 * hash) and the model (vocabulary). Problems are reported at the deck keys; returns the error
 * count. */
int data_open(data_loader *d, const cfg_config *cfg, const tok_tokenizer *tok, int T, nml_errors *errs);
void data_close(data_loader *d);

/* Move the cursor to (epoch, pos): the state a checkpoint keeps. */
void data_seek(data_loader *d, long epoch, uint64_t pos);

/* The ids of the next G training windows (the whole global batch of a step), advancing the cursor
 * into the next epoch when this one runs out. */
void data_next_windows(data_loader *d, long G, uint64_t *win);
/* Read n training windows: tokens and targets (n, T), host memory. */
void data_read_train(data_loader *d, const uint64_t *win, int n, int32_t *tokens, int32_t *targets);
/* Validation batch k (0-based) of B windows, in order, wrapping around the split. */
void data_val_batch(data_loader *d, int k, int B, int32_t *tokens, int32_t *targets);
uint64_t data_val_windows(const data_loader *d);

#endif
