/* sample: choosing the next token of generated text (repetition penalty; greedy, or temperature,
 * top-k and top-p sampling). */
#ifndef GREENLM_SAMPLE_H
#define GREENLM_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "base/rng.h"

/* The logits are processed in Hugging Face generate's order: the repetition penalty (a token of the
 * sequence so far has its logit divided by the penalty when positive, multiplied when negative,
 * once however often it occurs); then temperature 0 picks the largest (the lowest id on ties);
 * otherwise the logits are divided by the temperature, top-k keeps the tokens whose logit is at
 * least the k-th largest, top-p keeps the smallest set of most likely of those whose probabilities
 * add up to at least top_p (at least one token; tokens tied with the last one kept stay), and a
 * token is drawn from the softmax of what is kept. One rng stream per sampler. */
typedef struct {
  float z;
  int32_t id;
} sample_pair;

typedef struct {
  const cfg_sample *c;
  int V;
  rng_state rng;
  float *z;            /* (V) the processed logits */
  double *prob;        /* (V) unnormalised probabilities of the kept tokens */
  sample_pair *sorted; /* (V) by descending logit, for top-k and top-p */
  uint8_t *seen;       /* (V) the repetition penalty's marks, all 0 between calls */
} sample_state;

/* A sampler drawing from rng stream (seed, RNG_SAMPLE, stream): one stream per prompt, so a prompt
 * gives the same text alone or in a batch. */
void sample_init(sample_state *s, const cfg_sample *c, int V, uint64_t seed, uint64_t stream);
void sample_free(sample_state *s);
/* The next token, given the logits (host, V) of the last position and the n tokens of the sequence
 * so far (prompt and generated ones: those the repetition penalty applies to). */
int32_t sample_next(sample_state *s, const float *logits, const int32_t *seq, size_t n);

#endif
