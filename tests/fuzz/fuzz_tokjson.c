/* fuzz_tokjson: the tokenizer.json reader (src/text/tokjson.c) on arbitrary files, through a
 * directory holding only that file, as &tokenizer dir reads it. Properties: no crash; a tokenizer
 * that loads encodes any bytes (a fixed text and the input itself) to ids it has, and decodes them
 * back to exactly those bytes where it does not NFC-normalize; a refused file has one error with
 * its file, a message and a hint. */
#include "tokcheck.h"

static char dir[300];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 0);
  snprintf(dir, sizeof dir, "%s", fuzz_dir);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[400];
  fuzz_write("tokenizer.json", data, size, path, sizeof path);
  fuzz_tok_check(dir, data, size, "a refused tokenizer.json has one error with its file, a message and a hint");
  return 0;
}
