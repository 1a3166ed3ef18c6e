/* ncfile: opening a NetCDF file greenlm reads (checkpoints, token datasets) so that every way it can
 * be wrong gets a message of its own, before PnetCDF's generic ones: missing, a directory, empty,
 * a NetCDF-4 (HDF5) file, not NetCDF at all, or shorter than its header says (truncated). */
#ifndef GREENLM_NCFILE_H
#define GREENLM_NCFILE_H

#include <mpi.h>

#include "base/err.h"

/* Open path read-only with PnetCDF over comm (collective), after the checks above; `what` names the
 * file's kind in messages ("checkpoint", "dataset") and hint is the errors' hint. Returns 0 and
 * *ncid, or -1 after adding an error at the file (the same on every rank of comm). */
int ncfile_open(MPI_Comm comm, const char *path, MPI_Info info, const char *what, const char *hint, int *ncid,
                err_list *errs);

/* After every rank of comm wrote its part of tmp (bad: this rank failed): all agree, then rank 0
 * renames tmp to path durably (util_commit), or removes tmp when any rank failed; `what` names the
 * file's kind in messages. Returns 1 (on every rank) when the file is not in place, else 0. */
int ncfile_commit(MPI_Comm comm, int bad, const char *tmp, const char *path, const char *what, const char *hint,
                  err_list *errs);

/* Bytes a fixed-size (non-record) file nc needs: the end of its last variable (INT64_MAX when the
 * header's sizes overflow). */
MPI_Offset ncfile_extent(int nc);
/* Read a text attribute (NC_GLOBAL when var < 0) into buf; "" when absent or longer than len - 1. */
void ncfile_get_text(int ncid, int var, const char *name, char *buf, size_t len);

#endif
