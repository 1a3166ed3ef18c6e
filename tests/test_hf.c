/* test_hf: Hugging Face model directories in and out of greenlm, against transformers.
 *
 * tests/reference/hf-{neo,gpt2,gpt2-sharded}/ and hf-{neo,gpt2}.json were written by
 * tests/reference/make_hf_fixtures.py (save_pretrained of tiny random GPTNeoForCausalLM and
 * GPT2LMHeadModel, a tiny byte-level BPE tokenizer). For each model this test imports the weights
 * (hf_check_config, hf_read_params), checks the logits of the fixture batch to 1e-5 relative and
 * the lm-evaluation-harness encodings, log-likelihoods and greedy flags of its (context,
 * continuation) pairs, and those of lm-eval-pairs.json (encodings that differ from encoding context
 * and continuation apart; GPT-2's vocabulary where it is found), then exports (fp32, bf16, fp16,
 * sharded, byte tokenizer) and imports again. Bad inputs, built here byte by byte, must each fail
 * with an error that names the file and the tensor, and leave the parameters and the directories
 * untouched. The exports stay in $TEST_OUT/hf for
 * make_hf_fixtures.py --check. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/util.h"
#include "eval/score.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "model/gpt.h"
#include "testing.h"
#include "text/tok.h"

static char ref[4096], out[4096];

/* An error in errs whose place contains file and whose message contains what (either may be ""). */
static int has_error(const err_list *e, const char *file, const char *what) {
  for (int i = 0; i < e->n; i++)
    if (strstr(e->v[i].file, file) && strstr(e->v[i].msg, what)) return 1;
  return 0;
}

static void show(const err_list *e) {
  if (e->n) err_print(e, 20);
}

static int rm_entry(const char *p, const struct stat *st, int f, struct FTW *w) {
  (void)st, (void)f, (void)w;
  return remove(p);
}

static void path_of(char *buf, const char *dir, const char *name) { util_snprintf(buf, 4096, "%s/%s", dir, name); }

/* ---- import and the forward pass against transformers ---------------------------------------------- */

typedef struct {
  gpt_shape s;
  gpt_model m;
  cfg_model mc;
  float *host; /* the imported parameters (nparams) */
} loaded;

/* The deck a fixture model corresponds to, from its config.json. */
static void model_cfg(const char *dir, cfg_model *mc) {
  cfg_model_defaults(mc);
  err_list e = {0};
  T_CHECK(hf_config_to_model(dir, mc, &e) == 0, "hf_config_to_model %s", dir);
  show(&e);
  err_free(&e);
}

static int load(loaded *l, const char *dir, int B, int T) {
  err_list e = {0};
  model_cfg(dir, &l->mc);
  T_CHECK(hf_check_config(dir, &l->mc, &e) == 0, "%s: config.json disagrees with the deck made from it", dir);
  gpt_shape_from_cfg(&l->s, &l->mc);
  gpt_init(&l->m, &l->s, backend_cpu(), B, T, gpt_whole(&l->s), 1);
  int n = hf_read_params(dir, &l->s, l->m.tensors, l->m.ntensors, l->m.params, &e);
  T_CHECK(n == 0, "%s: hf_read_params: %d errors", dir, n);
  show(&e);
  err_free(&e);
  gpt_params_changed(&l->m, 0, l->m.nparams);
  l->host = malloc(l->m.nparams * sizeof(float));
  memcpy(l->host, l->m.params, l->m.nparams * sizeof(float));
  return n;
}

static void unload(loaded *l) {
  free(l->host);
  gpt_free(&l->m);
  gpt_shape_free(&l->s);
}

static void json_ints(const json_t *a, int32_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
}

/* A continuation longer than the block: the window of the last T + 1 tokens holds continuation
 * tokens only, and the score is the sum of its T predictions. */
static void check_long_continuation(loaded *l, tok_tokenizer *tok, const char *what) {
  const int T = l->m.T;
  char cont[4096] = "";
  for (int k = 0; k < 2 * T && strlen(cont) + 8 < sizeof cont; k++) strcat(cont, " river");
  score_request q = {"The", cont, 1};
  score_result r;
  score_one(&l->m, tok, &q, &r);
  tok_ids all = {0};
  tok_encode(tok, cont, strlen(cont), 0, &all);
  T_CHECK(all.n > (size_t)T + 1, "%s: the long continuation has %zu tokens, block %d", what, all.n, T);
  const int32_t *w = all.v + all.n - (size_t)T - 1;
  gpt_set_batch(&l->m, 0, w, w + 1, 1, T);
  gpt_forward(&l->m, 0, 1, T);
  gpt_loss(&l->m, 0, 1, T, 0.0f);
  const float *loss = gpt_token_losses(&l->m, T);
  double want = 0;
  for (int t = 0; t < T; t++) want -= loss[t];
  T_CHECK(r.truncated && r.inputs == T && r.ntokens == (int)all.n && fabs(r.loglik - want) < 1e-4 * fmax(1.0, fabs(want)),
          "%s: continuation of %zu tokens past block %d: log-likelihood %.6f over the window (want %.6f), truncated %d, "
          "inputs %d", what, all.n, T, r.loglik, want, r.truncated, r.inputs);
  tok_ids_free(&all);
}

/* ids equal the JSON array of integers want. */
static int ids_equal(const int32_t *ids, size_t n, const json_t *want) {
  int same = n == json_array_size(want);
  for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
  return same;
}

/* Pair i's tokens from score_encode are lm-eval's (context_ids, continuation_ids). */
static void check_encoding(tok_tokenizer *tok, const json_t *p, size_t i, const char *what) {
  const char *ctx = json_string_value(json_object_get(p, "context")), *cont = json_string_value(json_object_get(p, "continuation"));
  tok_ids all = {0};
  size_t n = score_encode(tok, ctx, cont, &all);
  T_CHECK(ids_equal(all.v, n, json_object_get(p, "context_ids")) &&
              ids_equal(all.v + n, all.n - n, json_object_get(p, "continuation_ids")),
          "%s: pair %zu (\"%s\", \"%s\"): %zu + %zu tokens, not lm-eval's encoding with transformers' tokenizer", what, i, ctx,
          cont, n, all.n - n);
  tok_ids_free(&all);
}

