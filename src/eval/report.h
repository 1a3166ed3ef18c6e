/* report: an evaluation's results as rows (task, metric, value, standard error, n): a table on the
 * terminal, and eval.json and eval.csv in the run directory, each written crash-safely (temporary
 * name, fsync, rename).
 *
 * eval.json:
 *   {"run": NAME, "model": SOURCE, "settings": {"num_fewshot": K, "limit": L, "seed": S},
 *    "tasks": {TASK: {METRIC: {"value": V, "stderr": E, "n": N}, ...}, ...}}
 * with tasks and metrics in the order they were added, and null for a value or standard error that
 * is NaN (none).
 * eval.csv: the header "task,metric,value,stderr,n", then one line per row; a NaN is an empty field,
 * a field with a comma, quote or newline is quoted as RFC 4180 says. */
#ifndef GREENLM_EVAL_REPORT_H
#define GREENLM_EVAL_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "eval/bench.h"

typedef struct {
  char *task, *metric;
  double value, stderr_; /* stderr_ NAN: none */
  long n;                /* items, windows or tokens the value is over */
} evalrep_row;

typedef struct {
  evalrep_row *rows;
  int nrows, cap;
} evalrep;

/* What eval.json says about the run besides the rows. */
typedef struct {
  const char *run_name; /* &job name */
  const char *model;    /* where the model came from: a checkpoint, a Hugging Face directory, ... */
  int num_fewshot;
  long limit;
  uint64_t seed;
} evalrep_info;

/* Add a row (the strings are copied). */
void evalrep_add(evalrep *rep, const char *task, const char *metric, double value, double stderr_, long n);
/* Add a benchmark's rows: acc, acc_norm and ppl where they are defined (not NaN), under its name. */
void evalrep_add_scores(evalrep *rep, const char *task, const bench_scores *s);
void evalrep_free(evalrep *rep);

/* The rows as an aligned table: task, metric, value, "± stderr" (blank for none), n. */
void evalrep_print(const evalrep *rep, FILE *out);

/* Write run_dir/eval.json and run_dir/eval.csv (run_dir must exist). Returns 0, or -1 after adding
 * an error naming the file. */
int evalrep_write(const evalrep *rep, const evalrep_info *info, const char *run_dir, err_list *errs);

#endif
