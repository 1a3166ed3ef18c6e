/* sample: text generation from a trained model (temperature and top-k sampling). */
#ifndef GREENLM_SAMPLE_H
#define GREENLM_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "cfg.h"
#include "model.h"

/* Continue `prompt` (token ids, n_prompt >= 1) by n_new tokens drawn with the deck's temperature and
 * top_k from rng stream (seed, RNG_SAMPLE, 0). The context is the last min(T, block_size) tokens,
 * T being the model's planned sequence length. out receives n_prompt + n_new ids. */
void sample_generate(gpt_model *m, const cfg_sample *c, uint64_t seed, const int32_t *prompt, int n_prompt,
                     int n_new, int32_t *out);

#endif
