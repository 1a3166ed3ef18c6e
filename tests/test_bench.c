/* test_bench: the benchmark readers (tests/data/bench-*.jsonl) build the requests lm-evaluation-
 * harness builds (hellaswag preprocessing, winogrande partial scoring, few-shot prompts that are
 * deterministic and never hold the item itself); scores of hand-made results; bad input is an error
 * at file:line; eval.json and eval.csv hold the rows. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "eval/bench.h"
#include "eval/report.h"
#include "testing.h"

static char data_dir[UTIL_PATH_MAX], out_dir[UTIL_PATH_MAX];

/* Load tests/data/bench-FILE.jsonl as kind; 0 or -1 (errors printed). */
static int load(bench_set *set, const char *kind, const char *file, long limit, int k, uint64_t seed) {
  char spec[UTIL_PATH_MAX + 64];
  err_list errs = {0};
  util_snprintf(spec, sizeof spec, "%s:%s/bench-%s.jsonl", kind, data_dir, file);
  int rc = bench_load(set, spec, limit, k, seed, &errs);
  if (rc != 0) err_print(&errs, 10);
  err_free(&errs);
  T_CHECK(rc == 0, "%s did not load", spec);
  return rc;
}

/* Request r's context and continuation are ctx and cont. */
static void expect_req(const bench_set *set, long r, const char *ctx, const char *cont) {
  const bench_request *q = bench_request_at(set, r);
  T_CHECK(strcmp(q->context, ctx) == 0, "%s request %ld: context \"%s\", not \"%s\"", set->name, r, q->context, ctx);
  T_CHECK(strcmp(q->continuation, cont) == 0, "%s request %ld: continuation \"%s\", not \"%s\"", set->name, r,
          q->continuation, cont);
}

static void test_lambada_requests(void) {
  bench_set s;
  if (load(&s, "lambada", "lambada", 0, 0, 1) != 0) return;
  T_CHECK(strcmp(s.name, "lambada:bench-lambada") == 0, "name %s", s.name);
  T_CHECK(s.nitems == 8 && s.nreq == 8 && s.nfile == 8, "%ld items, %ld requests", s.nitems, s.nreq);
  expect_req(&s, 5,
             "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him. The evil that "
             "men do lives after them; the good is oft interred with",
             " their");
  for (long r = 0; r < s.nreq; r++)
    T_CHECK(s.req[r].greedy == 1 && s.req[r].item == r && s.req[r].choice == 0, "request %ld", r);
  bench_free(&s);
  if (load(&s, "lambada", "lambada", 3, 0, 1) != 0) return;
  T_CHECK(s.nitems == 3 && s.nreq == 3 && s.nfile == 8, "limit 3: %ld items of %ld", s.nitems, s.nfile);
  bench_free(&s);
}

static void test_hellaswag_requests(void) {
  bench_set s;
  if (load(&s, "hellaswag", "hellaswag", 0, 0, 1) != 0) return;
  T_CHECK(s.nitems == 8 && s.nreq == 32, "%ld items, %ld requests", s.nitems, s.nreq);
  expect_req(&s, 3, "Roof shingle removal: A man is sitting on a roof. He", " starts pulling up roofing on a roof.");
  /* ctx_b capitalized (the rest lower-cased); an ending stripped */
  expect_req(&s, 5, "Baking cookies: A woman stands in a kitchen beside a bowl of dough. She rolls the dough flat with a pin",
             " and throws the bowl out of the window.");
  /* WikiHow: " [title]" -> ". ", tags removed, "  " -> " "; the space a removed leading tag leaves stays */
  const char *fig = "Home and Garden: How to plant a fig tree. Choose a sunny place. Figs like warmth and light.";
  expect_req(&s, 8, fig, "  Dig a hole twice as wide as the pot. Set the tree in it.");
  expect_req(&s, 9, fig, "  Water the tree with milk Figs drink milk.");
  expect_req(&s, 10, fig, "  Paint the tree blue.");
  expect_req(&s, 12, "Food and Entertaining: How to bake bread. Mix the flour, water, salt and yeast.",
             "  Knead the dough for ten minutes until it is smooth.");
  T_CHECK(s.req[8].context == s.req[9].context, "the choices of an item share its context");
  bench_free(&s);
}