/* Each pair encoded as lm-eval did; with a model l, score_one gives its log-likelihood and greedy
 * flag as lm-eval with transformers did. */
static void check_pairs(loaded *l, tok_tokenizer *tok, const json_t *pairs, const char *what) {
  size_t i;
  json_t *p;
  json_array_foreach(pairs, i, p) {
    check_encoding(tok, p, i, what);
    if (!l) continue;
    int want = json_is_true(json_object_get(p, "greedy"));
    long nt = (long)json_array_size(json_object_get(p, "continuation_ids"));
    score_request q = {json_string_value(json_object_get(p, "context")), json_string_value(json_object_get(p, "continuation")), 1};
    score_result r;
    score_one(&l->m, tok, &q, &r);
    double lr = json_number_value(json_object_get(p, "loglikelihood"));
    T_CHECK(fabs(r.loglik - lr) < 1e-4 * fmax(1.0, fabs(lr)) && r.greedy_ok == want && r.ntokens == nt,
            "%s: pair %zu: log-likelihood %.7f over %d tokens (greedy %d), lm-eval with transformers %.7f (greedy %d)", what, i,
            r.loglik, r.ntokens, r.greedy_ok, lr, want);
  }
}

/* The fixture's logits, and its lm-eval scores from greenlm's scorer (eval/score.h) with the
 * tokenizer of tokdir. */
static void check_fixture(loaded *l, const json_t *fx, const char *what, const char *tokdir) {
  int B = (int)json_integer_value(json_object_get(fx, "B")), T = (int)json_integer_value(json_object_get(fx, "T"));
  size_t N = (size_t)B * T, V = (size_t)l->s.V;
  T_CHECK((size_t)json_integer_value(json_object_get(fx, "V")) == V, "%s: vocabulary", what);
  int32_t *x = malloc(N * sizeof(int32_t));
  float *lref = malloc(N * V * sizeof(float)), *lg = malloc(N * V * sizeof(float));
  for (int b = 0; b < B; b++) json_ints(json_array_get(json_object_get(fx, "input_ids"), (size_t)b), x + (size_t)b * T, (size_t)T);
  const json_t *lj = json_object_get(fx, "logits");
  for (size_t i = 0; i < N * V; i++) lref[i] = (float)json_number_value(json_array_get(lj, i));
  gpt_set_batch(&l->m, 0, x, NULL, B, T);
  gpt_forward(&l->m, 0, B, T);
  for (size_t r = 0; r < N; r++) gpt_logits_row(&l->m, 0, r, lg + r * V);
  double e = t_rel_err(lg, lref, N * V);
  T_CHECK(e < 1e-5, "%s: logits relative error %.3g", what, e);
  printf("  %s: logits relative error %.2e\n", what, e);
  tok_tokenizer tok;
  err_list te = {0};
  T_CHECK(tok_open(&tok, CFG_TOK_BPE, tokdir, &te) == 0, "tok_open bpe %s", tokdir);
  show(&te);
  if (!te.n) check_pairs(l, &tok, json_object_get(fx, "pairs"), what);
  if (!te.n) check_long_continuation(l, &tok, what);
  if (!te.n) tok_free(&tok);
  err_free(&te);
  free(x), free(lref), free(lg);
}

/* greenlm's BPE tokenizer pointed at a Hugging Face directory encodes as GPT2Tokenizer did. */
static void check_tokenizer(const char *dir, const json_t *fx) {
  tok_tokenizer t;
  err_list e = {0};
  T_CHECK(tok_open(&t, CFG_TOK_BPE, dir, &e) == 0, "tok_open bpe %s (vocab.json, merges.txt)", dir);
  show(&e);
  err_free(&e);
  if (e.n) return;
  size_t i;
  json_t *x;
  json_array_foreach(json_object_get(fx, "encodings"), i, x) {
    const char *text = json_string_value(json_object_get(x, "text"));
    const json_t *want = json_object_get(x, "ids");
    tok_ids ids = {0};
    tok_encode(&t, text, strlen(text), 1, &ids);
    T_CHECK(ids_equal(ids.v, ids.n, want), "%s: \"%s\" encodes differently from GPT2Tokenizer", dir, text);
    tok_ids_free(&ids);
  }
  tok_free(&t);
}

/* ---- 16-bit conversions ------------------------------------------------------------------------------ */

static uint16_t bits16(float x, int bf) { return bf ? safetensors_f32_to_bf16(x) : safetensors_f32_to_f16(x); }

/* Every 16-bit value survives f16/bf16 -> fp32 -> f16/bf16; halfway cases round to even; overflow
 * goes to infinity, underflow to zero. */
static void check_conversions(void) {
  int bad[2] = {0, 0};
  for (int bf = 0; bf < 2; bf++)
    for (uint32_t h = 0; h < 65536; h++) {
      float x = bf ? safetensors_bf16_to_f32((uint16_t)h) : safetensors_f16_to_f32((uint16_t)h);
      bad[bf] += !isnan(x) && bits16(x, bf) != h;
      bad[bf] += isnan(x) && !isnan(bf ? safetensors_bf16_to_f32(bits16(x, bf)) : safetensors_f16_to_f32(bits16(x, bf)));
    }
  T_CHECK(!bad[0] && !bad[1], "16-bit values that do not round-trip through fp32: f16 %d, bf16 %d", bad[0], bad[1]);
  const float tie = 1.0f + ldexpf(1, -11), up = 1.0f + 3 * ldexpf(1, -11), sub = ldexpf(3, -25);
  T_CHECK(bits16(tie, 0) == 0x3c00 && bits16(up, 0) == 0x3c02, "f16 ties to even: %04x %04x", bits16(tie, 0), bits16(up, 0));
  T_CHECK(bits16(65504.0f, 0) == 0x7bff && bits16(65520.0f, 0) == 0x7c00 && bits16(-1e6f, 0) == 0xfc00, "f16 overflow");
  T_CHECK(bits16(ldexpf(1, -25), 0) == 0 && bits16(sub, 0) == 2 && bits16(ldexpf(1, -24), 0) == 1, "f16 subnormals: %04x",
          bits16(sub, 0));
  T_CHECK(bits16(1.0f + ldexpf(1, -8), 1) == 0x3f80 && bits16(1.0f + 3 * ldexpf(1, -8), 1) == 0x3f82 &&
          bits16(3.4e38f, 1) == 0x7f80, "bf16 ties to even and overflow: %04x", bits16(1.0f + 3 * ldexpf(1, -8), 1));
}

