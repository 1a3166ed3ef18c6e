/* greenlm-bench: training-step throughput and MFU of one rank for a model shape, against this
 * machine's measured SGEMM peak (or a given peak).
 *
 *   greenlm-bench --layers 12 --embd 768 --heads 12 --vocab 50304 --batch 4 --seq 64 --threads 1
 *   greenlm-bench --backend cuda --precision bf16 --peak 989000 --layers 24 --embd 2048 --heads 16 ...
 *
 * Each step is a full training step on random tokens: forward, fused softmax cross-entropy,
 * backward, global gradient norm and AdamW over all parameters. The first --warmup steps are not
 * timed; the median of the timed steps is reported. MFU = tokens/s * (6N + 12 L C T) / peak, N
 * without the position embedding, peak = the best n x n GEMM rate (at the precision) with the same
 * thread count, measured before and after the steps, or --peak GFLOP/s (a GPU's datasheet peak). --profile times every backend op. Output: a human-readable block and one
 * "result:" line of key=value pairs for scripts (run/bench collects them). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h" /* first: GREENLM_HAVE_CUDA decides what backend.h declares */
#include "model/backend.h"
#include "deck/cfg.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "base/rng.h"
#include "base/util.h"

/* ---- --profile: a backend table that times every op ------------------------------------------ */

static const backend *prof_inner;
static int prof_vocab; /* matmuls with M == vocab are the tied LM head, reported apart */
enum { P_EMBED_F, P_EMBED_B, P_LN_F, P_LN_B, P_MM_F, P_MM_B, P_HEAD_F, P_HEAD_B, P_ATT_F, P_ATT_B, P_GELU_F,
       P_GELU_B, P_RES, P_ACC, P_XENT, P_ADAMW, P_SUMSQ, P_ZERO, P_NOPS };
static const char *prof_name[P_NOPS] = {"embedding fwd", "embedding bwd", "layernorm fwd", "layernorm bwd",
                                        "matmul fwd", "matmul bwd", "lm head matmul fwd", "lm head matmul bwd",
                                        "attention fwd", "attention bwd", "gelu fwd", "gelu bwd", "residual",
                                        "accumulate", "softmax+xent", "adamw", "sumsq", "zero"};
static double prof_t[P_NOPS];
static long prof_n[P_NOPS];
static double prof_start(void) { return util_now(); }
static void prof_stop(int op, double t0) {
  prof_inner->sync();
  prof_t[op] += util_now() - t0;
  prof_n[op]++;
}
#define PROF(op, call)                                                                             \
  do {                                                                                             \
    double t0_ = prof_start();                                                                     \
    call;                                                                                          \
    prof_stop(op, t0_);                                                                            \
  } while (0)

