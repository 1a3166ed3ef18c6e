/* test_tok, test_gpt2: the tokenizers (one source, two programs).
 *
 * test_gpt2 (built with TEST_GPT2): every line of reference.jsonl (ids from an independent
 *    tokenizer) in the GPT-2 data folder ($GREENLM_GPT2_DIR, default
 *    $TOP_SRCDIR/../shared/data/gpt2) is reproduced exactly and decodes back to its text, and
 *    random byte strings round-trip with GPT-2's vocabulary. Skipped (exit 77) with a message when
 *    the folder is absent.
 * test_tok: random byte strings, valid UTF-8 or not, round-trip with a small vocabulary written
 *    here and with the byte tokenizer; corrupt tokenizer files are rejected with the file, the
 *    place and what is wrong; a directory or a FIFO in the place of a file is named as such (the FIFO
 *    never opened for a writer to come); a pair that does not match its manifest is refused. */
#include <jansson.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/rng.h"
#include "testing.h"
#include "text/tok.h"
#include "base/util.h"

static char tmpdir[4096];

static void roundtrip(tok_tokenizer *t, const char *text, size_t len, int special, const char *what) {
  tok_ids ids = {0};
  tok_encode(t, text, len, special, &ids);
  char *back = malloc(ids.n * (size_t)t->max_len + 1);
  size_t n = tok_decode(t, ids.v, ids.n, back);
  T_CHECK(n == len && memcmp(back, text, len) == 0, "%s: %zu bytes do not round-trip (got %zu)", what, len, n);
  free(back);
  tok_ids_free(&ids);
}

static void random_roundtrips(tok_tokenizer *t, const char *name) {
  rng_state r;
  rng_seed(&r, 99, 0, 0);
  char buf[3000];
  const char *pieces[] = {"hello", " world", "\xc3\xa9t\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87", "  ", "\n\n", "'s", "123",
                          "\xf0\x9f\x98\x80", "<|endoftext|>", "\xff", "\x80", "\xc3", "\t"};
  for (int k = 0; k < 300; k++) {
    size_t n = 0;
    int mode = k % 3; /* random bytes; random mix of pieces; pieces with stray invalid bytes */
    while (n < 2000) {
      if (mode == 0) {
        buf[n++] = (char)rng_below(&r, 256);
      } else {
        const char *p = pieces[rng_below(&r, sizeof pieces / sizeof *pieces - (mode == 1 ? 3 : 0))];
        size_t l = strlen(p);
        memcpy(buf + n, p, l);
        n += l;
      }
      if (rng_below(&r, 50) == 0) break;
    }
    char what[96];
    snprintf(what, sizeof what, "%s random text %d", name, k);
    roundtrip(t, buf, n, k & 1, what);
  }
  roundtrip(t, "", 0, 0, "empty text");
  char zeros[5] = {0, 0, 'a', 0, 0};
  roundtrip(t, zeros, 5, 0, "NUL bytes");
}