/* ---- export and import again ------------------------------------------------------------------------ */

static float rounded(float x, safetensors_dtype d) {
  return d == SAFETENSORS_BF16 ? safetensors_bf16_to_f32(safetensors_f32_to_bf16(x))
       : d == SAFETENSORS_F16  ? safetensors_f16_to_f32(safetensors_f32_to_f16(x))
                               : x;
}

/* Export l into out/name and import it again: bitwise the originals rounded to dtype. */
static void roundtrip(loaded *l, const char *name, const char *dtype, double shard_mb, const char *kind, const char *tokdir) {
  char dir[4096];
  path_of(dir, out, name);
  cfg_tokenizer tk;
  cfg_sample smp = {.n_tokens = 20, .temperature = 0.8, .top_k = 40, .top_p = 0.95, .repetition_penalty = 1.1};
  memset(&tk, 0, sizeof tk);
  util_strlcpy(tk.kind, kind, sizeof tk.kind);
  util_strlcpy(tk.dir, tokdir, sizeof tk.dir);
  err_list e = {0};
  int n = hf_export(dir, &l->s, l->host, &l->mc, &tk, &smp, dtype, shard_mb, 1, &e);
  T_CHECK(n == 0, "export %s: %d errors", dir, n);
  show(&e);
  T_CHECK(hf_check_config(dir, &l->mc, &e) == 0, "export %s: its config.json disagrees with the deck", dir);
  float *back = malloc(l->m.nparams * sizeof(float));
  T_CHECK(hf_read_params(dir, &l->s, l->m.tensors, l->m.ntensors, back, &e) == 0, "import of export %s", dir);
  show(&e);
  safetensors_dtype d = SAFETENSORS_F32;
  safetensors_dtype_parse(dtype, &d);
  size_t bad = 0;
  for (size_t i = 0; i < l->m.nparams && !e.n; i++) {
    float want = rounded(l->host[i], d);
    bad += memcmp(&back[i], &want, sizeof(float)) != 0;
  }
  T_CHECK(bad == 0 && !e.n, "export %s (%s): %zu of %zu parameters differ from the rounded originals", dir, dtype, bad,
          l->m.nparams);
  free(back);
  err_free(&e);
}

static void check_exports(loaded *l, const char *arch, const char *tokdir) {
  char name[128], p[4096];
  const char *dtypes[] = {"fp32", "bf16", "fp16"};
  for (int i = 0; i < 3; i++) {
    util_snprintf(name, sizeof name, "export-%s%s%s", arch, i ? "-" : "", i ? dtypes[i] : "");
    roundtrip(l, name, dtypes[i], 5000, "bpe", tokdir);
  }
  util_snprintf(name, sizeof name, "export-%s-sharded", arch);
  roundtrip(l, name, "fp32", 0.04, "bpe", tokdir);
  util_snprintf(p, sizeof p, "%s/%s/model.safetensors.index.json", out, name);
  T_CHECK(access(p, F_OK) == 0, "a sharded export has %s", p);
  util_snprintf(p, sizeof p, "%s/%s/model.safetensors", out, name);
  T_CHECK(access(p, F_OK) != 0, "a sharded export of 40 kB shards has no %s", p);
  util_snprintf(p, sizeof p, "%s/%s/model-00001-of-00005.safetensors", out, name);
  T_CHECK(access(p, F_OK) == 0, "a sharded export of 40 kB shards (about 144 kB in all) has %s", p);
  util_snprintf(name, sizeof name, "export-%s-bytes", arch);
  roundtrip(l, name, "fp32", 5000, "bytes", "");
  /* the exported tokenizer is the same vocabulary (the same identity hash); a tokenizer read from a
   * tokenizer.json is written as one again, and as vocab.json and merges.txt when they say all of it */
  tok_tokenizer a, b;
  err_list e = {0};
  static const char *const files[] = {"tokenizer.json", "vocab.json", "merges.txt"};
  for (int i = 0; i < 3; i++) {
    util_snprintf(p, sizeof p, "%s/export-%s/%s", out, arch, files[i]);
    T_CHECK(access(p, F_OK) == 0, "the export of a model with GPT-2's tokenizer.json has no %s", p);
  }
  util_snprintf(p, sizeof p, "%s/export-%s", out, arch);
  if (tok_open(&a, CFG_TOK_BPE, tokdir, &e) == 0 && tok_open(&b, CFG_TOK_BPE, p, &e) == 0) {
    T_CHECK(a.hash == b.hash, "exported tokenizer %s has another identity than %s", p, tokdir);
    tok_free(&b);
  }
  if (!e.n) tok_free(&a);
  show(&e);
  err_free(&e);
}

static void run_model(const char *arch, const char *dirname, int exports) {
  char dir[4096], fxp[4096], tokdir[4096];
  path_of(dir, ref, dirname);
  util_snprintf(tokdir, sizeof tokdir, "%s/hf-%s", ref, arch); /* the sharded copy has no vocab.json */
  util_snprintf(fxp, sizeof fxp, "%s/hf-%s.json", ref, arch);
  json_error_t je;
  json_t *fx = json_load_file(fxp, 0, &je);
  T_CHECK(fx != NULL, "cannot read fixture %s: %s", fxp, je.text);
  if (!fx) return;
  printf("%s\n", dir);
  loaded l;
  if (load(&l, dir, 2, 32) == 0) {
    check_fixture(&l, fx, dirname, tokdir);
    if (exports) check_exports(&l, arch, dir);
  }
  if (exports) check_tokenizer(dir, fx);
  unload(&l);
  json_decref(fx);
}

