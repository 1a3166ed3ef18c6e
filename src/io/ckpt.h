/* ckpt: PnetCDF parallel checkpoints that restart a run exactly, on any layout.
 *
 * One CDF-5 file per checkpoint, written collectively by all ranks (doc/formats.md):
 *   - every tensor in its global shape under its Hugging Face name, and its AdamW moments as
 *     adam_m.<name> and adam_v.<name>, each with a checksum attribute;
 *   - the run state as attributes: step, tokens, the loader's cursor, the seed, the loss scale,
 *     the resolved deck, the model's shape, the tokenizer's hash, the writer's layout, version.
 * Replica r of a stage writes piece r (of D equal pieces) of the stage's parameter buffer and of
 * the moments (with ZeRO-1 exactly the piece whose moments it keeps); the last stage leaves the
 * tied embedding to the first. Non-blocking puts and one collective wait per batch of
 * &checkpoint stage_mb per rank (PnetCDF 1.12's limit is 2 GiB). The file is written as NAME.tmp,
 * synced, and renamed; a crash leaves the previous checkpoints as they were. Reads go around
 * PnetCDF for the data: reader threads (rdahead) read each rank's runs straight from the disk.
 *
 * Checksums: for element i of a variable with bit pattern x, mix(i, x) summed modulo 2^64. The sum
 * does not depend on which rank holds which element, so a job of another layout verifies what it
 * read without reading anything twice. */
#ifndef GREENLM_CKPT_H
#define GREENLM_CKPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "text/data.h"
#include "model/gpt.h"
#include "deck/nml.h"
#include "model/optim.h"
#include "parallel/grad.h"
#include "parallel/par.h"

/* What a checkpoint holds of a rank, and the run state. */
typedef struct {
  const cfg_config *cfg;
  const par_layout *lay;
  gpt_model *model;
  optim_state *opt;
  data_loader *data;
  const char *tokenizer_hash;
  long step;     /* optimizer steps done */
  double tokens; /* tokens trained */
  double loss_scale;
  /* the compressed exchange's adaptive levels (&comm method alq, amq; none: comm_nlevels 0) */
  int comm_nlevels;
  float comm_levels[128];
  /* the compressed exchange's error-feedback residual: host memory indexed as the stage's parameter
   * buffer (nparams), or NULL; written as comm_residual, one row per replica (doc/formats.md) */
  float *comm_residual;
  const char *comm_residual_holders; /* which replicas' residuals cover which values (grad_residual_holders) */
  /* PowerSGD's warm-start Q (&comm method = 'powersgd'): host memory, the factored tensors' among the
   * stage's tensors [comm_lowrank_t0, comm_lowrank_t1) in order (psgd_q_floats), or NULL; written as
   * comm_powersgd_q (doc/formats.md) by the ranks with comm_lowrank_writes */
  float *comm_lowrank_q;
  long comm_lowrank_rank;
  int comm_lowrank_t0, comm_lowrank_t1, comm_lowrank_writes;
} ckpt_state;

enum { CKPT_PATH_MAX = CFG_STR_LEN + 64 };

typedef struct {
  double seconds, bytes; /* the whole job's bytes of tensors */
  double share_seconds;  /* read: of seconds, those spent passing pieces between replicas */
  int direct;            /* read: straight from the disk (O_DIRECT took), not through the page cache */
  int damaged;           /* read failed: the file is damaged (not a mismatch with the deck or the data) */
  int residual;          /* read, with an error-feedback residual: 1 restored, 0 started from zero (the file has
                            none, or one its replicas held otherwise: residual_held); -1 without one */
  char residual_held[GRAD_HOLDERS_MAX]; /* read, residual 0: how the file's replicas held theirs ("": it has none) */
  char path[CKPT_PATH_MAX];
} ckpt_stats;

/* The directory of the deck's checkpoints (&checkpoint dir, or run_dir/checkpoints). */
void ckpt_dir(const cfg_config *cfg, char *dir, size_t len);

/* Write dir/ckpt-<step>.nc and keep the newest &checkpoint keep. Collective over lay->comm.
 * Returns 0, or -1 (on every rank) after the ranks that failed added their errors; older
 * checkpoints are left as they were. */
int ckpt_write(const ckpt_state *s, ckpt_stats *st, err_list *errs);

/* The checkpoints to restart from, in the order to try them: &checkpoint restart's path, or with
 * 'latest' the complete checkpoints of the directory, newest first (names exactly as ckpt_write
 * gives them; nothing else in the directory counts). Returns their count (0: none); *paths to
 * free(). */
int ckpt_candidates(const cfg_config *cfg, char (**paths)[CKPT_PATH_MAX]);
/* Complete checkpoints in dir. */
int ckpt_count(const char *dir);

/* The checkpoint directory exists (created when missing) and takes a file: checked at start-up,
 * not at the first write. Returns 0, or -1 after an error at &checkpoint dir. Rank 0 calls it. */
int ckpt_check_dir(const cfg_config *cfg, err_list *errs);
/* Rename the checkpoint directory to DIR.replaced-<UTC time> (an overwritten run's checkpoints are
 * kept, never mixed with the new run's). Returns 0 and moved, or -1 after an error. Rank 0. */
int ckpt_set_aside_dir(const cfg_config *cfg, char *moved, size_t len, err_list *errs);
/* Rename a damaged checkpoint to PATH.damaged (out of 'latest''s way). Returns 0 and moved, or -1
 * with errno. */
int ckpt_set_aside_file(const char *path, char *moved, size_t len);

/* Read a checkpoint into the model, the optimizer state and the loader, and the step and token
 * count into s. The model's shape is checked against the deck (every mismatch listed) and every
 * variable's checksum verified. Collective. Returns the number of errors added to errs (the same
 * count on every rank; the messages on rank 0). */
int ckpt_read(ckpt_state *s, const char *path, ckpt_stats *st, err_list *errs);

#endif
