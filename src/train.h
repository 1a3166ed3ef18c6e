/* train: the training task. A job of P pipeline stages x D data-parallel replicas runs one
 * trainer per rank (trainer.h); train_run adds what a user sees of it: the topology and memory
 * lines, the restart, the progress lines, log.txt, metrics.csv, checkpoints when due, the verdict
 * (verdict.json, report.json) and the text sample. */
#ifndef GREENLM_TRAIN_H
#define GREENLM_TRAIN_H

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"

/* Exit statuses of the training task (doc/reference.md). */
enum {
  TRAIN_OK = 0,          /* completed, or stopped by the time limit or a signal with a checkpoint */
  TRAIN_BAD_INPUT = 1,   /* the deck, the data, the checkpoint or the run directory: nothing was trained */
  TRAIN_DIVERGED = 3,    /* the loss or the gradient norm stopped being finite */
  TRAIN_IO_FAILED = 4    /* a checkpoint or a run file could not be written (the older checkpoints stay) */
};

/* Before any task of the job runs: the run directory may take a fresh start (no finished run, no
 * other run's checkpoints, unless &job overwrite). Collective; returns 1 (every rank) after
 * errors. */
int train_preflight(const cfg_config *cfg, err_list *errs);

/* Run the deck's training job. `header` (the program and command line) goes into the resolved
 * deck. Collective over MPI_COMM_WORLD. Returns the exit status above (the same on every rank),
 * the errors added to errs for the caller's report. */
int train_run(const cfg_config *cfg, const backend *be, const char *header, err_list *errs);

#endif
