/* greenlm: the program. Reads a namelist deck, validates it on every rank, then runs its task.
 *
 *   mpirun -np 1 src/greenlm input/tiny.nml
 *   src/greenlm --dry-run --set model.n_layer=24 input/neo-125m.nml
 */
#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/backend.h"
#include "model/backends.h"
#include "deck/cfg.h"
#include "config.h"
#include "model/gpt.h"
#include "deck/nml.h"
#include "model/optim.h"
#include "parallel/par.h"
#include "text/bpe.h"
#include "text/prepare.h"
#include "train.h"
#include "base/util.h"

static void usage(FILE *fp) {
  fprintf(fp,
          "usage: greenlm [options] DECK\n"
          "       mpirun -np N greenlm [options] DECK\n"
          "\n"
          "Trains a GPT-Neo-style language model as the namelist DECK says.\n"
          "\n"
          "options:\n"
          "  --dry-run               validate the deck, print the resolved deck, parameter count and\n"
          "                          memory estimate per rank, and exit without writing anything\n"
          "  --ranks N               with --dry-run: plan the layout for N ranks (default: the ranks\n"
          "                          started)\n"
          "  --set group.key=value   override a deck key (repeatable), e.g. --set training.lr=3e-4\n"
          "  --deck-reference        print the Markdown reference of every deck key and exit\n"
          "  --version               print the version and exit\n"
          "  --help                  print this help and exit\n"
          "\n"
          "Documentation: README.md and doc/ in the source tree (doc/deck-reference.md for the keys).\n");
}

typedef struct {
  const char *deck;
  char **sets;
  int nsets;
  int dry_run;
  int ranks; /* --ranks N for the dry run's layout */
} args;

/* Returns -1 to continue, or an exit status. */
static int parse_args(int argc, char **argv, args *a, int rank) {
  memset(a, 0, sizeof *a);
  a->sets = util_calloc((size_t)argc, sizeof(char *), "arguments");
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
      if (rank == 0) usage(stdout);
      return 0;
    } else if (!strcmp(s, "--version")) {
      if (rank == 0) printf("greenlm %s\n", PACKAGE_VERSION);
      return 0;
    } else if (!strcmp(s, "--deck-reference")) {
      if (rank == 0) cfg_write_reference(stdout);
      return 0;
    } else if (!strcmp(s, "--dry-run")) {
      a->dry_run = 1;
    } else if (!strcmp(s, "--ranks") || !strncmp(s, "--ranks=", 8)) {
      const char *v = s[7] == '=' ? s + 8 : i + 1 < argc ? argv[++i] : "";
      char *end;
      long n = strtol(v, &end, 10);
      if (!*v || *end || n < 1 || n > 1 << 24) {
        if (rank == 0) fprintf(stderr, "greenlm: error: --ranks expects a positive rank count, got '%s'\n", v);
        return 2;
      }
      a->ranks = (int)n;
    } else if (!strcmp(s, "--set")) {
      if (i + 1 >= argc) {
        if (rank == 0) fprintf(stderr, "greenlm: error: --set needs group.key=value\n");
        return 2;
      }
      a->sets[a->nsets++] = argv[++i];
    } else if (!strncmp(s, "--set=", 6)) {
      a->sets[a->nsets++] = argv[i] + 6;
    } else if (s[0] == '-' && s[1]) {
      if (rank == 0) {
        fprintf(stderr, "greenlm: error: unknown option '%s'\n", s);
        usage(stderr);
      }
      return 2;
    } else if (a->deck) {
      if (rank == 0) fprintf(stderr, "greenlm: error: more than one deck given ('%s' and '%s')\n", a->deck, s);
      return 2;
    } else {
      a->deck = s;
    }
  }
  if (!a->deck) {
    if (rank == 0) {
      fprintf(stderr, "greenlm: error: no deck given\n");
      usage(stderr);
    }
    return 2;
  }
  return -1;
}

