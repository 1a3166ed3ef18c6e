/* sample: repetition penalty, greedy choice, temperature, top-k and top-p sampling. */
#include "model/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

void sample_init(sample_state *s, const cfg_sample *c, int V, uint64_t seed, uint64_t stream) {
  s->c = c;
  s->V = V;
  rng_seed(&s->rng, seed, RNG_SAMPLE, stream);
  s->z = util_malloc((size_t)V * sizeof(float), "sample logits");
  s->prob = util_malloc((size_t)V * sizeof(double), "sample probabilities");
  s->sorted = util_malloc((size_t)V * sizeof(sample_pair), "sorted logits");
  s->seen = util_calloc((size_t)V, 1, "repetition marks");
}

void sample_free(sample_state *s) {
  free(s->z);
  free(s->prob);
  free(s->sorted);
  free(s->seen);
  memset(s, 0, sizeof *s);
}

/* z = logits with the repetition penalty applied once to each token of seq. */
static void penalize(sample_state *s, const float *logits, const int32_t *seq, size_t n) {
  const float pen = (float)s->c->repetition_penalty;
  memcpy(s->z, logits, (size_t)s->V * sizeof(float));
  if (pen == 1.0f) return;
  for (size_t i = 0; i < n; i++) {
    int32_t t = seq[i];
    if (t < 0 || t >= s->V || s->seen[t]) continue;
    s->seen[t] = 1;
    s->z[t] = s->z[t] < 0 ? s->z[t] * pen : s->z[t] / pen;
  }
  for (size_t i = 0; i < n; i++)
    if (seq[i] >= 0 && seq[i] < s->V) s->seen[seq[i]] = 0;
}

static int32_t argmax(const float *z, int V) {
  int32_t best = 0;
  for (int v = 1; v < V; v++)
    if (z[v] > z[best]) best = v;
  return best;
}

static int cmp_desc(const void *a, const void *b) {
  const sample_pair *x = a, *y = b;
  if (x->z != y->z) return x->z < y->z ? 1 : -1;
  return (x->id > y->id) - (x->id < y->id);
}

static void swap(sample_pair *a, sample_pair *b) {
  sample_pair t = *a;
  *a = *b;
  *b = t;
}

/* Reorder v (n) so that its first k are the k largest in cmp_desc order (quickselect, average O(n)). */
static void select_first(sample_pair *v, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    swap(&v[(lo + hi) / 2], &v[hi]); /* the middle one as pivot, parked at hi */
    int store = lo;
    for (int i = lo; i < hi; i++)
      if (cmp_desc(&v[i], &v[hi]) < 0) swap(&v[i], &v[store++]);
    swap(&v[store], &v[hi]);
    if (store == k - 1 || store == k) return;
    if (store < k) lo = store + 1;
    else hi = store - 1;
  }
}

/* The smallest logit top-k and top-p keep (-inf when they keep everything); z is already divided by
 * the temperature. Only the top k are sorted (all V for top-p alone); tokens tied with the k-th
 * stay in, and count in top-p's total. */
static float cutoff(sample_state *s) {
  const int V = s->V, k = s->c->top_k > 0 && s->c->top_k < V ? (int)s->c->top_k : V;
  if (k == V && s->c->top_p >= 1.0) return -INFINITY;
  for (int v = 0; v < V; v++) s->sorted[v] = (sample_pair){s->z[v], v};
  if (k < V) select_first(s->sorted, V, k);
  qsort(s->sorted, (size_t)k, sizeof *s->sorted, cmp_desc);
  const float kth = s->sorted[k - 1].z, top = s->sorted[0].z;
  if (s->c->top_p >= 1.0) return kth;
  double total = 0.0, acc = 0.0;
  for (int i = 0; i < k; i++) total += exp((double)s->sorted[i].z - top);
  for (int i = k; i < V; i++) total += s->sorted[i].z == kth ? exp((double)kth - top) : 0.0;
  for (int m = 0; m < k; m++) { /* top-p: the shortest prefix whose probability reaches top_p */
    acc += exp((double)s->sorted[m].z - top);
    if (acc >= s->c->top_p * total) return s->sorted[m].z;
  }
  return kth;
}

int32_t sample_next(sample_state *s, const float *logits, const int32_t *seq, size_t n) {
  const int V = s->V;
  penalize(s, logits, seq, n);
  if (s->c->temperature <= 0.0) return argmax(s->z, V);
  const float inv = (float)(1.0 / s->c->temperature);
  for (int v = 0; v < V; v++) s->z[v] *= inv;
  const float cut = cutoff(s), mx = s->z[argmax(s->z, V)];
  double sum = 0.0;
  for (int v = 0; v < V; v++) {
    s->prob[v] = s->z[v] >= cut ? exp((double)s->z[v] - mx) : 0.0;
    sum += s->prob[v];
  }
  double u = rng_uniform(&s->rng) * sum, acc = 0.0;
  int32_t pick = 0;
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
