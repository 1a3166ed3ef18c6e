/* test_sizes: the size functions at 13B and 20B scale, against 64-bit formulas written out here.
 *
 * Parameter counts, tensor offsets, the activation arena, the backend workspace, a rank's memory
 * in a pipeline x data-parallel layout (stage split, ZeRO-1 pieces, pipeline buffers), the
 * gradient exchange's message bytes and MPI's chunking of messages beyond 2^31 elements. Most
 * results pass 2^32, where a 32-bit product would wrap. Nothing is allocated but the plans.
 *
 * Shapes: GPT-Neo 13B-shaped (C = 5120, 40 layers, 40 heads, V = 50257) and GPT-NeoX-20B-shaped
 * (C = 6144, 44 layers, 64 heads, V = 50432 padded), T = 2048, local layers with a 256 window. */
#include <mpi.h>
#include <stdint.h>

#include "testing.h"
#include "testdeck.h"
#include "parallel/backends.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/grad.h"
#include "parallel/par.h"
#include "parallel/pipe.h"
#include "parallel/qexch.h"
#include "trainer.h"
#include "base/util.h"

typedef unsigned long long u64;

typedef struct {
  const char *name;
  u64 V, T, L, C, H;
} shape;

static const shape S13 = {"13B", 50257, 2048, 40, 5120, 40}, S20 = {"20B", 50432, 2048, 44, 6144, 64};

/* GPT-Neo: per block ln_1 2C, q k v out 4C^2, out bias C, ln_2 2C, c_fc 4C^2 + 4C, c_proj 4C^2 + C */
static u64 neo_block(const shape *s) { return 12 * s->C * s->C + 10 * s->C; }
/* GPT-2: c_attn 3C^2 + 3C, c_proj C^2 + C, the rest as GPT-Neo */
static u64 gpt2_block(const shape *s) { return 12 * s->C * s->C + 13 * s->C; }

static u64 neo_params(const shape *s) { return s->V * s->C + s->T * s->C + s->L * neo_block(s) + 2 * s->C; }

static void shape_of(const shape *s, int arch, gpt_shape *g) {
  memset(g, 0, sizeof *g);
  g->arch = arch;
  g->V = (int)s->V, g->maxT = (int)s->T, g->L = (int)s->L, g->C = (int)s->C, g->H = g->Hkv = (int)s->H;
  g->F = 4 * (int)s->C;
  g->wpe = g->tied = g->out_bias = 1, g->qkv_bias = arch == GPT_ARCH_GPT2;
  g->window = calloc(s->L, sizeof *g->window);
  for (u64 l = 1; arch == GPT_ARCH_NEO && l < s->L; l += 2) g->window[l] = 256;
}

/* Parameter counts and tensor offsets. */
static void check_params(const shape *s) {
  gpt_shape g;
  shape_of(s, GPT_ARCH_NEO, &g);
  u64 n = gpt_count_params(&g);
  T_CHECK(n == neo_params(s), "%s: %llu parameters, expected %llu", s->name, n, neo_params(s));
  T_CHECK(n > (u64)1 << 33, "%s: %llu parameters should pass 2^33", s->name, n);
  int nt;
  gpt_tensor *t = gpt_list_tensors(&g, gpt_whole(&g), &nt);
  const gpt_tensor *last = &t[nt - 1];
  T_CHECK(last->offset + last->numel == n, "%s: the tensors end at %zu, not %llu", s->name, last->offset + last->numel, n);
  /* block l starts after the embeddings and l blocks */
  for (int i = 0; i < nt; i++)
    if (t[i].layer >= 0 && strstr(t[i].name, "ln_1.weight")) {
      u64 want = s->V * s->C + s->T * s->C + (u64)t[i].layer * neo_block(s);
      T_CHECK(t[i].offset == want, "%s: %s at %zu, expected %llu", s->name, t[i].name, t[i].offset, want);
    }
  T_CHECK(t[nt - 4].numel == 4 * s->C * s->C, "%s: %s has %zu elements", s->name, t[nt - 4].name, t[nt - 4].numel);
  free(t);
  /* a middle stage of 11 blocks, without embedding or head */
  gpt_part mid = {11, 22, 0, 0, 1, 0, 0, 1, 0};
  T_CHECK(gpt_part_params(&g, mid) == 11 * neo_block(s), "%s: blocks 11-21 hold %zu", s->name, gpt_part_params(&g, mid));
  gpt_shape_free(&g);
  shape_of(s, GPT_ARCH_GPT2, &g);
  u64 want = s->V * s->C + s->T * s->C + s->L * gpt2_block(s) + 2 * s->C;
  T_CHECK(gpt_count_params(&g) == want, "%s GPT-2: %zu parameters, expected %llu", s->name, gpt_count_params(&g), want);
  gpt_shape_free(&g);
}

