/* test_psgd: PowerSGD's exchange (src/parallel/psgd.c) on 4 ranks, in one level (D = 4) and in two
 * (2 nodes x 2; and 1 node of 4, which sums in fp32), over 30 steps of random gradients of three tensors (two matrices that travel as
 * rank-4 factors, a vector that travels in fp32):
 *   - error feedback's sum identity: the results summed over the steps plus the replicas' final
 *     residuals equal the gradients summed over the steps and replicas (within fp32 rounding);
 *   - the vector's result is the plain sum of the replicas' vectors every step;
 *   - every replica ends with the same bits;
 *   - a rank-4 matrix that every replica sends is summed exactly in one step (one power iteration
 *     finds its column space), its residual zero;
 *   - two levels give the one-level results within rounding (every step is linear in the sums; only
 *     the first step is compared: on random gradients, whose singular values lie close together, the
 *     subspace a power iteration finds amplifies rounding from step to step).
 * Run by test_parallel.sh on 4 ranks. */
#include <mpi.h>

#include "base/rng.h"
#include "base/util.h"
#include "model/backend.h"
#include "parallel/psgd.h"
#include "testing.h"

enum { STEPS = 30, NT = 3 };
static const int rows[NT] = {40, 17, 64}, cols[NT] = {30, 1, 64};

/* A model of the three tensors on the CPU backend, gradients zero. */
static gpt_model *model(gpt_tensor *t) {
  static gpt_model m;
  size_t at = 0;
  for (int i = 0; i < NT; i++) {
    t[i] = (gpt_tensor){.offset = at, .numel = (size_t)rows[i] * (size_t)cols[i], .rows = rows[i], .cols = cols[i], .index = i};
    at += t[i].numel;
  }
  m = (gpt_model){.be = backend_cpu(), .tensors = t, .ntensors = NT, .nparams = at};
  m.grads = calloc(at, sizeof(float));
  return &m;
}

/* Runs the exchange on `nodes` nodes of 4 / nodes ranks (4: one level; 1: one node, no factors, the
 * fp32 sums); the first step's results into out (nparams). */
