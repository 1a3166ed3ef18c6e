/* fuzz_tokenizer: the BPE vocabulary reader (encoder.json, vocab.bpe) on arbitrary files: the
 * input up to its first NUL byte is encoder.json, the rest vocab.bpe. Properties: no crash; a
 * vocabulary that loads encodes any bytes (a fixed text and the input itself) to ids it has, and
 * decodes them back to exactly those bytes. */
#include "tokcheck.h"

static char dir[300];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 0);
  snprintf(dir, sizeof dir, "%s", fuzz_dir);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_write_pair("encoder.json", "vocab.bpe", data, size);
  fuzz_tok_check(dir, data, size, "a refused vocabulary has one error with its file, a message and a hint");
  return 0;
}
