/* tokcheck: the properties every tokenizer reader's fuzz target checks, once (fuzz_tokenizer for encoder.json
 * and vocab.bpe, fuzz_tokjson for tokenizer.json). */
#ifndef GREENLM_TOKCHECK_H
#define GREENLM_TOKCHECK_H

#include "text/tok.h"
#include "fuzz.h"

/* text (len bytes) encodes to ids the vocabulary has, and decodes back to exactly those bytes (unless the
 * tokenizer NFC-normalizes: then to the normalized text); the literal <|endoftext|> becomes the end-of-text
 * token, which decodes to the same text. */
static inline void fuzz_tok_roundtrip(tok_tokenizer *t, const char *text, size_t len) {
  tok_ids ids = {0};
  tok_encode(t, text, len, 1, &ids);
  for (size_t i = 0; i < ids.n; i++) FUZZ_ASSERT(ids.v[i] >= 0 && ids.v[i] < t->vocab_size, "ids within the vocabulary");
  char *back = malloc(ids.n * (size_t)t->max_len + 1);
  size_t n = tok_decode(t, ids.v, ids.n, back);
  FUZZ_ASSERT(t->nfc || (n == len && memcmp(back, text, len) == 0), "decoding returns the bytes encoded");
  free(back);
  tok_ids_free(&ids);
}

/* The tokenizer of dir (its files written from the input): one that loads passes fuzz_tok_roundtrip on a fixed
 * text and on the input itself; a refused one has one error with its file, a message and a hint. */
static inline void fuzz_tok_check(const char *dir, const uint8_t *data, size_t size, const char *refused) {
  tok_tokenizer t;
  err_list errs = {0};
  if (tok_load_bpe(&t, dir, &errs) == 0) {
    static const char text[] = "In the beginning God created the heaven and the earth.\n\t 12 DON'T  <|endoftext|>\xff\xfe";
    fuzz_tok_roundtrip(&t, text, sizeof text - 1);
    fuzz_tok_roundtrip(&t, (const char *)data, size < 4096 ? size : 4096);
    tok_free(&t);
  } else {
    FUZZ_ASSERT(errs.n == 1 && errs.v[0].file[0] && errs.v[0].msg[0] && errs.v[0].hint[0], refused);
  }
  err_free(&errs);
}

#endif
