/* test_bigdata: a token dataset of more than 2^32 tokens, read at its ends and across 2^32.
 *
 * Preparing four billion tokens takes hours; what must hold past 2^32 is the format (CDF-5: a 64-bit
 * token dimension), the offsets the writers and the loader compute (64-bit) and the loader's window
 * numbering. So the test writes a dataset of 2^32 + 12291 tokens as a sparse file (about 8 GiB long,
 * a few KiB on disk): the header as prepare writes it, and tokens only at the start, around 2^32 and at
 * the end, each with a value of its position. The loader opens it (&data verify = .false.: the blocks
 * in between are holes) and reads windows at the start, straddling 2^32 and at the very end: every
 * token must be the one written at its position. With windows of 1 + 1 tokens the dataset has more
 * than 2^32 - 1 windows, which the loader refuses (its window order keeps 32-bit indices). */
#include <pnetcdf.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "testing.h"
#include "testdeck.h"
#include "text/data.h"
#include "text/tok.h"

enum { T = 4096, EDGE = 2 * T + 2 }; /* tokens per window; tokens written at each place */

static const int64_t N = ((int64_t)1 << 32) + 3 * (T + 1); /* tokens in the dataset */

/* The token at position p: its value, from the position. */
static unsigned short token_at(int64_t p) { return (unsigned short)(p * 7 % 251); }

/* Tokens [a, a + EDGE) of variable v. */
static int put_edge(int nc, int v, int64_t a) {
  unsigned short x[EDGE];
  for (int i = 0; i < EDGE; i++) x[i] = token_at(a + i);
  MPI_Offset start = a, count = EDGE;
  return ncmpi_put_vara_ushort_all(nc, v, &start, &count, x);
}

