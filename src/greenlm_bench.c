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
 * "result:" line of key=value pairs for scripts (run/bench collects them).
 *
 *   greenlm-bench --generate --layers 12 --embd 768 --heads 12 --vocab 50257 --seq 2048 --prompt 512 --new 256
 *
 * times decoding with the KV cache against recomputing the sequence for every token (gen_bench). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "model/backend.h"
#include "deck/cfg.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "base/rng.h"
#include "base/util.h"
#include "parallel/qexch.h"
#include "base/quant.h"

/* ---- --profile: a backend table that times every op ------------------------------------------ */

/* Slots: every op of the list, then the tied LM head's matmuls (M == vocab) apart, and zero. */
enum { P_HEAD_F = BACKEND_NOPS, P_HEAD_B, P_ZERO, P_NOPS };
static const backend *prof_inner;
static int prof_vocab;
static double prof_t[P_NOPS];
static long prof_n[P_NOPS];
static void prof_stop(int op, double t0) {
  prof_inner->sync(prof_inner);
  prof_t[op] += util_now() - t0;
  prof_n[op]++;
}
static const char *prof_name(int op) {
  return op < BACKEND_NOPS ? backend_op_names[op] : op == P_HEAD_F ? "LM head fwd" : op == P_HEAD_B ? "LM head bwd" : "zero";
}

/* prof_<op>: the inner op, synchronised and timed under its own name */
#define PROF_WRAP(name, params, args)                                                                                    static void prof_##name params {                                                                                         (void)be;                                                                                                              double t0 = util_now();                                                                                                BACKEND_CALL(prof_inner->name, prof_inner, args);                                                                      prof_stop(BACKEND_OP_##name, t0);                                                                                    }
BACKEND_OPS(PROF_WRAP)

static void prof_head_fwd(const backend *be, void *o, const void *x, const void *w, const void *b, int N, int K, int M,
                          int ldo) {
  if (M != prof_vocab) {
    prof_matmul_fwd(be, o, x, w, b, N, K, M, ldo);
    return;
  }
  double t0 = util_now();
  prof_inner->matmul_fwd(prof_inner, o, x, w, b, N, K, M, ldo);
  prof_stop(P_HEAD_F, t0);
}
static void prof_head_bwd(const backend *be, void *dx, float *dw, float *db, const void *d, const void *x, const void *w,
                          int N, int K, int M, int ldo, int acc) {
  if (M != prof_vocab) {
    prof_matmul_bwd(be, dx, dw, db, d, x, w, N, K, M, ldo, acc);
    return;
  }
  double t0 = util_now();
  prof_inner->matmul_bwd(prof_inner, dx, dw, db, d, x, w, N, K, M, ldo, acc);
  prof_stop(P_HEAD_B, t0);
}
static void prof_zero(const backend *be, void *p, size_t n) {
  (void)be;
  double t0 = util_now();
  prof_inner->zero(prof_inner, p, n);
  prof_stop(P_ZERO, t0);
}

static size_t counted; /* backend bytes allocated */
static void *count_alloc(const backend *be, size_t bytes) {
  (void)be;
  counted += bytes;
  return prof_inner->alloc(prof_inner, bytes);
}

#define PROF_SET(name, params, args) p.name = prof_##name;

/* A copy of the table (same context) that counts what it allocates and, with timed, times its ops. */
static backend wrapped(const backend *be, int vocab, int timed) {
  prof_inner = be;
  prof_vocab = vocab;
  backend p = *be;
  p.alloc = count_alloc;
  if (timed) {
    BACKEND_OPS(PROF_SET)
    p.matmul_fwd = prof_head_fwd, p.matmul_bwd = prof_head_bwd, p.zero = prof_zero;
  }
  return p;
}

/* ---- the benchmark ------------------------------------------------------------------------------ */

