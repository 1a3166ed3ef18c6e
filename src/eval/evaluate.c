/* evaluate: the 'eval' task: set-up, the dataset score, the benchmarks, the report. */
#include "eval/evaluate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "eval/bench.h"
#include "eval/report.h"
#include "eval/score.h"
#include "infer.h"

typedef struct {
  const cfg_config *cfg;
  infer_model im;
  int rank;
  eval_benchmarks b; /* the deck's benchmarks */
  evalrep rep;
  double t0;
  double tokens; /* fed through the model: the figure of merit's and the energy's denominator */
} eval_job;

int eval_benchmarks_load(eval_benchmarks *b, const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  const cfg_eval *c = &cfg->eval;
  memset(b, 0, sizeof *b);
  b->sets = util_calloc((size_t)c->benchmarks.n + 1, sizeof *b->sets, "benchmarks");
  long n0 = err_count(errs);
  for (int i = 0; i < c->benchmarks.n; i++) {
    int e0 = errs->n;
    if (!c->benchmarks.v[i][0]) continue; /* benchmarks = '' lists none */
    if (bench_load(&b->sets[b->n], c->benchmarks.v[i], c->limit, (int)c->num_fewshot, (uint64_t)cfg->job.seed, errs) == 0)
      b->n++;
    else if (errs->n > e0 && !errs->v[e0].line) /* a whole-file problem: point at the deck key */
      cfg_relocate(cfg, errs, e0, "eval", "benchmarks");
  }
  int bad = err_count(errs) > n0, any;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (any) eval_benchmarks_free(b);
  return any;
}

void eval_benchmarks_free(eval_benchmarks *b) {
  for (int s = 0; s < b->n; s++) bench_free(&b->sets[s]);
  free(b->sets);
  memset(b, 0, sizeof *b);
}

void eval_benchmark_score(const bench_set *set, gpt_model *m, tok_tokenizer *tok, MPI_Comm comm, bench_scores *out,
                          double *tokens, long *cut) {
  long n = bench_nrequests(set);
  score_request *q = util_malloc((size_t)(n + 1) * sizeof *q, "requests");
  score_result *r = util_malloc((size_t)(n + 1) * sizeof *r, "results");
  bench_result *br = util_malloc((size_t)(n + 1) * sizeof *br, "results");
  for (long i = 0; i < n; i++) {
    const bench_request *b = bench_request_at(set, i);
    q[i] = (score_request){b->context, b->continuation, b->greedy};
  }
  score_requests(m, tok, comm, q, n, r);
  *cut = 0, *tokens = 0;
  for (long i = 0; i < n; i++) {
    br[i] = (bench_result){r[i].loglik, r[i].ntokens, r[i].greedy_ok};
    *cut += r[i].truncated;
    *tokens += r[i].inputs;
  }
  bench_score(set, br, out);
  free(q), free(r), free(br);
}

/* The longest request in tokens (at most block_size), for the model's plan. Rank 0 encodes them as
 * score_one does. */
static int longest_request(eval_job *j) {
  int most = 1;
  if (j->rank == 0) {
    tok_ids ids = {0};
    for (int s = 0; s < j->b.n; s++)
      for (long r = 0; r < bench_nrequests(&j->b.sets[s]); r++) {
        const bench_request *q = bench_request_at(&j->b.sets[s], r);
        score_encode(&j->im.tok, q->context, q->continuation, &ids);
        if ((int)ids.n - 1 > most) most = (int)ids.n - 1;
      }
    tok_ids_free(&ids);
  }
  MPI_Bcast(&most, 1, MPI_INT, 0, j->im.comm);
  return most < j->im.shape.maxT ? most : j->im.shape.maxT;
}

/* The score of dataset `path` (of &eval val), into the report. Returns 1 (every rank) after errors. */
static int run_dataset(eval_job *j, const char *path, err_list *errs) {
  const cfg_eval *c = &j->cfg->eval;
  score_dataset d;
  if (score_dataset_run(&j->im, path, (int)j->cfg->training.micro_batch_size, (int)c->seq_len, &d, errs)) return 1;
  if (j->rank == 0) {
    char task[CFG_STR_LEN + 16];
    util_snprintf(task, sizeof task, "dataset:%s", path);
    evalrep_add(&j->rep, task, "loss", d.loss, NAN, (long)d.windows);
    evalrep_add(&j->rep, task, "perplexity", d.ppl, NAN, (long)d.windows);
    evalrep_add(&j->rep, task, "bits_per_byte", d.bpb, NAN, (long)d.windows);
    evalrep_add(&j->rep, task, "tokens", d.tokens, NAN, (long)d.windows);
    j->tokens += d.tokens;
    printf("eval: %s: %llu windows of %ld tokens, loss %.6f, perplexity %.4f, %.4f bits per byte (%.0f tokens/s)\n",
           path, (unsigned long long)d.windows, c->seq_len, d.loss, d.ppl, d.bpb, d.tokens / d.seconds);
    fflush(stdout);
  }
  return 0;
}