/* Returns 0 when the GPT-2 folder is absent (nothing tested). */
static int test_gpt2(void) {
  const char *dir = getenv("GREENLM_GPT2_DIR");
  char def[4096];
  if (!dir) {
    const char *top = getenv("TOP_SRCDIR");
    snprintf(def, sizeof def, "%s/../shared/data/gpt2", top ? top : ".");
    dir = def;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/reference.jsonl", dir);
  struct stat st;
  if (stat(path, &st) != 0) {
    printf("SKIP: no GPT-2 data folder at %s (set GREENLM_GPT2_DIR to a folder with encoder.json, "
           "vocab.bpe and reference.jsonl)\n",
           dir);
    return 0;
  }
  tok_tokenizer t;
  err_list errs = {0};
  T_CHECK(tok_load_bpe(&t, dir, &errs) == 0, "GPT-2 files do not load: %s", errs.n ? errs.v[0].msg : "");
  err_free(&errs);
  if (t.vocab_size == 0) return 1;
  T_CHECK(t.vocab_size == 50257 && t.nmerges == 50000 && t.eot == 50256, "GPT-2 vocabulary: %d tokens, %d merges, eot %d",
          t.vocab_size, t.nmerges, t.eot);
  FILE *fp = fopen(path, "r");
  char line[1 << 16];
  int lines = 0, exact = 0, nonempty = 0;
  while (fgets(line, sizeof line, fp)) {
    if (line[0] == '\n' || !line[0]) continue;
    nonempty++;
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    T_CHECK(o != NULL, "reference line %d is not JSON: %s", nonempty, je.text);
    if (!o) continue;
    json_t *text = json_object_get(o, "text"), *ids = json_object_get(o, "ids");
    const char *s = json_string_value(text);
    size_t len = json_string_length(text);
    tok_ids got = {0};
    tok_encode(&t, s, len, 0, &got);
    int ok = got.n == json_array_size(ids);
    for (size_t i = 0; ok && i < got.n; i++) ok = got.v[i] == json_integer_value(json_array_get(ids, i));
    lines++;
    exact += ok;
    T_CHECK(ok, "reference line %d (\"%.40s\"): %zu ids, expected %zu", lines, s, got.n, json_array_size(ids));
    roundtrip(&t, s, len, 0, "reference text");
    tok_ids_free(&got);
    json_decref(o);
  }
  fclose(fp);
  printf("GPT-2: %d of %d reference lines exact\n", exact, lines);
  T_CHECK(lines == nonempty && lines > 0, "read %d of %d reference lines", lines, nonempty);
  /* the special token */
  tok_ids ids = {0};
  tok_encode(&t, "a<|endoftext|>b", 15, 1, &ids);
  T_CHECK(ids.n == 3 && ids.v[1] == 50256, "<|endoftext|> with special tokens: %zu ids", ids.n);
  ids.n = 0;
  tok_encode(&t, "a<|endoftext|>b", 15, 0, &ids);
  T_CHECK(ids.n > 3, "<|endoftext|> as ordinary text must not be the special token");
  tok_ids_free(&ids);
  random_roundtrips(&t, "GPT-2");
  tok_free(&t);
  return 1;
}

/* A small valid vocabulary: 256 bytes, 3 merges, <|endoftext|>. */
static void write_small(const char *dir, const char *encoder_extra, const char *merges) {
  char path[4200];
  mkdir(dir, 0777);
  snprintf(path, sizeof path, "%s/encoder.json", dir);
  FILE *fp = fopen(path, "w");
  fprintf(fp, "{");
  for (int b = 0; b < 256; b++) {
    char s[8];
    tok_bytes_to_chars((char[]){(char)b}, 1, s, sizeof s);
    json_t *js = json_string(s);
    char *enc = json_dumps(js, JSON_ENCODE_ANY);
    fprintf(fp, "%s%s: %d", b ? ", " : "", enc, b);
    free(enc);
    json_decref(js);
  }
  fprintf(fp, ", \"th\": 256, \"the\": 257, \"\\u0120the\": 258, \"<|endoftext|>\": 259%s}", encoder_extra);
  fclose(fp);
  snprintf(path, sizeof path, "%s/vocab.bpe", dir);
  fp = fopen(path, "w");
  fprintf(fp, "#version: 0.2\n%s", merges);
  fclose(fp);
}

/* The tokenizer in dir is refused with one error whose place (file and line) and message hold fragment. */
static void expect_error(const char *dir, const char *fragment) {
  tok_tokenizer t;
  err_list errs = {0};
  int rc = tok_load_bpe(&t, dir, &errs);
  T_CHECK(rc != 0 && errs.n == 1, "corrupt tokenizer in %s was accepted (%d errors)", dir, errs.n);
  char full[2048] = "";
  if (errs.n) snprintf(full, sizeof full, "%s:%d: %s", errs.v[0].file, errs.v[0].line, errs.v[0].msg);
  T_CHECK(strstr(full, fragment) != NULL, "error \"%s\" lacks \"%s\"", full, fragment);
  if (rc == 0) tok_free(&t);
  err_free(&errs);
}

/* Paths that are not files where encoder.json or vocab.bpe belongs. */
static void test_not_files(void) {
  char dir[4200], path[4300];
  snprintf(dir, sizeof dir, "%s/dir-encoder", tmpdir);
  snprintf(path, sizeof path, "%s/encoder.json", dir);
  remove(path); /* an earlier run's directory */
  write_small(dir, "", "t h\n");
  remove(path);
  mkdir(path, 0777);
  expect_error(dir, "dir-encoder/encoder.json:0: a directory, not a tokenizer file");
  snprintf(dir, sizeof dir, "%s/fifo-merges", tmpdir);
  snprintf(path, sizeof path, "%s/vocab.bpe", dir);
  remove(path); /* an earlier run's FIFO: opening it to write would wait for a reader */
  write_small(dir, "", "t h\n");
  remove(path);
  T_CHECK(mkfifo(path, 0666) == 0, "cannot make a FIFO at %s", path);
  expect_error(dir, "fifo-merges/vocab.bpe:0: a FIFO (named pipe), not a tokenizer file");
}

/* file's bytes into buf (at most len); their count. */
static size_t slurp(const char *dir, const char *file, char *buf, size_t len) {
  char path[4300];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *fp = fopen(path, "rb");
  size_t n = fp ? fread(buf, 1, len, fp) : 0;
  if (fp) fclose(fp);
  return n;
}

/* A pair with its manifest loads; one of its files replaced by another's is refused. */
static void test_manifest(void) {
  char dir[4200], path[4300], enc[65536], voc[4096], text[512];
  snprintf(dir, sizeof dir, "%s/manifest", tmpdir);
  write_small(dir, "", "t h\nth e\n");
  size_t el = slurp(dir, "encoder.json", enc, sizeof enc), vl = slurp(dir, "vocab.bpe", voc, sizeof voc);
  tok_manifest_text(enc, el, voc, vl, text, sizeof text);
  snprintf(path, sizeof path, "%s/%s", dir, TOK_MANIFEST);
  FILE *fp = fopen(path, "w");
  fputs(text, fp);
  fclose(fp);
  tok_tokenizer t;
  err_list errs = {0};
  T_CHECK(tok_load_bpe(&t, dir, &errs) == 0, "a pair with its manifest does not load: %s", errs.n ? errs.v[0].msg : "");
  if (errs.n == 0) tok_free(&t);
  err_free(&errs);
  snprintf(path, sizeof path, "%s/vocab.bpe", dir); /* a newer vocab.bpe beside the older encoder.json */
  fp = fopen(path, "w");
  fputs("#version: 0.2\nt h\n", fp);
  fclose(fp);
  expect_error(dir, TOK_MANIFEST ":0: vocab.bpe is not the file this manifest lists");
  snprintf(path, sizeof path, "%s/%s", dir, TOK_MANIFEST);
  fp = fopen(path, "w");
  fputs("something else\n", fp);
  fclose(fp);
  expect_error(dir, TOK_MANIFEST ":1: not a greenlm tokenizer manifest");
}

static void test_small_and_corrupt(void) {
  char dir[4200];
  const char *good = "t h\nth e\n\xc4\xa0 the\n";
  snprintf(dir, sizeof dir, "%s/good", tmpdir);
  write_small(dir, "", good);
  tok_tokenizer t;
  err_list errs = {0};
  T_CHECK(tok_load_bpe(&t, dir, &errs) == 0, "small vocabulary does not load: %s", errs.n ? errs.v[0].msg : "");
  err_free(&errs);
  if (t.vocab_size) {
    tok_ids ids = {0};
    tok_encode(&t, "the the", 7, 0, &ids);
    T_CHECK(ids.n == 2 && ids.v[0] == 257 && ids.v[1] == 258, "small BPE: \"the the\" -> %zu ids", ids.n);
    tok_ids_free(&ids);
    random_roundtrips(&t, "small");
    tok_free(&t);
  }
  snprintf(dir, sizeof dir, "%s/no-such-dir", tmpdir);
  expect_error(dir, "cannot open the tokenizer: No such file or directory");
  static const struct {
    const char *name, *encoder_extra, *merges, *error;
  } bad[] = {
      {"bad-json", ", \"x\": ", "t h\n", "encoder.json:1:"},
      {"dup-id", ", \"zz\": 5", "t h\n", "token \"zz\" has a repeated id"},
      {"bad-merge", "", "t h\nthe\n", "vocab.bpe:3: a merge is two tokens and one space (\"left right\"), got \"the\""},
      {"unknown-merge", "", "t h\nq z\n", "vocab.bpe:3: the merged token of the merge is not in encoder.json: \"q z\""},
      {"dup-merge", "", "t h\nt h\n", "vocab.bpe:3: the merge appears twice"},
      {"no-merges", "", "", "vocab.bpe:0: no merges"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, bad[i].name);
    write_small(dir, bad[i].encoder_extra, bad[i].merges);
    expect_error(dir, bad[i].error);
  }
}

static void test_bytes(void) {
  tok_tokenizer t;
  tok_init_bytes(&t);
  tok_ids ids = {0};
  tok_encode(&t, "Ab\xff", 3, 1, &ids);
  T_CHECK(ids.n == 3 && ids.v[0] == 'A' && ids.v[2] == 255, "bytes tokenizer");
  tok_ids_free(&ids);
  random_roundtrips(&t, "bytes");
  tok_free(&t);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *out = getenv("TEST_OUT");
  snprintf(tmpdir, sizeof tmpdir, "%s/tok", out ? out : "tests/out");
  util_mkdir_p(tmpdir);
#ifdef TEST_GPT2
  const int gpt2_only = 1;
#else
  const int gpt2_only = 0;
#endif
  int rc;
  if (gpt2_only) {
    rc = test_gpt2() ? t_done("test_gpt2") : 77;
  } else {
    test_small_and_corrupt();
    test_not_files();
    test_manifest();
    test_bytes();
    rc = t_done("test_tok");
  }
  MPI_Finalize();
  return rc;
}