static void test_piqa_arc_requests(void) {
  bench_set s;
  if (load(&s, "piqa", "piqa", 0, 0, 1) == 0) {
    T_CHECK(s.nreq == 16, "piqa: %ld requests", s.nreq);
    expect_req(&s, 3, "Question: To light a fire in a hearth,\nAnswer:",
               " lay dry kindling under the logs and light it with a match.");
    bench_free(&s);
  }
  const char *files[] = {"arc", "arc-hf"};
  for (int f = 0; f < 2; f++) {
    if (load(&s, "arc", files[f], 0, 0, 1) != 0) continue;
    T_CHECK(s.nitems == 8 && s.nreq == 4 + 4 + 4 + 4 + 4 + 5 + 3 + 4, "%s: %ld requests", files[f], s.nreq);
    expect_req(&s, 1, "Question: Which of these is a source of light?\nAnswer:", " the Sun");
    expect_req(&s, 24, "Question: Which animal is a mammal?\nAnswer:", " a lizard");
    bench_free(&s);
  }
}

static void test_winogrande_mc_requests(void) {
  bench_set s;
  if (load(&s, "winogrande", "winogrande", 0, 0, 1) == 0) {
    T_CHECK(s.nreq == 16, "winogrande: %ld requests", s.nreq);
    expect_req(&s, 0, "The Lion spared the Mouse because the Lion", " was too small to be worth eating.");
    expect_req(&s, 1, "The Lion spared the Mouse because the Mouse", " was too small to be worth eating.");
    expect_req(&s, 5, "Noah brought the dove into the ark, since the dove", " had come back with an olive leaf.");
    bench_free(&s);
  }
  if (load(&s, "mc", "mc", 0, 0, 1) == 0) {
    T_CHECK(s.nreq == 3 + 3 + 2 + 4 + 3 + 3 + 4 + 2, "mc: %ld requests", s.nreq);
    expect_req(&s, 0, "In the beginning God created", " the heaven and the earth.");
    expect_req(&s, 7, "Romeo, Romeo,", "\nwhere is the ark?"); /* a choice that starts with white space */
    expect_req(&s, 22, "And the evening and the morning were the", " first day.");
    bench_free(&s);
  }
}

/* The item whose solved example (its gold context and continuation, then "\n\n") starts at p, with
 * its length; -1 for none. zs: the same file without few-shot examples. */
static long example_at(const bench_set *zs, const char *p, size_t *len) {
  for (long j = 0; j < zs->nitems; j++) {
    const bench_request *g = &zs->req[zs->first[j] + bench_gold(zs, j)];
    size_t lc = strlen(g->context), ln = strlen(g->continuation);
    if (strncmp(p, g->context, lc) == 0 && strncmp(p + lc, g->continuation, ln) == 0 &&
        strncmp(p + lc + ln, "\n\n", 2) == 0) {
      *len = lc + ln + 2;
      return j;
    }
  }
  return -1;
}

/* Every prompt of fs is k solved examples of distinct other items, then the item's own context. */
static void check_fewshot(const bench_set *fs, const bench_set *zs, int k) {
  for (long r = 0; r < fs->nreq; r++) {
    const char *p = fs->req[r].context;
    long seen[BENCH_MAX_FEWSHOT], item = fs->req[r].item;
    int n = 0, ok = 1;
    for (size_t len = 0; n < k; n++, p += len) {
      seen[n] = example_at(zs, p, &len);
      for (int i = 0; i < n; i++) ok &= seen[i] != seen[n];
      ok &= seen[n] >= 0 && seen[n] != item;
      if (seen[n] < 0) break;
    }
    T_CHECK(ok && n == k, "%s request %ld: not %d examples of other items: \"%s\"", fs->name, r, k, fs->req[r].context);
    T_CHECK(strcmp(p, zs->req[r].context) == 0, "%s request %ld: the prompt does not end with the item", fs->name, r);
    T_CHECK(strcmp(fs->req[r].continuation, zs->req[r].continuation) == 0, "%s request %ld: continuation", fs->name, r);
  }
}

