/* test_generate: the KV-cache generator against recomputation, and its stop conditions.
 *
 * On a GPT-Neo (a global and a local layer, window 8, shorter than what is generated, so the local
 * ring wraps), a GPT-2 (scaled scores, biased qkv) and a GPT-NeoX (rotary embeddings on half of each head's
 * dims at the rows' positions, the parallel residual, an untied head) with random weights, a batch of prompts of
 * different lengths (one longer than a prefill pass) is decoded greedily with the cache and by
 * recomputing every sequence for every token: the same tokens, and at every step logits within
 * 1e-5 (max |cache - recomputed| / max |recomputed|, fp32). Then: a sampled batch gives each prompt
 * the text it gets alone (one rng stream per prompt); the hooks stop a sequence; <|endoftext|> ends
 * one; a sequence stops at block_size. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deck/cfg.h"
#include "model/generate.h"
#include "base/rng.h"
#include "testing.h"
#include "base/util.h"

enum { NP = 3, MAXSTEPS = 64 };

static void shape_of(gpt_shape *s, const char *arch, int L, int C, int H, int V, int maxT, int window) {
  cfg_model mc;
  cfg_model_defaults(&mc);
  strcpy(mc.arch, arch);
  mc.vocab_size = V, mc.block_size = maxT, mc.n_layer = L, mc.n_embd = C, mc.n_head = H;
  mc.window_size = window, mc.layer_norm_epsilon = 1e-5, mc.init_std = 0.2; /* spread logits: no near-ties */
  strcpy(mc.attention_types.v[0], "global");
  strcpy(mc.attention_types.v[1], "local");
  mc.attention_types.n = strcmp(arch, "gpt-neo") ? 1 : 2;
  mc.rotary_pct = 0.5; /* gpt-neox: rotary embeddings at the rows' positions in the cache's passes */
  if (strcmp(arch, "llama") == 0) { /* grouped-query attention: a cache of H/2 heads; Llama 3's scaled rope */
    mc.n_kv_head = H / 2;
    strcpy(mc.rope_scaling, "llama3");
    mc.rope_original_positions = 16;
  }
  gpt_shape_from_cfg(s, &mc);
}

static cfg_sample settings(double temperature, long top_k, double top_p, double penalty) {
  cfg_sample c;
  memset(&c, 0, sizeof c);
  c.temperature = temperature, c.top_k = top_k, c.top_p = top_p, c.repetition_penalty = penalty, c.stop_eot = 1;
  return c;
}

/* The logits of every step of every prompt. */
typedef struct {
  int V, n[NP];
  float *l[NP]; /* (MAXSTEPS, V) */
} record;

static void keep(void *ctx, int p, const float *logits) {
  record *r = ctx;
  if (r->n[p] < MAXSTEPS) memcpy(r->l[p] + (size_t)r->n[p] * r->V, logits, (size_t)r->V * sizeof(float));
  r->n[p]++;
}

static void run(gen *g, const int32_t *const *prompts, const int *lens, int n, int n_tokens, record *r) {
  gen_hooks h = {.on_logits = keep, .ctx = r, .eot = -1};
  memset(r->n, 0, sizeof r->n);
  gen_run(g, prompts, lens, n, 0, n_tokens, &h);
}

/* Random prompts of the given lengths (the caller frees them). */
static void prompts_of(int32_t **p, const int *lens, int V, uint64_t seed) {
  rng_state r;
  rng_seed(&r, seed, 0, 0);
  for (int i = 0; i < NP; i++) {
    p[i] = malloc((size_t)lens[i] * sizeof(int32_t));
    for (int j = 0; j < lens[i]; j++) p[i][j] = (int32_t)rng_below(&r, (uint64_t)V);
  }
}

/* At bf16 storage (the CPU's 16-bit reference path) the two round different intermediate sums
 * (a pass of a few rows against whole sequences), so only the logits are compared, within 3e-2. */
static void test_against_recompute(const char *arch, int C, int H, int V, const int *lens, int n_tokens,
                                   const char *precision) {
  const backend *be = backend_kind_cpu.open(-1, precision);
  const int fp32 = be->storage == BACKEND_FP32;
  gpt_shape s;
  shape_of(&s, arch, 2, C, H, V, 128, 8);
  int max_len = 0;
  for (int i = 0; i < NP; i++) max_len = lens[i] + n_tokens > max_len ? lens[i] + n_tokens : max_len;
  gpt_model m;
  gpt_init(&m, &s, be, NP, max_len, gpt_whole(&s), 21); /* an arena for the recomputation */
  int32_t *p[NP];
  prompts_of(p, lens, V, 5);
  cfg_sample greedy = settings(0, 40, 1, 1);
  record kv = {.V = V}, re = {.V = V};
  for (int i = 0; i < NP; i++) kv.l[i] = malloc((size_t)MAXSTEPS * V * sizeof(float)), re.l[i] = malloc((size_t)MAXSTEPS * V * sizeof(float));
  gen a, b;
  gen_open(&a, &m, NP, max_len, &greedy, 1, GEN_CACHE);
  gen_open(&b, &m, NP, max_len, &greedy, 1, GEN_RECOMPUTE);
  run(&a, (const int32_t *const *)p, lens, NP, n_tokens, &kv);
  run(&b, (const int32_t *const *)p, lens, NP, n_tokens, &re);
  double worst = 0;
  for (int i = 0; i < NP; i++) {
    const gen_seq *x = &a.seqs[i], *y = &b.seqs[i];
    T_CHECK(x->n_new == n_tokens && y->n_new == n_tokens && x->end == GEN_END_LENGTH, "%s prompt %d: %d and %d tokens", arch,
            i, x->n_new, y->n_new);
    int agree = 0; /* steps with the same prefix: their logits are comparable */
    while (agree < x->n_new && x->tokens[x->n_prompt + agree] == y->tokens[y->n_prompt + agree]) agree++;
    T_CHECK(agree == x->n_new || !fp32, "%s prompt %d: the cache and recomputation chose different tokens", arch, i);
    for (int k = 0; k <= agree && k < kv.n[i] && k < MAXSTEPS; k++) {
      double e = t_rel_err(kv.l[i] + (size_t)k * V, re.l[i] + (size_t)k * V, (size_t)V);
      worst = e > worst ? e : worst;
    }
  }
  T_CHECK(worst <= (fp32 ? 1e-5 : 3e-2), "%s %s: logits of the cache against recomputation: relative error %.3g", arch,
          precision, worst);
  printf("  %-8s %s prompts %d, %d, %d + %d tokens: logits rel err %.2e; cache %.1f kB\n", arch, precision, lens[0],
         lens[1], lens[2], n_tokens, worst, a.mem.cache / 1e3);
  gen_close(&a), gen_close(&b);
  for (int i = 0; i < NP; i++) free(p[i]), free(kv.l[i]), free(re.l[i]);
  gpt_free(&m);
  gpt_shape_free(&s);
  backend_close(be);
}