typedef struct {
  int L, C, H, V, B, T, steps, warmup, threads, peak_n, profile, recompute, quant;
  double exchange_mb; /* --exchange: the largest gradient, MB (0: not this benchmark) */
  double peak_seconds, peak; /* peak: given GFLOP/s (0: measure) */
  const char *arch, *backend, *precision;
  const char *storage; /* NULL: the backend's choice for the precision */
  int generate, prompt, gen_new, gen_recompute; /* --generate: prompt tokens, new tokens, new tokens recomputed */
  int kv_heads, inner; /* --kv-heads (llama; 0: --heads), --inner the MLP width (0: 4 C) */
} bench_args;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void usage(FILE *fp) {
  fprintf(fp, "usage: greenlm-bench [--arch gpt-neo|gpt2|gpt-neox|llama] [--layers L] [--embd C] [--heads H] [--vocab V]\n"
              "                     [--kv-heads Hkv] [--inner F] [--batch B] [--seq T] [--steps N] [--warmup W] [--threads t]\n"
              "                     [--peak-size n] [--peak-seconds s] [--peak GFLOPS] [--profile]\n"
              "                     [--backend cpu|cuda] [--precision fp32|tf32|bf16|fp16] [--recompute]\n"
              "                     [--storage fp32|bf16|fp16]\n"
              "       greenlm-bench --quant   (gradient quantizer throughput, one core)\n"
              "       greenlm-bench --generate [--prompt P] [--new N] [--recompute-new K] [model options]\n"
              "                     (decoding with the KV cache against recomputation; --seq is the block size;\n"
              "                      defaults --prompt 512 --new 256, K = N)\n"
              "       mpiexec -n D greenlm-bench --exchange MB   (compressed exchanges against MPI_Allreduce,\n"
              "                                                   gradients of 1 MB up to MB)\n"
              "defaults: --layers 4 --embd 256 --heads 4 --vocab 50304 --batch 8 --seq 128 --steps 3 --warmup 1\n"
              "          --threads 1 --peak-size 2048 --peak-seconds 2 --backend cpu --precision fp32\n");
}

