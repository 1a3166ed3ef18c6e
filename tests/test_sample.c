/* test_sample: choosing the next token: greedy with ties, the repetition penalty (divided when
 * positive, multiplied when negative, once per token), top-k (with ties), top-p, temperature (the
 * frequencies of 20000 draws against the kept tokens' softmax), and seeded streams. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deck/cfg.h"
#include "model/sample.h"
#include "base/rng.h"
#include "testing.h"
#include "base/util.h"

enum { DRAWS = 20000 };

static cfg_sample settings(double temperature, long top_k, double top_p, double penalty) {
  cfg_sample c;
  memset(&c, 0, sizeof c);
  c.temperature = temperature, c.top_k = top_k, c.top_p = top_p, c.repetition_penalty = penalty, c.stop_eot = 1;
  return c;
}

static int32_t once(const cfg_sample *c, const float *logits, int V, const int32_t *seq, size_t n) {
  sample_state s;
  sample_init(&s, c, V, 1, 0);
  int32_t t = sample_next(&s, logits, seq, n);
  sample_free(&s);
  return t;
}

static void test_greedy_and_penalty(void) {
  cfg_sample g = settings(0, 40, 1, 1), pen = settings(0, 0, 1, 2);
  const float tie[4] = {1, 3, 3, 2};
  T_CHECK(once(&g, tie, 4, NULL, 0) == 1, "greedy: the lowest id of the tied largest");
  const float pos[2] = {2.1f, 1.0f}; /* 2.1 / 2 = 1.05 > 1: the penalty applies once, not per occurrence */
  const int32_t twice[2] = {0, 0};
  T_CHECK(once(&pen, pos, 2, twice, 2) == 0, "a repeated token is penalised once");
  const float neg[2] = {-1.0f, -1.5f}; /* -1 * 2 = -2 < -1.5 */
  const int32_t first[1] = {0};
  T_CHECK(once(&pen, neg, 2, first, 1) == 1, "a negative logit is multiplied by the penalty");
  const float mix[4] = {1.0f, 1.6f, -1.0f, 3.1f}; /* 3.1 / 2 = 1.55 < 1.6 */
  const int32_t seen[2] = {3, 2};
  T_CHECK(once(&pen, mix, 4, seen, 2) == 1, "a positive logit is divided by the penalty");
  printf("  greedy (ties to the lowest id), repetition penalty (once, divide/multiply)\n");
}

/* Frequencies of DRAWS draws against the expected probabilities p (V): max |f - p| < tol. */
static void frequencies(const char *what, const cfg_sample *c, const float *logits, const double *p, int V, double tol) {
  sample_state s;
  sample_init(&s, c, V, 7, 3);
  int *count = calloc((size_t)V, sizeof(int));
  for (int i = 0; i < DRAWS; i++) count[sample_next(&s, logits, NULL, 0)]++;
  double worst = 0;
  for (int v = 0; v < V; v++) {
    double f = (double)count[v] / DRAWS;
    T_CHECK(p[v] > 0 || count[v] == 0, "%s: token %d drawn %d times, outside the kept set", what, v, count[v]);
    worst = fabs(f - p[v]) > worst ? fabs(f - p[v]) : worst;
  }
  T_CHECK(worst < tol, "%s: frequencies off by %.4f", what, worst);
  printf("  %-40s frequencies within %.4f of the kept softmax\n", what, worst);
  free(count);
  sample_free(&s);
}