/* A tokenizer from dir into t; 0, or -1 after showing why. */
static int open_tok(tok_tokenizer *t, const char *dir) {
  err_list e = {0};
  int rc = tok_open(t, CFG_TOK_BPE, dir, &e);
  T_CHECK(rc == 0, "tok_open bpe %s", dir);
  show(&e);
  err_free(&e);
  return rc;
}

/* lm-eval-pairs.json: pairs whose lm-eval encoding differs from encoding context and continuation
 * apart, scored with the hf-gpt2 model; with GPT-2's vocabulary ($GREENLM_GPT2_DIR, default
 * $TOP_SRCDIR/../shared/data/gpt2, skipped when absent) the encodings of its gpt2_pairs. */
static void run_pairs(void) {
  char fxp[4096], dir[4096], g2[4096];
  path_of(fxp, ref, "lm-eval-pairs.json");
  json_error_t je;
  json_t *fx = json_load_file(fxp, 0, &je);
  T_CHECK(fx != NULL, "cannot read fixture %s: %s", fxp, je.text);
  if (!fx) return;
  path_of(dir, ref, "hf-gpt2");
  loaded l;
  tok_tokenizer tok;
  if (load(&l, dir, 1, 32) == 0 && open_tok(&tok, dir) == 0) {
    check_pairs(&l, &tok, json_object_get(fx, "pairs"), "lm-eval-pairs");
    tok_free(&tok);
  }
  unload(&l);
  const char *top = getenv("TOP_SRCDIR"), *gd = getenv("GREENLM_GPT2_DIR");
  util_snprintf(g2, sizeof g2, "%s/../shared/data/gpt2", top ? top : ".");
  path_of(fxp, gd ? gd : g2, "encoder.json");
  if (access(fxp, R_OK) != 0) {
    printf("SKIP: lm-eval encodings with GPT-2's vocabulary: no %s (set GREENLM_GPT2_DIR)\n", fxp);
  } else if (open_tok(&tok, gd ? gd : g2) == 0) {
    const json_t *gp = json_object_get(fx, "gpt2_pairs");
    T_CHECK(json_array_size(gp) > 0, "%s has no gpt2_pairs", "lm-eval-pairs.json");
    check_pairs(NULL, &tok, gp, "GPT-2 pairs");
    printf("  lm-eval encodings of %zu pairs with GPT-2's vocabulary\n", json_array_size(gp));
    tok_free(&tok);
  }
  json_decref(fx);
}

/* ---- bad input ------------------------------------------------------------------------------------- */

/* A model file's tensors in memory (the file's names, shapes and fp32 data). */
typedef struct {
  safetensors_out *t;
  float **data;
  char (*names)[SAFETENSORS_NAME_LEN];
  int n;
} tensors;

static void read_all(const char *path, tensors *ts) {
  safetensors_file f;
  err_list e = {0};
  memset(ts, 0, sizeof *ts);
  T_CHECK(safetensors_open(&f, path, &e) == 0, "open %s", path);
  show(&e);
  if (e.n) return;
  ts->n = f.n;
  ts->t = calloc((size_t)f.n + 2, sizeof *ts->t);
  ts->data = calloc((size_t)f.n + 2, sizeof *ts->data);
  ts->names = calloc((size_t)f.n + 2, sizeof *ts->names);
  for (int i = 0; i < f.n; i++) {
    ts->data[i] = malloc(f.t[i].numel * sizeof(float));
    T_CHECK(safetensors_read(&f, &f.t[i], ts->data[i], &e) == 0, "read %s", f.t[i].name);
    ts->t[i].name = strcpy(ts->names[i], f.t[i].name);
    ts->t[i].ndim = f.t[i].ndim;
    memcpy(ts->t[i].shape, f.t[i].shape, sizeof f.t[i].shape);
    ts->t[i].data = ts->data[i];
  }
  safetensors_close(&f);
}

static int find(const tensors *ts, const char *name) {
  for (int i = 0; i < ts->n; i++)
    if (strcmp(ts->t[i].name, name) == 0) return i;
  return -1;
}

/* out/bad-<name>/, fresh. */
static const char *bad_dir(const char *name) {
  static char dir[4096];
  util_snprintf(dir, sizeof dir, "%s/bad-%s", out, name);
  nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  util_mkdir_p(dir);
  return dir;
}

/* Import from dir must fail with an error at a file containing `file` whose message names `tensor`
 * and says `what`, and (when `alone`) leave the parameters alone: every check of the files comes
 * before the first tensor is read, but a NaN is found as its tensor is read. */
static void expect_error(loaded *l, const char *dir, const char *file, const char *tensor, const char *what, int alone) {
  float *p = malloc(l->m.nparams * sizeof(float));
  for (size_t i = 0; i < l->m.nparams; i++) p[i] = 7.0f;
  err_list e = {0};
  int n = hf_read_params(dir, &l->s, l->m.tensors, l->m.ntensors, p, &e);
  int untouched = 1;
  for (size_t i = 0; i < l->m.nparams; i++) untouched &= p[i] == 7.0f;
  T_CHECK(n > 0 && has_error(&e, file, tensor) && has_error(&e, file, what) && (untouched || !alone),
          "%s: expected an error at %s naming %s (\"%s\"), parameters untouched (%d)", dir, file, tensor, what, untouched);
  if (e.n) printf("  %s -> %s: %s\n", strrchr(dir, '/') + 1, e.v[0].msg, e.v[0].hint);
  free(p);
  err_free(&e);
}

static void expect_import_error(loaded *l, const char *dir, const char *file, const char *tensor, const char *what) {
  expect_error(l, dir, file, tensor, what, 1);
}

/* Write ts (without tensor `skip`, -1 for none) to dir/model.safetensors. */
static void write_model(const char *dir, tensors *ts, int skip) {
  safetensors_out *t = malloc(((size_t)ts->n + 1) * sizeof *t);
  int n = 0;
  for (int i = 0; i < ts->n; i++)
    if (i != skip) t[n++] = ts->t[i];
  char p[4096];
  path_of(p, dir, "model.safetensors");
  err_list e = {0};
  T_CHECK(safetensors_write(p, t, n, SAFETENSORS_F32, &e) == 0, "write %s", p);
  show(&e);
  err_free(&e);
  free(t);
}

