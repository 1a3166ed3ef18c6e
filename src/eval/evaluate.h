/* evaluate: the 'eval' task. The deck's model (infer.h) scored on a token dataset, every window
 * (loss, perplexity, bits per byte), and on benchmarks in their published formats (bench.h), the
 * work spread across the ranks; the results as a table, eval.json and eval.csv in the run
 * directory (doc/evaluation.md). */
#ifndef GREENLM_EVALUATE_H
#define GREENLM_EVALUATE_H

#include <mpi.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"

/* Collective over comm. Returns 0, or 1 (every rank) after adding errors. */
int eval_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs);

#endif