/* A sampled batch against each prompt alone (its stream index passed as `first`). */
static void test_batch_alone(gpt_model *m, int32_t **p, const int *lens) {
  cfg_sample c = settings(0.8, 10, 0.9, 1.3);
  gen batch, one;
  gen_open(&batch, m, NP, 100, &c, 9, GEN_CACHE);
  gen_open(&one, m, 1, 100, &c, 9, GEN_CACHE);
  gen_run(&batch, (const int32_t *const *)p, lens, NP, 0, 30, NULL);
  int same = 0;
  for (int i = 0; i < NP; i++) {
    gen_run(&one, (const int32_t *const *)&p[i], &lens[i], 1, i, 30, NULL);
    same += one.seqs[0].len == batch.seqs[i].len &&
            !memcmp(one.seqs[0].tokens, batch.seqs[i].tokens, (size_t)one.seqs[0].len * sizeof(int32_t));
  }
  T_CHECK(same == NP, "sampled: %d of %d prompts got the same text in the batch as alone", same, NP);
  gen_close(&batch), gen_close(&one);
}

static int stop_third(void *ctx, int p, int32_t token) {
  (void)token;
  return ++((int *)ctx)[p] == 3;
}

static void test_stops(void) {
  gpt_shape s;
  shape_of(&s, "gpt-neo", 2, 32, 4, 67, 128, 8);
  gpt_model m;
  gpt_init(&m, &s, backend_cpu(), 1, 1, (gpt_part){0, s.L, 1, 1, 1, 0, 1, 1, 0}, 4); /* weights only */
  const int lens[NP] = {4, 120, 17};
  int32_t *p[NP];
  prompts_of(p, lens, s.V, 6);
  test_batch_alone(&m, p, lens);
  cfg_sample greedy = settings(0, 0, 1, 1);
  gen g;
  gen_open(&g, &m, NP, 128, &greedy, 1, GEN_CACHE);
  int count[NP] = {0};
  gen_hooks h = {.on_token = stop_third, .ctx = count, .eot = -1};
  gen_run(&g, (const int32_t *const *)p, lens, NP, 0, 20, &h);
  T_CHECK(g.seqs[0].n_new == 3 && g.seqs[0].end == GEN_END_STOP, "the hook stops a sequence: %d tokens, %s",
          g.seqs[0].n_new, gen_end_name(g.seqs[0].end));
  T_CHECK(g.seqs[1].n_new == 3 && g.seqs[1].end == GEN_END_STOP, "the hook stopped the long prompt after %d tokens",
          g.seqs[1].n_new);
  int32_t first = g.seqs[2].tokens[lens[2]];
  h = (gen_hooks){.eot = first};
  gen_run(&g, (const int32_t *const *)p, lens, NP, 0, 20, &h);
  T_CHECK(g.seqs[2].n_new == 1 && g.seqs[2].end == GEN_END_EOT, "<|endoftext|> ends a sequence: %d tokens, %s",
          g.seqs[2].n_new, gen_end_name(g.seqs[2].end));
  T_CHECK(g.seqs[1].len == 128 && g.seqs[1].end == GEN_END_FULL, "block_size ends a sequence: %d tokens, %s",
          g.seqs[1].len, gen_end_name(g.seqs[1].end));
  printf("  stops: the caller's hook, <|endoftext|>, block_size; a sampled batch = its prompts alone\n");
  gen_close(&g);
  for (int i = 0; i < NP; i++) free(p[i]);
  gpt_free(&m);
  gpt_shape_free(&s);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const int neo[NP] = {1, 70, 7}, gpt2[NP] = {5, 12, 3};
  test_against_recompute("gpt-neo", 32, 4, 67, neo, 20, "fp32");
  test_against_recompute("gpt2", 48, 6, 101, gpt2, 25, "fp32");
  test_against_recompute("gpt-neox", 48, 4, 101, gpt2, 25, "fp32");
  test_against_recompute("gpt-neox", 48, 4, 101, neo, 20, "bf16");
  test_against_recompute("llama", 48, 4, 101, gpt2, 25, "fp32");
  test_against_recompute("llama", 48, 4, 101, neo, 20, "bf16");
  test_against_recompute("gpt-neo", 32, 4, 67, neo, 20, "bf16");
  test_stops();
  int rc = t_done("test_generate");
  MPI_Finalize();
  return rc;
}