/* The activation arena at fp32 (B x T rows a multiple of 16: every buffer is a whole number of
 * 64-byte lines, so the plan is the plain sum). */
static u64 acts_formula(const shape *s, u64 B, int recompute) {
  const u64 N = B * s->T, C = s->C, F = 4 * C, V = s->V;
  u64 block = 4 * (7 * N * C + 4 * N + B * s->H * s->T + 2 * N * F); /* ln1 qkv att mid ln2, stats, lse, fc gel */
  const u64 ldv = (V + GPT_LOGITS_ALIGN - 1) / GPT_LOGITS_ALIGN * GPT_LOGITS_ALIGN; /* the logits' padded rows */
  u64 slot = 4 * (s->L + 1) * N * C + (recompute ? 0 : s->L * block) + 4 * (N * C + 2 * N + N * ldv); /* + the head */
  u64 shared = 4 * (2 * N * C + N * (F > 3 * C ? F : 3 * C)) + 2 * 64 * s->T * 4; /* dres dsmall dbig, the CPU scratch */
  return slot + shared + (recompute ? block : 0);
}

static void check_memory(const shape *s, const backend *fp32, const backend *bf16) {
  gpt_shape g;
  shape_of(s, GPT_ARCH_NEO, &g);
  const u64 B = 16, N = B * s->T, C = s->C, V = s->V, n = neo_params(s);
  for (int rc = 0; rc <= 1; rc++) {
    gpt_part whole = gpt_whole(&g);
    whole.recompute = rc;
    gpt_memory m = gpt_plan_memory(&g, fp32, (int)B, (int)s->T, whole);
    T_CHECK(m.acts == acts_formula(s, B, rc), "%s recompute %d: arena %zu, expected %llu", s->name, rc, m.acts,
            acts_formula(s, B, rc));
    T_CHECK(m.params == 4 * n && m.grads == 4 * n && m.compute == 0, "%s: params %zu grads %zu compute %zu", s->name,
            m.params, m.grads, m.compute);
    /* tokens, targets and losses (N each), the step's two sums (N * 4 bytes is a multiple of 8) */
    T_CHECK(m.io == N * 12 + 16 && m.work == 0, "%s: io %zu work %zu", s->name, m.io, m.work);
    T_CHECK(m.total == m.params + m.grads + m.acts + m.io, "%s: total %zu", s->name, m.total);
  }
  /* the logits alone, 16 x 2048 x V fp32, pass 2^32 bytes */
  T_CHECK(4 * N * V > (u64)1 << 32, "%s: the logits should pass 4 GiB", s->name);
  /* bf16: a compute copy; the CPU workspace widens the operands of its largest op to fp32: the LM
   * head's backward (dinp, dout, inp, w) or the MLP's through gelu (dpre, inp, pre (N,F); dout (N,C); w (C,F)), 6 x
   * 16 floats of alignment */
  gpt_memory m = gpt_plan_memory(&g, bf16, (int)B, (int)s->T, gpt_whole(&g));
  T_CHECK(m.compute == 2 * n, "%s bf16: compute copy %zu, expected %llu", s->name, m.compute, 2 * n);
  const u64 head = 2 * N * C + N * V + V * C, mlp = 3 * N * 4 * C + N * C + 4 * C * C;
  u64 work = 4 * ((head > mlp ? head : mlp) + 6 * 16);
  T_CHECK(m.work == work, "%s bf16: workspace %zu, expected %llu", s->name, m.work, work);
  gpt_shape_free(&g);
}

/* A rank of a 4-stage x 2-replica ZeRO-1 layout: the stage split, what each stage holds, its AdamW
 * piece, the reduce-scatter landing area, the pipeline buffer. */
