/* greenlm-iobench: checkpoint write and read rates against plain fwrite/fread of the same bytes
 * on the same disk, in one run.
 *
 *   mpirun -n 2 greenlm-iobench --dir /scratch/me/io --layers 12 --embd 768 --heads 12 --vocab 50304
 *
 * The ranks form D data-parallel replicas with ZeRO-1 (each writes its piece of the parameters and
 * the moments it keeps). A checkpoint is written (collective PnetCDF, fsync, rename) and read back
 * (collective, checksums verified); then each rank fwrites the same number of bytes to a file of
 * its own, fsyncs it, and freads it back. Written files are dropped from the page cache
 * (posix_fadvise DONTNEED) before they are read, so reads come from the disk.
 *
 * Fairness: the rounds alternate which of the two goes first, and before each timed write the
 * target file is deleted and an untimed scratch file of the same size is written and deleted, so
 * both writers find the page cache in the same state (on virtual machines the first write into
 * long-unused memory runs 2-4x slower, which would otherwise favour whichever went second). Each
 * figure is the best of --repeat rounds; per-round lines are printed too, and the result line
 * gives both rates and their ratios. */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/backend.h"
#include "deck/cfg.h"
#include "io/ckpt.h"
#include "config.h"
#include "parallel/grad.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "parallel/par.h"
#include "base/util.h"

static void usage(FILE *fp) {
  fprintf(fp, "usage: greenlm-iobench --dir DIR [--layers L] [--embd C] [--heads H] [--vocab V] [--repeat R]\n"
              "                       [--stage-mb MB] [--read-mb MB] [--read-requests N] [--direct-read T|F]\n"
              "defaults: --layers 12 --embd 768 --heads 12 --vocab 50304 --repeat 3 (GPT-2-124M: 1.5 GB),\n"
              "          --stage-mb 8 --read-mb 8 --read-requests 4 --direct-read T (the &checkpoint keys)\n");
}

/* fwrite n bytes to path, fsync, drop from the page cache; returns seconds (collective max). */
static double raw_write(const char *path, const char *buf, size_t n) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = util_now();
  FILE *fp = fopen(path, "wb");
  UTIL_CHECK(fp, NULL, "cannot write %s", path);
  UTIL_CHECK(fwrite(buf, 1, n, fp) == n, NULL, "fwrite to %s failed", path);
  fflush(fp);
  fsync(fileno(fp));
  posix_fadvise(fileno(fp), 0, 0, POSIX_FADV_DONTNEED);
  fclose(fp);
  double t = util_now() - t0, most;
  MPI_Allreduce(&t, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

static double raw_read(const char *path, char *buf, size_t n) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = util_now();
  FILE *fp = fopen(path, "rb");
  UTIL_CHECK(fp && fread(buf, 1, n, fp) == n, NULL, "fread of %s failed", path);
  fclose(fp);
  double t = util_now() - t0, most;
  MPI_Allreduce(&t, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

/* The untimed warm-up read: the scratch file is read, dropped from the page cache and deleted. */
static void warm_read(const char *scratch, char *buf, size_t n) {
  raw_read(scratch, buf, n);
  int fd = open(scratch, O_RDONLY);
  if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
  remove(scratch);
  MPI_Barrier(MPI_COMM_WORLD);
}

/* The benchmark's settings, its checkpoint state and its best times. */
typedef struct {
  int rank, size;
  const char *dir, *stage_mb, *read_mb, *requests, *direct;
  long layers, embd, heads, vocab, reps;
  cfg_config *cfg;
  par_layout lay;
  gpt_shape shape;
  gpt_model model;
  grad_exchange *gx;
  optim_state opt;
  ckpt_state cs;
  size_t mine; /* this rank's bytes in the checkpoint: its piece of the parameters and of the two moments */
  char *buf, raw[CFG_STR_LEN + 32], scratch[CFG_STR_LEN + 32], cs_path[CFG_STR_LEN + 64];
  double best_w, best_r, best_rf, best_fw, best_fr, bytes;
} iobench;

/* The command line into b; returns -1 to go on, or the exit status. */
static int parse_options(iobench *b, int argc, char **argv) {
  b->stage_mb = "8", b->read_mb = "8", b->requests = "4", b->direct = "T";
  b->layers = 12, b->embd = 768, b->heads = 12, b->vocab = 50304, b->reps = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) {
      if (!b->rank) usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      if (!b->rank) usage(stderr);
      return 2;
    }
    const char *k = argv[i], *v = argv[++i];
    if (!strcmp(k, "--dir")) b->dir = v;
    else if (!strcmp(k, "--layers")) b->layers = atol(v);
    else if (!strcmp(k, "--embd")) b->embd = atol(v);
    else if (!strcmp(k, "--heads")) b->heads = atol(v);
    else if (!strcmp(k, "--vocab")) b->vocab = atol(v);
    else if (!strcmp(k, "--repeat")) b->reps = atol(v);
    else if (!strcmp(k, "--stage-mb")) b->stage_mb = v;
    else if (!strcmp(k, "--read-mb")) b->read_mb = v;
    else if (!strcmp(k, "--read-requests")) b->requests = v;
    else if (!strcmp(k, "--direct-read")) b->direct = v;
    else {
      if (!b->rank) fprintf(stderr, "greenlm-iobench: error: unknown option '%s'\n", k), usage(stderr);
      return 2;
    }
  }
  if (!b->dir || b->layers < 1 || b->embd < 1 || b->heads < 1 || b->embd % b->heads || b->vocab < 2 || b->reps < 1) {
    if (!b->rank) fprintf(stderr, "greenlm-iobench: error: give --dir and a valid shape\n"), usage(stderr);
    return 2;
  }
  return -1;
}

