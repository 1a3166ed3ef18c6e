/* test_model: properties of the model that the reference fixtures do not cover:
 *   - the dry run's memory plan equals what the backend really allocates (also for inference: weights
 *     only, and the generator's KV caches);
 *   - seeded initialisation is bitwise repeatable and independent of which layers a rank holds;
 *   - causality: a prefix forward gives the same logits as the full sequence at those positions;
 *   - gradient accumulation over micro-batches equals one larger batch. */
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deck/cfg.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "base/rng.h"
#include "testing.h"
#include "base/util.h"

static void shape_of(gpt_shape *s, const char *arch, int L, int C, int H, int V, int maxT, int window) {
  cfg_model mc;
  cfg_model_defaults(&mc);
  strcpy(mc.arch, arch);
  mc.vocab_size = V, mc.block_size = maxT, mc.n_layer = L, mc.n_embd = C, mc.n_head = H;
  mc.window_size = window, mc.layer_norm_epsilon = 1e-5, mc.init_std = 0.02;
  strcpy(mc.attention_types.v[0], "global");
  strcpy(mc.attention_types.v[1], "local");
  mc.attention_types.n = strcmp(arch, "gpt2") ? 2 : 1;
  gpt_shape_from_cfg(s, &mc);
}

static void test_memory_plan(const char *precision) {
  const struct {
    const char *arch;
    int L, C, H, V, maxT, B, T;
  } cases[] = {{"gpt-neo", 2, 32, 4, 67, 24, 2, 16}, {"gpt2", 3, 48, 6, 101, 64, 3, 64}, {"gpt-neo", 4, 64, 4, 256, 128, 5, 100}};
  for (int i = 0; i < 3; i++) {
    gpt_shape s;
    shape_of(&s, cases[i].arch, cases[i].L, cases[i].C, cases[i].H, cases[i].V, cases[i].maxT, 8);
    /* the whole model; a first stage with 3 activation slots; a last stage; the first stage with
     * recomputation (one block's inner activations instead of one per block and slot); the whole
     * model for inference (weights only); tensor rank 1 of 2 of the whole model, and of a last stage with
     * recomputation */
    gpt_part parts[7] = {gpt_whole(&s),
                         {0, s.L - 1, 1, 0, 3, 0, 0, 1, 0},
                         {s.L - 1, s.L, 0, 1, 1, 0, 0, 1, 0},
                         {0, s.L - 1, 1, 0, 3, 1, 0, 1, 0},
                         {0, s.L, 1, 1, 1, 0, 1, 1, 0},
                         {0, s.L, 1, 1, 1, 0, 0, 2, 1},
                         {s.L - 1, s.L, 0, 1, 2, 1, 0, 2, 1}};
    for (int k = 0; k < 7; k++) {
      const backend *counting = t_counting_backend(precision, 0); /* a fresh instance: its workspace is counted */
      gpt_memory plan = gpt_plan_memory(&s, counting, cases[i].B, cases[i].T, parts[k]);
      t_counted = 0;
      gpt_model m;
      gpt_init(&m, &s, counting, cases[i].B, cases[i].T, parts[k], 7);
      T_CHECK(t_counted == plan.total, "%s %s case %d part %d: planned %zu bytes, allocated %zu", precision,
              cases[i].arch, i, k, plan.total, t_counted);
      T_CHECK(plan.params == m.nparams * sizeof(float) && m.nparams == gpt_part_params(&s, parts[k]), "parameter bytes");
      T_CHECK(plan.compute == (strcmp(precision, "fp32") ? m.nparams * 2 : 0), "%s: compute copy %zu bytes", precision,
              plan.compute);
      if (k == 3) {
        gpt_memory kept = gpt_plan_memory(&s, counting, cases[i].B, cases[i].T, parts[1]);
        T_CHECK(plan.acts < kept.acts, "recomputation plans %zu activation bytes, not fewer than %zu", plan.acts, kept.acts);
      }
      if (k == 4) { /* the generator's KV caches and pass: planned exactly too */
        T_CHECK(plan.grads == 0 && plan.acts == 0 && plan.work == 0, "an inference model plans only its weights");
        gen_memory gp = gen_plan_memory(&s, counting, 3, cases[i].maxT, GEN_CACHE);
        t_counted = 0;
        gen g;
        gen_open(&g, &m, 3, cases[i].maxT, NULL, 1, GEN_CACHE);
        T_CHECK(t_counted == gp.total && gp.cache > 0, "%s %s case %d generator: planned %zu bytes, allocated %zu",
                precision, cases[i].arch, i, gp.total, t_counted);
        gen_close(&g);
      }
      gpt_free(&m);
    }
    gpt_shape_free(&s);
  }
}