/* The sparse dataset at path for the tokenizer of hash `hash`. Returns 0 or a PnetCDF error. */
static int write_sparse(const char *path, const char *hash) {
  int nc, dt, dd, db, vt, vd, vb, rc = ncmpi_create(MPI_COMM_SELF, path, NC_CLOBBER | NC_64BIT_DATA, MPI_INFO_NULL, &nc);
  if (rc != NC_NOERR) return rc;
  int64_t nblocks = (N + DATA_BLOCK_TOKENS - 1) / DATA_BLOCK_TOKENS;
  rc |= ncmpi_def_dim(nc, DATA_DIM_TOKEN, N, &dt) | ncmpi_def_dim(nc, DATA_DIM_DOCUMENT, 2, &dd);
  rc |= ncmpi_def_dim(nc, DATA_DIM_BLOCK, nblocks, &db);
  rc |= ncmpi_def_var(nc, DATA_VAR_TOKENS, NC_USHORT, 1, &dt, &vt) | ncmpi_def_var(nc, DATA_VAR_DOC_START, NC_INT64, 1, &dd, &vd);
  rc |= ncmpi_def_var(nc, DATA_VAR_BLOCK_SUM, NC_UINT64, 1, &db, &vb);
  rc |= ncmpi_put_att_text(nc, NC_GLOBAL, "format", strlen(DATA_FORMAT), DATA_FORMAT);
  rc |= ncmpi_put_att_text(nc, NC_GLOBAL, "tokenizer_hash", strlen(hash), hash);
  const struct {
    const char *name;
    long long v;
  } ints[] = {{"format_version", DATA_FORMAT_VERSION}, {"vocab_size", 256}, {"eot_id", -1}, {"token_count", N},
              {"document_count", 2}, {"block_tokens", DATA_BLOCK_TOKENS}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    rc |= ncmpi_put_att_longlong(nc, NC_GLOBAL, ints[i].name, NC_INT64, 1, &ints[i].v);
  rc |= ncmpi_enddef(nc);
  if (rc == NC_NOERR) rc = put_edge(nc, vt, 0) | put_edge(nc, vt, ((int64_t)1 << 32) - T) | put_edge(nc, vt, N - EDGE);
  long long starts[2] = {0, N - T};
  MPI_Offset start = 0, count = 2;
  if (rc == NC_NOERR) rc = ncmpi_put_vara_longlong_all(nc, vd, &start, &count, starts);
  unsigned long long *sums = calloc((size_t)nblocks, sizeof *sums); /* not checked (&data verify = .false.) */
  count = nblocks;
  if (rc == NC_NOERR) rc = ncmpi_put_vara_ulonglong_all(nc, vb, &start, &count, sums);
  free(sums);
  return rc | ncmpi_close(nc);
}

/* Window w read by the loader holds the tokens written at positions w T .. w T + T. */
static void check_window(data_loader *d, uint64_t w, const char *where) {
  int32_t tokens[T], targets[T];
  data_read_train(d, &w, 1, tokens, targets);
  int64_t p = (int64_t)w * T, bad = -1;
  for (int k = 0; k < T && bad < 0; k++)
    if (tokens[k] != token_at(p + k) || targets[k] != token_at(p + k + 1)) bad = p + k;
  T_CHECK(bad < 0, "window %llu (%s): token %lld is not the one written there", (unsigned long long)w, where, (long long)bad);
  printf("  window %-8llu tokens %lld .. %lld (%s): as written\n", (unsigned long long)w, (long long)p, (long long)(p + T),
         where);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *out = getenv("TEST_OUT");
  char dir[4096], path[4200], deck[9000];
  snprintf(dir, sizeof dir, "%s/bigdata", out ? out : "tests/out");
  util_mkdir_p(dir);
  snprintf(path, sizeof path, "%s/big.nc", dir);
  err_list e = {0};
  tok_tokenizer tok;
  T_CHECK(tok_open(&tok, CFG_TOK_BYTES, "", &e) == 0, "the bytes tokenizer");
  int rc = write_sparse(path, tok.hash_hex);
  T_CHECK(rc == NC_NOERR, "writing the sparse dataset: %s", ncmpi_strerror(rc));
  struct stat st;
  if (stat(path, &st) == 0)
    printf("  %s: %lld tokens, %.2f GiB long, %.1f MiB on disk\n", path, (long long)N, (double)st.st_size / (1 << 30),
           (double)st.st_blocks * 512 / (1 << 20));
  snprintf(deck, sizeof deck,
           "&job task = 'train' /\n&tokenizer kind = 'bytes' /\n&model vocab_size = 256, block_size = %d /\n"
           "&training seq_len = %d, micro_batch_size = 1, global_batch_size = 1 /\n"
           "&data train = '%s', val = '%s', verify = .false. /\n", T, T, path, path);
  cfg_config *c = t_load_deck(deck, "bigdata.nml", 1);
  data_loader d;
  rc = data_open(&d, c, &tok, T, &e);
  err_print(&e, 10);
  T_CHECK(rc == 0, "the loader does not open a dataset of %lld tokens", (long long)N);
  if (rc == 0) {
    T_CHECK(d.set[0].file.ntokens == N, "the loader sees %lld tokens, not %lld", (long long)d.set[0].file.ntokens,
            (long long)N);
    uint64_t last = (uint64_t)((N - 1) / T) - 1, at32 = ((uint64_t)1 << 32) / T;
    T_CHECK(d.nwin > at32, "the loader counts %llu windows", (unsigned long long)d.nwin);
    check_window(&d, 0, "the start");
    check_window(&d, at32 - 1, "ending at 2^32");
    check_window(&d, at32, "starting at 2^32");
    check_window(&d, last, "the end");
    data_close(&d);
  }
  /* windows of 2 tokens: more than 2^32 - 1 of them, more than the window order indexes */
  err_list e2 = {0};
  rc = data_open(&d, c, &tok, 1, &e2);
  T_CHECK(rc > 0 && e2.n && strstr(e2.v[0].msg, "more than 2^32 - 1 in one dataset"),
          "a dataset of more than 2^32 - 1 windows is not refused: %s", e2.n ? e2.v[0].msg : "no error");
  if (rc == 0) data_close(&d);
  err_free(&e2);
  tok_free(&tok);
  free(c);
  err_free(&e);
  remove(path);
  int code = t_done("test_bigdata");
  MPI_Finalize();
  return code;
}
