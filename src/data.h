/* data: token streams for training and validation, and the shuffled window loader.
 *
 * A training example is a window of T+1 consecutive tokens (inputs = the first T, targets = the
 * last T). The training split is cut into non-overlapping windows; each epoch visits all of them
 * in a deterministic shuffle drawn from (seed, epoch), so the order depends only on the deck and
 * a restarted run can continue from the cursor (epoch, position). Validation uses the windows of
 * the validation split in order. */
#ifndef GREENLM_DATA_H
#define GREENLM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "nml.h"

typedef struct {
  int32_t *tok;
  size_t n;
} data_split;

typedef struct {
  data_split train, val;
  int T;
  uint64_t seed;
  /* cursor */
  long epoch;
  size_t pos;
  /* windows of the current epoch, shuffled */
  size_t nwin;
  uint32_t *perm;
  size_t train_bytes, val_bytes;
} data_loader;

/* Read and tokenize the deck's &data files for windows of T+1 tokens. Problems (missing, empty,
 * too short files) are reported at the deck key that named the file; returns the error count. */
int data_open(data_loader *d, const cfg_config *cfg, int T, nml_errors *errs);
void data_close(data_loader *d);

/* Next B training windows: tokens and targets (B,T), host memory. Advances the cursor. */
void data_next_train(data_loader *d, int B, int32_t *tokens, int32_t *targets);
/* Validation batch k (0-based) of B windows, in order, wrapping around the split. */
void data_val_batch(const data_loader *d, int k, int B, int32_t *tokens, int32_t *targets);
/* Number of validation windows. */
size_t data_val_windows(const data_loader *d);

/* Byte-level tokenizer: encode text (one token per byte) and decode tokens to bytes. */
size_t data_encode_bytes(const char *text, size_t len, int32_t *out);
size_t data_decode_bytes(const int32_t *tok, size_t n, char *out);

#endif
