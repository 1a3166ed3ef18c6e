/* fuzz_tokjson: the tokenizer.json reader (src/text/tokjson.c) on arbitrary files, through a
 * directory holding only that file, as &tokenizer dir reads it. Properties: no crash; a tokenizer
 * that loads encodes any bytes (a fixed text and the input itself) to ids it has, and decodes them
 * back to exactly those bytes where it does not NFC-normalize; a refused file has one error with
 * its file, a message and a hint. */
#include "text/tok.h"
#include "fuzz.h"

static char dir[300];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 0);
  snprintf(dir, sizeof dir, "%s", fuzz_dir);
  return 0;
}

static void roundtrip(tok_tokenizer *t, const char *text, size_t len) {
  tok_ids ids = {0};
  tok_encode(t, text, len, 1, &ids);
  for (size_t i = 0; i < ids.n; i++) FUZZ_ASSERT(ids.v[i] >= 0 && ids.v[i] < t->vocab_size, "ids within the vocabulary");
  char *back = malloc(ids.n * (size_t)t->max_len + 1);
  size_t n = tok_decode(t, ids.v, ids.n, back);
  FUZZ_ASSERT(t->nfc || (n == len && memcmp(back, text, len) == 0), "decoding returns the bytes encoded");
  free(back);
  tok_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[400];
  fuzz_write("tokenizer.json", data, size, path, sizeof path);
  tok_tokenizer t;
  err_list errs = {0};
  if (tok_load_bpe(&t, dir, &errs) == 0) {
    static const char text[] = "In the beginning God created the heaven and the earth.\n\t 12 DON'T  <|endoftext|>\xff\xfe";
    roundtrip(&t, text, sizeof text - 1);
    roundtrip(&t, (const char *)data, size < 4096 ? size : 4096);
    tok_free(&t);
  } else {
    FUZZ_ASSERT(errs.n == 1 && errs.v[0].file[0] && errs.v[0].msg[0] && errs.v[0].hint[0],
                "a refused tokenizer.json has one error with its file, a message and a hint");
  }
  err_free(&errs);
  return 0;
}