/* Rank 0 reads the deck and broadcasts its text; NULL (on every rank) when it cannot be read. */
static char *read_deck(const char *path, int rank) {
  char err[600] = "";
  long len = -1;
  char *text = NULL;
  if (rank == 0) {
    size_t n;
    text = util_read_file(path, &n, err, sizeof err);
    len = text ? (long)n : -1;
    if (!text) fprintf(stderr, "greenlm: error: %s\n  hint: give the path of a deck, e.g. input/tiny.nml\n", err);
  }
  MPI_Bcast(&len, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  if (len < 0) return NULL;
  if (rank != 0) text = util_malloc((size_t)len + 1, "deck text");
  MPI_Bcast(text, (int)len + 1, MPI_CHAR, 0, MPI_COMM_WORLD);
  return text;
}

/* All ranks must have resolved the same configuration (same binary, same deck). */
static void check_agreement(const cfg_config *cfg) {
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&buf, &len);
  cfg_write_deck(cfg, fp, NULL);
  fclose(fp);
  unsigned long long h = util_hash64(buf, len, 0), lo, hi;
  free(buf);
  MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  UTIL_CHECK(lo == hi, "start every rank with the same greenlm binary and deck",
             "ranks resolved different configurations");
}

static void dry_run(const cfg_config *cfg, const backend *be, const char *header, int nranks) {
  cfg_write_deck(cfg, stdout, header);
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  int T = (int)cfg->training.seq_len;
  size_t n = gpt_count_params(&s);
  par_layout L;
  par_plan(&L, cfg, nranks, 0);
  char b[6][32], desc[4096];
  printf("! parameters: %zu (%.3f M)\n", n, (double)n / 1e6);
  printf("! FLOPs per token: %.6g (6N + 12LCT, N without wpe)\n", gpt_flops_per_token(&s, T));
  printf("! layout: %d rank%s = %d pipeline stage%s x %d replica%s, %d micro-batch%s per step, ZeRO-%d\n", nranks,
         nranks == 1 ? "" : "s", L.P, L.P == 1 ? "" : "s", L.D, L.D == 1 ? "" : "s", L.m, L.m == 1 ? "" : "es", L.zero);
  par_describe(&L, desc, sizeof desc);
  for (char *line = strtok(desc, "\n"); line; line = strtok(NULL, "\n")) printf("! %s\n", line);
  size_t worst = 0;
  for (int st = 0; st < L.P; st++) {
    train_memory m = train_plan_memory(cfg, be, &L, st, 0);
    if (m.total > worst) worst = m.total;
    printf("! memory per rank, stage %d: parameters %s, gradients %s, AdamW %s, activations %s (%d slot%s), "
           "buffers %s; total %zu bytes (%s)\n",
           st, util_fmt_bytes((double)m.model.params, b[0], 32), util_fmt_bytes((double)m.model.grads, b[1], 32),
           util_fmt_bytes((double)m.adam, b[2], 32), util_fmt_bytes((double)m.model.acts, b[3], 32), m.part.nslots,
           m.part.nslots == 1 ? "" : "s", util_fmt_bytes((double)(m.model.io + m.exchange + m.pipe), b[4], 32), m.total,
           util_fmt_bytes((double)m.total, b[5], 32));
  }
  printf("! memory per rank total: %zu bytes (%s) at the largest stage\n", worst, util_fmt_bytes((double)worst, b[5], 32));
  par_free(&L);
  gpt_shape_free(&s);
}

