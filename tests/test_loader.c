/* test_loader: the window loader on a dataset this test prepares itself (bytes tokenizer, the
 * Genesis slice, one document per line):
 *   - each epoch visits every training window exactly once, in an order fixed by (seed, epoch)
 *     and different from one epoch to the next;
 *   - the order does not depend on how many windows a step takes;
 *   - a loader moved to a saved cursor (data_seek) continues with exactly the same windows;
 *   - a window's tokens are the dataset's tokens, and its targets are the tokens shifted by one;
 *   - the order is that of a plain Fisher-Yates shuffle per epoch from (seed, RNG_DATA, epoch), the
 *     loader's order before blends existed (a blend of one dataset changes nothing).
 * Blends (&data train of two datasets, the training and the validation split):
 *   - with train_weights = 0.7, 0.3 the realised shares over 200000 windows are within 4 binomial
 *     standard deviations of the weights; without weights, the shares follow the window counts;
 *   - each dataset visits each of its windows once per epoch, the first dataset in the same order
 *     as alone; the order does not depend on the windows per step;
 *   - a loader moved to the datasets' cursors continues with the same windows;
 *   - every rank draws the same windows (the hash of the first ones is printed: tests/test_blend.sh
 *     compares it across 1, 2 and 3 ranks);
 *   - a dataset of another tokenizer in a blend is refused, the file named.
 * Read-ahead (&data prefetch): the windows data_peek_windows gives are always the next ones drawn,
 * all of a step unless a dataset's epoch ends within it; data_prefetch brings a window's pages
 * into the page cache (checked with mincore where the file system lets them be dropped first). */
#define _DEFAULT_SOURCE /* mincore */
#include <fcntl.h>
#include <mpi.h>
#include <pnetcdf.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "deck/cfg.h"
#include "text/data.h"
#include "text/prepare.h"
#include "testing.h"
#include "text/tok.h"
#include "base/rng.h"
#include "base/util.h"

