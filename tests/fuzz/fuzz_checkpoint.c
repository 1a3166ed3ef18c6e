/* fuzz_checkpoint: the checkpoint reader (header, shapes, run state, tensors, checksums) on
 * arbitrary files, read by a tiny model's trainer. Properties: no crash; a refused file has errors
 * with places and hints; an accepted one gives a run state within its bounds. */
#include "deck/cfg.h"
#include "model/backend.h"
#include "text/prepare.h"
#include "trainer.h"
#include "fuzz.h"

static cfg_config cfg;
static trainer *t;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 1);
  char text[600], deck[2400];
  snprintf(text, sizeof text, "%s/text.txt", fuzz_dir);
  FILE *fp = fopen(text, "w");
  for (int i = 0; i < 40; i++) fprintf(fp, "line %d of the text the tiny model of the checkpoint fuzzer reads\n", i);
  fclose(fp);
  snprintf(deck, sizeof deck,
           "&job task = 'prepare', 'train', seed = 3 /\n"
           "&prepare input = '%s', documents = 'line', train_out = '%s/train.nc', val_out = '%s/val.nc' /\n"
           "&model vocab_size = 256, block_size = 8, n_layer = 1, n_embd = 8, n_head = 2, window_size = 4 /\n"
           "&training seq_len = 8, micro_batch_size = 1 /\n",
           text, fuzz_dir, fuzz_dir);
  err_list errs = {0};
  if (cfg_load(&cfg, deck, strlen(deck), "fuzz.nml", NULL, 0, &errs) || cfg_resolve_layout(&cfg, 1, &errs) ||
      prepare_run(&cfg, MPI_COMM_SELF, &errs) || !(t = trainer_open(&cfg, backend_cpu(), MPI_COMM_SELF, &errs))) {
    err_print(&errs, 10);
    abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[400];
  fuzz_write("ckpt-00000001.nc", data, size, path, sizeof path);
  long step = -1;
  double tokens = -1;
  ckpt_stats st;
  err_list errs = {0};
  if (trainer_restore(t, path, &step, &tokens, &st, &errs) == 0) {
    FUZZ_ASSERT(step >= 0 && tokens >= 0 && t->data.set[0].pos <= t->data.set[0].nwin, "an accepted run state is within its bounds");
  } else {
    for (int i = 0; i < errs.n; i++) FUZZ_ASSERT(errs.v[i].msg[0], "errors carry a message");
    FUZZ_ASSERT(errs.n > 0 && errs.v[0].hint[0], "the first error has a hint");
  }
  if (getenv("FUZZ_VERBOSE")) err_print(&errs, 10), printf("%s: %d errors\n", __FILE__, errs.n);
  err_free(&errs);
  return 0;
}
