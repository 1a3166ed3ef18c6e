/* pipe: 1F1B schedule with non-blocking neighbour messages. */
#include "parallel/pipe.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

enum { TAG_FWD = 0, TAG_BWD = 1 };
static int tag(int k, int dir) { return 2 * k + dir; }

size_t pipe_bytes(const gpt_shape *s, gpt_part part, int B, int T, size_t esize) {
  return part.has_embed ? 0 : (size_t)B * T * s->C * esize;
}

/* Activations and their gradients travel in the storage type, as rows of C elements (pipe_state.row). */
static size_t elem_bytes(const gpt_model *m) { return backend_dtype_size(m->be->storage); }

void pipe_init(pipe_state *p, const par_layout *lay, gpt_model *m, int B, int T) {
  memset(p, 0, sizeof *p);
  p->lay = lay;
  p->model = m;
  p->B = B;
  p->T = T;
  /* pinned where the backend has devices: the copies to the device go straight from them, queued */
  p->tokens = m->be->host_alloc(m->be, (size_t)PIPE_BATCH_BUFS * B * T * sizeof(int32_t));
  p->targets = m->be->host_alloc(m->be, (size_t)PIPE_BATCH_BUFS * B * T * sizeof(int32_t));
  gpt_part part = gpt_model_part(m);
  size_t nb = pipe_bytes(&m->s, part, B, T, elem_bytes(m));
  p->bsend = nb ? m->be->alloc(m->be, nb) : NULL;
  p->fsend = util_malloc((size_t)m->nslots * sizeof(MPI_Request), "sends");
  for (int i = 0; i < m->nslots; i++) p->fsend[i] = MPI_REQUEST_NULL;
  p->bsend_req = MPI_REQUEST_NULL;
  const size_t x = (size_t)B * T * m->s.C; /* one micro-batch's activations */
  comm_stage_init(&p->fst, m->be, m->has_head ? 0 : (size_t)m->nslots * x, elem_bytes(m));
  comm_stage_init(&p->rst, m->be, m->has_embed && m->has_head ? 0 : x, elem_bytes(m));
  comm_stage_init(&p->bst, m->be, m->has_embed ? 0 : x, elem_bytes(m));
  MPI_Type_contiguous(m->s.C * (int)elem_bytes(m), MPI_BYTE, &p->row);
  MPI_Type_commit(&p->row);
}

void pipe_free(pipe_state *p) {
  p->model->be->host_free(p->model->be, p->tokens);
  p->model->be->host_free(p->model->be, p->targets);
  if (p->bsend) p->model->be->free(p->model->be, p->bsend);
  free(p->fsend);
  comm_stage_free(&p->fst);
  comm_stage_free(&p->rst);
  comm_stage_free(&p->bst);
  MPI_Type_free(&p->row);
  memset(p, 0, sizeof *p);
}

static void timed_wait(pipe_state *p, MPI_Request *r) {
  if (*r == MPI_REQUEST_NULL) return;
  double t0 = util_now();
  MPI_Wait(r, MPI_STATUS_IGNORE);
  p->st.wait_s += util_now() - t0;
}

/* A pass that began at t0 is queued: with pipeline stages it is waited for and timed (the bubble's figure needs
 * it); a single stage goes on without waiting (pipe_train_step waits once and times the whole schedule). */
static void staged(pipe_state *p, double t0) {
  if (p->lay->P == 1) return;
  p->model->be->sync(p->model->be);
  p->st.compute_s += util_now() - t0;
}

/* Micro-batch k forward: receive or read its input, run the stage, pass it on. */
static void forward(pipe_state *p, int k, int B, int T, float dscale, pipe_batch_fn batch, void *bctx) {
  gpt_model *m = p->model;
  const int slot = k % m->nslots, stage = p->lay->stage, rows = B * T;
  const size_t n = (size_t)rows * (size_t)m->s.C, bytes = n * elem_bytes(m);
  timed_wait(p, &p->fsend[slot]); /* the slot's output is about to be overwritten */
  if (m->has_embed || m->has_head) {
    if (p->nfilled == PIPE_BATCH_BUFS) m->be->sync(m->be), p->nfilled = 0; /* every queued copy has left */
    const size_t at = (size_t)p->nfilled++ * p->B * p->T;
    batch(bctx, k, p->tokens + at, p->targets + at);
    gpt_set_batch(m, slot, m->has_embed ? p->tokens + at : NULL, m->has_head ? p->targets + at : NULL, B, T);
  }
  if (!m->has_embed) {
    MPI_Request r;
    void *in = gpt_input(m, slot, B, T);
    MPI_Irecv(comm_stage_recv(&p->rst, 0, in), rows, p->row, stage - 1, tag(k, TAG_FWD), p->lay->pipe, &r);
    timed_wait(p, &r);
    comm_stage_done(&p->rst, 0, in, n);
  }
  double t0 = util_now();
  gpt_forward(m, slot, B, T);
  if (m->has_head) gpt_loss(m, slot, B, T, dscale);
  staged(p, t0);
  if (!m->has_head) {
    void *buf = comm_stage_send(&p->fst, (size_t)slot * p->B * p->T * m->s.C, gpt_output(m, slot, B, T), n);
    MPI_Isend(buf, rows, p->row, stage + 1, tag(k, TAG_FWD), p->lay->pipe, &p->fsend[slot]);
    p->st.bytes += (double)bytes;
  }
}