static int parse(int argc, char **argv, bench_args *a) {
  *a = (bench_args){4, 256, 4, 50304, 8, 128, 3, 1, 1, 2048, 0, 0, 0, 0.0, 2.0, 0.0, "gpt-neo", "cpu", "fp32", NULL, 0, 512, 256, 0, 0, 0};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(k, "--profile") || !strcmp(k, "--recompute") || !strcmp(k, "--quant") || !strcmp(k, "--generate")) {
      *(!strcmp(k, "--profile") ? &a->profile : !strcmp(k, "--recompute") ? &a->recompute
        : !strcmp(k, "--quant")  ? &a->quant : &a->generate) = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "greenlm-bench: error: %s needs a value\n", k);
      return 2;
    }
    const char *v = argv[++i];
    char *end;
    double x = strtod(v, &end);
    const char *words = !strcmp(k, "--storage") ? CFG_CHOICES(CFG_DTYPES) : !strcmp(k, "--precision") ? CFG_CHOICES(CFG_PRECISIONS)
                      : !strcmp(k, "--arch") ? CFG_CHOICES(CFG_ARCHS) : !strcmp(k, "--backend") ? "cpu|cuda" : NULL; /* the deck's words (a kind, not 'auto') */
    if (words) {
      if (cfg_choice_index(words, v) < 0) {
        fprintf(stderr, "greenlm-bench: error: %s '%s' is not one of %s\n", k, v, words);
        return 2;
      }
      *(!strcmp(k, "--storage") ? &a->storage : !strcmp(k, "--backend") ? &a->backend : !strcmp(k, "--arch") ? &a->arch
                                                                                            : &a->precision) = v;
      continue;
    }
    if (*end || x < 0 || (x == 0 && strcmp(k, "--warmup") != 0)) {
      fprintf(stderr, "greenlm-bench: error: %s expects a positive number (--warmup: >= 0), got '%s'\n", k, v);
      return 2;
    }
    if (!strcmp(k, "--layers")) a->L = (int)x;
    else if (!strcmp(k, "--embd")) a->C = (int)x;
    else if (!strcmp(k, "--heads")) a->H = (int)x;
    else if (!strcmp(k, "--kv-heads")) a->kv_heads = (int)x;
    else if (!strcmp(k, "--inner")) a->inner = (int)x;
    else if (!strcmp(k, "--vocab")) a->V = (int)x;
    else if (!strcmp(k, "--batch")) a->B = (int)x;
    else if (!strcmp(k, "--seq")) a->T = (int)x;
    else if (!strcmp(k, "--steps")) a->steps = (int)x;
    else if (!strcmp(k, "--warmup")) a->warmup = (int)x;
    else if (!strcmp(k, "--threads")) a->threads = (int)x;
    else if (!strcmp(k, "--peak-size")) a->peak_n = (int)x;
    else if (!strcmp(k, "--peak-seconds")) a->peak_seconds = x;
    else if (!strcmp(k, "--peak")) a->peak = x;
    else if (!strcmp(k, "--exchange")) a->exchange_mb = x;
    else if (!strcmp(k, "--prompt")) a->prompt = (int)x;
    else if (!strcmp(k, "--new")) a->gen_new = (int)x;
    else if (!strcmp(k, "--recompute-new")) a->gen_recompute = (int)x;
    else {
      fprintf(stderr, "greenlm-bench: error: unknown option '%s'\n", k);
      usage(stderr);
      return 2;
    }
  }
  if (a->generate && a->prompt + a->gen_new > a->T) {
    fprintf(stderr, "greenlm-bench: error: --generate: --prompt %d + --new %d exceed the block size --seq %d\n", a->prompt,
            a->gen_new, a->T);
    return 2;
  }
  if (a->C % a->H) {
    fprintf(stderr, "greenlm-bench: error: --embd %d is not divisible by --heads %d\n", a->C, a->H);
    return 2;
  }
  if (a->kv_heads && (a->H % a->kv_heads || cfg_choice_index(CFG_CHOICES(CFG_ARCHS), a->arch) != CFG_ARCH_LLAMA)) {
    fprintf(stderr, "greenlm-bench: error: --kv-heads %d: llama's key/value heads, a divisor of --heads %d\n",
            a->kv_heads, a->H);
    return 2;
  }
  return -1;
}

/* The backend asked for, on its first device, at --storage when given (also a storage type the
 * backend does not yet enable for runs: the parity program tests those so). NULL after a message. */
static backend *open_backend(const bench_args *a) {
  const char *build;
  const backend_kind *k = backend_find_kind(a->backend, &build);
  if (!k) {
    fprintf(stderr, "greenlm-bench: error: --backend %s: %s\n", a->backend, build ? build : "no such backend");
    return NULL;
  }
  char why[256], names[64];
  if (!(k->caps().precisions & backend_precision_bit(a->precision))) {
    fprintf(stderr, "greenlm-bench: error: --precision %s: the %s backend computes at %s\n", a->precision, k->name,
            backend_precision_names(k->caps().precisions, names, sizeof names));
    return NULL;
  }
  if (k->devices && k->devices(why, sizeof why) == 0) {
    fprintf(stderr, "greenlm-bench: error: --backend %s: no usable device (%s)\n", a->backend, why);
    return NULL;
  }
  backend *be = k->open(0, a->precision);
  if (a->storage) {
    backend_dtype t = backend_precision_storage(a->storage);
    if (!(be->caps.storage & (1u << t)))
      printf("note:    %s storage, which the %s backend does not yet enable for runs\n", a->storage, k->name);
    be->storage = t;
  }
  return be;
}