int main(int argc, char **argv) {
  signal(SIGXFSZ, SIG_IGN); /* a file-size limit makes writes fail with an error, not kill the job */
  util_mpi_init(&argc, &argv);
  /* GREENLM_FILE_SIZE_LIMIT=bytes: a file-size limit set after MPI has started (its shared-memory
   * files are not limited), to rehearse a full disk or a quota */
  const char *fsize = getenv("GREENLM_FILE_SIZE_LIMIT");
  if (fsize && *fsize) {
    struct rlimit rl = {(rlim_t)strtoull(fsize, NULL, 10), (rlim_t)strtoull(fsize, NULL, 10)};
    setrlimit(RLIMIT_FSIZE, &rl);
  }
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  util_set_rank(rank);

  args a;
  int rc = parse_args(argc, argv, &a, rank);
  if (rc >= 0) {
    free(a.sets);
    util_exit_all(rc);
  }
  char *text = read_deck(a.deck, rank);
  if (!text) util_exit_all(1);

  cfg_config *cfg = util_calloc(1, sizeof *cfg, "configuration");
  nml_errors errs = {0};
  if (cfg_load(cfg, text, a.deck, a.sets, a.nsets, &errs) > 0) {
    if (rank == 0) {
      nml_errors_print(&errs, 20);
      fprintf(stderr, "greenlm: %d error%s in the deck; nothing was run or written\n", errs.n, errs.n == 1 ? "" : "s");
    }
    util_exit_all(1);
  }
  /* the layout depends on the rank count: the dry run plans --ranks N (default: the ranks started) */
  int layout_ranks = a.ranks > 0 ? a.ranks : size;
  if ((cfg_has_task(cfg, "train") || a.dry_run) && cfg_resolve_layout(cfg, layout_ranks, &errs) > 0) {
    if (rank == 0) {
      nml_errors_print(&errs, 20);
      fprintf(stderr, "greenlm: the layout does not fit %d rank%s; nothing was run or written\n", layout_ranks,
              layout_ranks == 1 ? "" : "s");
    }
    util_exit_all(1);
  }
  check_agreement(cfg);

  char header[4096];
  {
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    int o = snprintf(header, sizeof header, "greenlm %s resolved deck (a valid deck: run it again with greenlm FILE)\n"
                                            "from: %s\ndate: %s\nranks: %d\ncommand:", PACKAGE_VERSION, a.deck, date, size);
    for (int i = 0; i < argc && o < (int)sizeof header - 2; i++)
      o += snprintf(header + o, sizeof header - (size_t)o, " %s", argv[i]);
  }
  const backend *be = backends_plan(cfg); /* the dry run plans with the table; no device is opened */
  if (a.dry_run) {
    if (rank == 0) dry_run(cfg, be, header, layout_ranks);
    util_exit_all(0);
  }
  char be_note[640] = ""; /* how the backend was chosen, where there was a choice */
  if (cfg_has_task(cfg, "train") && !(be = backends_open(cfg, MPI_COMM_WORLD, &errs, be_note, sizeof be_note))) {
    if (rank == 0) {
      nml_errors_print(&errs, 20);
      fprintf(stderr, "greenlm: the deck cannot run here; nothing was run or written\n");
    }
    util_exit_all(1);
  }
  if (rank == 0) {
    printf("greenlm %s: deck %s, tasks", PACKAGE_VERSION, a.deck);
    for (int i = 0; i < cfg->job.task.n; i++) printf(" %s", cfg->job.task.v[i]);
    printf(", %d rank%s\n", size, size == 1 ? "" : "s");
    if (be_note[0]) printf("%s\n", be_note);
    printf("== resolved deck ==\n");
    cfg_write_deck(cfg, stdout, NULL);
    fflush(stdout);
  }
  rc = 0;
  for (int i = 0; i < cfg->job.task.n && rc == 0; i++) {
    const char *task = cfg->job.task.v[i];
    if (rank == 0) printf("== task: %s ==\n", task), fflush(stdout);
    if (!strcmp(task, "tokenizer")) rc = bpe_run_task(cfg, MPI_COMM_WORLD);
    else if (!strcmp(task, "prepare")) rc = prepare_run(cfg, MPI_COMM_WORLD);
    else rc = train_run(cfg, be, header);
  }
  free(text);
  free(cfg);
  free(a.sets);
  nml_errors_free(&errs);
  util_exit_all(rc);
}
