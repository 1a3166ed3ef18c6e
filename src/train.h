/* train: the training task. A job of P pipeline stages x D data-parallel replicas runs one
 * trainer per rank (trainer.h); train_run adds what a user sees of it: the topology and memory
 * lines, the restart, the progress lines, log.txt, metrics.csv, checkpoints when due, the verdict
 * (verdict.json, report.json) and the text sample. */
#ifndef GREENLM_TRAIN_H
#define GREENLM_TRAIN_H

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"

/* The exit statuses the training task returns (err.h has the table). */
enum {
  TRAIN_OK = ERR_EXIT_OK,               /* completed, or stopped by the time limit or a signal with a checkpoint */
  TRAIN_BAD_INPUT = ERR_EXIT_BAD_INPUT, /* the deck, the data, the checkpoint or the run directory */
  TRAIN_DIVERGED = ERR_EXIT_DIVERGED,
  TRAIN_IO_FAILED = ERR_EXIT_IO_FAILED
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