static void run(int rank, int nodes, float *out) {
  gpt_tensor t[NT];
  gpt_model *m = model(t);
  const size_t n = m->nparams;
  cfg_comm c = {.powersgd_rank = 4, .error_every = 1};
  MPI_Comm intra, cross;
  const int R = 4 / nodes;
  MPI_Comm_split(MPI_COMM_WORLD, rank / R, rank, &intra);
  MPI_Comm_split(MPI_COMM_WORLD, rank % R, rank, &cross);
  psgd *x = psgd_create(m, &c, 7, intra, cross);
  double *in = calloc(n, sizeof *in), *got = calloc(n, sizeof *got);
  rng_state g;
  rng_seed(&g, 11, 99, (uint64_t)rank);
  int vector_sums = 1;
  for (int s = 0; s < STEPS; s++) {
    for (size_t i = 0; i < n; i++) m->grads[i] = (float)rng_normal(&g);
    float *vec = m->grads + t[1].offset, want[17];
    MPI_Allreduce(vec, want, rows[1], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) in[i] += m->grads[i];
    psgd_stats st = {0};
    psgd_exchange(x, s, &st);
    for (int i = 0; i < rows[1]; i++) vector_sums &= fabsf(vec[i] - want[i]) <= 1e-6f * (1 + fabsf(want[i]));
    for (size_t i = 0; i < n; i++) got[i] += m->grads[i];
    if (s == 0) memcpy(out, m->grads, n * sizeof *out);
  }
  /* the identity: sum of results (the same on every replica) + sum of residuals = sum of inputs */
  double *res = calloc(n, sizeof *res), *all_in = calloc(n, sizeof *all_in);
  const float *e = psgd_residual(x);
  for (size_t i = 0; i < n; i++) res[i] = e[i];
  MPI_Allreduce(MPI_IN_PLACE, res, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(in, all_in, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] + res[i] - all_in[i])), scale = fmax(scale, fabs(all_in[i]));
  if (rank == 0) printf("%d node(s) of %d: results + residuals against the inputs' sum over %d steps: %.2e of %.2e\n", nodes, R, STEPS, worst, scale);
  T_CHECK(worst <= 1e-5 * scale, "%d node(s): error feedback's identity is off by %g (of %g)", nodes, worst, scale);
  double rmax = 0;
  for (size_t i = 0; i < n; i++) rmax = fmax(rmax, fabs(res[i]));
  T_CHECK(nodes > 1 || rmax == 0, "one node: its fp32 sums leave a residual of %g", rmax);
  T_CHECK(vector_sums, "%d node(s): the vector is not the replicas' sum", nodes);
  float *lo = malloc(n * sizeof *lo), *hi = malloc(n * sizeof *hi);
  MPI_Allreduce(out, lo, (int)n, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(out, hi, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  T_CHECK(!memcmp(lo, hi, n * sizeof *lo), "%d node(s): the replicas' results differ", nodes);
  free(lo), free(hi), free(res), free(all_in), free(in), free(got);
  psgd_free(x);
  free(m->grads);
}

/* The rank-4 matrix L on every replica, zero residuals: the result is 4 L, the residual zero. */
static void exact_low_rank(int rank) {
  gpt_tensor t[NT];
  gpt_model *m = model(t);
  cfg_comm c = {.powersgd_rank = 4};
  MPI_Comm intra, cross;
  MPI_Comm_dup(MPI_COMM_SELF, &intra), MPI_Comm_dup(MPI_COMM_WORLD, &cross);
  psgd *x = psgd_create(m, &c, 3, intra, cross);
  float *A = malloc(64 * 4 * sizeof *A), *B = malloc(64 * 4 * sizeof *B), *L = calloc(64 * 64, sizeof *L);
  rng_state g;
  rng_seed(&g, 5, 99, 0);
  for (int i = 0; i < 64 * 4; i++) A[i] = (float)rng_normal(&g), B[i] = (float)rng_normal(&g);
  m->be->lowrank_expand(m->be, L, A, B, 64, 64, 4, 0);
  memcpy(m->grads + t[2].offset, L, sizeof(float) * 64 * 64);
  psgd_stats st = {0};
  psgd_exchange(x, 0, &st);
  for (int i = 0; i < 64 * 64; i++) L[i] *= 4;
  const double e = t_rel_err(m->grads + t[2].offset, L, 64 * 64);
  double r = 0;
  for (int i = 0; i < 64 * 64; i++) r = fmax(r, fabs(psgd_residual(x)[t[2].offset + i]) / 4);
  if (rank == 0) printf("a rank-4 matrix on every replica: summed with a relative error of %.2e, residual %.2e\n", e, r);
  T_CHECK(e < 1e-4, "a rank-4 matrix is not summed exactly in one step (rel err %g)", e);
  T_CHECK(r < 1e-3, "a rank-4 matrix leaves a residual of %g", r);
  free(A), free(B), free(L);
  psgd_free(x);
  free(m->grads);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  int rank;
  if (t_need_ranks(4, &rank)) return 77;
  size_t n = 0;
  for (int i = 0; i < NT; i++) n += (size_t)rows[i] * (size_t)cols[i];
  float *flat = malloc(n * sizeof *flat), *two = malloc(n * sizeof *two);
  run(rank, 4, flat);
  run(rank, 2, two);
  double d = t_rel_err(two, flat, n);
  run(rank, 1, two);
  exact_low_rank(rank);
  if (rank == 0) printf("two levels against one: the first step's results differ by %.2e\n", d);
  T_CHECK(d < 1e-4, "two levels differ from one by %g", d);
  free(flat), free(two);
  int rc = rank == 0 ? t_done("test_psgd") : (t_failed ? 1 : 0);
  MPI_Finalize();
  return rc;
}
