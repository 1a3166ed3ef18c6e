/* fuzz_dataset: the token dataset reader (header, lengths, every token id, the checksums) on
 * arbitrary files. Properties: no crash; a dataset that opens and verifies gives windows whose ids
 * are all within the vocabulary; one that is refused has errors with places and hints. */
#include "deck/cfg.h"
#include "text/data.h"
#include "text/tok.h"
#include "fuzz.h"

static cfg_config cfg;
static tok_tokenizer tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 1);
  char path[400], deck[1200];
  snprintf(path, sizeof path, "%s/data.nc", fuzz_dir);
  snprintf(deck, sizeof deck, "&data train = '%s', val = '%s' /\n&model vocab_size = 512 /\n&training seq_len = 8 /\n",
           path, path);
  err_list errs = {0};
  if (cfg_load(&cfg, deck, strlen(deck), "fuzz.nml", NULL, 0, &errs) != 0) abort();
  tok_init_bytes(&tok);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[400];
  fuzz_write("data.nc", data, size, path, sizeof path);
  data_loader d;
  err_list errs = {0};
  if (data_open(&d, &cfg, &tok, 8, &errs) == 0) {
    if (data_verify(&d, MPI_COMM_SELF, &errs) == 0) {
      uint64_t win[4];
      int32_t x[4 * 8], y[4 * 8];
      data_next_windows(&d, 4, win);
      data_read_train(&d, win, 4, x, y);
      data_val_batch(&d, 0, 1, 4, x, y);
      for (int i = 0; i < 32; i++) FUZZ_ASSERT(x[i] >= 0 && x[i] < 512 && y[i] >= 0 && y[i] < 512, "ids in the vocabulary");
    }
    data_close(&d);
  }
  for (int i = 0; i < errs.n; i++) FUZZ_ASSERT(errs.v[i].msg[0] && errs.v[i].hint[0], "errors carry a message and a hint");
  if (getenv("FUZZ_VERBOSE")) err_print(&errs, 10), printf("%s: %d errors\n", __FILE__, errs.n);
  err_free(&errs);
  return 0;
}