/* Micro-batch k backward: receive the output gradient, run the stage, send the input gradient. */
static void backward(pipe_state *p, int k, gpt_hook hook, void *hctx) {
  gpt_model *m = p->model;
  const int slot = k % m->nslots, stage = p->lay->stage, rows = p->B * p->T;
  const size_t n = (size_t)rows * (size_t)m->s.C, bytes = n * elem_bytes(m);
  if (!m->has_head) {
    MPI_Request r;
    MPI_Irecv(comm_stage_recv(&p->rst, 0, gpt_grad_output(m)), rows, p->row, stage + 1, tag(k, TAG_BWD), p->lay->pipe,
              &r);
    timed_wait(p, &r);
    comm_stage_done(&p->rst, 0, gpt_grad_output(m), n);
  }
  double t0 = util_now();
  gpt_backward(m, slot, p->B, p->T, hook, hctx);
  staged(p, t0);
  if (!m->has_embed) {
    timed_wait(p, &p->bsend_req);
    m->be->copy(m->be, p->bsend, gpt_grad_input(m), bytes);
    MPI_Isend(comm_stage_send(&p->bst, 0, p->bsend, n), rows, p->row, stage - 1, tag(k, TAG_BWD), p->lay->pipe,
              &p->bsend_req);
    p->st.bytes += (double)bytes;
  }
}

static void drain(pipe_state *p) {
  for (int i = 0; i < p->model->nslots; i++) timed_wait(p, &p->fsend[i]);
  timed_wait(p, &p->bsend_req);
}

void pipe_train_step(pipe_state *p, int nmicro, float dscale, pipe_batch_fn batch, void *bctx, gpt_hook hook,
                     void *hctx) {
  const int P = p->lay->P, s = p->lay->stage;
  const int warm = P - s - 1 < nmicro ? P - s - 1 : nmicro;
  const double t0 = util_now();
  int f = 0, b = 0; /* next forward, next backward */
  for (; f < warm; f++) forward(p, f, p->B, p->T, dscale, batch, bctx);
  while (f < nmicro) { /* steady state: one forward, one backward */
    forward(p, f++, p->B, p->T, dscale, batch, bctx);
    backward(p, b, b == nmicro - 1 ? hook : NULL, hctx);
    b++;
  }
  for (; b < nmicro; b++) backward(p, b, b == nmicro - 1 ? hook : NULL, hctx); /* cool-down */
  drain(p);
  if (P == 1) { /* queued without a wait between passes: one wait, and the schedule's time */
    p->model->be->sync(p->model->be);
    p->st.compute_s += util_now() - t0;
  }
}

double pipe_eval(pipe_state *p, int n, pipe_batch_fn batch, void *bctx) {
  gpt_sums_clear(p->model);
  for (int k = 0; k < n; k++) {
    forward(p, k, p->B, p->T, 0.0f, batch, bctx);
    drain(p); /* forward-only: a slot is free again as soon as its activations left */
  }
  double sums[2];
  gpt_sums_read(p->model, sums);
  return sums[0];
}

void pipe_forward_one(pipe_state *p, const int32_t *tokens, int t, float *logits) {
  gpt_model *m = p->model;
  const int stage = p->lay->stage;
  const size_t n = (size_t)t * (size_t)m->s.C;
  if (m->has_embed) gpt_set_batch(m, 0, tokens, NULL, 1, t);
  if (!m->has_embed) {
    void *in = gpt_input(m, 0, 1, t);
    MPI_Recv(comm_stage_recv(&p->rst, 0, in), t, p->row, stage - 1, tag(0, TAG_FWD), p->lay->pipe, MPI_STATUS_IGNORE);
    comm_stage_done(&p->rst, 0, in, n);
  }
  gpt_forward(m, 0, 1, t);
  if (!m->has_head)
    MPI_Send(comm_stage_send(&p->fst, 0, gpt_output(m, 0, 1, t), n), t, p->row, stage + 1, tag(0, TAG_FWD),
             p->lay->pipe);
  else gpt_logits_row(m, 0, (size_t)(t - 1), logits);
}

pipe_stats pipe_take_stats(pipe_state *p) {
  pipe_stats s = p->st;
  memset(&p->st, 0, sizeof p->st);
  return s;
}
