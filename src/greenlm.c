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

#include "base/env.h"
#include "base/fpenv.h"
#include "model/backend.h"
#include "parallel/backends.h"
#include "parallel/grad.h"
#include "parallel/hier.h"
#include "parallel/qexch.h"
#include "deck/cfg.h"
#include "config.h"
#include "model/gpt.h"
#include "deck/nml.h"
#include "eval/evaluate.h"
#include "export.h"
#include "model/optim.h"
#include "parallel/par.h"
#include "parallel/tp.h"
#include "text/bpe.h"
#include "text/data.h"
#include "text/prepare.h"
#include "textgen.h"
#include "train.h"
#include "plan/plan.h"
#include "trainer.h"
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
          "  --plan                  run the 'plan' task alone: predict memory, time, energy and CO2e of\n"
          "                          training on the machine of &machine for every layout (doc/planning.md)\n"
          "  --machine FILE          a namelist read after the deck, its keys replacing the deck's: the\n"
          "                          machine to plan for (&machine, &energy), e.g. input/machines/v100-4x6.nml\n"
          "  --set group.key=value   override a deck key (repeatable), e.g. --set training.lr=3e-4\n"
          "  --deck-reference        print the Markdown reference of every deck key and exit\n"
          "  --env-reference         print the Markdown table of greenlm's environment variables and exit\n"
          "  --version               print the version and exit\n"
          "  --help                  print this help and exit\n"
          "\n"
          "Documentation: the manual page greenlm(1), and README.md and doc/ in the source tree or\n"
          "share/doc/greenlm where greenlm is installed (doc/deck-reference.md for the keys).\n");
}

typedef struct {
  const char *deck;
  const char *machine; /* --machine FILE */
  char **sets;
  int nsets;
  int dry_run;
  int ranks; /* --ranks N for the dry run's layout */
} args;

static const char USAGE_HINT[] = "greenlm --help lists the options";

/* The options that print something and end: 1 when one was given (printed on rank 0). */
static int print_option(const char *s, int rank) {
  if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
    if (rank == 0) usage(stdout);
  } else if (!strcmp(s, "--version")) {
    if (rank == 0) printf("greenlm %s\n", PACKAGE_VERSION);
  } else if (!strcmp(s, "--deck-reference")) {
    if (rank == 0) cfg_write_reference(stdout);
  } else if (!strcmp(s, "--env-reference")) {
    if (rank == 0) env_write_reference(stdout);
  } else {
    return 0;
  }
  return 1;
}

/* The command line into a. Returns -1 to continue, or an exit status (2 after errors were added to
 * errs; every rank parses the same line, rank 0 reports). */
static int parse_args(int argc, char **argv, args *a, int rank, err_list *errs) {
  memset(a, 0, sizeof *a);
  a->sets = util_calloc((size_t)argc, sizeof(char *), "arguments");
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (print_option(s, rank)) return 0;
    if (!strcmp(s, "--dry-run")) {
      a->dry_run = 1;
    } else if (!strcmp(s, "--plan")) {
      a->sets[a->nsets++] = (char *)"job.task='plan'";
    } else if (!strcmp(s, "--machine") && i + 1 >= argc) {
      err_add(errs, "--machine", 0, 0, "e.g. --machine input/machines/v100-4x6.nml", "needs a file");
    } else if (!strcmp(s, "--machine") || !strncmp(s, "--machine=", 10)) {
      a->machine = s[9] == '=' ? s + 10 : argv[++i];
    } else if (!strcmp(s, "--ranks") || !strncmp(s, "--ranks=", 8)) {
      const char *v = s[7] == '=' ? s + 8 : i + 1 < argc ? argv[++i] : "";
      char *end, shown[80];
      long n = strtol(v, &end, 10);
      if (!*v || *end || n < 1 || n > PAR_MAX_RANKS)
        err_add(errs, "--ranks", 0, 0, "e.g. --dry-run --ranks 24", "expects a rank count from 1 to %d, got '%s'",
                PAR_MAX_RANKS, err_quote(shown, sizeof shown, v, strlen(v)));
      a->ranks = (int)n;
    } else if (!strcmp(s, "--set") && i + 1 >= argc) {
      err_add(errs, "--set", 0, 0, "e.g. --set training.lr=3e-4", "needs group.key=value");
    } else if (!strcmp(s, "--set") || !strncmp(s, "--set=", 6)) {
      a->sets[a->nsets++] = s[5] == '=' ? argv[i] + 6 : argv[++i];
    } else if (s[0] == '-' && s[1]) {
      err_add(errs, s, 0, 0, USAGE_HINT, "unknown option");
    } else if (a->deck) {
      err_add(errs, s, 0, 0, "give one deck; combine decks into one file", "a second deck (the first is '%s')", a->deck);
    } else {
      a->deck = s;
    }
  }
  if (!a->deck && errs->n == 0) err_add(errs, NULL, 0, 0, USAGE_HINT, "no deck given: greenlm [options] DECK");
  if (errs->n == 0) return -1;
  if (rank == 0) err_print(errs, 20);
  return ERR_EXIT_USAGE;
}

