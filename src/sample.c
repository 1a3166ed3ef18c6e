/* sample: autoregressive generation with temperature and top-k. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "util.h"

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

void sample_generate(gpt_model *m, const cfg_sample *c, uint64_t seed, const int32_t *prompt, int n_prompt,
                     int n_new, int32_t *out) {
  const int V = m->s.V, Tmax = m->T < m->s.maxT ? m->T : m->s.maxT;
  float *logits = util_malloc((size_t)V * sizeof(float), "sample logits");
  float *sorted = util_malloc((size_t)V * sizeof(float), "sample logits");
  double *prob = util_malloc((size_t)V * sizeof(double), "sample probabilities");
  rng_state r;
  rng_seed(&r, seed, RNG_SAMPLE, 0);
  memcpy(out, prompt, (size_t)n_prompt * sizeof(int32_t));
  int n = n_prompt;
  for (int step = 0; step < n_new; step++) {
    int t = n < Tmax ? n : Tmax; /* context: the last t tokens */
    gpt_set_batch(m, out + (n - t), NULL, 1, t);
    gpt_forward(m, 1, t);
    m->be->to_host(logits, gpt_logits(m) + (size_t)(t - 1) * V, (size_t)V * sizeof(float));
    /* top-k: keep logits >= the k-th largest */
    float cut = -INFINITY;
    if (c->top_k > 0 && c->top_k < V) {
      memcpy(sorted, logits, (size_t)V * sizeof(float));
      qsort(sorted, (size_t)V, sizeof(float), cmp_desc);
      cut = sorted[c->top_k - 1];
    }
    float mx = -INFINITY;
    for (int v = 0; v < V; v++)
      if (logits[v] > mx) mx = logits[v];
    double sum = 0.0;
    for (int v = 0; v < V; v++) {
      prob[v] = logits[v] >= cut ? exp(((double)logits[v] - mx) / c->temperature) : 0.0;
      sum += prob[v];
    }
    double u = rng_uniform(&r) * sum, acc = 0.0;
    int pick = 0;
    for (int v = 0; v < V; v++) {
      if (prob[v] > 0.0) pick = v; /* rounding fallback: the last eligible token */
      acc += prob[v];
      if (u < acc) {
        pick = v;
        break;
      }
    }
    out[n++] = pick;
  }
  free(logits);
  free(sorted);
  free(prob);
}