static void test_fewshot(void) {
  const char *kinds[] = {"lambada", "hellaswag", "piqa", "arc", "winogrande", "mc"};
  for (int i = 0; i < 6; i++) {
    bench_set zs, a, b, c;
    int k = i == 0 ? 3 : 2;
    if (load(&zs, kinds[i], kinds[i], 0, 0, 1) != 0) continue;
    if (load(&a, kinds[i], kinds[i], 5, k, 42) == 0 && load(&b, kinds[i], kinds[i], 5, k, 42) == 0 &&
        load(&c, kinds[i], kinds[i], 5, k, 43) == 0) {
      check_fewshot(&a, &zs, k);
      int same = 1, differ = 0;
      for (long r = 0; r < a.nreq; r++) {
        same &= strcmp(a.req[r].context, b.req[r].context) == 0;
        differ |= strcmp(a.req[r].context, c.req[r].context) != 0;
      }
      T_CHECK(same, "%s: the same seed drew other examples", kinds[i]);
      T_CHECK(differ, "%s: seeds 42 and 43 drew the same examples for every item", kinds[i]);
      bench_free(&a), bench_free(&b), bench_free(&c);
    }
    bench_free(&zs);
  }
  /* one example, spelled out: winogrande's is the gold option's context and the shared continuation */
  bench_set w;
  if (load(&w, "winogrande", "winogrande", 1, 1, 7) != 0) return;
  const char *ctx = w.req[0].context;
  T_CHECK(strstr(ctx, "\n\nThe Lion spared the Mouse because the Lion") != NULL && strstr(ctx, "because the Mouse") == NULL,
          "winogrande few-shot prompt: \"%s\"", ctx);
  bench_free(&w);
}

static void test_scores(void) {
  bench_set s;
  bench_scores sc;
  if (load(&s, "piqa", "piqa", 0, 0, 1) == 0) {
    /* golds 0 1 0 0 0 1 0 0; choice lengths (characters) 40/35 32/58 28/27 31/20 49/47 20/34 61/44 54/47.
     * raw argmax 0 0 0(tie: the first) 1 0 0 1 1 -> right: items 0 2 4 -> acc 3/8;
     * per character -0.25/-0.57 -0.94/-0.69 -0.179/-0.185 -0.387/-0.400 -0.061/-0.191 -0.30/-0.26
     * -0.33/-0.23 -0.074/-0.043 -> argmax 0 1 0 0 0 1 1 1 -> right: items 0-5 -> acc_norm 6/8 */
    const double ll[16] = {-10, -20, -30, -40, -5, -5, -12, -8, -3, -9, -6, -9, -20, -10, -4, -2};
    bench_result res[16];
    for (int r = 0; r < 16; r++) res[r] = (bench_result){.loglik = ll[r], .ntokens = 2};
    bench_score(&s, res, &sc);
    T_CHECK(sc.n == 8 && sc.tokens == 32, "piqa: n %ld, tokens %ld", sc.n, sc.tokens);
    T_CHECK(fabs(sc.acc - 0.375) < 1e-12 && fabs(sc.acc_norm - 0.75) < 1e-12, "piqa: acc %g, acc_norm %g", sc.acc,
            sc.acc_norm);
    /* sample standard deviation / sqrt(n) = sqrt(p (1 - p) / (n - 1)) */
    T_CHECK(fabs(sc.acc_stderr - 0.18298126367785) < 1e-12, "piqa: acc_stderr %.14f", sc.acc_stderr);
    T_CHECK(fabs(sc.acc_norm_stderr - 0.16366341767699) < 1e-12, "piqa: acc_norm_stderr %.14f", sc.acc_norm_stderr);
    T_CHECK(isnan(sc.ppl), "piqa has no perplexity");
    bench_free(&s);
  }
  if (load(&s, "lambada", "lambada", 0, 0, 1) == 0) {
    bench_result res[8];
    for (int r = 0; r < 8; r++) res[r] = (bench_result){.loglik = -(r + 1), .ntokens = 1 + (r == 1), .greedy_ok = r % 3 == 0};
    bench_score(&s, res, &sc); /* greedy right: items 0 3 6; exp(-mean(-1 .. -8)) = exp(4.5) */
    T_CHECK(fabs(sc.acc - 0.375) < 1e-12 && fabs(sc.acc_stderr - 0.18298126367785) < 1e-12, "lambada: acc %g ± %g",
            sc.acc, sc.acc_stderr);
    T_CHECK(fabs(sc.ppl - 90.0171313005218) < 1e-9, "lambada: ppl %.13f", sc.ppl);
    T_CHECK(isnan(sc.acc_norm) && isnan(sc.acc_norm_stderr) && sc.tokens == 9, "lambada: acc_norm %g, tokens %ld",
            sc.acc_norm, sc.tokens);
    bench_free(&s);
  }
  if (load(&s, "winogrande", "winogrande", 2, 0, 1) == 0) { /* golds 1 0: right, then wrong */
    bench_result res[4] = {{-9, 3, 0}, {-4, 3, 0}, {-9, 3, 0}, {-4, 3, 0}};
    bench_score(&s, res, &sc);
    T_CHECK(sc.acc == 0.5 && fabs(sc.acc_stderr - 0.5) < 1e-12 && isnan(sc.acc_norm), "winogrande: acc %g ± %g",
            sc.acc, sc.acc_stderr);
    bench_free(&s);
  }
}

