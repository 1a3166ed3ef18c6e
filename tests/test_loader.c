/* test_loader: the window loader on a dataset this test prepares itself (bytes tokenizer, the
 * Genesis slice, one document per line):
 *   - each epoch visits every training window exactly once, in an order fixed by (seed, epoch)
 *     and different from one epoch to the next;
 *   - the order does not depend on how many windows a step takes;
 *   - a loader moved to a saved cursor (data_seek) continues with exactly the same windows;
 *   - a window's tokens are the dataset's tokens, and its targets are the tokens shifted by one. */
#include <mpi.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>

#include "deck/cfg.h"
#include "text/data.h"
#include "text/prepare.h"
#include "testing.h"
#include "text/tok.h"
#include "base/util.h"

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *top = getenv("TOP_SRCDIR"), *out = getenv("TEST_OUT");
  char dir[4096], deck[16384];
  snprintf(dir, sizeof dir, "%s/loader", out ? out : "tests/out");
  util_mkdir_p(dir);
  snprintf(deck, sizeof deck,
           "&job task = 'prepare', 'train', seed = 77 /\n"
           "&prepare input = '%s/tests/data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,\n"
           "  train_out = '%s/train.nc', val_out = '%s/val.nc' /\n"
           "&model vocab_size = 256 /\n&training seq_len = 32 /\n",
           top ? top : ".", dir, dir);
  cfg_config *cfg = calloc(1, sizeof *cfg);
  err_list errs = {0};
  T_CHECK(cfg_load(cfg, deck, strlen(deck), "loader.nml", NULL, 0, &errs) == 0, "deck rejected");
  err_print(&errs, 5);
  T_CHECK(prepare_run(cfg, MPI_COMM_WORLD, &errs) == 0, "prepare failed");
  tok_tokenizer tok;
  tok_init_bytes(&tok);
  data_loader d, e;
  T_CHECK(data_open(&d, cfg, &tok, 32, &errs) == 0, "dataset does not open");
  err_print(&errs, 5);
  if (errs.n) return t_done("test_loader");
  const uint64_t n = d.nwin;
  T_CHECK(n > 100, "only %llu windows", (unsigned long long)n);
  /* two epochs, 7 windows at a time */
  uint64_t *seen = calloc(n, sizeof *seen), *ep0 = malloc(n * sizeof *ep0), *ep1 = malloc(n * sizeof *ep1), w[7];
  uint64_t got = 0;
  while (got < 2 * n) {
    data_next_windows(&d, 7, w);
    for (int i = 0; i < 7 && got < 2 * n; i++, got++) {
      if (got < n) ep0[got] = w[i], seen[w[i]]++;
      else ep1[got - n] = w[i];
    }
  }
  int once = 1;
  for (uint64_t i = 0; i < n; i++) once &= seen[i] == 1;
  T_CHECK(once, "an epoch does not visit every window exactly once");
  T_CHECK(memcmp(ep0, ep1, n * sizeof *ep0) != 0, "two epochs have the same order");
  /* the same order when a step takes 16 windows; a restart from a saved cursor continues it */
  data_close(&d);
  T_CHECK(data_open(&d, cfg, &tok, 32, &errs) == 0, "reopen");
  uint64_t *big = malloc(2 * n * sizeof *big);
  for (uint64_t i = 0; i < 2 * n; i += 16) {
    uint64_t chunk[16];
    data_next_windows(&d, 16, chunk);
    for (int k = 0; k < 16 && i + k < 2 * n; k++) big[i + k] = chunk[k];
  }
  T_CHECK(memcmp(big, ep0, n * sizeof *ep0) == 0 && memcmp(big + n, ep1, n * sizeof *ep1) == 0,
          "the order depends on the windows per step");
  data_close(&d);
  T_CHECK(data_open(&d, cfg, &tok, 32, &errs) == 0 && data_open(&e, cfg, &tok, 32, &errs) == 0, "reopen");
  uint64_t a[5], b[5];
  for (int s = 0; s < 30; s++) data_next_windows(&d, 5, a); /* run 30 steps, "checkpoint" the cursor */
  data_seek(&e, 0, d.set[0].epoch, d.set[0].pos);
  int same = 1;
  for (int s = 0; s < 60; s++) { /* past an epoch boundary */
    data_next_windows(&d, 5, a);
    data_next_windows(&e, 5, b);
    same &= memcmp(a, b, sizeof a) == 0;
  }
  T_CHECK(same, "a loader restarted from the cursor gives other windows");
  /* window contents, against the dataset read directly */
  int32_t x[2 * 32], y[2 * 32], ref[33];
  uint64_t pick[2] = {3, n - 1};
  data_read_train(&d, pick, 2, x, y);
  int nc, var;
  char path[4200];
  snprintf(path, sizeof path, "%s/train.nc", dir);
  T_CHECK(ncmpi_open(MPI_COMM_SELF, path, NC_NOWRITE, MPI_INFO_NULL, &nc) == NC_NOERR, "open %s", path);
  ncmpi_inq_varid(nc, "tokens", &var);
  for (int i = 0; i < 2; i++) {
    MPI_Offset start = (MPI_Offset)pick[i] * 32, count = 33;
    ncmpi_get_vara_int_all(nc, var, &start, &count, ref);
    int ok = 1;
    for (int t = 0; t < 32; t++) ok &= x[i * 32 + t] == ref[t] && y[i * 32 + t] == ref[t + 1];
    T_CHECK(ok, "window %llu: tokens or targets differ from the dataset's", (unsigned long long)pick[i]);
  }
  ncmpi_close(nc);
  data_close(&d);
  data_close(&e);
  tok_free(&tok);
  free(seen), free(ep0), free(ep1), free(big), free(cfg);
  err_free(&errs);
  int rc = t_done("test_loader");
  MPI_Finalize();
  return rc;
}
