/* backends: which compute backend a run uses (&system backend and precision), from the kinds this
 * build has (backend_kinds) and what each says it can do (backend_caps).
 *
 *   backend = '<kind>'  that kind: 'cpu' always; a device kind ('cuda') where the build has it and
 *                       every rank's node has devices
 *   backend = 'auto'    the build's device kind where the rank's node has devices, else the CPU
 *
 * A device kind gives each rank the device nearest its cores (hwloc PCI locality), the node's
 * devices shared evenly. What cannot work with this build at all (a kind it was built without, a
 * precision the backend does not compute at) is a deck error found by backends_check right after
 * the deck is loaded, before anything is read; what depends on the machine is found by
 * backends_open. */
#ifndef GREENLM_BACKENDS_H
#define GREENLM_BACKENDS_H

#include <mpi.h>
#include <stddef.h>

#include "model/backend.h"
#include "deck/cfg.h"
#include "deck/nml.h"

/* What this build cannot run wherever it runs (a backend it was built without, a precision the
 * backend does not compute at, a shape beyond the named backend's attention limits): errors at the
 * deck keys. greenlm calls it after cfg_load, before anything is read. */
void backends_check(const cfg_config *cfg, err_list *errs);

/* Whether the opened instance's device computes at &system precision (backend_caps.precisions of
 * an instance are its device's: a V100, sm_70, has neither bf16 nor tf32) and takes the deck's
 * shape (its attention limits, for backend = 'auto'): 0, or -1 after errors at the deck keys naming
 * the device (`where`) and what it has. backends_open calls it. */
int backends_check_device(const cfg_config *cfg, const backend *be, const char *where, err_list *errs);

/* An instance of the backend the deck asks for, for planning (the dry run): no device is touched.
 * backend_close it. */
const backend *backends_plan(const cfg_config *cfg);

/* Choose and open this rank's backend for a run. Collective over comm. Returns NULL on every
 * rank when a rank cannot run the deck (each such rank added its error). `note` receives a line
 * for the log ("backend: cuda, GPU 0 of 4 on each node ..."). backend_close it after the run. */
const backend *backends_open(const cfg_config *cfg, MPI_Comm comm, err_list *errs, char *note, size_t len);

#endif