static void p_embed_fwd(float *o, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C) {
  PROF(P_EMBED_F, prof_inner->embed_fwd(o, tok, wte, wpe, B, T, C));
}
static void p_embed_bwd(float *dwte, float *dwpe, const float *d, const int32_t *tok, int B, int T, int C) {
  PROF(P_EMBED_B, prof_inner->embed_bwd(dwte, dwpe, d, tok, B, T, C));
}
static void p_ln_fwd(float *o, float *m, float *r, const float *x, const float *w, const float *b, int N, int C,
                     float eps) {
  PROF(P_LN_F, prof_inner->layernorm_fwd(o, m, r, x, w, b, N, C, eps));
}
static void p_ln_bwd(float *dx, float *dw, float *db, const float *d, const float *x, const float *w, const float *m,
                     const float *r, int N, int C) {
  PROF(P_LN_B, prof_inner->layernorm_bwd(dx, dw, db, d, x, w, m, r, N, C));
}
static void p_mm_fwd(float *o, const float *x, const float *w, const float *b, int N, int K, int M) {
  PROF(M == prof_vocab ? P_HEAD_F : P_MM_F, prof_inner->matmul_fwd(o, x, w, b, N, K, M));
}
static void p_mm_bwd(float *dx, float *dw, float *db, const float *d, const float *x, const float *w, int N, int K,
                     int M) {
  PROF(M == prof_vocab ? P_HEAD_B : P_MM_B, prof_inner->matmul_bwd(dx, dw, db, d, x, w, N, K, M));
}
static void p_att_fwd(float *o, float *lse, const float *qkv, float *s, int B, int T, int C, int H, int w, float sc) {
  PROF(P_ATT_F, prof_inner->attention_fwd(o, lse, qkv, s, B, T, C, H, w, sc));
}
static void p_att_bwd(float *dqkv, const float *d, const float *o, const float *lse, const float *qkv, float *s, int B,
                      int T, int C, int H, int w, float sc) {
  PROF(P_ATT_B, prof_inner->attention_bwd(dqkv, d, o, lse, qkv, s, B, T, C, H, w, sc));
}
static void p_gelu_fwd(float *o, const float *x, size_t n) { PROF(P_GELU_F, prof_inner->gelu_fwd(o, x, n)); }
static void p_gelu_bwd(float *dx, const float *d, const float *x, size_t n) {
  PROF(P_GELU_B, prof_inner->gelu_bwd(dx, d, x, n));
}
static void p_res(float *o, const float *a, const float *b, size_t n) { PROF(P_RES, prof_inner->residual_fwd(o, a, b, n)); }
static void p_acc(float *d, const float *s, size_t n) { PROF(P_ACC, prof_inner->accumulate(d, s, n)); }
static void p_xent(float *l, float *x, const int32_t *t, int N, int V, float ds) {
  PROF(P_XENT, prof_inner->xent_fwd_bwd(l, x, t, N, V, ds));
}
static void p_adamw(float *p, const float *g, float *m, float *v, size_t n, const backend_adamw_args *a) {
  PROF(P_ADAMW, prof_inner->adamw(p, g, m, v, n, a));
}
static double p_sumsq(const float *x, size_t n) {
  double r;
  PROF(P_SUMSQ, r = prof_inner->sumsq(x, n));
  return r;
}
static void p_zero(void *p, size_t n) { PROF(P_ZERO, prof_inner->zero(p, n)); }

static backend profiled(const backend *be, int vocab) {
  prof_inner = be;
  prof_vocab = vocab;
  backend p = *be;
  p.embed_fwd = p_embed_fwd, p.embed_bwd = p_embed_bwd, p.layernorm_fwd = p_ln_fwd, p.layernorm_bwd = p_ln_bwd;
  p.matmul_fwd = p_mm_fwd, p.matmul_bwd = p_mm_bwd, p.attention_fwd = p_att_fwd, p.attention_bwd = p_att_bwd;
  p.gelu_fwd = p_gelu_fwd, p.gelu_bwd = p_gelu_bwd, p.residual_fwd = p_res, p.accumulate = p_acc;
  p.xent_fwd_bwd = p_xent, p.adamw = p_adamw, p.sumsq = p_sumsq, p.zero = p_zero;
  return p;
}

/* ---- the benchmark ------------------------------------------------------------------------------ */

typedef struct {
  int L, C, H, V, B, T, steps, warmup, threads, peak_n, profile, recompute;
  double peak_seconds, peak; /* peak: given GFLOP/s (0: measure) */
  const char *arch, *backend, *precision;
} bench_args;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void usage(FILE *fp) {
  fprintf(fp, "usage: greenlm-bench [--arch gpt-neo|gpt2] [--layers L] [--embd C] [--heads H] [--vocab V]\n"
              "                     [--batch B] [--seq T] [--steps N] [--warmup W] [--threads t]\n"
              "                     [--peak-size n] [--peak-seconds s] [--peak GFLOPS] [--profile]\n"
              "                     [--backend cpu|cuda] [--precision fp32|tf32|bf16|fp16] [--recompute]\n"
              "defaults: --layers 4 --embd 256 --heads 4 --vocab 50304 --batch 8 --seq 128 --steps 3 --warmup 1\n"
              "          --threads 1 --peak-size 2048 --peak-seconds 2 --backend cpu --precision fp32\n");
}

