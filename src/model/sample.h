/* sample: choosing the next token of generated text (temperature and top-k sampling). */
#ifndef GREENLM_SAMPLE_H
#define GREENLM_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "base/rng.h"

/* Draws tokens from logits with the deck's temperature and top-k, from rng stream
 * (seed, RNG_SAMPLE, 0). */
typedef struct {
  const cfg_sample *c;
  int V;
  rng_state rng;
  float *sorted;
  double *prob;
} sample_state;

void sample_init(sample_state *s, const cfg_sample *c, int V, uint64_t seed);
void sample_free(sample_state *s);
/* The next token, given the logits (host, V) of the last position. */
int32_t sample_next(sample_state *s, const float *logits);

#endif