static void check_layout(const shape *s, const backend *fp32) {
  char deck[1024];
  snprintf(deck, sizeof deck,
           "&job run_dir = 'runs/sizes' /\n"
           "&model arch = 'gpt-neo', vocab_size = %llu, block_size = %llu, n_layer = %llu, n_embd = %llu,\n"
           "  n_head = %llu, attention_types = 'global', 'local', window_size = 256 /\n"
           "&training seq_len = %llu, micro_batch_size = 2, global_batch_size = 16 /\n"
           "&parallel pipeline_stages = 4, zero_stage = 1 /\n"
           "&data train = 'train.nc', val = 'val.nc' /\n",
           s->V, s->T, s->L, s->C, s->H, s->T);
  cfg_config *cfg = t_load_deck(deck, s->name, 8);
  par_layout lay;
  par_plan(&lay, cfg, 8, 0);
  T_CHECK(lay.P == 4 && lay.D == 2 && lay.nmicro == 4, "%s: layout %d x %d, %d micro-batches", s->name, lay.P, lay.D,
          lay.nmicro);
  u64 total = 0;
  for (int st = 0; st < lay.P; st++) {
    gpt_part p = par_stage_part(&lay, st);
    u64 nl = (u64)(p.hi - p.lo);
    T_CHECK(p.lo == lay.lo[st] && nl >= 1 && p.nslots == 4 - st, "%s stage %d: blocks [%d, %d), %d slots",
            s->name, st, p.lo, p.hi, p.nslots);
    u64 n = (st == 0 || st == 3 ? s->V * s->C : 0) + (st == 0 ? s->T * s->C : 0) + nl * neo_block(s) + (st == 3 ? 2 * s->C : 0);
    trainer_memory tm = trainer_plan_memory(cfg, fp32, &lay, st, 0);
    T_CHECK(tm.model.params == 4 * n, "%s stage %d: %zu parameter bytes, expected %llu", s->name, st, tm.model.params, 4 * n);
    T_CHECK(tm.adam == 2 * 4 * (n / 2), "%s stage %d: AdamW %zu bytes, expected %llu", s->name, st, tm.adam, 8 * (n / 2));
    T_CHECK(tm.exchange == 4 * (n - n / 2), "%s stage %d: landing %zu bytes", s->name, st, tm.exchange);
    u64 pipe = st == 0 ? 0 : 2 * s->T * s->C * 4;
    T_CHECK(tm.pipe == pipe, "%s stage %d: pipeline buffer %zu, expected %llu", s->name, st, tm.pipe, pipe);
    T_CHECK(tm.total == tm.model.total + tm.adam + tm.exchange + tm.pipe, "%s stage %d: total", s->name, st);
    T_CHECK(grad_own_params(n, &lay, 1) == n - n / 2, "%s stage %d: replica 1 owns %zu", s->name, st,
            grad_own_params(n, &lay, 1));
    total += n;
  }
  T_CHECK(lay.lo[0] == 0 && lay.lo[4] == (int)s->L, "%s: the stages cover [%d, %d)", s->name, lay.lo[0], lay.lo[4]);
  T_CHECK(total == neo_params(s) + s->V * s->C, "%s: the stages hold %llu (the model and the tied copy)", s->name, total);
  /* the exchange of the whole model's gradients, uncompressed, and the error-feedback residual */
  gpt_shape g;
  shape_of(s, GPT_ARCH_NEO, &g);
  int nt;
  gpt_tensor *t = gpt_list_tensors(&g, gpt_whole(&g), &nt);
  size_t q = qexch_plan_bytes(&cfg->comm, t, nt, 2);
  T_CHECK(q == 4 * neo_params(s), "%s: fp32 exchange of %zu bytes, expected %llu", s->name, q, 4 * neo_params(s));
  cfg_comm c = cfg->comm;
  snprintf(c.method, sizeof c.method, "qsgd");
  c.bits = 4, c.error_feedback = 1;
  T_CHECK(qexch_plan_residual_bytes(&c, neo_params(s), 2) == 4 * neo_params(s), "%s: residual %zu bytes", s->name,
          qexch_plan_residual_bytes(&c, neo_params(s), 2));
  free(t);
  gpt_shape_free(&g);
  par_free(&lay);
  free(cfg);
}

/* MPI's counts are ints: a message of n elements goes in chunks that add up to n. */
static void check_chunks(void) {
  const size_t ns[] = {0, 1, COMM_CHUNK, (size_t)COMM_CHUNK + 1, ((size_t)1 << 34) + 12345};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    size_t sum = 0, i = 0;
    for (; comm_chunk(ns[k], i) > 0; i++) {
      int c = comm_chunk(ns[k], i);
      T_CHECK(c <= COMM_CHUNK, "chunk %zu of %zu: %d elements", i, ns[k], c);
      sum += (size_t)c;
    }
    T_CHECK(sum == ns[k] && i == (ns[k] + COMM_CHUNK - 1) / COMM_CHUNK, "%zu elements in %zu chunks sum to %zu", ns[k], i, sum);
  }
  /* ZeRO pieces of a 20B buffer over 64 replicas tile it */
  const size_t n = 20256485376ull;
  size_t at = 0;
  for (int r = 0; r < 64; r++) {
    T_CHECK(par_piece(n, 64, r) == at, "piece %d starts at %zu, not %zu", r, par_piece(n, 64, r), at);
    at = par_piece(n, 64, r + 1);
  }
  T_CHECK(at == n, "the pieces end at %zu", at);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const backend *fp32 = backend_kind_cpu.open(-1, "fp32"), *bf16 = backend_kind_cpu.open(-1, "bf16");
  const shape *all[] = {&S13, &S20};
  for (int i = 0; i < 2; i++) {
    check_params(all[i]);
    check_memory(all[i], fp32, bf16);
    check_layout(all[i], fp32);
  }
  check_chunks();
  backend_close(fp32);
  backend_close(bf16);
  int rc = t_done("test_sizes");
  MPI_Finalize();
  return rc;
}
