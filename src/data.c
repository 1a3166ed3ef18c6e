/* data: byte-level text loading and the shuffled window loader. */
#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "util.h"

size_t data_encode_bytes(const char *text, size_t len, int32_t *out) {
  for (size_t i = 0; i < len; i++) out[i] = (unsigned char)text[i];
  return len;
}

size_t data_decode_bytes(const int32_t *tok, size_t n, char *out) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (tok[i] >= 0 && tok[i] < 256) out[k++] = (char)tok[i];
  return k;
}

static void split_from(data_split *s, const char *text, size_t len) {
  s->tok = util_malloc((len ? len : 1) * sizeof(int32_t), "tokens");
  s->n = data_encode_bytes(text, len, s->tok);
}

static void shuffle_epoch(data_loader *d) {
  rng_state r;
  rng_seed(&r, d->seed, RNG_DATA, (uint64_t)d->epoch);
  for (size_t i = 0; i < d->nwin; i++) d->perm[i] = (uint32_t)i;
  for (size_t i = d->nwin; i > 1; i--) {
    size_t j = (size_t)rng_below(&r, i);
    uint32_t t = d->perm[i - 1];
    d->perm[i - 1] = d->perm[j];
    d->perm[j] = t;
  }
}

int data_open(data_loader *d, const cfg_config *cfg, int T, nml_errors *errs) {
  memset(d, 0, sizeof *d);
  const cfg_data *dc = &cfg->data;
  int n0 = errs->n;
  char err[600];
  size_t len = 0;
  char *text = util_read_file(dc->train_file, &len, err, sizeof err);
  if (!text) {
    cfg_error_at(cfg, errs, "data", "train_file", "check the path (relative paths start at the working directory)",
                 "%s", err);
    return errs->n - n0;
  }
  if (len == 0) {
    cfg_error_at(cfg, errs, "data", "train_file", "give a file with text in it", "'%s' is empty", dc->train_file);
    free(text);
    return errs->n - n0;
  }
  if (dc->val_file[0]) {
    size_t vlen = 0;
    char *vtext = util_read_file(dc->val_file, &vlen, err, sizeof err);
    if (!vtext) {
      cfg_error_at(cfg, errs, "data", "val_file", "check the path, or leave val_file empty to split train_file", "%s",
                   err);
    } else {
      split_from(&d->val, vtext, vlen);
      d->val_bytes = vlen;
      free(vtext);
    }
    split_from(&d->train, text, len);
    d->train_bytes = len;
  } else {
    /* hold out the last val_fraction, cut after a newline where one is near */
    size_t cut = (size_t)((double)len * (1.0 - dc->val_fraction));
    size_t nl = cut;
    while (nl < len && nl < cut + 4096 && text[nl] != '\n') nl++;
    if (nl < len && text[nl] == '\n') cut = nl + 1;
    split_from(&d->train, text, cut);
    split_from(&d->val, text + cut, len - cut);
    d->train_bytes = cut;
    d->val_bytes = len - cut;
  }
  free(text);
  if (errs->n > n0) return errs->n - n0;
  char hint[200];
  snprintf(hint, sizeof hint, "give more text or lower &training seq_len (a window needs seq_len + 1 = %d tokens)",
           T + 1);
  if (d->train.n < (size_t)T + 1)
    cfg_error_at(cfg, errs, "data", "train_file", hint, "the training split of '%s' has %zu tokens, fewer than one window",
                 dc->train_file, d->train.n);
  if (d->val.n < (size_t)T + 1)
    cfg_error_at(cfg, errs, "data", dc->val_file[0] ? "val_file" : "val_fraction", hint,
                 "the validation split has %zu tokens, fewer than one window", d->val.n);
  if (errs->n > n0) return errs->n - n0;
  d->T = T;
  d->seed = (uint64_t)cfg->job.seed;
  d->nwin = (d->train.n - 1) / (size_t)T;
  d->perm = util_malloc(d->nwin * sizeof *d->perm, "window order");
  d->epoch = 0;
  d->pos = 0;
  shuffle_epoch(d);
  return 0;
}

void data_close(data_loader *d) {
  free(d->train.tok);
  free(d->val.tok);
  free(d->perm);
  memset(d, 0, sizeof *d);
}

static void window(const data_split *s, size_t w, int T, int32_t *tokens, int32_t *targets) {
  const int32_t *src = s->tok + w * (size_t)T;
  memcpy(tokens, src, (size_t)T * sizeof(int32_t));
  memcpy(targets, src + 1, (size_t)T * sizeof(int32_t));
}

void data_next_train(data_loader *d, int B, int32_t *tokens, int32_t *targets) {
  for (int b = 0; b < B; b++) {
    if (d->pos == d->nwin) {
      d->epoch++;
      d->pos = 0;
      shuffle_epoch(d);
    }
    window(&d->train, d->perm[d->pos++], d->T, tokens + (size_t)b * d->T, targets + (size_t)b * d->T);
  }
}

size_t data_val_windows(const data_loader *d) { return (d->val.n - 1) / (size_t)d->T; }

void data_val_batch(const data_loader *d, int k, int B, int32_t *tokens, int32_t *targets) {
  size_t nw = data_val_windows(d);
  for (int b = 0; b < B; b++) {
    size_t w = ((size_t)k * B + b) % nw;
    window(&d->val, w, d->T, tokens + (size_t)b * d->T, targets + (size_t)b * d->T);
  }
}