static void test_init(void) {
  gpt_shape s;
  shape_of(&s, "gpt-neo", 3, 32, 4, 50, 16, 4);
  gpt_model a, b, c, part;
  gpt_init(&a, &s, backend_cpu(), 1, 8, gpt_whole(&s), 11);
  gpt_init(&b, &s, backend_cpu(), 1, 8, gpt_whole(&s), 11);
  gpt_init(&c, &s, backend_cpu(), 1, 8, gpt_whole(&s), 12);
  gpt_init(&part, &s, backend_cpu(), 1, 8, (gpt_part){1, 2, 0, 0, 1, 0, 0, 1, 0}, 11); /* block 1 only */
  T_CHECK(!memcmp(a.params, b.params, a.nparams * sizeof(float)), "same seed, same parameters");
  T_CHECK(memcmp(a.params, c.params, a.nparams * sizeof(float)) != 0, "another seed, other parameters");
  gpt_block_ptrs pa, pp;
  gpt_block(&a, a.params, 1, &pa);
  gpt_block(&part, part.params, 1, &pp);
  size_t n = part.nparams;
  T_CHECK(!memcmp(pa.ln1_w, pp.ln1_w, n * sizeof(float)), "block 1 initialised the same when held alone");
  T_CHECK(part.ntensors == 13 && gpt_find_tensor(&part, "transformer.wte.weight") == NULL, "only block 1 held");
  /* statistics of the normal initialisation */
  const gpt_tensor *t = gpt_find_tensor(&a, "transformer.h.0.mlp.c_fc.weight");
  double s1 = 0, s2 = 0;
  for (size_t i = 0; i < t->numel; i++) {
    s1 += a.params[t->offset + i];
    s2 += (double)a.params[t->offset + i] * a.params[t->offset + i];
  }
  double sd = sqrt(s2 / t->numel - (s1 / t->numel) * (s1 / t->numel));
  T_CHECK(fabs(sd - 0.02) < 0.002 && fabs(s1 / t->numel) < 0.002, "init std %.4f mean %.4f", sd, s1 / t->numel);
  gpt_free(&a), gpt_free(&b), gpt_free(&c), gpt_free(&part);
  gpt_shape_free(&s);
}

static void test_causality(void) {
  gpt_shape s;
  shape_of(&s, "gpt-neo", 2, 32, 4, 40, 16, 3);
  gpt_model m;
  gpt_init(&m, &s, backend_cpu(), 2, 12, gpt_whole(&s), 5);
  int32_t tok[24];
  rng_state r;
  rng_seed(&r, 3, 0, 0);
  for (int i = 0; i < 24; i++) tok[i] = (int32_t)rng_below(&r, 40);
  gpt_set_batch(&m, 0, tok, NULL, 2, 12);
  gpt_forward(&m, 0, 2, 12);
  size_t n = (size_t)12 * 40;
  float *full = t_logits(&m, 0, 24);
  /* the second sequence, first 7 tokens, alone */
  gpt_set_batch(&m, 0, tok + 12, NULL, 1, 7);
  gpt_forward(&m, 0, 1, 7);
  float *part = t_logits(&m, 0, 7);
  double e = t_rel_err(part, full + n, (size_t)7 * 40);
  T_CHECK(e < 1e-6, "prefix logits differ from the full sequence's: %.3g", e);
  /* changing a later token leaves earlier logits unchanged */
  tok[12 + 10] = (tok[12 + 10] + 1) % 40;
  gpt_set_batch(&m, 0, tok, NULL, 2, 12);
  gpt_forward(&m, 0, 2, 12);
  float *again = t_logits(&m, 0, 24);
  e = t_rel_err(again + n, full + n, (size_t)10 * 40);
  T_CHECK(e == 0.0, "a later token changed earlier logits: %.3g", e);
  free(full), free(part), free(again);
  gpt_free(&m);
  gpt_shape_free(&s);
}