/* The model of the command line, as a deck's &model would give it. */
static void model_config(const bench_args *a, cfg_model *mc) {
  cfg_model_defaults(mc);
  util_strlcpy(mc->arch, a->arch, sizeof mc->arch);
  mc->vocab_size = a->V, mc->block_size = a->T, mc->n_layer = a->L, mc->n_embd = a->C, mc->n_head = a->H;
  mc->n_kv_head = a->kv_heads, mc->n_inner = a->inner;
  mc->window_size = 256, mc->layer_norm_epsilon = 1e-5, mc->init_std = 0.02;
  util_strlcpy(mc->attention_types.v[0], "global", CFG_ITEM_LEN);
  util_strlcpy(mc->attention_types.v[1], "local", CFG_ITEM_LEN);
  mc->attention_types.n = cfg_model_arch_of(mc) == CFG_ARCH_GPT_NEO ? 2 : 1; /* local layers are GPT-Neo's alone */
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
    gpt_sums_clear(m);
    gpt_set_batch(m, 0, x, y, a->B, a->T);
    gpt_forward(m, 0, a->B, a->T);
    gpt_loss(m, 0, a->B, a->T, 1.0f / (float)N);
    be->sync(be);
    double t1 = util_now();
    gpt_backward(m, 0, a->B, a->T, NULL, NULL);
    be->sync(be);
    double t2 = util_now();
    be->reduce_sum(be, m->sums + 1, m->grads, m->nparams, 1);
    optim_adamw_step(&opt, m, &tc, step, tc.lr, 1.0, m->sums);
    double sums[2];
    gpt_sums_read(m, sums); /* waits for the update */
    double t3 = util_now();
    bt.loss = sums[0] / N;
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

/* used: the growth of the device's memory in use over the model's set-up and the steps (0 on the CPU) */
static void report(const bench_args *a, const gpt_model *m, const bench_times *bt, double peak, char *engine,
                   size_t used) {
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
  size_t plan = m->mem.total + optim_bytes(m->nparams);
  char b[5][32];
  printf("memory:  plan %s (model %s, AdamW %s), allocated %s", util_fmt_bytes((double)plan, b[0], 32),
         util_fmt_bytes((double)m->mem.total, b[1], 32), util_fmt_bytes((double)optim_bytes(m->nparams), b[2], 32),
         util_fmt_bytes((double)counted, b[3], 32));
  if (used) printf(", device use grew by %s (%.3f of the plan)", util_fmt_bytes((double)used, b[4], 32), (double)used / plan);
  printf("\n");
  if (a->profile) {
    double total = 0;
    for (int i = 0; i < P_NOPS; i++) total += prof_t[i];
    printf("profile: time per step by op (%.1f ms of %.1f ms in ops)\n", 1e3 * total / a->steps, 1e3 * per);
    for (int i = 0; i < P_NOPS; i++)
      if (prof_n[i])
        printf("  %-20s %9.2f ms %5.1f%%  (%ld calls)\n", prof_name(i), 1e3 * prof_t[i] / a->steps,
               100 * prof_t[i] / (per * a->steps), prof_n[i] / a->steps);
  }
  for (char *c = engine; *c; c++)
    if (*c == ' ') *c = '_';
  printf("result: arch=%s L=%d C=%d H=%d V=%d B=%d T=%d threads=%d peak_gflops=%.1f ms_per_step=%.1f "
         "tokens_per_s=%.1f model_gflops=%.1f mfu=%.4f backend=%s precision=%s storage=%s recompute=%d activation_bytes=%zu "
         "plan_bytes=%zu allocated_bytes=%zu device_bytes=%zu engine=%s\n",
         a->arch, a->L, a->C, a->H, a->V, a->B, a->T, a->threads, peak, 1e3 * per, tps, tps * fpt / 1e9, mfu, a->backend,
         a->precision, backend_dtype_name(m->be->storage), a->recompute, m->mem.acts, plan, counted, used, engine);
}

/* --generate: greedy decoding of --new tokens after a --prompt of random tokens, batch 1, random
 * weights: with the KV cache (and again after a 16-token prompt: the cost of a token must not
 * depend on the prompt), then by recomputing the sequence for every token (--recompute-new of them).
 * Decode tokens/s exclude each side's first token (the prompt's forward pass), and are per CPU second
 * of this process (a shared machine's other jobs do not count; wall-clock rates beside); the two must
 * choose the same tokens, or the ratio is not reported as valid. */
/* Process CPU seconds (all threads): on a shared machine the rates are given per CPU second of the
 * benchmark itself, wall-clock beside. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  double *wall, *cpu; /* when each token was drawn */
  int n;
} gen_clock;