/* Write text to out_dir/name; its path in path. */
static void write_file(char *path, size_t len, const char *name, const char *text) {
  util_snprintf(path, len, "%s/%s", out_dir, name);
  FILE *f = fopen(path, "w");
  T_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

/* Loading text as kind (with k few-shot examples) fails with one error at the file's line that says what. */
static void expect_bad(const char *kind, const char *text, int k, int line, const char *what) {
  char path[UTIL_PATH_MAX], spec[UTIL_PATH_MAX + 32];
  write_file(path, sizeof path, "bad.jsonl", text);
  util_snprintf(spec, sizeof spec, "%s:%s", kind, path);
  err_list errs = {0};
  bench_set s;
  int rc = bench_load(&s, spec, 0, k, 1, &errs);
  T_CHECK(rc == -1 && s.nreq == 0 && s.req == NULL, "%s \"%s\": loaded", kind, text);
  T_CHECK(errs.n == 1, "%s \"%s\": %d errors", kind, text, errs.n);
  if (errs.n >= 1) {
    const err_item *e = &errs.v[0];
    T_CHECK(strcmp(e->file, path) == 0 && e->line == line, "%s \"%s\": error at %s:%d, not line %d", kind, text, e->file,
            e->line, line);
    T_CHECK(strstr(e->msg, what) != NULL, "%s \"%s\": \"%s\" does not say \"%s\"", kind, text, e->msg, what);
    T_CHECK(strstr(what, "num_fewshot") || strstr(e->hint, kind) != NULL, "%s: the hint \"%s\" does not give the fields", kind, e->hint);
  }
  err_free(&errs);
}

static void test_bad_input(void) {
  const char *mc = "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"label\": 0}\n";
  char two[256];
  util_snprintf(two, sizeof two, "%s\n{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"label\": 2}\n", mc);
  expect_bad("mc", two, 0, 3, "\"label\" = 2 is not in 0 .. 1"); /* the blank line 2 counts */
  util_snprintf(two, sizeof two, "%s{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"label\": 0\n", mc);
  expect_bad("mc", two, 0, 2, "is not JSON");
  expect_bad("mc", "[1, 2]\n", 0, 1, "not a JSON object");
  expect_bad("mc", "{\"context\": \"a\", \"choices\": [\"b\", 3], \"label\": 0}\n", 0, 1, "element 1 of \"choices\"");
  expect_bad("hellaswag", "{\"activity_label\": \"a\", \"ctx_a\": \"b\", \"ctx_b\": \"c\", \"label\": 0}", 0, 1,
             "missing field \"endings\"");
  expect_bad("hellaswag",
             "{\"activity_label\": \"a\", \"ctx_a\": \"b\", \"ctx_b\": \"c\", \"endings\": [\"d\", \"e\"], \"label\": \"\"}", 0,
             1, "\"label\" is empty");
  expect_bad("piqa", "{\"goal\": 5, \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}", 0, 1, "\"goal\" is not a string");
  expect_bad("piqa", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\"}", 0, 1, "keep the labels apart");
  expect_bad("arc", "{\"question\": \"q\", \"choices\": {\"text\": [\"a\"], \"label\": [\"A\"]}, \"answerKey\": \"B\"}", 0, 1,
             "answerKey \"B\" is not the label");
  expect_bad("arc", "{\"question\": {\"stem\": \"q\", \"choices\": [{\"text\": \"a\"}]}, \"answerKey\": \"A\"}", 0, 1,
             "\"choices label\"");
  expect_bad("winogrande", "{\"sentence\": \"no blank\", \"option1\": \"a\", \"option2\": \"b\", \"answer\": \"1\"}", 0, 1,
             "no \"_\"");
  expect_bad("winogrande", "{\"sentence\": \"a _ b\", \"option1\": \"a\", \"option2\": \"b\", \"answer\": \"3\"}", 0, 1,
             "\"answer\" = 3");
  expect_bad("lambada", "{\"text\": \"oneword\"}", 0, 1, "no space");
  expect_bad("lambada", "\n\n", 0, 0, "no items");
  expect_bad("lambada", "{\"text\": \"a b\"}\n{\"text\": \"c d\"}\n", 2, 0, "num_fewshot = 2 needs 2 items");
  err_list errs = {0};
  bench_set s;
  T_CHECK(bench_load(&s, "squad:x.jsonl", 0, 0, 1, &errs) == -1 && errs.n == 1 && strstr(errs.v[0].msg, "unknown kind"),
          "an unknown kind loaded");
  T_CHECK(bench_load(&s, "lambada", 0, 0, 1, &errs) == -1 && errs.n == 2 && strstr(errs.v[1].msg, "not 'kind:path'"),
          "a benchmark without a path loaded");
  err_free(&errs);
}

/* acc_norm divides by characters, not bytes: "éé" is 2 characters in 4 bytes. */
static void test_norm_characters(void) {
  char path[UTIL_PATH_MAX], spec[UTIL_PATH_MAX + 8];
  write_file(path, sizeof path, "chars.jsonl", "{\"context\": \"x\", \"choices\": [\"\xc3\xa9\xc3\xa9\", \"abc\"], \"label\": 1}\n");
  util_snprintf(spec, sizeof spec, "mc:%s", path);
  err_list errs = {0};
  bench_set s;
  if (bench_load(&s, spec, 0, 0, 1, &errs) != 0) {
    T_CHECK(0, "%s did not load", spec);
    err_free(&errs);
    return;
  }
  bench_result res[2] = {{-2.2, 1, 0}, {-3.0, 1, 0}}; /* per character -1.1 < -1.0; per byte -0.55 > -1.0 */
  bench_scores sc;
  bench_score(&s, res, &sc);
  T_CHECK(sc.acc == 0 && sc.acc_norm == 1, "acc %g, acc_norm %g", sc.acc, sc.acc_norm);
  bench_free(&s);
}

/* The whole of a file (NULL when unreadable; free it). */
static char *slurp(const char *path) {
  err_list errs = {0};
  size_t len;
  char *text = util_read_file(path, 1 << 20, &len, "test output", NULL, &errs);
  err_free(&errs);
  return text;
}

static void test_report(void) {
  evalrep rep = {0};
  bench_scores sc = {.n = 8, .acc = 0.375, .acc_stderr = 0.25, .acc_norm = 0.75, .acc_norm_stderr = 0.125, .ppl = NAN};
  evalrep_add(&rep, "val", "loss", 3.5, NAN, 4096);
  evalrep_add(&rep, "val", "tokens", 4096, NAN, 4096);
  evalrep_add_scores(&rep, "piqa:bench-piqa", &sc);
  evalrep_add(&rep, "a,\"b\"", "ppl", 12.25, 0.5, 3);
  evalrep_info info = {.run_name = "tiny", .model = "runs/tiny/checkpoints/step-30.nc", .num_fewshot = 2, .limit = 100, .seed = 1234};
  err_list errs = {0};
  T_CHECK(evalrep_write(&rep, &info, out_dir, &errs) == 0, "eval.json / eval.csv not written");
  err_free(&errs);

  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/eval.json", out_dir);
  json_error_t jerr;
  json_t *j = json_load_file(path, 0, &jerr);
  T_CHECK(j != NULL, "eval.json does not parse: %s", jerr.text);
  json_t *acc = json_object_get(json_object_get(json_object_get(j, "tasks"), "piqa:bench-piqa"), "acc_norm");
  json_t *loss = json_object_get(json_object_get(json_object_get(j, "tasks"), "val"), "loss");
  T_CHECK(strcmp(json_string_value(json_object_get(j, "run")), "tiny") == 0 &&
              strcmp(json_string_value(json_object_get(j, "model")), info.model) == 0,
          "eval.json: run or model");
  T_CHECK(json_integer_value(json_object_get(json_object_get(j, "settings"), "num_fewshot")) == 2 &&
              json_integer_value(json_object_get(json_object_get(j, "settings"), "limit")) == 100 &&
              json_integer_value(json_object_get(json_object_get(j, "settings"), "seed")) == 1234,
          "eval.json: settings");
  T_CHECK(json_real_value(json_object_get(acc, "value")) == 0.75 && json_real_value(json_object_get(acc, "stderr")) == 0.125 &&
              json_integer_value(json_object_get(acc, "n")) == 8,
          "eval.json: piqa acc_norm");
  T_CHECK(json_real_value(json_object_get(loss, "value")) == 3.5 && json_is_null(json_object_get(loss, "stderr")),
          "eval.json: val loss (stderr null)");
  json_decref(j);

  util_snprintf(path, sizeof path, "%s/eval.csv", out_dir);
  char *csv = slurp(path);
  const char *want = "task,metric,value,stderr,n\nval,loss,3.5,,4096\nval,tokens,4096,,4096\n"
                     "piqa:bench-piqa,acc,0.375,0.25,8\npiqa:bench-piqa,acc_norm,0.75,0.125,8\n\"a,\"\"b\"\"\",ppl,12.25,0.5,3\n";
  T_CHECK(csv && strcmp(csv, want) == 0, "eval.csv:\n%s", csv ? csv : "(unreadable)");
  free(csv);

  char *table = NULL;
  size_t tlen = 0;
  FILE *mem = open_memstream(&table, &tlen);
  evalrep_print(&rep, mem);
  fclose(mem);
  T_CHECK(strstr(table, "task             metric      value  ± stderr             n\n") &&
              strstr(table, "val              tokens       4096                    4096\n") &&
              strstr(table, "piqa:bench-piqa  acc_norm   0.7500  ± 0.1250             8\n"),
          "the table:\n%s", table);
  free(table);
  evalrep_free(&rep);
  util_snprintf(path, sizeof path, "%s/no/such/dir", out_dir);
  T_CHECK(evalrep_write(&rep, &info, path, &errs) == -1 && errs.n == 1 && strstr(errs.v[0].file, "eval.json"),
          "writing into a missing directory did not fail with the file named");
  err_free(&errs);
}

int main(void) {
  const char *top = getenv("TOP_SRCDIR"), *out = getenv("TEST_OUT");
  util_snprintf(data_dir, sizeof data_dir, "%s/tests/data", top ? top : ".");
  util_snprintf(out_dir, sizeof out_dir, "%s/bench", out ? out : "tests/out");
  T_CHECK(util_mkdir_p(out_dir) == 0, "cannot create %s", out_dir);
  test_lambada_requests();
  test_hellaswag_requests();
  test_piqa_arc_requests();
  test_winogrande_mc_requests();
  test_fewshot();
  test_scores();
  test_norm_characters();
  test_bad_input();
  test_report();
  return t_done("test_bench");
}
