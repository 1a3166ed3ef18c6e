/* test_scaler: dynamic loss scaling (&system precision = 'fp16'), on the CPU backend.
 *
 *   1. The update rule (optim_scaler): an overflow skips the step and halves the scale, `window`
 *      good steps in a row double it, a scale that would fall below 1 is a divergence, and a
 *      disabled scaler stays at 1 and reports any overflow as a divergence.
 *   2. A tiny GPT-Neo trained with the scaling logic at loss scale 1024 ends bit for bit where the
 *      unscaled run ends: the scales are powers of two, so scaling and unscaling are exact.
 *   3. An injected overflow: a loss scale of 2^140 makes the loss gradient infinite in float. Steps
 *      are skipped (parameters untouched) and the scale halved until the gradients are finite;
 *      from then on every step follows the rule, and the loss falls. A checkpoint carries the
 *      scale and a restart continues with it.
 * cfg_load refuses precision = 'fp16' on the CPU backend (which computes in fp32); this test sets
 * the field afterwards to drive the trainer's scaling logic with CPU arithmetic. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "deck/cfg.h"
#include "model/optim.h"
#include "text/prepare.h"
#include "testing.h"
#include "testdeck.h"
#include "trainer.h"
#include "base/util.h"

static void test_rule(void) {
  optim_scaler s;
  optim_scaler_init(&s, 0, 65536.0, 2);
  T_CHECK(s.scale == 1.0, "disabled scaler starts at %g, not 1", s.scale);
  T_CHECK(optim_scaler_update(&s, 1) == 1 && optim_scaler_update(&s, 1) == 1 && s.scale == 1.0,
          "disabled scaler changed its scale to %g", s.scale);
  T_CHECK(optim_scaler_update(&s, 0) == -1, "disabled scaler does not report an overflow as divergence");

  optim_scaler_init(&s, 1, 8.0, 3);
  T_CHECK(optim_scaler_update(&s, 1) == 1 && optim_scaler_update(&s, 1) == 1 && s.scale == 8.0,
          "the scale changed before the window was full: %g", s.scale);
  T_CHECK(optim_scaler_update(&s, 1) == 1 && s.scale == 16.0, "3 good steps of window 3 did not double 8: %g", s.scale);
  T_CHECK(optim_scaler_update(&s, 1) == 1 && optim_scaler_update(&s, 0) == 0 && s.scale == 8.0,
          "an overflow did not skip and halve 16: %g", s.scale);
  T_CHECK(optim_scaler_update(&s, 1) == 1 && optim_scaler_update(&s, 1) == 1 && s.scale == 8.0,
          "the good-step count did not restart after the overflow: %g", s.scale);
  optim_scaler_init(&s, 1, 2.0, 100);
  T_CHECK(optim_scaler_update(&s, 0) == 0 && s.scale == 1.0, "2 did not halve to 1: %g", s.scale);
  T_CHECK(optim_scaler_update(&s, 0) == -1, "an overflow at scale 1 is not a divergence");
}

static cfg_config *deck(const char *dir, double loss_scale, long window) {
  char text[8192];
  const char *top = getenv("TOP_SRCDIR");
  snprintf(text, sizeof text,
           "&job task = 'prepare', 'train', seed = 7, run_dir = '%s/run' /\n"
           "&prepare input = '%s/tests/data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,\n"
           "  train_out = '%s/train.nc', val_out = '%s/val.nc' /\n"
           "&model vocab_size = 256, block_size = 32, n_layer = 2, n_embd = 32, n_head = 4,\n"
           "  attention_types = 'global', 'local', window_size = 8 /\n"
           "&training seq_len = 32, micro_batch_size = 2, global_batch_size = 8, max_steps = 1000,\n"
           "  lr = 3e-3, min_lr = 3e-4, warmup_steps = 2, grad_clip = 1.0, eval_batches = 2 /\n"
           "&system loss_scale = %.17g, loss_scale_window = %ld /\n",
           dir, top ? top : ".", dir, dir, loss_scale, window);
  return t_load_deck(text, "scaler.nml", 1);
}

static trainer *open_trainer(cfg_config *c, const char *precision) {
  util_strlcpy(c->system.precision, precision, sizeof c->system.precision);
  err_list e = {0};
  trainer *t = trainer_open(c, backend_cpu(), MPI_COMM_SELF, &e);
  err_print(&e, 10);
  err_free(&e);
  T_CHECK(t != NULL, "trainer_open failed");
  return t;
}

/* Train `steps` steps; the losses go to loss (may be NULL). Returns the parameters. */
static float *train(trainer *t, int steps, double *loss, size_t *n) {
  for (int s = 0; s < steps; s++) {
    trainer_step_info info;
    T_CHECK(trainer_step(t, s, &info) == 0, "step %d diverged", s);
    T_CHECK(!info.skipped, "step %d skipped at loss scale %g", s, info.loss_scale);
    if (loss) loss[s] = info.loss;
  }
  return trainer_gather_params(t, n);
}

