/* train: the training task: data, model, optimizer loop, evaluation, reports and the verdict. */
#ifndef GREENLM_TRAIN_H
#define GREENLM_TRAIN_H

#include "backend.h"
#include "cfg.h"

/* Run the deck's training job. `header` (the program and command line) goes into the resolved
 * deck. Returns the process exit status: 0 on success, 1 on bad input, 3 when training diverged. */
int train_run(const cfg_config *cfg, const backend *be, const char *header);

#endif