/* Copy src to dir/model.safetensors with its JSON header edited (entry `name`: dtype, offsets
 * shifted by db/de) and the data area cut by `cut` bytes. */
static void rewrite(const char *src, const char *dir, const char *name, const char *dtype, long db, long de, long cut) {
  size_t len;
  err_list e = {0};
  char *buf = util_read_file(src, 1 << 24, &len, "model", NULL, &e);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)buf[i];
  json_t *h = json_loadb(buf + 8, (size_t)hl, 0, NULL), *t = json_object_get(h, name);
  if (dtype) json_object_set_new(t, "dtype", json_string(dtype));
  json_t *off = json_object_get(t, "data_offsets");
  json_array_set_new(off, 0, json_integer(json_integer_value(json_array_get(off, 0)) + db));
  json_array_set_new(off, 1, json_integer(json_integer_value(json_array_get(off, 1)) + de));
  char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER), p[4096];
  uint64_t nl = strlen(text);
  unsigned char lb[8];
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(nl >> (8 * i));
  path_of(p, dir, "model.safetensors");
  FILE *fp = fopen(p, "wb");
  fwrite(lb, 1, 8, fp);
  fwrite(text, 1, nl, fp);
  fwrite(buf + 8 + hl, 1, len - 8 - hl - (size_t)cut, fp);
  fclose(fp);
  free(text), free(buf);
  json_decref(h);
  err_free(&e);
}

static void write_bytes(const char *dir, const char *file, const void *data, size_t n) {
  char p[4096];
  path_of(p, dir, file);
  FILE *fp = fopen(p, "wb");
  fwrite(data, 1, n, fp);
  fclose(fp);
}

/* Shards whose index places a tensor in the wrong file. */
static void bad_index(loaded *l, tensors *ts) {
  const char *d = bad_dir("index");
  err_list e = {0};
  int nf = 0;
  T_CHECK(safetensors_write_model(d, ts->t, ts->n, SAFETENSORS_F32, 40000, &nf, &e) == 0 && nf == 5, "5 shards, got %d", nf);
  char p[4096];
  path_of(p, d, "model.safetensors.index.json");
  json_t *idx = json_load_file(p, 0, NULL);
  json_object_set_new(json_object_get(idx, "weight_map"), "transformer.wte.weight", json_string("model-00001-of-00005.safetensors"));
  json_dump_file(idx, p, 0);
  json_decref(idx);
  expect_import_error(l, d, "model.safetensors.index.json", "transformer.wte.weight", "which does not hold it");
  err_free(&e);
}