static void test_distributions(void) {
  const float z[5] = {0, 1, 2, 3, 2.5f};
  cfg_sample k2 = settings(1, 2, 1, 1);
  double a = exp(3.0) / (exp(3.0) + exp(2.5));
  const double pk[5] = {0, 0, 0, a, 1 - a};
  frequencies("top-k 2", &k2, z, pk, 5, 0.015);
  const float tie[4] = {1, 2, 2, 0}; /* top-k 1 keeps both tokens tied with the largest */
  cfg_sample k1 = settings(1, 1, 1, 1);
  const double pt[4] = {0, 0.5, 0.5, 0};
  frequencies("top-k 1 with a tie", &k1, tie, pt, 4, 0.015);
  float lp[4];
  const double probs[4] = {0.05, 0.5, 0.15, 0.3};
  for (int v = 0; v < 4; v++) lp[v] = (float)log(probs[v]);
  cfg_sample p75 = settings(1, 0, 0.75, 1), p40 = settings(1, 0, 0.4, 1), p85 = settings(1, 0, 0.85, 1);
  const double q75[4] = {0, 0.5 / 0.8, 0, 0.3 / 0.8}, q40[4] = {0, 1, 0, 0}, q85[4] = {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95};
  frequencies("top-p 0.75 (keeps 0.5 + 0.3)", &p75, lp, q75, 4, 0.015);
  frequencies("top-p 0.4 (keeps the largest)", &p40, lp, q40, 4, 1e-12);
  frequencies("top-p 0.85 (keeps three)", &p85, lp, q85, 4, 0.015);
  cfg_sample t2 = settings(2, 0, 1, 1);
  const float u[3] = {0, 1, 2};
  double e0 = 1, e1 = exp(0.5), e2 = exp(1.0), sum = e0 + e1 + e2;
  const double pt2[3] = {e0 / sum, e1 / sum, e2 / sum};
  frequencies("temperature 2", &t2, u, pt2, 3, 0.015);
}

static int cmp_float_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

/* A large vocabulary (the partial selection of the top k): every draw among the k largest, and
 * with top-p as well, among the smallest prefix of those reaching top_p. */
static void test_large(void) {
  enum { V = 5000, K = 40 };
  float *z = malloc(V * sizeof(float)), *sorted = malloc(V * sizeof(float));
  rng_state r;
  rng_seed(&r, 11, 0, 0);
  for (int v = 0; v < V; v++) z[v] = (float)(3 * rng_normal(&r));
  memcpy(sorted, z, V * sizeof(float));
  qsort(sorted, V, sizeof(float), cmp_float_desc);
  double total = 0, acc = 0;
  for (int i = 0; i < K; i++) total += exp((double)sorted[i] - sorted[0]);
  int m = 0;
  while ((acc += exp((double)sorted[m] - sorted[0])) < 0.5 * total) m++;
  cfg_sample k = settings(1, K, 1, 1), kp = settings(1, K, 0.5, 1);
  sample_state a, b;
  sample_init(&a, &k, V, 3, 0), sample_init(&b, &kp, V, 3, 0);
  int outside = 0, seen_last = 0;
  for (int i = 0; i < 3000; i++) {
    int32_t x = sample_next(&a, z, NULL, 0), y = sample_next(&b, z, NULL, 0);
    outside += z[x] < sorted[K - 1] || z[y] < sorted[m];
    seen_last |= z[y] == sorted[m];
  }
  T_CHECK(outside == 0 && seen_last, "top-k %d of %d (and top-p 0.5, %d kept): %d draws outside", K, V, m + 1, outside);
  printf("  top-k %d of %d, with top-p 0.5 (%d kept): every draw in the kept set\n", K, V, m + 1);
  sample_free(&a), sample_free(&b);
  free(z), free(sorted);
}

static void test_streams(void) {
  cfg_sample c = settings(1, 0, 1, 1);
  const float z[6] = {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  sample_state a, b, o;
  sample_init(&a, &c, 6, 5, 2), sample_init(&b, &c, 6, 5, 2), sample_init(&o, &c, 6, 5, 3);
  int same = 1, differ = 0;
  for (int i = 0; i < 200; i++) {
    int32_t x = sample_next(&a, z, NULL, 0), y = sample_next(&b, z, NULL, 0), w = sample_next(&o, z, NULL, 0);
    same &= x == y, differ |= x != w;
  }
  T_CHECK(same && differ, "the same (seed, stream) draws the same tokens (%d), another stream others (%d)", same, differ);
  sample_free(&a), sample_free(&b), sample_free(&o);
  printf("  seeded streams: repeatable, one per prompt\n");
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  test_greedy_and_penalty();
  test_distributions();
  test_large();
  test_streams();
  int rc = t_done("test_sample");
  MPI_Finalize();
  return rc;
}