static int gen_tick(void *ctx, int p, int32_t token) {
  gen_clock *c = ctx;
  (void)p, (void)token;
  c->wall[c->n] = util_now(), c->cpu[c->n++] = cpu_now();
  return 0;
}

/* What one side measured: decode rates (tokens after the first, per CPU and wall second), the CPU
 * ms of the first and last decode steps, the first token's CPU seconds (the prompt's forward). */
typedef struct {
  double cpu_tps, wall_tps, first_ms, last_ms, prefill_cpu;
  size_t bytes;
} gen_measure;

static gen_measure gen_side(gpt_model *m, gen_mode mode, const int32_t *prompt, int len, int n_new, int32_t *out) {
  cfg_sample greedy;
  memset(&greedy, 0, sizeof greedy);
  greedy.repetition_penalty = 1, greedy.top_p = 1;
  gen_clock c = {.wall = malloc((size_t)n_new * sizeof(double)), .cpu = malloc((size_t)n_new * sizeof(double))};
  gen_hooks h = {.on_token = gen_tick, .ctx = &c, .eot = -1};
  gen g;
  gen_open(&g, m, 1, len + n_new, &greedy, 1, mode);
  double t0 = cpu_now();
  gen_run(&g, &prompt, &len, 1, 0, n_new, &h);
  if (out) memcpy(out, g.seqs[0].tokens + len, (size_t)n_new * sizeof(int32_t));
  const int n = c.n;
  gen_measure r = {.prefill_cpu = c.cpu[0] - t0, .bytes = g.mem.cache + g.mem.acts + g.mem.io};
  if (n > 1) {
    r.cpu_tps = (n - 1) / (c.cpu[n - 1] - c.cpu[0]), r.wall_tps = (n - 1) / (c.wall[n - 1] - c.wall[0]);
    r.first_ms = 1e3 * (c.cpu[1] - c.cpu[0]), r.last_ms = 1e3 * (c.cpu[n - 1] - c.cpu[n - 2]);
  }
  gen_close(&g);
  free(c.wall), free(c.cpu);
  return r;
}

static void gen_line(const char *what, int prompt, int n, const gen_measure *r) {
  printf("%-14s prompt %4d: first token %.3f s, then %d: %.3f tokens/s (%.1f ms/token; first %.1f, last %.1f); "
         "wall %.3f tokens/s\n",
         what, prompt, r->prefill_cpu, n - 1, r->cpu_tps, 1e3 / r->cpu_tps, r->first_ms, r->last_ms, r->wall_tps);
}

