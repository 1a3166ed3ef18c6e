/* export: the 'export' task: the deck's model (infer.h says where it comes from) written as a
 * Hugging Face model directory (&export; io/hf.h: config.json, safetensors, tokenizer files). */
#ifndef GREENLM_EXPORT_H
#define GREENLM_EXPORT_H

#include <mpi.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"

/* The directory of the export: &export dir, or run_dir/hf. */
void export_dir(const cfg_config *cfg, char *dir, size_t len);

/* Collective over comm. Returns 0, or 1 (every rank) after adding errors; nothing is written then. */
int export_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs);

#endif