static int parse(int argc, char **argv, bench_args *a) {
  *a = (bench_args){4, 256, 4, 50304, 8, 128, 3, 1, 1, 2048, 0, 0, 2.0, 0.0, "gpt-neo", "cpu", "fp32"};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(k, "--profile") || !strcmp(k, "--recompute")) {
      *(!strcmp(k, "--profile") ? &a->profile : &a->recompute) = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "greenlm-bench: error: %s needs a value\n", k);
      return 2;
    }
    const char *v = argv[++i];
    char *end;
    double x = strtod(v, &end);
    if (!strcmp(k, "--arch")) {
      a->arch = v;
      continue;
    }
    if (!strcmp(k, "--backend") || !strcmp(k, "--precision")) {
      int ok = !strcmp(k, "--backend") ? !strcmp(v, "cpu") || !strcmp(v, "cuda")
                                       : !strcmp(v, "fp32") || !strcmp(v, "tf32") || !strcmp(v, "bf16") || !strcmp(v, "fp16");
      if (!ok) {
        fprintf(stderr, "greenlm-bench: error: %s '%s' is not one of %s\n", k, v,
                !strcmp(k, "--backend") ? "cpu, cuda" : "fp32, tf32, bf16, fp16");
        return 2;
      }
      *(!strcmp(k, "--backend") ? &a->backend : &a->precision) = v;
      continue;
    }
    if (*end || x < 0 || (x == 0 && strcmp(k, "--warmup") != 0)) {
      fprintf(stderr, "greenlm-bench: error: %s expects a positive number (--warmup: >= 0), got '%s'\n", k, v);
      return 2;
    }
    if (!strcmp(k, "--layers")) a->L = (int)x;
    else if (!strcmp(k, "--embd")) a->C = (int)x;
    else if (!strcmp(k, "--heads")) a->H = (int)x;
    else if (!strcmp(k, "--vocab")) a->V = (int)x;
    else if (!strcmp(k, "--batch")) a->B = (int)x;
    else if (!strcmp(k, "--seq")) a->T = (int)x;
    else if (!strcmp(k, "--steps")) a->steps = (int)x;
    else if (!strcmp(k, "--warmup")) a->warmup = (int)x;
    else if (!strcmp(k, "--threads")) a->threads = (int)x;
    else if (!strcmp(k, "--peak-size")) a->peak_n = (int)x;
    else if (!strcmp(k, "--peak-seconds")) a->peak_seconds = x;
    else if (!strcmp(k, "--peak")) a->peak = x;
    else {
      fprintf(stderr, "greenlm-bench: error: unknown option '%s'\n", k);
      usage(stderr);
      return 2;
    }
  }
  if (a->C % a->H) {
    fprintf(stderr, "greenlm-bench: error: --embd %d is not divisible by --heads %d\n", a->C, a->H);
    return 2;
  }
  if (!strcmp(a->backend, "cpu") && strcmp(a->precision, "fp32") != 0) {
    fprintf(stderr, "greenlm-bench: error: --precision %s needs --backend cuda (the CPU backend computes in fp32)\n",
            a->precision);
    return 2;
  }
  return -1;
}

/* The backend asked for (CPU, or CUDA in a build that has it). Returns NULL after a message. */
static const backend *open_backend(const bench_args *a) {
  if (strcmp(a->backend, "cuda") != 0) return backend_cpu();
#ifdef GREENLM_HAVE_CUDA
  char why[256];
  if (gpu_device_count(why, sizeof why) == 0) {
    fprintf(stderr, "greenlm-bench: error: --backend cuda: no usable GPU (%s)\n", why);
    return NULL;
  }
  gpu_open(0, a->precision);
  return backend_cuda();
#else
  fprintf(stderr, "greenlm-bench: error: --backend cuda: this build has no CUDA backend (configure --with-cuda)\n");
  return NULL;
#endif
}