/* The order of epoch `epoch` of n windows as the loader drew it before blends existed. */
static void plain_order(uint64_t seed, long epoch, uint64_t n, uint64_t *perm) {
  rng_state r;
  rng_seed(&r, seed, RNG_DATA, (uint64_t)epoch);
  for (uint64_t i = 0; i < n; i++) perm[i] = i;
  for (uint64_t i = n; i > 1; i--) {
    uint64_t j = rng_below(&r, i), t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
}

/* A loader of the deck `base` plus `extra` (a &data group); 0 or the errors, first message in msg. */
static int open_deck(data_loader *d, const char *base, const char *extra, const tok_tokenizer *tok, char *msg,
                     size_t len) {
  char deck[20000];
  snprintf(deck, sizeof deck, "%s%s", base, extra);
  cfg_config *cfg = calloc(1, sizeof *cfg);
  err_list errs = {0};
  int n = cfg_load(cfg, deck, strlen(deck), "blend.nml", NULL, 0, &errs);
  if (n == 0) n = data_open(d, cfg, tok, 32, &errs);
  snprintf(msg, len, "%s", errs.n ? errs.v[0].msg : "");
  err_free(&errs);
  free(cfg);
  return n;
}

/* A copy of src whose tokenizer_hash says another tokenizer made it (rank 0 writes it). */
static void copy_other_tokenizer(const char *src, const char *dst) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    char buf[65536];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
    int nc;
    T_CHECK(ncmpi_open(MPI_COMM_SELF, dst, NC_WRITE, MPI_INFO_NULL, &nc) == NC_NOERR, "open %s", dst);
    ncmpi_redef(nc);
    ncmpi_put_att_text(nc, NC_GLOBAL, "tokenizer_hash", 16, "0123456789abcdef");
    ncmpi_close(nc);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* The blend of the training and validation splits (see the head comment). */
static void test_blend(const char *deck, const char *dir, const tok_tokenizer *tok, const uint64_t *ep0) {
  char extra[9000], msg[2048];
  snprintf(extra, sizeof extra, "&data train = '%s/train.nc', '%s/val.nc', train_weights = 0.7, 0.3 /\n", dir, dir);
  data_loader d, e;
  T_CHECK(open_deck(&d, deck, extra, tok, msg, sizeof msg) == 0, "blend does not open: %s", msg);
  T_CHECK(open_deck(&e, deck, extra, tok, msg, sizeof msg) == 0, "blend does not open: %s", msg);
  if (d.nsets != 2 || e.nsets != 2) return;
  const uint64_t n0 = d.set[0].nwin, n1 = d.set[1].nwin, N = 200000;
  uint64_t *w = malloc(N * sizeof *w), *first0 = malloc(n0 * sizeof *w), *seen1 = calloc(n1, sizeof *w), c[2] = {0, 0};
  for (uint64_t i = 0; i < N; i += 8) data_next_windows(&d, 8, w + i);
  for (uint64_t i = 0; i < N; i++) {
    int s = w[i] >= n0;
    if (s == 0 && c[0] < n0) first0[c[0]] = w[i];
    if (s == 1 && c[1] < n1) seen1[w[i] - n0]++;
    c[s]++;
  }
  double share = (double)c[1] / (double)N, sd = sqrt(0.3 * 0.7 / (double)N);
  printf("blend 0.7/0.3: %llu + %llu windows, share %.5f (4 sigma %.5f)\n", (unsigned long long)c[0],
         (unsigned long long)c[1], share, 4 * sd);
  T_CHECK(fabs(share - 0.3) <= 4 * sd, "share %.5f of the second dataset, weight 0.3 +- %.5f", share, 4 * sd);
  T_CHECK(data_drawn(&d, 0) == c[0] && data_drawn(&d, 1) == c[1], "the cursors do not count the windows drawn");
  T_CHECK(memcmp(first0, ep0, n0 * sizeof *ep0) == 0, "the first dataset's order differs from its order alone");
  int once = 1;
  for (uint64_t i = 0; i < n1; i++) once &= seen1[i] == 1;
  T_CHECK(once, "an epoch of the second dataset does not visit every window once");
  /* other windows per step; then a restart from the datasets' cursors */
  int same = 1;
  for (uint64_t i = 0; i + 16 <= 4000; i += 16) {
    uint64_t chunk[16];
    data_next_windows(&e, 16, chunk);
    same &= memcmp(chunk, w + i, sizeof chunk) == 0;
  }
  T_CHECK(same, "the blend's order depends on the windows per step");
  uint64_t h = util_hash64(w, 4000 * sizeof *w, 0), lo, hi;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  T_CHECK(lo == hi, "the ranks draw other windows");
  printf("blend windows hash %016llx\n", (unsigned long long)h);
  for (int s = 0; s < 2; s++)
    data_seek(&e, s, (long)(data_drawn(&d, s) / d.set[s].nwin), data_drawn(&d, s) % d.set[s].nwin);
  same = 1;
  for (int k = 0; k < 600; k++) {
    uint64_t a[5], b[5];
    data_next_windows(&d, 5, a);
    data_next_windows(&e, 5, b);
    same &= memcmp(a, b, sizeof a) == 0;
  }
  T_CHECK(same, "a blend restarted from its cursors gives other windows");
  data_close(&d);
  data_close(&e);
  /* weights by size */
  snprintf(extra, sizeof extra, "&data train = '%s/train.nc', '%s/val.nc' /\n", dir, dir);
  T_CHECK(open_deck(&d, deck, extra, tok, msg, sizeof msg) == 0, "blend by size does not open: %s", msg);
  double want = (double)n1 / (double)(n0 + n1);
  T_CHECK(d.nsets == 2 && fabs(d.set[1].weight - want) < 1e-12, "weight by size %g, want %g",
          d.nsets == 2 ? d.set[1].weight : -1.0, want);
  data_close(&d);
  /* a dataset of another tokenizer */
  char other[4200];
  snprintf(other, sizeof other, "%s/other.nc", dir);
  char src[4200];
  snprintf(src, sizeof src, "%s/val.nc", dir);
  copy_other_tokenizer(src, other);
  snprintf(extra, sizeof extra, "&data train = '%s/train.nc', '%s' /\n", dir, other);
  T_CHECK(open_deck(&d, deck, extra, tok, msg, sizeof msg) > 0 && strstr(msg, "other.nc") &&
              strstr(msg, "another tokenizer"), "a dataset of another tokenizer is not refused by name: '%s'", msg);
  free(w), free(first0), free(seen1);
}

/* Pages of window w of d's dataset 0 resident in the page cache (map: the whole file, mapped). */
static int window_resident(const data_loader *d, const unsigned char *map, uint64_t w) {
  const data_file *f = &d->set[0].file;
  long pg = sysconf(_SC_PAGESIZE);
  off_t a = (off_t)f->tok_off + (off_t)(w * (uint64_t)d->T) * f->tok_bytes, b = a + (off_t)(d->T + 1) * f->tok_bytes;
  off_t first = a / pg * pg;
  unsigned char vec[64] = {0};
  size_t npg = (size_t)((b - first + pg - 1) / pg);
  if (npg > sizeof vec || mincore((void *)(map + first), (size_t)(b - first), vec) != 0) return 0;
  int all = 1;
  for (size_t i = 0; i < npg; i++) all &= vec[i] & 1;
  return all;
}

/* Read-ahead: peeks against draws over several epochs of a blend; a hinted window's pages resident. */
static void test_read_ahead(const char *deck, const char *dir, const tok_tokenizer *tok) {
  data_loader d;
  char extra[9000], msg[512];
  snprintf(extra, sizeof extra, "&data train = '%s/train.nc', '%s/val.nc', train_weights = 0.7, 0.3 /\n", dir, dir);
  T_CHECK(open_deck(&d, deck, extra, tok, msg, sizeof msg) == 0, "blend does not open: %s", msg);
  enum { G = 37 };
  uint64_t peek[G], next[G];
  int prefix = 1, short_ok = 1, shorts = 0;
  for (int step = 0; step < 300; step++) { /* about 6 epochs of the smaller dataset */
    long e0 = d.set[0].epoch + d.set[1].epoch, n = data_peek_windows(&d, G, peek);
    data_next_windows(&d, G, next);
    prefix &= memcmp(peek, next, (size_t)n * sizeof *peek) == 0;
    if (n < G) shorts++, short_ok &= d.set[0].epoch + d.set[1].epoch > e0; /* an epoch ended within the step */
  }
  T_CHECK(prefix, "data_peek_windows does not give the windows drawn next");
  T_CHECK(short_ok && shorts > 0, "a peek fell short %d times, not only where an epoch ended", shorts);
  /* the hint reads the window into the page cache */
  int fd = open(d.set[0].file.path, O_RDONLY);
  struct stat sb;
  T_CHECK(fd >= 0 && fstat(fd, &sb) == 0 && d.set[0].file.fd >= 0, "cannot open %s", d.set[0].file.path);
  unsigned char *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
  uint64_t w = d.set[0].nwin / 2;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (map != MAP_FAILED && !window_resident(&d, map, w)) {
    data_prefetch(&d, &w, 1);
    int in = 0;
    for (int k = 0; k < 200 && !(in = window_resident(&d, map, w)); k++) nanosleep(&(struct timespec){0, 5000000}, NULL);
    T_CHECK(in, "window %llu is not in the page cache 1 s after its read-ahead hint", (unsigned long long)w);
  } else
    printf("read-ahead: the file system keeps %s in memory; residency not checked\n", d.set[0].file.path);
  if (map != MAP_FAILED) munmap(map, (size_t)sb.st_size);
  close(fd);
  data_close(&d);
}

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
  uint64_t *plain = malloc(n * sizeof *plain);
  plain_order(77, 0, n, plain);
  T_CHECK(memcmp(plain, ep0, n * sizeof *ep0) == 0, "epoch 0 is not the plain shuffle of (seed, epoch)");
  plain_order(77, 1, n, plain);
  T_CHECK(memcmp(plain, ep1, n * sizeof *ep1) == 0, "epoch 1 is not the plain shuffle of (seed, epoch)");
  free(plain);
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
  test_blend(deck, dir, &tok, ep0);
  test_read_ahead(deck, dir, &tok);
  tok_free(&tok);
  free(seen), free(ep0), free(ep1), free(big), free(cfg);
  err_free(&errs);
  int rc = t_done("test_loader");
  MPI_Finalize();
  return rc;
}