/* The program's state, from the command line to the exit status. */
typedef struct {
  int rank, size;
  args a;
  cfg_config *cfg;
  const backend *be;
  char header[4096];  /* the program and the command line, for the resolved deck */
  err_list errs;
} program;

static const char NOTHING_DONE[] = "nothing was run or written";

/* The environment: greenlm's variables checked, the file-size limit applied. Every rank. */
static int check_environment(program *p) {
  env_check(&p->errs);
  if (err_report(&p->errs, MPI_COMM_WORLD, 20, NOTHING_DONE)) return ERR_EXIT_BAD_INPUT;
  long long limit = env_file_size_limit();
  if (limit > 0) { /* after MPI has started: its shared-memory files are not limited */
    struct rlimit rl = {(rlim_t)limit, (rlim_t)limit};
    setrlimit(RLIMIT_FSIZE, &rl);
  }
  return -1;
}

/* All ranks must run the same build: the cfg_config bytes rank 0 sends mean the same to each. */
static int check_builds(program *p) {
  unsigned long long h = cfg_table_hash(), lo, hi;
  MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (lo == hi) return -1;
  err_add(&p->errs, NULL, 0, 0, "start every rank with the same greenlm binary", "the ranks run different greenlm builds");
  err_report(&p->errs, MPI_COMM_WORLD, 20, NOTHING_DONE);
  return ERR_EXIT_BAD_INPUT;
}

/* Rank 0: load the deck (and machine file) and check everything that needs no data: the keys, what
 * this build's backends take, and for training the layout and its gradient exchange. */
static void check_deck(program *p, const cfg_source *src) {
  long n0 = err_count(&p->errs);
  if (cfg_load_sources(p->cfg, src, p->a.machine ? 2 : 1, p->a.sets, p->a.nsets, &p->errs) != 0) return;
  backends_check(p->cfg, &p->errs);
  if (err_count(&p->errs) > n0 || !(cfg_has_task(p->cfg, CFG_TASK_TRAIN) || p->a.dry_run)) return;
  if (cfg_resolve_layout(p->cfg, p->a.ranks > 0 ? p->a.ranks : p->size, &p->errs) == 0)
    grad_check(p->cfg, (int)p->cfg->parallel.data_parallel, &p->errs);
}

/* Rank 0 reads, checks and resolves the deck (with the layout for the ranks the run has, or
 * --ranks); the other ranks receive the result. Returns -1 to go on, or the exit status. */
