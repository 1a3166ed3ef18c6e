/* backends: which compute backend a run uses (&system backend and precision).
 *
 *   backend = 'cpu'   the CPU backend (fp32 only)
 *   backend = 'cuda'  the CUDA backend: needs a build configured --with-cuda and a GPU on every rank
 *   backend = 'auto'  CUDA where this build has it and the rank's node has a GPU, else the CPU
 *
 * Each rank takes GPU (node-local rank mod the node's visible GPUs); CUDA_VISIBLE_DEVICES limits
 * and orders the GPUs as the CUDA runtime sees them. What cannot work with this build at all
 * (backend = 'cuda' without CUDA, precision other than fp32 on the CPU) is a deck error found by
 * cfg_load and the dry run; what depends on the machine is found by backends_open. */
#ifndef GREENLM_BACKENDS_H
#define GREENLM_BACKENDS_H

#include <mpi.h>
#include <stddef.h>

#include "model/backend.h"
#include "deck/cfg.h"
#include "deck/nml.h"

/* The backend table the deck asks for, for planning (the dry run): no device is touched. */
const backend *backends_plan(const cfg_config *cfg);

/* Choose and open this rank's backend for a run. Collective over comm. Returns NULL on every
 * rank when a rank cannot run the deck (each such rank added its error). `note` receives a line
 * for the log ("backend: cuda, GPU 0 of 4 on each node ..."). */
const backend *backends_open(const cfg_config *cfg, MPI_Comm comm, err_list *errs, char *note, size_t len);

#endif