static int gen_bench(const bench_args *a, const backend *be, char *engine) {
  cfg_model mc;
  model_config(a, &mc);
  gpt_shape s;
  gpt_shape_from_cfg(&s, &mc);
  const int P = a->prompt, N = a->gen_new, K = a->gen_recompute > 0 && a->gen_recompute < N ? a->gen_recompute : N;
  gpt_model m; /* an activation arena of (1, P + N) for the recomputation */
  gpt_init(&m, &s, be, 1, P + N, gpt_whole(&s), 1);
  int32_t *prompt = malloc((size_t)P * sizeof(int32_t)), *kv = malloc((size_t)N * sizeof(int32_t));
  int32_t *re = malloc((size_t)N * sizeof(int32_t));
  rng_state r;
  rng_seed(&r, 7, 0, 0);
  for (int i = 0; i < P; i++) prompt[i] = (int32_t)rng_below(&r, (uint64_t)s.V);
  gen_measure k = gen_side(&m, GEN_CACHE, prompt, P, N, kv);
  gen_measure sh = gen_side(&m, GEN_CACHE, prompt + P - 16, 16, N, NULL);
  gen_measure rc = gen_side(&m, GEN_RECOMPUTE, prompt, P, K, re);
  int same = 0;
  while (same < K && kv[same] == re[same]) same++;
  const double ratio = rc.cpu_tps > 0 ? k.cpu_tps / rc.cpu_tps : 0;
  char b[32];
  printf("greenlm-bench %s --generate\n", PACKAGE_VERSION);
  printf("engine:  %s\n", engine);
  printf("model:   %s L=%d C=%d H=%d V=%d block %d, %.1f M parameters, random weights; greedy, batch 1\n", a->arch, a->L,
         a->C, a->H, a->V, a->T, gpt_count_params(&s) / 1e6);
  printf("cache:   KV caches and pass activations %s\n", util_fmt_bytes((double)k.bytes, b, sizeof b));
  printf("rates per CPU second of this process (wall-clock beside); decode = the tokens after the first\n");
  gen_line("KV cache:", P, N, &k);
  gen_line("KV cache:", 16, N, &sh);
  gen_line("recomputation:", P, K, &rc);
  printf("speed-up: %.1fx decode tokens/s (%s: %d of %d tokens the same)\n", ratio, same == K ? "VALID" : "INVALID", same, K);
  for (char *c = engine; *c; c++)
    if (*c == ' ') *c = '_';
  printf("result: arch=%s L=%d C=%d H=%d V=%d block=%d prompt=%d new=%d recomputed=%d kv_tokens_per_s=%.3f "
         "kv_short_prompt_tokens_per_s=%.3f recompute_tokens_per_s=%.4f speedup=%.2f valid=%d kv_bytes=%zu engine=%s\n",
         a->arch, a->L, a->C, a->H, a->V, a->T, P, N, K, k.cpu_tps, sh.cpu_tps, rc.cpu_tps, ratio, same == K, k.bytes,
         engine);
  free(prompt), free(kv), free(re);
  gpt_free(&m);
  gpt_shape_free(&s);
  return same == K ? 0 : 1;
}

/* ALQ's b-bit levels for the n values v in L2 buckets of B, fitted as the trainer fits them. */
static void alq_levels(quant_scheme *q, int bits, const float *v, size_t n, size_t B) {
  quant_hist *h = util_malloc(sizeof *h, "histogram");
  quant_hist_clear(h);
  for (size_t b = 0; b + B <= n; b += B) quant_hist_add(h, v + b, B);
  float lv[QUANT_MAX_LEVELS];
  const int nl = 1 << (bits - 1);
  quant_fit_alq(h, nl, 30, lv);
  UTIL_CHECK(quant_levels(q, bits, QUANT_L2, lv, nl) == 0, NULL, "internal: ALQ's levels are not increasing");
  free(h);
}

/* --quant: encode and decode rates of the gradient quantizer on one core, GB/s of fp32 input, for
 * each level set at 2, 4 and 8 bits, buckets of 512 (max norm) or 8192 (L2), and ALQ's table of
 * levels (fitted to the values as the trainer fits them) in L2 buckets of 128, 64 MiB of Gaussian
 * values, as the trainer's exchange calls it (a message of buckets: quant_encode_segs). */
static int quant_bench(void) {
  const size_t n = (size_t)16 << 20;
  float *v = util_malloc(n * sizeof(float), "values"), *y = util_malloc(n * sizeof(float), "decoded");
  uint8_t *msg = util_malloc(n * sizeof(float) + 4096, "messages");
  rng_state r;
  rng_seed(&r, 1, RNG_DATA, 0);
  for (size_t i = 0; i < n; i++) v[i] = (float)rng_normal(&r);
  printf("quantizer  bits  bucket  encode GB/s  decode GB/s  bytes/value\n");
  static const char *const names[] = {"QSGD (L2)", "QSGDinf", "NUQSGD", "min-max", "ALQ (L2)"};
  for (int kind = 0; kind < 5; kind++)
    for (int bits = 2; bits <= 8; bits *= 2) {
      quant_scheme q;
      if (kind == 2) quant_exponential(&q, bits, QUANT_L2);
      else if (kind == 4) alq_levels(&q, bits, v, n, 128);
      else quant_uniform(&q, bits, kind == 0 ? QUANT_L2 : kind == 1 ? QUANT_MAX : QUANT_MINMAX);
      size_t B = kind == 4 ? 128 : q.norm == QUANT_L2 ? 8192 : 512, per = quant_bytes(&q, B), nb = n / B;
      quant_seg *seg = util_malloc(nb * sizeof *seg, "segments");
      for (size_t b = 0; b < nb; b++) seg[b] = (quant_seg){.at = b * B, .n = B, .off = b * per, .quantized = 1, .id = b};
      double t0 = util_now();
      quant_encode_segs(&q, seg, (int)nb, v, NULL, 1, msg);
      double t1 = util_now();
      quant_decode_segs(&q, seg, (int)nb, msg, 0, y, 0);
      double t2 = util_now(), gb = (double)n * sizeof(float) / 1e9;
      free(seg);
      printf("%-10s %5d %7zu %12.2f %12.2f %12.3f\n", names[kind], bits, B, gb / (t1 - t0), gb / (t2 - t1),
             (double)per / (double)B);
    }
  free(v), free(y), free(msg);
  return 0;
}