/* A deck for the shape and the layout (D = size replicas, ZeRO-1), the model and its AdamW state.
 * Returns -1 to go on, or the exit status. */
static int open_state(iobench *b) {
  char text[4096];
  snprintf(text, sizeof text,
           "&job task = 'train', run_dir = '%s' /\n&model vocab_size = %ld, block_size = 64, n_layer = %ld, n_embd = %ld,\n"
           "  n_head = %ld /\n&training seq_len = 8, micro_batch_size = 1 /\n&data train = 'x', val = 'y' /\n"
           "&parallel zero_stage = 1 /\n&checkpoint dir = '%s/ckpt', keep = 1, stage_mb = %s, read_mb = %s,\n"
           "  read_requests = %s, direct_read = %s /\n",
           b->dir, b->vocab, b->layers, b->embd, b->heads, b->dir, b->stage_mb, b->read_mb, b->requests, b->direct);
  b->cfg = util_calloc(1, sizeof *b->cfg, "configuration");
  err_list errs = {0};
  if (b->rank == 0 && (cfg_load(b->cfg, text, strlen(text), "iobench", NULL, 0, &errs) || cfg_resolve_layout(b->cfg, b->size, &errs)))
    err_add(&errs, NULL, 0, 0, "give a shape greenlm can train", "the benchmark's deck is refused");
  if (err_report(&errs, MPI_COMM_WORLD, 10, "the benchmark did not start")) return 1;
  MPI_Bcast(b->cfg, (int)sizeof *b->cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
  const backend *be = backend_cpu();
  par_create(&b->lay, b->cfg, MPI_COMM_WORLD);
  gpt_shape_from_cfg(&b->shape, &b->cfg->model);
  gpt_init(&b->model, &b->shape, be, 1, 8, par_part(&b->lay), 1);
  b->gx = grad_create(&b->model, &b->lay, 25, NULL, 0, 0);
  size_t lo, hi;
  grad_own_range(b->gx, &lo, &hi);
  optim_init(&b->opt, be, lo, hi);
  for (size_t i = 0; i < hi - lo; i++) b->opt.m[i] = 1e-3f * (float)(i % 1000), b->opt.v[i] = 1e-6f * (float)(i % 777);
  b->cs = (ckpt_state){.cfg = b->cfg, .lay = &b->lay, .model = &b->model, .opt = &b->opt, .tokenizer_hash = "", .step = 100,
                      .loss_scale = 1.0};
  b->mine = 3 * (hi - lo) * sizeof(float);
  b->buf = util_malloc(b->mine + 1, "raw buffer");
  memset(b->buf, 7, b->mine);
  util_snprintf(b->raw, sizeof b->raw, "%s/raw-%d.bin", b->dir, b->rank);
  util_snprintf(b->scratch, sizeof b->scratch, "%s/scratch-%d.bin", b->dir, b->rank);
  ckpt_dir(b->cfg, b->cs_path, sizeof b->cs_path - 24);
  util_snprintf(b->cs_path + strlen(b->cs_path), 24, "/ckpt-%08ld.nc", b->cs.step);
  if (!b->rank) util_mkdir_p(b->dir);
  MPI_Barrier(MPI_COMM_WORLD);
  b->best_w = b->best_r = b->best_rf = b->best_fw = b->best_fr = 1e30;
  return -1;
}

/* The checkpoint written and read back, timed. Returns 0, or 1 after the errors were reported. */
static int time_checkpoint(iobench *b, int last) {
  ckpt_stats st;
  err_list errs = {0};
  if (!b->rank) remove(b->cs_path);
  raw_write(b->scratch, b->buf, b->mine);
  MPI_Barrier(MPI_COMM_WORLD);
  if (ckpt_write(&b->cs, &st, &errs) != 0) return err_report(&errs, MPI_COMM_WORLD, 10, "the benchmark stops") > 0;
  b->bytes = st.bytes;
  b->best_w = st.seconds < b->best_w ? st.seconds : b->best_w;
  if (!b->rank) printf("checkpoint write %.2f s", st.seconds);
  warm_read(b->scratch, b->buf, b->mine);
  if (ckpt_read(&b->cs, st.path, &st, &errs) != 0)
    return err_report(&errs, MPI_COMM_WORLD, 10, "reading the checkpoint back failed; the benchmark stops") > 0;
  b->best_r = st.seconds < b->best_r ? st.seconds : b->best_r;
  double rf = st.seconds - st.share_seconds;
  b->best_rf = rf < b->best_rf ? rf : b->best_rf;
  if (!b->rank) printf(", read %.2f s (%.2f s sharing%s)%s", st.seconds, st.share_seconds, st.direct ? "" : ", page cache",
                       last ? "\n" : "; ");
  return 0;
}

/* The same bytes by fwrite and fread, timed. */
static void time_raw(iobench *b, int last) {
  remove(b->raw);
  raw_write(b->scratch, b->buf, b->mine);
  double fw = raw_write(b->raw, b->buf, b->mine);
  warm_read(b->scratch, b->buf, b->mine);
  double fr = raw_read(b->raw, b->buf, b->mine);
  b->best_fw = fw < b->best_fw ? fw : b->best_fw, b->best_fr = fr < b->best_fr ? fr : b->best_fr;
  if (!b->rank) printf("raw write %.2f s, read %.2f s%s", fw, fr, last ? "\n" : "; ");
}

static void report(const iobench *b) {
  double total = 0, dm = (double)b->mine, bytes = b->bytes;
  MPI_Allreduce(&dm, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (b->rank) return;
  printf("greenlm-iobench %s: %ld layers, C=%ld, V=%ld: %zu parameters; %d rank%s (ZeRO-1 pieces)\n", PACKAGE_VERSION,
         b->layers, b->embd, b->vocab, gpt_count_params(&b->shape), b->size, b->size == 1 ? "" : "s");
  printf("checkpoint: %.3f GB of tensors; write %.2f s = %.2f GB/s, read %.2f s = %.2f GB/s (best of %ld);\n"
         "            read without sharing the pieces between replicas %.2f s = %.2f GB/s\n",
         bytes / 1e9, b->best_w, bytes / 1e9 / b->best_w, b->best_r, bytes / 1e9 / b->best_r, b->reps, b->best_rf,
         bytes / 1e9 / b->best_rf);
  printf("raw:        %.3f GB by fwrite/fread; write %.2f s = %.2f GB/s, read %.2f s = %.2f GB/s\n", total / 1e9, b->best_fw,
         total / 1e9 / b->best_fw, b->best_fr, total / 1e9 / b->best_fr);
  printf("result: ranks=%d gb=%.3f ckpt_write_gbs=%.3f ckpt_read_gbs=%.3f raw_write_gbs=%.3f raw_read_gbs=%.3f "
         "write_ratio=%.3f read_ratio=%.3f file_read_ratio=%.3f\n",
         b->size, bytes / 1e9, bytes / 1e9 / b->best_w, bytes / 1e9 / b->best_r, total / 1e9 / b->best_fw,
         total / 1e9 / b->best_fr, (bytes / b->best_w) / (total / b->best_fw), (bytes / b->best_r) / (total / b->best_fr),
         (bytes / b->best_rf) / (total / b->best_fr));
}

static void close_state(iobench *b) {
  remove(b->raw);
  free(b->buf);
  optim_free(&b->opt);
  grad_free(b->gx);
  gpt_free(&b->model);
  gpt_shape_free(&b->shape);
  par_free(&b->lay);
}

/* Each timed write is preceded by deleting the file about to be written and by an untimed write of
 * the same bytes to a scratch file; each timed read by an untimed read of that scratch file, then
 * deleted. Both then find the page cache in the same state (on virtual machines the first use of
 * long-unused memory can be several times slower than the next). Rounds alternate which of the two
 * goes first. */
int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  iobench b = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.size);
  util_set_rank(b.rank);
  int rc = parse_options(&b, argc, argv);
  if (rc < 0) rc = open_state(&b);
  for (long r = 0; rc < 0 && r < b.reps; r++) {
    if (!b.rank) printf("round %ld: ", r + 1);
    for (int turn = 0; turn < 2 && rc < 0; turn++) {
      if (turn == (int)(r % 2) && time_checkpoint(&b, turn)) rc = 1;
      else if (turn != (int)(r % 2)) time_raw(&b, turn);
      if (!b.rank) fflush(stdout);
    }
  }
  if (rc < 0) report(&b), rc = 0;
  if (b.buf) close_state(&b);
  free(b.cfg);
  util_exit_all(rc);
}