static void bad_weights(loaded *l) {
  char src[4096];
  util_snprintf(src, sizeof src, "%s/hf-gpt2/model.safetensors", ref);
  tensors ts;
  read_all(src, &ts);
  if (!ts.n) return;
  const char *d;
  int fc = find(&ts, "transformer.h.0.mlp.c_fc.weight"), wte = find(&ts, "transformer.wte.weight");
  write_model(d = bad_dir("missing"), &ts, find(&ts, "transformer.h.1.mlp.c_fc.bias"));
  expect_import_error(l, d, "bad-missing", "transformer.h.1.mlp.c_fc.bias", "missing tensor");
  ts.t[ts.n] = ts.t[fc];
  ts.t[ts.n].name = "transformer.h.7.mlp.c_fc.weight";
  ts.n++;
  write_model(d = bad_dir("extra"), &ts, -1);
  expect_import_error(l, d, "bad-extra/model.safetensors", "transformer.h.7.mlp.c_fc.weight", "unexpected tensor");
  ts.t[ts.n - 1].name = "lm_head.weight";
  ts.t[ts.n - 1].data = ts.data[wte];
  memcpy(ts.t[ts.n - 1].shape, ts.t[wte].shape, sizeof ts.t[wte].shape);
  write_model(d = bad_dir("lm-head-tied"), &ts, -1);
  err_list e = {0};
  float *p = malloc(l->m.nparams * sizeof(float));
  T_CHECK(hf_read_params(d, &l->s, l->m.tensors, l->m.ntensors, p, &e) == 0 && memcmp(p, l->host, l->m.nparams * 4) == 0,
          "an lm_head.weight equal to wte is accepted");
  float *other = malloc(ts.t[wte].shape[0] * ts.t[wte].shape[1] * sizeof(float));
  memcpy(other, ts.data[wte], ts.t[wte].shape[0] * ts.t[wte].shape[1] * sizeof(float));
  other[5] += 1.0f;
  ts.t[ts.n - 1].data = other;
  write_model(d = bad_dir("lm-head"), &ts, -1);
  expect_import_error(l, d, "bad-lm-head/model.safetensors", "lm_head.weight", "differs from transformer.wte.weight");
  ts.n--;
  int64_t s0 = ts.t[fc].shape[0];
  ts.t[fc].shape[0] = ts.t[fc].shape[1], ts.t[fc].shape[1] = s0;
  write_model(d = bad_dir("shape"), &ts, -1);
  expect_import_error(l, d, "bad-shape/model.safetensors", "transformer.h.0.mlp.c_fc.weight", "has shape [128, 32]");
  ts.t[fc].shape[1] = ts.t[fc].shape[0], ts.t[fc].shape[0] = s0;
  for (int i = 0; i < ts.n; i++) ts.t[i].name += strncmp(ts.t[i].name, "transformer.", 12) == 0 ? 12 : 0;
  write_model(d = bad_dir("no-prefix"), &ts, -1);
  T_CHECK(hf_read_params(d, &l->s, l->m.tensors, l->m.ntensors, p, &e) == 0 && memcmp(p, l->host, l->m.nparams * 4) == 0,
          "names without the transformer. prefix (the original gpt2 repository's) are read");
  show(&e);
  /* headers edited byte by byte */
  const char *ln = "transformer.h.0.ln_1.weight";
  bad_index(l, &ts);
  rewrite(src, d = bad_dir("dtype"), ln, "I32", 0, 0, 0);
  expect_import_error(l, d, "bad-dtype/model.safetensors", ln, "dtype I32 is not supported");
  rewrite(src, d = bad_dir("dtype-size"), ln, "F64", 0, 0, 0);
  expect_import_error(l, d, "bad-dtype-size/model.safetensors", ln, "elements of F64 take");
  rewrite(src, d = bad_dir("dtype-unknown"), ln, "Q7", 0, 0, 0);
  expect_import_error(l, d, "bad-dtype-unknown/model.safetensors", ln, "unknown dtype \"Q7\"");
  rewrite(src, d = bad_dir("overlap"), ln, NULL, -4, -4, 0);
  expect_import_error(l, d, "bad-overlap/model.safetensors", ln, "overlap");
  rewrite(src, d = bad_dir("size"), ln, NULL, 0, -4, 0);
  expect_import_error(l, d, "bad-size/model.safetensors", ln, "take 128");
  rewrite(src, d = bad_dir("truncated"), ln, NULL, 0, 0, 100);
  expect_import_error(l, d, "bad-truncated/model.safetensors", "transformer.", "reach past the data area");
  unsigned char big[16] = {0x40, 0x42, 0x0f, 0, 0, 0, 0, 0, '{', '}'};
  write_bytes(d = bad_dir("header-length"), "model.safetensors", big, sizeof big);
  expect_import_error(l, d, "bad-header-length/model.safetensors", "header length 1000000", "larger than the file");
  unsigned char txt[24] = {16, 0, 0, 0, 0, 0, 0, 0, 't', 'h', 'i', 's', ' ', 'i', 's', ' ', 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'};
  write_bytes(d = bad_dir("not-json"), "model.safetensors", txt, sizeof txt);
  expect_import_error(l, d, "bad-not-json/model.safetensors", "header", "not a JSON object");
  write_bytes(d = bad_dir("pytorch"), "pytorch_model.bin", "PK", 2);
  expect_import_error(l, d, "bad-pytorch", "pytorch_model.bin", "safetensors weights only");
  for (int i = 0; i < ts.n; i++) free(ts.data[i]);
  free(other), free(p), free(ts.data), free(ts.t), free(ts.names);
  err_free(&e);
}

/* Weights that are not all finite: a NaN (F32), an infinity (BF16) refused by name and index; a value
 * beyond fp16's range refused by the export instead of written as an infinity. */
static void bad_values(loaded *l) {
  char src[4096], p[4096];
  util_snprintf(src, sizeof src, "%s/hf-gpt2/model.safetensors", ref);
  tensors ts;
  read_all(src, &ts);
  if (!ts.n) return;
  int fc = find(&ts, "transformer.h.1.mlp.c_fc.weight"), wte = find(&ts, "transformer.wte.weight");
  float keep = ts.data[fc][5];
  ts.data[fc][5] = NAN;
  const char *d = bad_dir("nan");
  write_model(d, &ts, -1);
  expect_error(l, d, "bad-nan/model.safetensors", "transformer.h.1.mlp.c_fc.weight", "element 5 [0, 5] is NaN", 0);
  ts.data[fc][5] = keep;
  ts.data[wte][32 * 2 + 7] = -INFINITY;
  err_list e = {0};
  path_of(p, d = bad_dir("inf-bf16"), "model.safetensors");
  T_CHECK(safetensors_write(p, ts.t, ts.n, SAFETENSORS_BF16, &e) == 0, "write %s", p);
  expect_error(l, d, "bad-inf-bf16/model.safetensors", "transformer.wte.weight", "element 71 [2, 7] is -infinity", 0);
  float *params = malloc(l->m.nparams * sizeof(float));
  memcpy(params, l->host, l->m.nparams * sizeof(float));
  params[l->m.nparams - 1] = 1e6f; /* the last tensor: ln_f.bias */
  cfg_tokenizer tk;
  cfg_sample smp = {.temperature = 0};
  memset(&tk, 0, sizeof tk);
  strcpy(tk.kind, "bytes");
  path_of(p, out, "bad-fp16-range");
  T_CHECK(hf_export(p, &l->s, params, &l->mc, &tk, &smp, "fp16", 5000, 0, &e) == 1 &&
          has_error(&e, "bad-fp16-range", "transformer.ln_f.bias: element 31 = 1e+06 is beyond the range of F16") &&
          access(p, F_OK) != 0, "a value beyond fp16's range is an export error, and nothing is written");
  show(&e);
  for (int i = 0; i < ts.n; i++) free(ts.data[i]);
  free(params), free(ts.data), free(ts.t), free(ts.names);
  err_free(&e);
}

/* A config.json that must be refused with one error saying `what`. */
typedef struct {
  const char *name, *json, *what;
} config_case;

static void expect_config_errors(const config_case *cases, size_t n, const cfg_model *mc) {
  err_list e = {0};
  for (size_t i = 0; i < n; i++) {
    const char *d = bad_dir(cases[i].name);
    write_bytes(d, "config.json", cases[i].json, strlen(cases[i].json));
    T_CHECK(hf_check_config(d, mc, &e) == 1 && has_error(&e, "config.json", cases[i].what), "%s: expected \"%s\"",
            cases[i].name, cases[i].what);
    show(&e);
    err_free(&e);
  }
}

/* config.json's counts beyond the deck's ranges (a loop or a product over them would run away), and
 * paths that are not files where the directory's files belong. */
static void hostile_config(loaded *neo) {
  static const config_case cases[] = {
      {"layers", "{\"model_type\": \"gpt_neo\", \"num_layers\": 1000000000000}",
       "num_layers = 1000000000000 is more than greenlm takes (&model n_layer, at most 4096)"},
      {"inner", "{\"model_type\": \"gpt2\", \"n_inner\": 9223372036854775807}",
       "n_inner = 9223372036854775807 is more than greenlm takes (&model n_inner, at most 4194304)"},
      {"repeats", "{\"model_type\": \"gpt_neo\", \"num_layers\": 2, \"attention_types\": [[[], 1000000000000000000]]}",
       "attention_types entry 0 repeats its kinds 1000000000000000000 times: not in 0 .. 2"},
  };
  expect_config_errors(cases, sizeof cases / sizeof cases[0], &neo->mc);
  err_list e = {0};
  char p[4096], dir[4096];
  const char *d = bad_dir("config-dir");
  path_of(p, d, "config.json");
  mkdir(p, 0755);
  T_CHECK(hf_check_config(d, &neo->mc, &e) == 1 && has_error(&e, "config.json", "a directory, not a model config file"),
          "a directory where config.json belongs is named as such");
  err_free(&e);
  path_of(dir, ref, "hf-neo");
  d = bad_dir("weights-fifo");
  path_of(p, d, "model.safetensors");
  T_CHECK(mkfifo(p, 0644) == 0, "mkfifo %s", p);
  expect_import_error(neo, d, "bad-weights-fifo/model.safetensors", "", "a FIFO (named pipe), not a safetensors file");
}

static void bad_config(loaded *neo) {
  char dir[4096];
  path_of(dir, ref, "hf-gpt2");
  cfg_model mc;
  model_cfg(dir, &mc);
  mc.n_embd = 64, mc.n_head = 8, mc.n_layer = 3, mc.vocab_size = 300, mc.block_size = 128;
  err_list e = {0};
  int n = hf_check_config(dir, &mc, &e);
  const char *keys[] = {"&model n_embd = 64", "&model n_head = 8", "&model n_layer = 3", "&model vocab_size = 300",
                        "&model block_size = 128", "&model n_inner = 256"}; /* n_inner 0: 4 n_embd */
  T_CHECK(n == 6, "6 mismatches of the deck with %s/config.json, got %d", dir, n);
  for (int i = 0; i < 6; i++) T_CHECK(has_error(&e, "hf-gpt2/config.json", keys[i]), "a mismatch names %s", keys[i]);
  for (int i = 0; i < e.n; i++) printf("  mismatch: %s (hint: %s)\n", e.v[i].msg, e.v[i].hint);
  err_free(&e);
  path_of(dir, ref, "hf-neo");
  mc = neo->mc;
  mc.attention_types.n = 1;
  mc.window_size = 8;
  strcpy(mc.arch, "gpt2");
  n = hf_check_config(dir, &mc, &e);
  T_CHECK(n == 3 && has_error(&e, "config.json", "layer 1 is local") && has_error(&e, "config.json", "window_size = 4") &&
          has_error(&e, "config.json", "model_type = 'gpt-neo'"), "neo config vs a gpt2 deck: 3 errors, got %d", n);
  err_free(&e);
  const char *relu = "{\"model_type\": \"gpt2\", \"activation_function\": \"relu\", \"scale_attn_weights\": false}";
  const char *d = bad_dir("relu");
  write_bytes(d, "config.json", relu, strlen(relu));
  T_CHECK(hf_check_config(d, &neo->mc, &e) == 2 && has_error(&e, "bad-relu/config.json", "activation_function = \"relu\"") &&
          has_error(&e, "bad-relu/config.json", "scale_attn_weights = false"), "relu and unscaled attention are refused");
  err_free(&e);
  const char *mistral = "{\"model_type\": \"mistral\", \"hidden_size\": 32}";
  d = bad_dir("mistral");
  write_bytes(d, "config.json", mistral, strlen(mistral));
  T_CHECK(hf_check_config(d, &neo->mc, &e) == 1 && has_error(&e, "bad-mistral/config.json", "unsupported architecture: "
          "model_type = \"mistral\""), "mistral (sliding-window attention) is an unsupported architecture");
  err_free(&e);
}

/* A deck mc against tests/reference/<name>/config.json: exactly the n mismatches keys, each named. */
static void expect_mismatches(const char *name, const cfg_model *mc, const char *const *keys, int n) {
  err_list e = {0};
  char dir[4096], where[128];
  path_of(dir, ref, name);
  util_snprintf(where, sizeof where, "%s/config.json", name);
  int got = hf_check_config(dir, mc, &e);
  T_CHECK(got == n, "%d mismatches of the deck with %s/config.json, got %d", n, dir, got);
  for (int i = 0; i < n; i++) T_CHECK(has_error(&e, where, keys[i]), "a mismatch names %s", keys[i]);
  show(&e);
  err_free(&e);
}

/* GPT-NeoX's config.json: fields greenlm does not implement are named and refused; the deck's GPT-NeoX keys are
 * compared with the config's. */
static void bad_neox_config(const loaded *neox) {
  static const config_case cases[] = {
      {"neox-field", "{\"model_type\": \"gpt_neox\", \"sliding_window\": 4096}",
       "config.json field \"sliding_window\" is not one greenlm implements"},
      {"neox-scaling", "{\"model_type\": \"gpt_neox\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
       "rope_scaling is set"},
      {"neox-rope-type", "{\"model_type\": \"gpt_neox\", \"rope_parameters\": {\"rope_type\": \"dynamic\"}}",
       "rope_parameters.rope_type = dynamic is not supported"},
      {"neox-dropout", "{\"model_type\": \"gpt_neox\", \"hidden_dropout\": 0.1}", "hidden_dropout = 0.1"},
      {"neox-act", "{\"model_type\": \"gpt_neox\", \"hidden_act\": \"relu\"}", "hidden_act = \"relu\" is not an activation"},
  };
  expect_config_errors(cases, sizeof cases / sizeof cases[0], &neox->mc);
  cfg_model mc = neox->mc;
  mc.rotary_pct = 1.0, mc.rotary_emb_base = 500000.0, mc.use_parallel_residual = 0, mc.attention_bias = 0;
  util_strlcpy(mc.activation, "gelu_new", sizeof mc.activation), util_strlcpy(mc.head, "tied", sizeof mc.head);
  static const char *const keys[] = {"&model rotary_pct = 1", "&model rotary_emb_base = 500000",
                                     "&model use_parallel_residual = .false.", "&model attention_bias = .false.",
                                     "&model activation = 'gelu_new'", "&model head = 'tied'"};
  expect_mismatches("hf-neox", &mc, keys, 6);
}

/* Llama's config.json: scaled rotary embeddings other than Llama 3's, an incomplete Llama 3 scaling, fields greenlm
 * does not implement, another activation or head size are named and refused; the deck's Llama keys (Llama 3's
 * scaling too) are compared with the config's. */
static void bad_llama_config(const loaded *llama, const loaded *llama3) {
  static const config_case cases[] = {
      {"llama-field", "{\"model_type\": \"llama\", \"sliding_window\": 4096}",
       "config.json field \"sliding_window\" is not one greenlm implements"},
      {"llama-yarn", "{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}}",
       "rope_scaling is set: scaled rotary embeddings of type yarn are not supported"},
      {"llama-dynamic", "{\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}",
       "rope_parameters.rope_type = dynamic is not supported"},
      {"llama3-incomplete", "{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
       "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}",
       "rope_scaling.original_max_position_embeddings is missing"},
      {"llama3-field", "{\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
       "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, "
       "\"attention_factor\": 2.0}}", "rope_parameters.attention_factor is not a field greenlm implements"},
      {"llama-act", "{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", "hidden_act = \"gelu\" is not silu"},
      {"llama-head-dim", "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32}",
       "head_dim = 32 with hidden_size 64 and 4 heads"},
      {"llama-dropout", "{\"model_type\": \"llama\", \"attention_dropout\": 0.1}", "attention_dropout = 0.1"},
  };
  expect_config_errors(cases, sizeof cases / sizeof cases[0], &llama->mc);
  cfg_model mc = llama->mc;
  mc.n_kv_head = 4, mc.rotary_emb_base = 10000.0, mc.attention_bias = 1, mc.mlp_bias = 1;
  static const char *const keys[] = {"&model n_kv_head = 4", "&model rotary_emb_base = 10000",
                                     "&model attention_bias = .true.", "&model mlp_bias = .true."};
  expect_mismatches("hf-llama", &mc, keys, 4);
  mc = llama3->mc; /* Llama 3's scaling: each of its keys, and none in the deck */
  mc.rope_factor = 4, mc.rope_low_freq_factor = 2, mc.rope_high_freq_factor = 8, mc.rope_original_positions = 8192;
  static const char *const scaled[] = {"&model rope_factor = 4", "&model rope_low_freq_factor = 2",
                                       "&model rope_high_freq_factor = 8", "&model rope_original_positions = 8192"};
  expect_mismatches("hf-llama3", &mc, scaled, 4);
  util_strlcpy(mc.rope_scaling, "none", sizeof mc.rope_scaling);
  static const char *const unscaled[] = {"&model rope_scaling = 'none'"};
  expect_mismatches("hf-llama3", &mc, unscaled, 1);
}

/* Exporting into a non-empty directory without overwrite, or with a bad dtype, writes nothing. */
static void bad_export(loaded *l) {
  const char *d = bad_dir("export");
  write_bytes(d, "keep.txt", "mine", 4);
  cfg_tokenizer tk;
  cfg_sample smp = {.temperature = 0};
  memset(&tk, 0, sizeof tk);
  strcpy(tk.kind, "bytes");
  err_list e = {0};
  T_CHECK(hf_export(d, &l->s, l->host, &l->mc, &tk, &smp, "fp32", 5000, 0, &e) == 1 && has_error(&e, "bad-export", "not empty"),
          "export into a non-empty directory without overwrite is an error");
  char p[4096], dir2[4096];
  path_of(p, d, "keep.txt");
  path_of(dir2, out, "bad-export-dtype");
  T_CHECK(access(p, F_OK) == 0, "the existing directory is left alone");
  T_CHECK(hf_export(dir2, &l->s, l->host, &l->mc, &tk, &smp, "fp8", 5000, 0, &e) == 1 && access(dir2, F_OK) != 0,
          "an unknown dtype is an error and writes nothing");
  T_CHECK(hf_export(d, &l->s, l->host, &l->mc, &tk, &smp, "bf16", 5000, 1, &e) == 0 && access(p, F_OK) != 0,
          "overwrite replaces the directory");
  DIR *dp = opendir(out); /* no temporary directory is left behind */
  struct dirent *de;
  while (dp && (de = readdir(dp)))
    T_CHECK(!strstr(de->d_name, ".tmp-") && !strstr(de->d_name, ".old-"), "temporary directory left: %s/%s", out, de->d_name);
  if (dp) closedir(dp);
  err_free(&e);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *top = getenv("TOP_SRCDIR"), *o = getenv("TEST_OUT");
  util_snprintf(ref, sizeof ref, "%s/tests/reference", top ? top : ".");
  util_snprintf(out, sizeof out, "%s/hf", o ? o : "tests/out");
  nftw(out, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  util_mkdir_p(out);
  check_conversions();
  run_model("neo", "hf-neo", 1);
  run_model("gpt2", "hf-gpt2-sharded", 0);
  run_model("gpt2", "hf-gpt2", 1);
  run_model("neox", "hf-neox", 1);           /* as transformers 5 saves it: lm_head, rope_parameters */
  run_model("neox", "hf-neox-published", 0); /* as Pythia is published: embed_out, rotary_pct, rotary_emb_base */
  run_model("llama", "hf-llama", 1);         /* grouped-query attention, rope_parameters */
  run_model("llama3", "hf-llama3", 1);       /* and Llama 3.1's scaled rotary embedding */
  run_pairs();
  loaded gpt2, neo, neox, llama, llama3;
  char dir[4096];
  path_of(dir, ref, "hf-gpt2");
  load(&gpt2, dir, 2, 16);
  bad_weights(&gpt2);
  bad_values(&gpt2);
  bad_export(&gpt2);
  path_of(dir, ref, "hf-neo");
  load(&neo, dir, 2, 16);
  bad_config(&neo);
  hostile_config(&neo);
  path_of(dir, ref, "hf-neox");
  load(&neox, dir, 2, 16);
  bad_neox_config(&neox);
  path_of(dir, ref, "hf-llama");
  load(&llama, dir, 2, 16);
  path_of(dir, ref, "hf-llama3");
  load(&llama3, dir, 2, 16);
  bad_llama_config(&llama, &llama3);
  unload(&llama), unload(&llama3);
  unload(&gpt2);
  unload(&neo);
  unload(&neox);
  int rc = t_done("test_hf");
  MPI_Finalize();
  return rc;
}
