/* evaluate: the 'eval' task. The deck's model (infer.h) scored on a token dataset, every window
 * (loss, perplexity, bits per byte), and on benchmarks in their published formats (bench.h), the
 * work spread across the ranks; the results as a table, eval.json and eval.csv in the run
 * directory (doc/evaluation.md). */
#ifndef GREENLM_EVALUATE_H
#define GREENLM_EVALUATE_H

#include <mpi.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "eval/bench.h"
#include "model/backend.h"
#include "model/gpt.h"
#include "text/tok.h"

/* The deck's &eval benchmarks, read on every rank of comm (each builds the same requests). */
typedef struct {
  int n;
  bench_set *sets;
} eval_benchmarks;

/* Collective. Returns 0, or 1 (every rank) after adding errors; nothing is left loaded then. */
int eval_benchmarks_load(eval_benchmarks *b, const cfg_config *cfg, MPI_Comm comm, err_list *errs);
void eval_benchmarks_free(eval_benchmarks *b);

/* Score one benchmark on the whole model m held by every rank of comm (score.h: the same scores for
 * any rank count). *tokens receives the tokens fed through the model, *cut the requests whose
 * context was cut to the model's planned length. Collective. */
void eval_benchmark_score(const bench_set *set, gpt_model *m, tok_tokenizer *tok, MPI_Comm comm, bench_scores *out,
                          double *tokens, long *cut);

/* The 'eval' task. Collective over comm. Returns 0, or 1 (every rank) after adding errors. */
int eval_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs);

#endif