/* --exchange: one gradient of S MB (S = 1, 4, 16, ... up to the given MB) exchanged across the
 * job's ranks: fp32 MPI_Allreduce, and the compressed exchanges of qexch.h at 4 bits (QSGDinf
 * all-gather, integer sum, reduce-scatter/all-gather; NUQSGD all-gather), each timed from the start
 * of encoding to the end of decoding (the median of a few exchanges, after one unmeasured). Rank 0
 * prints milliseconds per exchange, the ratio to the all-reduce, the bytes each rank sends, and the
 * encoding's and decoding's shares. On a device backend (--backend cuda) the gradient is in device
 * memory: the compressed exchanges encode and decode there, and the all-reduce goes through the host
 * (copied down and up, as the trainer stages it where MPI cannot read the device). */
static double exchange_once(qexch *x, gpt_model *m, float *host, long step, double *enc, double *dec) {
  const backend *be = m->be;
  const size_t bytes = m->nparams * sizeof(float);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = util_now();
  if (x) {
    MPI_Request req;
    qexch_launch(x, 0, step, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    *dec += qexch_finish(x, 0);
    *enc += qexch_take_encode_s(x);
  } else if (host) {
    be->to_host(be, host, m->grads, bytes);
    MPI_Allreduce(MPI_IN_PLACE, host, (int)m->nparams, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    be->to_device(be, m->grads, host, bytes);
  } else {
    MPI_Allreduce(MPI_IN_PLACE, m->grads, (int)m->nparams, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  be->sync(be);
  double t = util_now() - t0, most;
  MPI_Allreduce(&t, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

/* One kind of exchange of the gradient of m, timed: the median ms; the encoding's and decoding's
 * ms per exchange (rank 0's) into enc and dec. */
static double time_exchange(qexch *x, gpt_model *m, float *host, double mb, double *enc, double *dec) {
  enum { REPS = 5 };
  double ms[REPS], e = 0, d = 0;
  int reps = mb >= 256 ? 3 : REPS;
  exchange_once(x, m, host, 0, &e, &d);
  e = d = 0;
  for (int r = 0; r < reps; r++) ms[r] = 1e3 * exchange_once(x, m, host, r + 1, &e, &d);
  qsort(ms, (size_t)reps, sizeof ms[0], cmp_double);
  *enc = 1e3 * e / reps, *dec = 1e3 * d / reps;
  return ms[reps / 2];
}

static int exchange_bench(const bench_args *a) {
  static const struct {
    const char *method, *exchange;
  } kinds[] = {{"none", "allgather"}, {"qsgdinf", "allgather"}, {"qsgdinf", "intsum"}, {"qsgdinf", "sra"}, {"nuqsgd", "allgather"}};
  int rank, D;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &D);
  backend *be = open_backend(a);
  if (!be) return 1;
  if (rank == 0) printf("exchange across %d ranks (%s backend)\n%8s  %-8s %-9s %10s %8s %12s %10s %10s\n", D, be->name, "MB",
                        "method", "exchange", "ms", "ratio", "bytes sent", "encode ms", "decode ms");
  for (double mb = 1; mb <= a->exchange_mb; mb *= 4) {
    size_t n = (size_t)(mb * (1 << 20)) / sizeof(float);
    gpt_tensor t = {.name = "gradient", .offset = 0, .numel = n, .rows = (int)n, .cols = 1};
    gpt_model m = {.be = be, .tensors = &t, .ntensors = 1, .nparams = n};
    float *host = util_malloc(n * sizeof(float), "gradient");
    for (size_t i = 0; i < n; i++) host[i] = (float)((double)rng_hash(7, i) / 1.8446744073709552e19 - 0.5);
    m.grads = be->caps.host_memory ? host : be->alloc(be, n * sizeof(float));
    if (!be->caps.host_memory) be->to_device(be, m.grads, host, n * sizeof(float));
    double base = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      cfg_comm c = {.bits = 4, .min_numel = 0, .error_every = 0};
      util_strlcpy(c.method, kinds[k].method, sizeof c.method);
      util_strlcpy(c.exchange, kinds[k].exchange, sizeof c.exchange);
      qexch_bucket b = {.b0 = 0, .b1 = n, .lo = 0, .hi = n, .t0 = 0, .t1 = 1};
      qexch *x = qexch_create(&c, 0, 1, &m, 1, &b, MPI_COMM_WORLD, MPI_COMM_WORLD);
      double enc, dec, med = time_exchange(x, &m, be->caps.host_memory ? NULL : host, mb, &enc, &dec);
      if (!x) base = med;
      size_t sent = x ? qexch_message_bytes(x, 0) : n * sizeof(float);
      if (rank == 0) printf("%8.0f  %-8s %-9s %10.2f %8.2f %12zu %10.2f %10.2f\n", mb, kinds[k].method,
                            x ? kinds[k].exchange : "allreduce", med, med / base, sent, enc, dec);
      qexch_free(x);
    }
    if (!be->caps.host_memory) be->free(be, m.grads);
    free(host);
  }
  backend_close(be);
  return 0;
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  bench_args a;
  int rc = parse(argc, argv, &a);
  if (rc >= 0) util_exit_all(rc);
  if (a.quant) util_exit_all(quant_bench());
  if (a.exchange_mb > 0) util_exit_all(exchange_bench(&a));
  const backend *be = open_backend(&a);
  if (!be) util_exit_all(1);
  be->set_threads(be, a.threads);
  char engine[256];
  be->describe(be, engine, sizeof engine);
  if (a.generate) {
    int grc = gen_bench(&a, be, engine);
    backend_close(be);
    util_exit_all(grc);
  }
  double peak = a.peak > 0 ? a.peak : be->measure_gflops(be, a.peak_n, a.peak_seconds);
  cfg_model mc;
  model_config(&a, &mc);
  gpt_shape s;
  gpt_shape_from_cfg(&s, &mc);
  backend w = wrapped(be, a.V, a.profile); /* --profile: every op synchronised and timed, slightly slower steps */
  be = &w;
  size_t used0 = be->device_memory_used ? be->device_memory_used(be) : 0;
  gpt_model m;
  gpt_part whole = gpt_whole(&s);
  whole.recompute = a.recompute; /* activation recomputation: MFU still counts the model's FLOPs only */
  gpt_init(&m, &s, be, a.B, a.T, whole, 1);
  bench_times bt = run_steps(&a, be, &m);
  size_t used = be->device_memory_used ? be->device_memory_used(be) - used0 : 0;
  /* the better of two peak measurements (before and after the steps): on a shared machine both
   * guard against a slow moment */
  double peak2 = a.peak > 0 ? a.peak : be->measure_gflops(be, a.peak_n, a.peak_seconds);
  report(&a, &m, &bt, peak2 > peak ? peak2 : peak, engine, used);
  gpt_free(&m);
  gpt_shape_free(&s);
  backend_close(prof_inner);
  util_exit_all(0);
}
