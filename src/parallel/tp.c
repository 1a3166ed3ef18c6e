/* tp: sums and gathers over a tensor-parallel group, on backend memory. */
#include "parallel/tp.h"

#include "base/util.h"

static void tp_sum(void *ctx, float *x, size_t n) {
  tp_group *g = ctx;
  double t0 = util_now();
  float *buf = comm_stage_send(&g->st, 0, x, n);
  comm_allreduce_sum(buf, n, g->comm);
  comm_stage_done(&g->st, 0, x, n);
  g->bytes += (double)n * sizeof(float);
  g->wait_s += util_now() - t0;
}

static void tp_gather(void *ctx, float *all, const float *mine, size_t n) {
  tp_group *g = ctx;
  double t0 = util_now();
  UTIL_CHECK(n <= (size_t)1 << 30, NULL, "internal: a tensor-parallel gather of %zu floats", n);
  const float *buf = comm_stage_send(&g->st, 0, mine, n);
  MPI_Allgather(buf, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, g->comm);
  g->bytes += (double)n * sizeof(float);
  g->wait_s += util_now() - t0;
}

void tp_open(tp_group *g, gpt_model *m, MPI_Comm comm, int B, int T) {
  g->comm = comm;
  g->bytes = g->wait_s = 0.0;
  size_t N = (size_t)B * T, C = (size_t)m->s.C, most = (size_t)(m->s.V + m->tp - 1) / (size_t)m->tp;
  size_t cap = N * C > 2 * N ? N * C : 2 * N;
  comm_stage_init(&g->st, m->be, m->tp > 1 ? (cap > most ? cap : most) : 0, sizeof(float));
  if (m->tp > 1) gpt_set_tp_comm(m, &(gpt_tp_comm){tp_sum, tp_gather, g});
}

void tp_close(tp_group *g) { comm_stage_free(&g->st); }

double tp_floats_per_micro(const gpt_shape *s, gpt_part part, int N) {
  if (part.tp <= 1) return 0.0;
  int sums = (part.recompute ? 5 : 4) * (part.hi - part.lo) + (part.has_embed ? 1 : 0) + (part.has_head ? 1 : 0);
  return (double)sums * N * s->C;
}