static int read_config(program *p) {
  int rc = check_environment(p);
  if (rc < 0) rc = check_builds(p);
  if (rc >= 0) return rc;
  p->cfg = util_calloc(1, sizeof *p->cfg, "configuration");
  if (p->rank == 0) {
    cfg_source src[2] = {{NULL, 0, p->a.deck}, {NULL, 0, p->a.machine}};
    src[0].text = util_read_file(p->a.deck, NML_MAX_BYTES, &src[0].len, "deck", "give the path of a deck, e.g. input/tiny.nml",
                                 &p->errs);
    if (p->a.machine)
      src[1].text = util_read_file(p->a.machine, NML_MAX_BYTES, &src[1].len, "machine file",
                                   "give the path of a machine file, e.g. input/machines/v100-4x6.nml", &p->errs);
    if (src[0].text && (!p->a.machine || src[1].text))
      check_deck(p, src);
    free((char *)src[0].text), free((char *)src[1].text);
  }
  if (err_report(&p->errs, MPI_COMM_WORLD, 20, NOTHING_DONE)) return ERR_EXIT_BAD_INPUT;
  MPI_Bcast(p->cfg, (int)sizeof *p->cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
  return -1;
}

static void make_header(program *p, int argc, char **argv) {
  time_t now = time(NULL);
  char date[64];
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  int o = util_snprintf(p->header, sizeof p->header, "greenlm %s resolved deck (a valid deck: run it again with greenlm FILE)\n"
                                                     "from: %s\ndate: %s\nranks: %d\ncommand:", PACKAGE_VERSION, p->a.deck,
                        date, p->size);
  for (int i = 0; i < argc && o < (int)sizeof p->header - 2; i++)
    o += util_snprintf(p->header + o, sizeof p->header - (size_t)o, " %s", argv[i]);
}

/* Rank 0: the resolved deck, the size, the layout and the memory per rank; nothing is opened. */
static void dry_run(const cfg_config *cfg, const backend *be, const char *header, int nranks) {
  cfg_write_deck(cfg, stdout, header);
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  int T = (int)cfg->training.seq_len;
  size_t n = gpt_count_params(&s);
  par_layout lay;
  par_plan(&lay, cfg, nranks, 0);
  char b[6][32], desc[4096];
  printf("! parameters: %zu (%.3f M)\n", n, (double)n / 1e6);
  printf("! FLOPs per token: %.6g (6N + 12LCT, N without lookup-only embeddings)\n", gpt_flops_per_token(&s, T));
  printf("! layout: %d rank%s = %d pipeline stage%s x %d tensor rank%s x %d replica%s, %d micro-batch%s per step, "
         "ZeRO-%d\n", nranks, nranks == 1 ? "" : "s", lay.P, lay.P == 1 ? "" : "s", lay.tp, lay.tp == 1 ? "" : "s", lay.D,
         lay.D == 1 ? "" : "s", lay.nmicro, lay.nmicro == 1 ? "" : "es", lay.zero);
  par_describe(&lay, desc, sizeof desc);
  for (char *line = strtok(desc, "\n"); line; line = strtok(NULL, "\n")) printf("! %s\n", line);
  size_t worst = 0;
  for (int st = 0; st < lay.P; st++) {
    trainer_memory m = trainer_plan_fullest(cfg, be, &lay, st);
    if (m.total > worst) worst = m.total;
    printf("! memory per rank, stage %d: parameters %s, gradients %s, AdamW %s, activations %s (%d slot%s), "
           "buffers %s; total %zu bytes (%s)\n",
           st, util_fmt_bytes((double)(m.model.params + m.model.compute), b[0], 32),
           util_fmt_bytes((double)m.model.grads, b[1], 32), util_fmt_bytes((double)m.adam, b[2], 32),
           util_fmt_bytes((double)m.model.acts, b[3], 32), m.part.nslots, m.part.nslots == 1 ? "" : "s",
           util_fmt_bytes((double)(m.model.io + m.model.work + m.exchange + m.pipe), b[4], 32), m.total,
           util_fmt_bytes((double)m.total, b[5], 32));
    if (lay.tp > 1) { /* what a tensor rank hands to its group's sums per step */
      double f = tp_floats_per_micro(&s, m.part, (int)cfg->training.micro_batch_size * T) * lay.nmicro;
      printf("! tensor-parallel sums per rank and step, stage %d: %s in %d all-reduces of %s among %d ranks\n", st,
             util_fmt_bytes(f * sizeof(float), b[0], 32),
             (int)(f / ((double)cfg->training.micro_batch_size * T * s.C) + 0.5),
             util_fmt_bytes((double)cfg->training.micro_batch_size * T * s.C * sizeof(float), b[1], 32), lay.tp);
    }
    if (lay.D > 1) { /* what a replica hands to the gradient collectives per step */
      int nt;
      gpt_tensor *t = gpt_list_tensors(&s, m.part, &nt);
      size_t sent = qexch_plan_bytes(&cfg->comm, t, nt, lay.D), fp32 = gpt_part_params(&s, m.part) * sizeof(float);
      par_layout ls = lay;
      ls.stage = st;
      hier_shape h = hier_plan_shape(&cfg->comm, &ls, 0);
      int two = hier_on(&cfg->comm, lay.D);
      if (two) /* inside the node a reduce-scatter and an all-gather in fp32, between nodes a R-th compressed */
        sent = h.nodes > 1 ? qexch_plan_bytes(&cfg->comm, t, nt, h.nodes) / (size_t)h.per_node : 0;
      printf("! gradient exchange per replica and step, stage %d: %s%s (fp32: %s, %.1fx fewer)\n", st,
             util_fmt_bytes((double)sent, b[0], 32), two ? " between nodes" : "", util_fmt_bytes((double)fp32, b[1], 32),
             (double)fp32 / (double)(sent ? sent : 1));
      if (two)
        printf("! two-level exchange, stage %d: %d node%s x %d replicas%s; inside a node %s per replica and step in fp32\n",
               st, h.nodes, h.nodes > 1 ? "s" : "", h.per_node,
               cfg->comm.ranks_per_node ? "" : " (ranks_per_node = 0: the nodes MPI reports, taken here as one)",
               util_fmt_bytes(h.per_node > 1 ? (double)fp32 * (1.0 + 1.0 / h.per_node) : 0.0, b[0], 32));
      size_t ef = qexch_plan_residual_bytes(&cfg->comm, gpt_part_params(&s, m.part), two ? h.nodes : lay.D);
      if (ef) printf("! error-feedback residual per rank, stage %d: %s of %s memory\n", st, util_fmt_bytes((double)ef, b[0], 32),
                     be->caps.host_memory || cfg_comm_exchange_of(&cfg->comm) == CFG_EXCHANGE_INTSUM ? "host" : "device (in the total above)");
      free(t);
    }
  }
  printf("! memory per rank total: %zu bytes (%s) at the largest stage\n", worst, util_fmt_bytes((double)worst, b[5], 32));
  par_free(&lay);
  gpt_shape_free(&s);
}


/* ---- the tasks: &job task's words and order are CFG_TASKS (deck/cfg.h); here what each runs ---- */

/* A task's run: its exit status, the same on every rank (0, or non-zero after adding errors: 1, or
 * the training task's TRAIN_* status). */
typedef int (*task_fn)(program *p);
static int run_tokenizer(program *p) { return bpe_run_task(p->cfg, MPI_COMM_WORLD, &p->errs); }
static int run_prepare(program *p) { return prepare_run(p->cfg, MPI_COMM_WORLD, &p->errs); }
static int run_plan(program *p) { return plan_run(p->cfg, MPI_COMM_WORLD, &p->errs); }
static int run_train(program *p) { return train_run(p->cfg, p->be, p->header, &p->errs); }
static int run_eval(program *p) { return eval_run(p->cfg, p->be, MPI_COMM_WORLD, &p->errs); }
static int run_sample(program *p) { return textgen_run(p->cfg, p->be, MPI_COMM_WORLD, &p->errs); }
static int run_export(program *p) { return export_run(p->cfg, p->be, MPI_COMM_WORLD, &p->errs); }

static const struct {
  task_fn run;
  int computes; /* needs the run's backend */
} tasks[CFG_NTASKS] = {
    [CFG_TASK_TOKENIZER] = {run_tokenizer, 0}, [CFG_TASK_PREPARE] = {run_prepare, 0}, [CFG_TASK_PLAN] = {run_plan, 0},
    [CFG_TASK_TRAIN] = {run_train, 1},         [CFG_TASK_EVAL] = {run_eval, 1},       [CFG_TASK_SAMPLE] = {run_sample, 1},
    [CFG_TASK_EXPORT] = {run_export, 1},
};

/* The deck's tasks in order, on the backend of the run; each task's errors reported once. */
static int run_tasks(program *p) {
  const cfg_config *cfg = p->cfg;
  char note[640] = ""; /* how the backend was chosen, where there was a choice */
  int train = cfg_has_task(cfg, CFG_TASK_TRAIN); /* every check runs, so that all their errors come at once */
  int bad = train && train_preflight(cfg, &p->errs);
  bad |= train && data_check_weights(cfg, &p->errs);
  bad |= cfg_has_task(cfg, CFG_TASK_TOKENIZER) && bpe_preflight(cfg, MPI_COMM_WORLD, &p->errs);
  bad |= cfg_has_task(cfg, CFG_TASK_PREPARE) && prepare_preflight(cfg, MPI_COMM_WORLD, &p->errs);
  if (bad) {
    err_report(&p->errs, MPI_COMM_WORLD, 20, NOTHING_DONE);
    return ERR_EXIT_BAD_INPUT;
  }
  int computes = 0;
  for (int i = 0; i < cfg->job.task.n; i++) computes |= tasks[cfg_task_of(cfg->job.task.v[i])].computes;
  if (computes && cfg->system.flush_subnormals) fpenv_flush_subnormals(); /* before any thread a backend starts */
  if (computes && !(p->be = backends_open(cfg, MPI_COMM_WORLD, &p->errs, note, sizeof note))) {
    err_report(&p->errs, MPI_COMM_WORLD, 20, "the deck cannot run here; nothing was run or written");
    return ERR_EXIT_BAD_INPUT;
  }
  if (p->rank == 0) {
    printf("greenlm %s: deck %s, tasks", PACKAGE_VERSION, p->a.deck);
    for (int i = 0; i < cfg->job.task.n; i++) printf(" %s", cfg->job.task.v[i]);
    printf(", %d rank%s\n", p->size, p->size == 1 ? "" : "s");
    if (note[0]) printf("%s\n", note);
    printf("== resolved deck ==\n");
    cfg_write_deck(cfg, stdout, NULL);
    fflush(stdout);
  }
  int rc = 0;
  for (int i = 0; i < cfg->job.task.n && rc == 0; i++) {
    cfg_task task = cfg_task_of(cfg->job.task.v[i]);
    if (p->rank == 0) printf("== task: %s ==\n", cfg_task_name(task)), fflush(stdout);
    rc = tasks[task].run(p);
    char outcome[160];
    util_snprintf(outcome, sizeof outcome, "the '%s' task %s", cfg_task_name(task), rc ? "failed" : "went on");
    err_report(&p->errs, MPI_COMM_WORLD, 20, rc ? outcome : NULL);
    err_free(&p->errs);
  }
  backend_close(p->be);
  p->be = NULL;
  return rc;
}

int main(int argc, char **argv) {
  signal(SIGXFSZ, SIG_IGN); /* a file-size limit makes writes fail with an error, not kill the job */
  util_mpi_init(&argc, &argv);
  program p = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.size);
  util_set_rank(p.rank);
  int rc = parse_args(argc, argv, &p.a, p.rank, &p.errs);
  if (rc < 0) rc = read_config(&p);
  if (rc < 0) {
    make_header(&p, argc, argv);
    if (p.a.dry_run) {
      if (p.rank == 0) {
        const backend *be = backends_plan(p.cfg);
        dry_run(p.cfg, be, p.header, p.a.ranks > 0 ? p.a.ranks : p.size);
        backend_close(be);
      }
      rc = 0;
    } else {
      rc = run_tasks(&p);
    }
  }
  free(p.cfg);
  free(p.a.sets);
  err_free(&p.errs);
  util_exit_all(rc);
}
