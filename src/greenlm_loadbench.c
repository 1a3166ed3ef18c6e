/* greenlm-loadbench: the training loader's speed from the datasets of a deck, on disk: windows and
 * tokens per second and rank, cold and warm, and how long it holds up steps of a given length with
 * and without read-ahead (&data prefetch).
 *
 *   mpirun -n 2 greenlm-loadbench [--steps N] [--step-ms MS[,MS...]] [--set group.key=value ...] DECK
 *
 * The deck is a training deck: its &data train (one dataset or a blend), &tokenizer, &training
 * seq_len, micro_batch_size and global_batch_size. Each rank is one data-parallel replica and draws
 * its share of every step's windows through the loader itself (data_next_windows, data_read_train,
 * micro-batch by micro-batch), from step 0. Phases, each over the same --steps steps:
 *   cold:  the datasets dropped from the page cache first (posix_fadvise DONTNEED on each file, by
 *          rank 0), the steps read back to back;
 *   warm:  the same windows again, now in the page cache;
 *   for each --step-ms S, each step's reads followed by S ms standing for the step's computation
 *          (a busy wait), three times: warm (the floor: on virtual machines the first reads after a
 *          long computation are slower than back to back, even from the page cache), cold without
 *          read-ahead, and cold with it (data_prefetch_next, as the trainer calls it: the next
 *          step's windows hinted while this one computes).
 * A phase's figure is the slowest rank's time in the loader; the windows are the same in every
 * phase, so the phases compare like with like. &data verify is turned off (it reads every token and
 * would warm the cache), and so are pipeline and tensor parallelism (every rank is a replica). */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "config.h"
#include "deck/cfg.h"
#include "deck/nml.h"
#include "text/data.h"
#include "text/tok.h"

enum { MAX_SETS = 16, MAX_PHASE_MS = 8 };

typedef struct {
  int rank, size;
  const char *deck;
  char *sets[MAX_SETS + 3];
  int nsets;
  long steps;
  double step_ms[MAX_PHASE_MS];
  int nms;
  cfg_config *cfg;
  tok_tokenizer tok;
  data_loader data;
  long G, per;      /* windows per step, of them this rank's */
  uint64_t *win, *next;
  int32_t *tokens, *targets;
  double hint_s; /* the slowest rank's seconds in the read-ahead hints of the last phase */
} loadbench;

static void usage(FILE *fp) {
  fprintf(fp, "usage: greenlm-loadbench [--steps N] [--step-ms MS[,MS...]] [--set group.key=value ...] DECK\n"
              "defaults: --steps 200 --step-ms 32,160 (GPT-Neo 125M steps of 8 x 2048 tokens on an H200 at the\n"
              "          50%% MFU goal and as measured; doc/data.md)\n");
}

/* The --step-ms list into b. Returns 0, or -1 when it is not a list of positive numbers. */
static int parse_ms(loadbench *b, const char *v) {
  char *end;
  b->nms = 0;
  while (*v && b->nms < MAX_PHASE_MS) {
    double x = strtod(v, &end);
    if (end == v || x <= 0) return -1;
    b->step_ms[b->nms++] = x;
    v = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return *v ? -1 : 0;
}

/* The command line into b; returns -1 to go on, or the exit status. */
static int parse_options(loadbench *b, int argc, char **argv) {
  b->steps = 200;
  parse_ms(b, "32,160");
  b->sets[b->nsets++] = "data.verify=F";
  b->sets[b->nsets++] = "parallel.pipeline_stages=1";
  b->sets[b->nsets++] = "parallel.tensor_parallel=1";
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "--help")) {
      if (!b->rank) usage(stdout);
      return 0;
    }
    if (k[0] != '-' && !b->deck) {
      b->deck = k;
      continue;
    }
    int bad = i + 1 >= argc;
    const char *v = bad ? "" : argv[++i];
    if (!bad && !strcmp(k, "--steps")) bad = (b->steps = atol(v)) < 1;
    else if (!bad && !strcmp(k, "--step-ms")) bad = parse_ms(b, v) != 0;
    else if (!bad && !strcmp(k, "--set") && b->nsets < MAX_SETS + 3) b->sets[b->nsets++] = (char *)v;
    else bad = 1;
    if (bad) {
      if (!b->rank) fprintf(stderr, "greenlm-loadbench: error: bad option or value '%s %s'\n", k, v), usage(stderr);
      return 2;
    }
  }
  if (!b->deck) {
    if (!b->rank) fprintf(stderr, "greenlm-loadbench: error: give a training deck\n"), usage(stderr);
    return 2;
  }
  return -1;
}

/* The deck (rank 0 reads it; every rank receives it), the tokenizer and the datasets, the buffers.
 * Returns -1 to go on, or the exit status. */