/* The model of the command line, as a deck's &model would give it. */
static void model_config(const bench_args *a, cfg_model *mc) {
  memset(mc, 0, sizeof *mc);
  util_strlcpy(mc->arch, a->arch, sizeof mc->arch);
  mc->vocab_size = a->V, mc->block_size = a->T, mc->n_layer = a->L, mc->n_embd = a->C, mc->n_head = a->H;
  mc->window_size = 256, mc->layer_norm_epsilon = 1e-5, mc->init_std = 0.02;
  util_strlcpy(mc->attention_types.v[0], "global", CFG_ITEM_LEN);
  util_strlcpy(mc->attention_types.v[1], "local", CFG_ITEM_LEN);
  mc->attention_types.n = strcmp(a->arch, "gpt2") ? 2 : 1;
}

/* What the steps measured: mean seconds per phase, the median step, the last loss. */
typedef struct {
  double fwd, bwd, opt, median, loss;
} bench_times;

/* Warm-up and timed steps on random tokens: forward with the loss, backward, clipping and AdamW. */
static bench_times run_steps(const bench_args *a, const backend *be, gpt_model *m) {
  optim_state opt;
  optim_init(&opt, be, 0, m->nparams);
  cfg_training tc;
  memset(&tc, 0, sizeof tc);
  tc.lr = 1e-4, tc.beta1 = 0.9, tc.beta2 = 0.95, tc.adam_eps = 1e-8, tc.weight_decay = 0.1, tc.grad_clip = 1.0;
  util_strlcpy(tc.lr_decay, "constant", sizeof tc.lr_decay);
  const int N = a->B * a->T;
  int32_t *x = util_malloc((size_t)N * sizeof(int32_t), "tokens"), *y = util_malloc((size_t)N * sizeof(int32_t), "targets");
  rng_state r;
  rng_seed(&r, 1, RNG_DATA, 0);
  bench_times bt = {0};
  double *step_ms = util_malloc((size_t)a->steps * sizeof(double), "step times");
  for (int step = 0; step < a->warmup + a->steps; step++) {
    for (int i = 0; i < N; i++) x[i] = (int32_t)rng_below(&r, (uint64_t)a->V), y[i] = (int32_t)rng_below(&r, (uint64_t)a->V);
    double t0 = util_now();
    gpt_zero_grad(m);
    gpt_set_batch(m, 0, x, y, a->B, a->T);
    gpt_forward(m, 0, a->B, a->T);
    bt.loss = gpt_loss(m, 0, a->B, a->T, 1.0f / (float)N) / N;
    be->sync();
    double t1 = util_now();
    gpt_backward(m, 0, a->B, a->T, NULL, NULL);
    be->sync();
    double t2 = util_now();
    double norm = sqrt(be->sumsq(m->grads, m->nparams));
    optim_adamw_step(&opt, m, &tc, step, tc.lr, optim_clip_scale(&tc, norm));
    be->sync();
    double t3 = util_now();
    if (step >= a->warmup) {
      bt.fwd += (t1 - t0) / a->steps, bt.bwd += (t2 - t1) / a->steps, bt.opt += (t3 - t2) / a->steps;
      step_ms[step - a->warmup] = 1e3 * (t3 - t0);
    }
    if (step + 1 == a->warmup) memset(prof_t, 0, sizeof prof_t), memset(prof_n, 0, sizeof prof_n);
  }
  qsort(step_ms, (size_t)a->steps, sizeof(double), cmp_double);
  bt.median = 1e-3 * (a->steps % 2 ? step_ms[a->steps / 2] : 0.5 * (step_ms[a->steps / 2 - 1] + step_ms[a->steps / 2]));
  free(x), free(y), free(step_ms);
  optim_free(&opt);
  return bt;
}

