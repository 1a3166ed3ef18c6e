/* prepare: the 'prepare' task, text to token datasets (format in data.h).
 *
 * Every rank tokenizes its share of the input (corpus.c), documents are assigned to the
 * validation split by a seeded shuffle of their global indices, and the ranks write each split's
 * tokens collectively with PnetCDF into NAME.tmp, renamed to NAME once complete. The token
 * variables are identical for any rank count. */
#ifndef GREENLM_PREPARE_H
#define GREENLM_PREPARE_H

#include <mpi.h>

#include "deck/cfg.h"

/* Run the task; returns the exit status (0, or 1 after adding errors). Collective. */
int prepare_run(const cfg_config *cfg, MPI_Comm comm, err_list *errs);
/* Before any task runs: the files the task writes (train_out, val_out when val_fraction > 0, their .tmp
 * and the spill files) are no path that is not a regular file, none of the inputs or the tokenizer's
 * files under any spelling, would not be read as an input (corpus_clash), and the two splits are two
 * files. Returns 0, or 1 on every rank after rank 0 added errors at the deck keys. Collective. */
int prepare_preflight(const cfg_config *cfg, MPI_Comm comm, err_list *errs);

#endif
