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

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  util_set_rank(rank);
  const char *dir = NULL, *stage_mb = "8", *read_mb = "8", *requests = "4", *direct = "T";
  long L = 12, C = 768, H = 12, V = 50304, reps = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) {
      if (!rank) usage(stdout);
      util_exit_all(0);
    }
    if (i + 1 >= argc) {
      if (!rank) usage(stderr);
      util_exit_all(2);
    }
    const char *k = argv[i], *v = argv[++i];
    if (!strcmp(k, "--dir")) dir = v;
    else if (!strcmp(k, "--layers")) L = atol(v);
    else if (!strcmp(k, "--embd")) C = atol(v);
    else if (!strcmp(k, "--heads")) H = atol(v);
    else if (!strcmp(k, "--vocab")) V = atol(v);
    else if (!strcmp(k, "--repeat")) reps = atol(v);
    else if (!strcmp(k, "--stage-mb")) stage_mb = v;
    else if (!strcmp(k, "--read-mb")) read_mb = v;
    else if (!strcmp(k, "--read-requests")) requests = v;
    else if (!strcmp(k, "--direct-read")) direct = v;
    else {
      if (!rank) fprintf(stderr, "greenlm-iobench: error: unknown option '%s'\n", k), usage(stderr);
      util_exit_all(2);
    }
  }
  if (!dir || L < 1 || C < 1 || H < 1 || C % H || V < 2 || reps < 1) {
    if (!rank) fprintf(stderr, "greenlm-iobench: error: give --dir and a valid shape\n"), usage(stderr);
    util_exit_all(2);
  }
  /* a deck for the shape and the layout: D = size replicas, ZeRO-1 */
  char text[4096];
  snprintf(text, sizeof text,
           "&job task = 'train', run_dir = '%s' /\n&model vocab_size = %ld, block_size = 64, n_layer = %ld, n_embd = %ld,\n"
           "  n_head = %ld /\n&training seq_len = 8, micro_batch_size = 1 /\n&data train = 'x', val = 'y' /\n"
           "&parallel zero_stage = 1 /\n&checkpoint dir = '%s/ckpt', keep = 1, stage_mb = %s, read_mb = %s,\n"
           "  read_requests = %s, direct_read = %s /\n",
           dir, V, L, C, H, dir, stage_mb, read_mb, requests, direct);
  cfg_config *cfg = util_calloc(1, sizeof *cfg, "configuration");
  err_list errs = {0};
  if (cfg_load(cfg, text, strlen(text), "iobench", NULL, 0, &errs) || cfg_resolve_layout(cfg, size, &errs)) {
    if (!rank) err_print(&errs, 10);
    util_exit_all(1);
  }
  const backend *be = backend_cpu();
  par_layout lay;
  par_create(&lay, cfg, MPI_COMM_WORLD);
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  gpt_model m;
  gpt_init(&m, &s, be, 1, 8, par_part(&lay), 1);
  grad_exchange *gx = grad_create(&m, &lay, 25);
  size_t lo, hi;
  grad_own_range(gx, &lo, &hi);
  optim_state opt;
  optim_init(&opt, be, lo, hi);
  for (size_t i = 0; i < hi - lo; i++) opt.m[i] = 1e-3f * (float)(i % 1000), opt.v[i] = 1e-6f * (float)(i % 777);
  ckpt_state cs = {cfg, &lay, &m, &opt, NULL, "", 100, 0.0, 1.0};
  /* this rank's bytes in the checkpoint: its piece of the parameters and of the two moments */
  size_t mine = 3 * (hi - lo) * sizeof(float);
  double best_w = 1e30, best_r = 1e30, best_rf = 1e30, best_fw = 1e30, best_fr = 1e30, bytes = 0;
  char *buf = util_malloc(mine + 1, "raw buffer"), raw[CFG_STR_LEN + 32];
  memset(buf, 7, mine);
  util_snprintf(raw, sizeof raw, "%s/raw-%d.bin", dir, rank);
  if (!rank) util_mkdir_p(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  /* Each timed write is preceded by deleting the file about to be written and by an untimed write
   * of the same bytes to a scratch file; each timed read by an untimed read of that scratch file,
   * then deleted. Both then find the page cache in the same state (on virtual machines the first
   * use of long-unused memory can be several times slower than the next). Rounds alternate which
   * of the two goes first. */
  char scratch[CFG_STR_LEN + 32], cs_path[CFG_STR_LEN + 64];
  ckpt_dir(cfg, cs_path, sizeof cs_path - 24);
  util_snprintf(cs_path + strlen(cs_path), 24, "/ckpt-%08ld.nc", cs.step);
  util_snprintf(scratch, sizeof scratch, "%s/scratch-%d.bin", dir, rank);
  for (long r = 0; r < reps; r++) {
    ckpt_stats st;
    double fw = 0, fr = 0;
    if (!rank) printf("round %ld: ", r + 1);
    for (int turn = 0; turn < 2; turn++) {
      if (turn == (int)(r % 2)) { /* the checkpoint */
        if (!rank) remove(cs_path);
        raw_write(scratch, buf, mine);
        MPI_Barrier(MPI_COMM_WORLD);
        if (ckpt_write(&cs, &st, &errs) != 0) {
          err_report(&errs, MPI_COMM_WORLD, 10, "the benchmark stops");
          util_exit_all(1);
        }
        bytes = st.bytes;
        best_w = st.seconds < best_w ? st.seconds : best_w;
        if (!rank) printf("checkpoint write %.2f s", st.seconds);
        warm_read(scratch, buf, mine);
        if (ckpt_read(&cs, st.path, &st, &errs) != 0) {
          err_report(&errs, MPI_COMM_WORLD, 10, "reading the checkpoint back failed; the benchmark stops");
          util_exit_all(1);
        }
        best_r = st.seconds < best_r ? st.seconds : best_r;
        double rf = st.seconds - st.share_seconds;
        best_rf = rf < best_rf ? rf : best_rf;
        if (!rank) printf(", read %.2f s (%.2f s sharing%s)%s", st.seconds, st.share_seconds, st.direct ? "" : ", page cache",
                          turn ? "\n" : "; ");
      } else { /* the same bytes by fwrite and fread */
        remove(raw);
        raw_write(scratch, buf, mine);
        fw = raw_write(raw, buf, mine);
        warm_read(scratch, buf, mine);
        fr = raw_read(raw, buf, mine);
        best_fw = fw < best_fw ? fw : best_fw, best_fr = fr < best_fr ? fr : best_fr;
        if (!rank) printf("raw write %.2f s, read %.2f s%s", fw, fr, turn ? "\n" : "; ");
      }
      if (!rank) fflush(stdout);
    }
  }
  double total = 0, dm = (double)mine;
  MPI_Allreduce(&dm, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  remove(raw);
  if (!rank) {
    printf("greenlm-iobench %s: %ld layers, C=%ld, V=%ld: %zu parameters; %d rank%s (ZeRO-1 pieces)\n", PACKAGE_VERSION,
           L, C, V, gpt_count_params(&s), size, size == 1 ? "" : "s");
    printf("checkpoint: %.3f GB of tensors; write %.2f s = %.2f GB/s, read %.2f s = %.2f GB/s (best of %ld);\n"
           "            read without sharing the pieces between replicas %.2f s = %.2f GB/s\n",
           bytes / 1e9, best_w, bytes / 1e9 / best_w, best_r, bytes / 1e9 / best_r, reps, best_rf, bytes / 1e9 / best_rf);
    printf("raw:        %.3f GB by fwrite/fread; write %.2f s = %.2f GB/s, read %.2f s = %.2f GB/s\n", total / 1e9, best_fw,
           total / 1e9 / best_fw, best_fr, total / 1e9 / best_fr);
    printf("result: ranks=%d gb=%.3f ckpt_write_gbs=%.3f ckpt_read_gbs=%.3f raw_write_gbs=%.3f raw_read_gbs=%.3f "
           "write_ratio=%.3f read_ratio=%.3f file_read_ratio=%.3f\n",
           size, bytes / 1e9, bytes / 1e9 / best_w, bytes / 1e9 / best_r, total / 1e9 / best_fw, total / 1e9 / best_fr,
           (bytes / best_w) / (total / best_fw), (bytes / best_r) / (total / best_fr), (bytes / best_rf) / (total / best_fr));
  }
  free(buf);
  optim_free(&opt);
  grad_free(gx);
  gpt_free(&m);
  gpt_shape_free(&s);
  par_free(&lay);
  free(cfg);
  util_exit_all(0);
}