static int open_loader(loadbench *b) {
  err_list errs = {0};
  b->cfg = util_calloc(1, sizeof *b->cfg, "configuration");
  if (b->rank == 0) {
    size_t len;
    char *text = util_read_file(b->deck, NML_MAX_BYTES, &len, "deck", "give the path of a training deck", &errs);
    if (text && cfg_load(b->cfg, text, len, b->deck, b->sets, b->nsets, &errs) == 0)
      cfg_resolve_layout(b->cfg, b->size, &errs);
    free(text);
  }
  if (err_report(&errs, MPI_COMM_WORLD, 20, "the benchmark did not start")) return 1;
  MPI_Bcast(b->cfg, (int)sizeof *b->cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
  const cfg_config *c = b->cfg;
  int T = (int)c->training.seq_len, bad = tok_open(&b->tok, cfg_tokenizer_kind_of(&c->tokenizer), c->tokenizer.dir, &errs) != 0;
  if (!bad) bad = data_open(&b->data, c, &b->tok, T, &errs) != 0;
  if (err_report(&errs, MPI_COMM_WORLD, 20, "the benchmark did not start")) return 1;
  b->per = c->training.micro_batch_size * c->parallel.micro_batches;
  b->G = b->per * b->size;
  b->win = util_malloc((size_t)b->G * sizeof *b->win, "windows");
  b->next = util_malloc((size_t)b->G * sizeof *b->next, "windows");
  size_t n = (size_t)c->training.micro_batch_size * (size_t)T;
  b->tokens = util_malloc(n * sizeof *b->tokens, "tokens");
  b->targets = util_malloc(n * sizeof *b->targets, "targets");
  return -1;
}

/* Rank 0 drops every training dataset from the page cache; then all start from step 0. */
static void go_cold(loadbench *b) {
  for (int s = 0; b->rank == 0 && s < b->data.nsets; s++) {
    int fd = open(b->data.set[s].file.path, O_RDONLY);
    if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* --steps steps from step 0: this rank's windows read micro-batch by micro-batch, then sleep_ms;
 * with read-ahead, the next step's hinted before the sleep. Returns the slowest rank's seconds in
 * the loader (b->hint_s: in the hints). */
static double run_phase(loadbench *b, double sleep_ms, int ahead) {
  const long B = b->cfg->training.micro_batch_size;
  double in_loader = 0, hints = 0, most;
  for (int s = 0; s < b->data.nsets; s++) data_seek(&b->data, s, 0, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  for (long step = 0; step < b->steps; step++) {
    double t0 = util_now();
    data_next_windows(&b->data, b->G, b->win);
    for (long k = 0; k < b->per; k += B)
      data_read_train(&b->data, b->win + (size_t)b->rank * (size_t)b->per + (size_t)k, (int)B, b->tokens, b->targets);
    double t1 = util_now();
    if (ahead) data_prefetch_next(&b->data, b->G, b->rank * b->per, b->per, b->next);
    in_loader += util_now() - t0;
    hints += util_now() - t1;
    for (double end = util_now() + sleep_ms / 1e3; util_now() < end;) /* the step's computation: a busy wait */
      ;
  }
  MPI_Allreduce(&in_loader, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&hints, &b->hint_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

/* One phase's line: windows and tokens per second and rank, ms per step in the loader. */
static void print_phase(const loadbench *b, const char *name, double s, double step_ms, int ahead) {
  if (b->rank) return;
  double w = (double)b->steps * (double)b->per, T = (double)b->cfg->training.seq_len, ms = 1e3 * s / (double)b->steps;
  printf("%-34s %9.0f windows/s %11.0f tokens/s per rank; %7.3f ms per step in the loader", name, w / s, w * T / s, ms);
  if (step_ms > 0) printf(" (%.1f%% of a %g ms step)", 100.0 * ms / (ms + step_ms), step_ms);
  if (ahead) printf(", %.3f ms of it in the hints", 1e3 * b->hint_s / (double)b->steps);
  printf("\n");
  fflush(stdout);
}

static void run_all(loadbench *b) {
  const data_loader *d = &b->data;
  int64_t tokens = data_train_tokens(d);
  if (!b->rank)
    printf("greenlm-loadbench %s: %s: %d dataset%s, %lld tokens (%d bytes each), %llu windows of %d+1; %d rank%s, "
           "%ld windows per rank and step, %ld steps\n", PACKAGE_VERSION, b->deck, d->nsets, d->nsets > 1 ? "s" : "",
           (long long)tokens, d->set[0].file.tok_bytes, (unsigned long long)d->nwin, d->T, b->size, b->size > 1 ? "s" : "",
           b->per, b->steps);
  go_cold(b);
  double cold = run_phase(b, 0, 0);
  print_phase(b, "cold", cold, 0, 0);
  double warm = run_phase(b, 0, 0);
  print_phase(b, "warm", warm, 0, 0);
  char name[64];
  double stall[MAX_PHASE_MS][3]; /* warm (the floor), cold without read-ahead, cold with it */
  static const char *const kind[3] = {"warm", "cold, no read-ahead", "cold, read-ahead"};
  for (int i = 0; i < b->nms; i++)
    for (int k = 0; k < 3; k++) {
      if (k > 0) go_cold(b);
      stall[i][k] = run_phase(b, b->step_ms[i], k == 2);
      snprintf(name, sizeof name, "%g ms steps, %s", b->step_ms[i], kind[k]);
      print_phase(b, name, stall[i][k], b->step_ms[i], k == 2);
    }
  if (!b->rank) {
    printf("result: ranks=%d T=%d windows_per_step=%ld cold_wps=%.1f warm_wps=%.1f", b->size, d->T, b->per,
           (double)(b->steps * b->per) / cold, (double)(b->steps * b->per) / warm);
    for (int i = 0; i < b->nms; i++)
      printf(" warm_ms_%g=%.3f cold_ms_%g=%.3f ahead_ms_%g=%.3f", b->step_ms[i], 1e3 * stall[i][0] / (double)b->steps,
             b->step_ms[i], 1e3 * stall[i][1] / (double)b->steps, b->step_ms[i], 1e3 * stall[i][2] / (double)b->steps);
    printf("\n");
  }
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  loadbench b = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.size);
  util_set_rank(b.rank);
  int rc = parse_options(&b, argc, argv);
  if (rc < 0) rc = open_loader(&b);
  if (rc < 0) {
    run_all(&b);
    data_close(&b.data);
    tok_free(&b.tok);
    rc = 0;
  }
  free(b.win), free(b.next), free(b.tokens), free(b.targets), free(b.cfg);
  util_exit_all(rc);
}