/* 2: scale 1024 reproduces the unscaled run exactly */
static void test_exact(const char *dir) {
  enum { STEPS = 6 };
  double l32[STEPS], l16[STEPS];
  size_t n32, n16;
  cfg_config *c = deck(dir, 1024, 1000000);
  trainer *t = open_trainer(c, "fp32");
  float *p32 = t ? train(t, STEPS, l32, &n32) : NULL;
  trainer_close(t);
  t = open_trainer(c, "fp16");
  float *p16 = t ? train(t, STEPS, l16, &n16) : NULL;
  trainer_close(t);
  T_CHECK(p32 && p16 && n32 == n16 && memcmp(p32, p16, n32 * sizeof(float)) == 0,
          "loss scale 1024 changed the parameters (relative difference %.3g)",
          p32 && p16 ? t_rel_err(p16, p32, n32) : INFINITY);
  T_CHECK(memcmp(l32, l16, sizeof l32) == 0, "loss scale 1024 changed the losses: %.9g vs %.9g", l16[STEPS - 1],
          l32[STEPS - 1]);
  printf("loss scale 1024: %d steps bit for bit as unscaled (final loss %.5f)\n", STEPS, l16[STEPS - 1]);
  free(p32), free(p16), free(c);
}

/* 3: an overflow injected by a huge initial scale; skipped steps, the rule, a checkpoint */
static void test_overflow(const char *dir) {
  enum { STEPS = 160, WINDOW = 4 };
  cfg_config *c = deck(dir, ldexp(1.0, 140), WINDOW);
  trainer *t = open_trainer(c, "fp16");
  if (!t) return;
  size_t n;
  float *before = trainer_gather_params(t, &n);
  double expect = ldexp(1.0, 140), first_loss = NAN, last_loss = NAN;
  int good = 0, skipped = 0, applied = 0, first_applied = -1, bad_rule = 0;
  char ckpt[CFG_STR_LEN] = "";
  double ckpt_scale = 0, final_loss = NAN; /* the scale after the checkpointed step; the last step's loss */
  for (int s = 0; s < STEPS; s++) {
    trainer_step_info info;
    int rc = trainer_step(t, s, &info);
    T_CHECK(rc == 0, "step %d diverged at loss scale %g", s, info.loss_scale);
    if (rc != 0) break;
    if (info.loss_scale != expect) bad_rule++;
    final_loss = info.loss;
    if (s == 0) {
      float *after = trainer_gather_params(t, &n);
      T_CHECK(info.skipped, "the first step (loss scale 2^140: infinite loss gradient) was not skipped");
      T_CHECK(memcmp(before, after, n * sizeof(float)) == 0, "a skipped step changed the parameters");
      free(after);
    }
    if (info.skipped) {
      skipped++;
      expect /= 2, good = 0;
    } else {
      if (first_applied < 0) first_applied = s, first_loss = info.loss;
      applied++;
      last_loss = info.loss;
      if (++good == WINDOW) expect *= 2, good = 0;
    }
    if (s == STEPS - 2) { /* a checkpoint before the last step: the restart must repeat it */
      ckpt_stats st;
      err_list cerr = {0};
      T_CHECK(trainer_checkpoint(t, s + 1, 0.0, &st, &cerr) == 0, "checkpoint: %s", cerr.n ? cerr.v[0].msg : "");
      err_free(&cerr);
      util_strlcpy(ckpt, st.path, sizeof ckpt);
      ckpt_scale = expect;
    }
  }
  T_CHECK(bad_rule == 0, "%d steps used a loss scale the rule does not give", bad_rule);
  T_CHECK(applied > 0 && skipped > 0, "%d steps applied, %d skipped", applied, skipped);
  T_CHECK(isfinite(last_loss) && last_loss < first_loss, "the loss did not fall after the overflows: %g -> %g",
          first_loss, last_loss);
  printf("loss scale 2^140: %d steps skipped (first update at step %d, scale 2^%.0f), %d applied; loss %.4f -> %.4f; "
         "final scale 2^%.0f\n", skipped, first_applied + 1, log2(ldexp(1.0, 140)) - first_applied, applied, first_loss,
         last_loss, log2(expect));
  trainer_close(t);
  /* the restart takes the loss scale of the checkpoint, not the deck's */
  trainer *r = open_trainer(c, "fp16");
  if (r && ckpt[0]) {
    long step;
    double tokens;
    ckpt_stats st;
    err_list e = {0};
    T_CHECK(trainer_restore(r, ckpt, &step, &tokens, &st, &e) == 0, "restart from %s failed", ckpt);
    err_print(&e, 10);
    err_free(&e);
    trainer_step_info info;
    T_CHECK(trainer_step(r, step, &info) == 0, "the restarted step diverged");
    T_CHECK(info.loss_scale == ckpt_scale, "the restart used loss scale %g, not the checkpoint's %g", info.loss_scale,
            ckpt_scale);
    T_CHECK(info.loss == final_loss, "the restarted step's loss %.9g is not the original's %.9g", info.loss, final_loss);
  }
  trainer_close(r);
  free(before), free(c);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *out = getenv("TEST_OUT");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/scaler", out ? out : "tests/out");
  util_mkdir_p(dir);
  test_rule();
  cfg_config *c = deck(dir, 65536, 2000);
  err_list perr = {0};
  T_CHECK(prepare_run(c, MPI_COMM_SELF, &perr) == 0, "prepare failed");
  err_print(&perr, 10);
  err_free(&perr);
  free(c);
  test_exact(dir);
  test_overflow(dir);
  int rc = t_done("test_scaler");
  MPI_Finalize();
  return rc;
}