/* One benchmark scored, its metrics into the report. */
static void run_benchmark(eval_job *j, const bench_set *set) {
  double t0 = util_now(), tokens;
  long cut;
  bench_scores s;
  eval_benchmark_score(set, &j->im.model, &j->im.tok, j->im.comm, &s, &tokens, &cut);
  j->tokens += tokens;
  if (j->rank == 0) {
    evalrep_add_scores(&j->rep, set->name, &s);
    printf("eval: %s: %ld items, %ld requests, %ld tokens scored in %.2f s%s\n", set->name, s.n, bench_nrequests(set), s.tokens,
           util_now() - t0, cut ? " (some contexts cut on the left to the block size)" : "");
    fflush(stdout);
  }
}

/* The table on the terminal, eval.json and eval.csv in the run directory (rank 0), after the figure of
 * merit and the energy. Returns 1 (every rank) when a file could not be written. */
static int report(eval_job *j, err_list *errs) {
  int bad = 0, measured;
  double joules, wall = util_now() - j->t0;
  /* a forward pass: a third of the training FLOPs per token (gpt.h) */
  infer_meter_report(&j->im, j->tokens, j->tokens * gpt_flops_per_token(&j->im.shape, (int)j->cfg->eval.seq_len) / 3, &joules,
                     &measured);
  if (j->rank == 0) {
    printf("eval: %.0f tokens scored in %.2f s: %.0f tokens/s over %d rank%s\n", j->tokens, wall, j->tokens / wall,
           j->im.size, j->im.size == 1 ? "" : "s");
    evalrep_add(&j->rep, "run", "seconds", wall, NAN, j->im.size);
    evalrep_add(&j->rep, "run", "tokens_per_s", j->tokens / wall, NAN, j->im.size);
    if (joules > 0) evalrep_add(&j->rep, "run", measured ? "energy_j" : "energy_j_estimated", joules, NAN, j->im.size);
    const cfg_config *cfg = j->cfg;
    evalrep_print(&j->rep, stdout);
    evalrep_info st = {cfg->job.name, j->im.source, (int)cfg->eval.num_fewshot, cfg->eval.limit, (uint64_t)cfg->job.seed};
    bad = util_mkdir_p(cfg->job.run_dir) != 0 || evalrep_write(&j->rep, &st, cfg->job.run_dir, errs) != 0;
    if (!bad) printf("eval: results in %s/eval.json and eval.csv\n", cfg->job.run_dir);
    fflush(stdout);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, j->im.comm);
  return bad;
}

int eval_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs) {
  eval_job j = {.cfg = cfg, .t0 = util_now()};
  MPI_Comm_rank(comm, &j.rank);
  int any, bad = infer_open(&j.im, cfg, be, comm, errs) != 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (!any) any = eval_benchmarks_load(&j.b, cfg, comm, errs);
  int dataset = cfg->eval.val.n > 0 && !cfg_eval_skips_val(cfg);
  if (!any) {
    int T = j.b.n ? longest_request(&j) : 1;
    if ((int)cfg->eval.seq_len > T && dataset) T = (int)cfg->eval.seq_len;
    any = infer_load(&j.im, (int)cfg->training.micro_batch_size, T, errs);
    if (!any) any = infer_meter(&j.im, errs);
  }
  if (!any && j.rank == 0) printf("eval: the model from the %s\n", j.im.source), fflush(stdout);
  for (int v = 0; !any && dataset && v < cfg->eval.val.n; v++) any = run_dataset(&j, cfg->eval.val.v[v], errs);
  for (int s = 0; !any && s < j.b.n; s++) run_benchmark(&j, &j.b.sets[s]);
  if (!any) any = report(&j, errs);
  eval_benchmarks_free(&j.b);
  evalrep_free(&j.rep);
  infer_close(&j.im);
  return any;
}
