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

#endif
