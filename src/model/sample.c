/* sample: temperature and top-k sampling. */
#include "model/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

void sample_init(sample_state *s, const cfg_sample *c, int V, uint64_t seed) {
  s->c = c;
  s->V = V;
  rng_seed(&s->rng, seed, RNG_SAMPLE, 0);
  s->sorted = util_malloc((size_t)V * sizeof(float), "sample logits");
  s->prob = util_malloc((size_t)V * sizeof(double), "sample probabilities");
}

void sample_free(sample_state *s) {
  free(s->sorted);
  free(s->prob);
  memset(s, 0, sizeof *s);
}

int32_t sample_next(sample_state *s, const float *logits) {
  const int V = s->V;
  /* top-k: keep logits >= the k-th largest */
  float cut = -INFINITY;
  if (s->c->top_k > 0 && s->c->top_k < V) {
    memcpy(s->sorted, logits, (size_t)V * sizeof(float));
    qsort(s->sorted, (size_t)V, sizeof(float), cmp_desc);
    cut = s->sorted[s->c->top_k - 1];
  }
  float mx = -INFINITY;
  for (int v = 0; v < V; v++)
    if (logits[v] > mx) mx = logits[v];
  double sum = 0.0;
  for (int v = 0; v < V; v++) {
    s->prob[v] = logits[v] >= cut ? exp(((double)logits[v] - mx) / s->c->temperature) : 0.0;
    sum += s->prob[v];
  }
  double u = rng_uniform(&s->rng) * sum, acc = 0.0;
  int pick = 0;
  for (int v = 0; v < V; v++) {
    if (s->prob[v] > 0.0) pick = v; /* rounding fallback: the last eligible token */
    acc += s->prob[v];
    if (u < acc) {
      pick = v;
      break;
    }
  }
  return pick;
}