static void report(const bench_args *a, const gpt_model *m, const bench_times *bt, double peak, char *engine) {
  const int N = a->B * a->T;
  double per = bt->median, tps = N / per, fpt = gpt_flops_per_token(&m->s, a->T), mfu = tps * fpt / (peak * 1e9);
  size_t n = gpt_count_params(&m->s);
  printf("greenlm-bench %s\n", PACKAGE_VERSION);
  printf("engine:  %s\n", engine);
  if (a->peak > 0)
    printf("peak:    %.1f GFLOP/s (given by --peak)\n", peak);
  else
    printf("peak:    %.1f GFLOP/s (best %dx%dx%d GEMM in two %.1f s runs, before and after the steps; %d thread%s)\n",
           peak, a->peak_n, a->peak_n, a->peak_n, a->peak_seconds, a->threads, a->threads == 1 ? "" : "s");
  printf("model:   %s L=%d C=%d H=%d V=%d, %zu parameters (%.1f M); batch B=%d x T=%d = %d tokens\n", a->arch, a->L, a->C,
         a->H, a->V, n, n / 1e6, a->B, a->T, N);
  printf("step:    %.1f ms median (means: forward+loss %.1f, backward %.1f, clip+AdamW %.1f) of %d after %d warm-up\n",
         1e3 * per, 1e3 * bt->fwd, 1e3 * bt->bwd, 1e3 * bt->opt, a->steps, a->warmup);
  printf("speed:   %.1f tokens/s, %.1f GFLOP/s model, MFU %.1f%% of the measured peak (loss %.3f)\n", tps,
         tps * fpt / 1e9, 100 * mfu, bt->loss);
  if (a->profile) {
    double total = 0;
    for (int i = 0; i < P_NOPS; i++) total += prof_t[i];
    printf("profile: time per step by op (%.1f ms of %.1f ms in ops)\n", 1e3 * total / a->steps, 1e3 * per);
    for (int i = 0; i < P_NOPS; i++)
      if (prof_n[i])
        printf("  %-20s %9.2f ms %5.1f%%  (%ld calls)\n", prof_name[i], 1e3 * prof_t[i] / a->steps,
               100 * prof_t[i] / (per * a->steps), prof_n[i] / a->steps);
  }
  for (char *c = engine; *c; c++)
    if (*c == ' ') *c = '_';
  printf("result: arch=%s L=%d C=%d H=%d V=%d B=%d T=%d threads=%d peak_gflops=%.1f ms_per_step=%.1f "
         "tokens_per_s=%.1f model_gflops=%.1f mfu=%.4f backend=%s precision=%s recompute=%d activation_bytes=%zu engine=%s\n",
         a->arch, a->L, a->C, a->H, a->V, a->B, a->T, a->threads, peak, 1e3 * per, tps, tps * fpt / 1e9, mfu, a->backend,
         a->precision, a->recompute, m->mem.acts, engine);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  bench_args a;
  int rc = parse(argc, argv, &a);
  if (rc >= 0) util_exit_all(rc);
  const backend *be = open_backend(&a);
  if (!be) util_exit_all(1);
  be->set_threads(a.threads);
  char engine[256];
  be->describe(engine, sizeof engine);
  double peak = a.peak > 0 ? a.peak : be->measure_gflops(a.peak_n, a.peak_seconds);
  cfg_model mc;
  model_config(&a, &mc);
  gpt_shape s;
  gpt_shape_from_cfg(&s, &mc);
  backend prof = profiled(be, a.V);
  if (a.profile) be = &prof; /* every op synchronised and timed: slightly slower steps */
  gpt_model m;
  gpt_part whole = gpt_whole(&s);
  whole.recompute = a.recompute; /* activation recomputation: MFU still counts the model's FLOPs only */
  gpt_init(&m, &s, be, a.B, a.T, whole, 1);
  bench_times bt = run_steps(&a, be, &m);
  /* the better of two peak measurements (before and after the steps): on a shared machine both
   * guard against a slow moment */
  double peak2 = a.peak > 0 ? a.peak : be->measure_gflops(a.peak_n, a.peak_seconds);
  report(&a, &m, &bt, peak2 > peak ? peak2 : peak, engine);
  gpt_free(&m);
  gpt_shape_free(&s);
  util_exit_all(0);
}