static void test_accumulation(void) {
  gpt_shape s;
  shape_of(&s, "gpt-neo", 2, 32, 4, 40, 16, 3);
  gpt_model big, small, fresh;
  gpt_init(&big, &s, backend_cpu(), 2, 10, gpt_whole(&s), 9);
  gpt_init(&small, &s, backend_cpu(), 1, 10, gpt_whole(&s), 9);
  gpt_init(&fresh, &s, backend_cpu(), 2, 10, gpt_whole(&s), 9); /* gradients as allocated: zero */
  for (size_t i = 0; i < big.nparams; i++) big.grads[i] = small.grads[i] = 7.0f; /* a last step's, to be cleared */
  int32_t x[20], y[20];
  rng_state r;
  rng_seed(&r, 4, 0, 0);
  for (int i = 0; i < 20; i++) x[i] = (int32_t)rng_below(&r, 40), y[i] = (int32_t)rng_below(&r, 40);
  const float dscale = 1.0f / 20;
  gpt_zero_grad(&big);
  gpt_sums_clear(&big);
  gpt_set_batch(&big, 0, x, y, 2, 10);
  gpt_forward(&big, 0, 2, 10);
  gpt_loss(&big, 0, 2, 10, dscale);
  gpt_backward(&big, 0, 2, 10, NULL, NULL);
  gpt_zero_grad(&small);
  gpt_sums_clear(&small);
  for (int k = 0; k < 2; k++) { /* the losses' sums accumulate over the micro-batches */
    gpt_set_batch(&small, 0, x + 10 * k, y + 10 * k, 1, 10);
    gpt_forward(&small, 0, 1, 10);
    gpt_loss(&small, 0, 1, 10, dscale);
    gpt_backward(&small, 0, 1, 10, NULL, NULL);
  }
  double sb[2], ss[2];
  gpt_sums_read(&big, sb), gpt_sums_read(&small, ss);
  const double lb = sb[0], ls = ss[0];
  T_CHECK(fabs(lb - ls) < 1e-5 * fabs(lb) && lb > 0, "loss %.8f vs %.8f", lb, ls);
  double e = t_rel_err(small.grads, big.grads, big.nparams);
  T_CHECK(e < 1e-5, "accumulated gradients differ from the big batch's: %.3g", e);
  /* gpt_zero_grad then a pass (written, not added) equals a pass on zeroed gradients, bit for bit */
  gpt_set_batch(&fresh, 0, x, y, 2, 10);
  gpt_forward(&fresh, 0, 2, 10);
  gpt_loss(&fresh, 0, 2, 10, dscale);
  gpt_backward(&fresh, 0, 2, 10, NULL, NULL);
  T_CHECK(!memcmp(fresh.grads, big.grads, big.nparams * sizeof(float)),
          "gradients after gpt_zero_grad and a backward pass differ from those of zeroed gradients");
  gpt_free(&big), gpt_free(&small), gpt_free(&fresh);
  gpt_shape_free(&s);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  test_memory_plan("fp32");
  test_memory_plan("bf16");
  test_memory_plan("fp16");
  test_init();
  test_causality();
  test_accumulation();
  int rc = t_done("test_model");
  MPI_Finalize();
  return rc;
}
