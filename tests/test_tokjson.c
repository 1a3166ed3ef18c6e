/* test_tokjson: Hugging Face's tokenizer.json read natively (src/text/tokjson.c).
 *
 * - tests/data/tokjson/{neox,llama3}: tokenizers with the structure of GPT-NeoX-20B's and Llama 3's
 *   tokenizer.json (tests/reference/make_tokjson_fixtures.py made them with Hugging Face's tokenizers,
 *   with the ids and decodings it gives for varied texts): loaded from their directory as a
 *   &tokenizer dir is, every text encodes to the same ids and decodes to the same text; the
 *   end-of-text token is the file's; random bytes, valid UTF-8 or not, round-trip.
 * - tests/data/tokjson/nfc.jsonl: greenlm's NFC gives Python's unicodedata NFC of each string.
 * - tests/data/tokjson/refuse: tokenizers greenlm cannot reproduce are refused naming the field
 *   and its value; malformed files (not JSON, gaps in the ids, an unknown merge token, a token that is
 *   not byte-level, a directory in the file's place) give their errors.
 * - which file a directory's tokenizer comes from when it has several; GPT-2's vocabulary has the same
 *   hash (the identity datasets record) from tokenizer.json as from vocab.json and merges.txt. */
#include <jansson.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/rng.h"
#include "base/util.h"
#include "testing.h"
#include "text/nfc.h"
#include "text/tok.h"
#include "text/tokjson.h"

static char tmpdir[4096], datadir[4096];

/* Each line of a JSONL file as a JSON object: fn(obj, ctx); returns the line count. */
static int each_line(const char *path, void (*fn)(const json_t *, void *), void *ctx) {
  FILE *fp = fopen(path, "r");
  T_CHECK(fp != NULL, "cannot open %s", path);
  if (!fp) return 0;
  char *line = NULL;
  size_t cap = 0;
  int n = 0;
  while (getline(&line, &cap, fp) > 0) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    T_CHECK(o != NULL, "%s:%d: %s", path, n + 1, je.text);
    if (o) fn(o, ctx);
    json_decref(o);
    n++;
  }
  free(line);
  fclose(fp);
  return n;
}

/* ---- reference encodings ------------------------------------------------------------------------ */

typedef struct {
  tok_tokenizer *t;
  const char *name;
  int line;
} ref_ctx;

static void check_reference(const json_t *o, void *ctx) {
  ref_ctx *c = ctx;
  const char *text = json_string_value(json_object_get(o, "text"));
  const char *want = json_string_value(json_object_get(o, "decoded"));
  const json_t *ids = json_object_get(o, "ids");
  c->line++;
  tok_ids got = {0};
  tok_encode(c->t, text, strlen(text), 1, &got);
  int same = got.n == json_array_size(ids);
  for (size_t i = 0; same && i < got.n; i++) same = got.v[i] == json_integer_value(json_array_get(ids, i));
  T_CHECK(same, "%s line %d (\"%.40s\"): %zu ids, the reference has %zu (first difference at %d)", c->name, c->line,
          text, got.n, json_array_size(ids), got.n ? got.v[0] : -1);
  int32_t *want_ids = malloc((json_array_size(ids) + 1) * sizeof *want_ids);
  for (size_t i = 0; i < json_array_size(ids); i++) want_ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
  char *back = malloc(json_array_size(ids) * (size_t)c->t->max_len + 1);
  size_t n = tok_decode(c->t, want_ids, json_array_size(ids), back);
  T_CHECK(n == strlen(want) && memcmp(back, want, n) == 0, "%s line %d: decoding gives %zu bytes, not the %zu of \"%.40s\"",
          c->name, c->line, n, strlen(want), want);
  free(back), free(want_ids);
  tok_ids_free(&got);
}

static void roundtrips(tok_tokenizer *t, const char *name, int any_bytes) {
  rng_state r;
  rng_seed(&r, 7, 0, 0);
  static const char *pieces[] = {"Hello", " world", "\xc3\xa9t\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87", "   ", "\n\r\n", "'S",
                                 "12345", "\xf0\x9f\x98\x80", "DON'T", "\t", "\xff", "\x80", "\xc3"};
  char buf[2100], what[96];
  for (int k = 0; k < 200; k++) {
    size_t n = 0;
    while (n < 2000 && rng_below(&r, 40) != 0) {
      if (any_bytes && k % 2) {
        buf[n++] = (char)rng_below(&r, 256);
        continue;
      }
      const char *p = pieces[rng_below(&r, sizeof pieces / sizeof *pieces - (any_bytes ? 0 : 3))];
      memcpy(buf + n, p, strlen(p));
      n += strlen(p);
    }
    tok_ids ids = {0};
    tok_encode(t, buf, n, 0, &ids);
    char *back = malloc(ids.n * (size_t)t->max_len + 1);
    size_t m = tok_decode(t, ids.v, ids.n, back);
    snprintf(what, sizeof what, "%s random text %d", name, k);
    T_CHECK(m == n && memcmp(back, buf, n) == 0, "%s: %zu bytes do not round-trip (got %zu)", what, n, m);
    free(back);
    tok_ids_free(&ids);
  }
}

/* One fixture directory: loads from the directory (no other tokenizer file there), matches its
 * reference, has the expected end-of-text token and vocabulary size. */
static void test_fixture(const char *name, int eot, int vocab, int any_bytes) {
  char dir[4200], ref[4300];
  snprintf(dir, sizeof dir, "%s/%s", datadir, name);
  snprintf(ref, sizeof ref, "%s/reference.jsonl", dir);
  tok_tokenizer t;
  err_list errs = {0};
  int rc = tok_load_bpe(&t, dir, &errs);
  T_CHECK(rc == 0, "%s does not load: %s", name, errs.n ? errs.v[0].msg : "");
  err_free(&errs);
  if (rc != 0) return;
  T_CHECK(strstr(t.desc, "tokenizer.json") != NULL, "%s: read from %s", name, t.desc);
  T_CHECK(t.eot == eot && t.vocab_size == vocab, "%s: eot %d, vocabulary %d (want %d, %d)", name, t.eot, t.vocab_size,
          eot, vocab);
  ref_ctx c = {&t, name, 0};
  int lines = each_line(ref, check_reference, &c);
  T_CHECK(lines >= 20, "%s: %d reference lines", name, lines);
  roundtrips(&t, name, any_bytes);
  tok_tokenizer again;
  errs = (err_list){0};
  T_CHECK(tok_load_bpe(&again, dir, &errs) == 0 && again.hash == t.hash, "%s: a second load has another hash", name);
  if (errs.n == 0) tok_free(&again);
  err_free(&errs);
  printf("%s: %d reference texts, vocabulary %d, %d merges, eot %d, hash %s\n", name, lines, t.vocab_size, t.nmerges,
         t.eot, t.hash_hex);
  tok_free(&t);
}

/* ---- NFC ---------------------------------------------------------------------------------------- */

static void check_nfc(const json_t *o, void *ctx) {
  (void)ctx;
  const char *text = json_string_value(json_object_get(o, "text")), *want = json_string_value(json_object_get(o, "nfc"));
  size_t n;
  char *got = nfc_normalize(text, strlen(text), &n);
  T_CHECK(n == strlen(want) && memcmp(got, want, n) == 0, "NFC of \"%s\" is \"%.*s\", not \"%s\"", text, (int)n, got, want);
  free(got);
}

static void test_nfc(void) {
  char path[4300];
  snprintf(path, sizeof path, "%s/nfc.jsonl", datadir);
  int n = each_line(path, check_nfc, NULL);
  T_CHECK(n >= 300, "nfc.jsonl: %d lines", n);
  static const char invalid[] = "a\xcc\x81\xff\xcc\x81\xc3"; /* a + U+0301, a stray byte, U+0301, a cut sequence */
  size_t len;
  char *got = nfc_normalize(invalid, sizeof invalid - 1, &len);
  T_CHECK(len == 6 && memcmp(got, "\xc3\xa1\xff\xcc\x81\xc3", 6) == 0, "NFC around bytes that are not UTF-8");
  free(got);
  T_CHECK(nfc_quick("plain ASCII, caf\xc3\xa9", 16) && !nfc_quick("e\xcc\x81", 3), "nfc_quick");
}

/* ---- refusals and malformed files ------------------------------------------------------------------ */

static void expect_error(const char *path, const char *fragment) {
  tok_tokenizer t;
  err_list errs = {0};
  int rc = tokjson_load(&t, path, &errs);
  char full[2200] = "(no error)";
  if (errs.n) snprintf(full, sizeof full, "%s: %s", errs.v[0].file, errs.v[0].msg);
  T_CHECK(rc != 0 && strstr(full, fragment) != NULL, "%s: error \"%s\" lacks \"%s\"", path, full, fragment);
  T_CHECK(rc != 0 || errs.n == 0, "%s: an error but success", path);
  if (rc == 0) tok_free(&t);
  err_free(&errs);
}

static void test_refusals(void) {
  char path[4300];
  snprintf(path, sizeof path, "%s/refuse/expected.json", datadir);
  json_t *expected = json_load_file(path, 0, NULL);
  T_CHECK(json_object_size(expected) >= 7, "%s: %zu cases", path, json_object_size(expected));
  const char *name;
  json_t *want;
  json_object_foreach(expected, name, want) {
    snprintf(path, sizeof path, "%s/refuse/%s.json", datadir, name);
    expect_error(path, json_string_value(want));
  }
  json_decref(expected);
}

/* A copy of the llama3 fixture with one text replaced (from -> to) at tmpdir/name.json. */
static void write_variant(const char *name, const char *from, const char *to, char *out, size_t outlen) {
  char src[4300];
  snprintf(src, sizeof src, "%s/llama3/tokenizer.json", datadir);
  err_list errs = {0};
  size_t n;
  char *text = util_read_file(src, 1 << 24, &n, "fixture", "", &errs);
  err_free(&errs);
  if (!text) return;
  char *at = strstr(text, from);
  T_CHECK(at != NULL, "variant %s: \"%s\" not in the fixture", name, from);
  snprintf(out, outlen, "%s/%s.json", tmpdir, name);
  FILE *fp = fopen(out, "w");
  if (at) {
    fwrite(text, 1, (size_t)(at - text), fp);
    fputs(to, fp);
    fputs(at + strlen(from), fp);
  }
  fclose(fp);
  free(text);
}

static void test_malformed(void) {
  static const struct {
    const char *name, *from, *to, *error;
  } cases[] = {
      {"truncated", "\"model\"", "\"model\" [", "truncated.json: not valid JSON"},
      {"id-gap", "\"<|end_of_text|>\"", "\"<|end_of_text|>\", \"id\": 800", "the largest id leaves gaps"},
      {"negative-id", "\"<|end_of_text|>\"", "\"<|end_of_text|>\", \"id\": -3", "an id is an integer from 0"},
      {"unknown-merge", "[\n    \"t\",\n    \"h\"\n   ]", "[\"t\", \"qqq\"]", "model.merges[0] = [\"t\",\"qqq\"]: the right token"},
      {"bad-merge", "[\n    \"t\",\n    \"h\"\n   ]", "\"t h x\"", "model.merges[0] = \"t h x\": a merge is"},
      {"not-byte-level", "\"Ġzzzq\"", "\"\\u2581zzzq\"", "model.vocab = \"\xe2\x96\x81zzzq\": not a byte-level token string"},
      {"split-string", "\"Regex\"", "\"String\"", "pre_tokenizer.pretokenizers[0].pattern = {\"String\""},
      {"bad-regex", "\"(?i:'s", "\"(?i:'s(", "pre_tokenizer.pretokenizers[0].pattern.Regex: PCRE2 cannot compile"},
      {"no-decoder", "\"decoder\": {", "\"decoder\": null, \"x\": {", "decoder = (missing): greenlm decodes"},
      {"dropout", "\"dropout\": null", "\"dropout\": 0.1", "model.dropout = 0.1: BPE dropout"},
      {"added-over-vocab", "\"<|end_of_text|>\"", "\"<|end_of_text|>\", \"id\": 0", "its id is an added token's with other text"},
      {"added-twice", "\"<|end_of_text|>\"", "\"<|end_of_text|>\", \"id\": 701", "another added token has this id"},
  };
  char path[4300];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_variant(cases[i].name, cases[i].from, cases[i].to, path, sizeof path);
    expect_error(path, cases[i].error);
  }
  snprintf(path, sizeof path, "%s/dir-json/tokenizer.json", tmpdir);
  util_mkdir_p(path);
  expect_error(path, "a directory, not a tokenizer file");
}

/* ---- which file a directory's tokenizer comes from ------------------------------------------------ */

static void copy_file(const char *from, const char *to) {
  err_list errs = {0};
  size_t n;
  char *text = util_read_file(from, 1 << 24, &n, "fixture", "", &errs);
  err_free(&errs);
  FILE *fp = fopen(to, "wb");
  if (text && fp) fwrite(text, 1, n, fp);
  if (fp) fclose(fp);
  free(text);
}

static void test_loading_rule(void) {
  char dir[4400], path[4500], src[4300], deep[241];
  memset(deep, 'd', sizeof deep - 1); /* a deep directory: the description keeps the whole path */
  deep[sizeof deep - 1] = '\0';
  snprintf(dir, sizeof dir, "%s/%s/both", tmpdir, deep);
  util_mkdir_p(dir);
  snprintf(path, sizeof path, "%s/encoder.json", dir);
  remove(path); /* an earlier run's */
  snprintf(src, sizeof src, "%s/llama3/tokenizer.json", datadir);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  copy_file(src, path);
  snprintf(path, sizeof path, "%s/vocab.json", dir); /* Hugging Face's GPT-2 files beside it: not read */
  copy_file("/dev/null", path);
  snprintf(path, sizeof path, "%s/merges.txt", dir);
  copy_file("/dev/null", path);
  tok_tokenizer t;
  err_list errs = {0};
  T_CHECK(tok_load_bpe(&t, dir, &errs) == 0, "tokenizer.json beside vocab.json: %s", errs.n ? errs.v[0].msg : "");
  if (errs.n == 0) {
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    const char *at = strstr(t.desc, " from ");
    T_CHECK(at && strcmp(at + 6, path) == 0, "the description does not end with the whole path: %s", t.desc);
    tok_free(&t);
  }
  err_free(&errs);
  snprintf(path, sizeof path, "%s/encoder.json", dir); /* GPT-2's names come first: the empty file is read */
  copy_file("/dev/null", path);
  errs = (err_list){0};
  int rc = tok_load_bpe(&t, dir, &errs);
  T_CHECK(rc != 0 && errs.n && !strstr(errs.v[0].file, "tokenizer.json"), "encoder.json is not read before tokenizer.json");
  if (rc == 0) tok_free(&t);
  err_free(&errs);
}

/* GPT-2's vocabulary has one identity from either format: tests/reference/hf-gpt2 (transformers saved
 * tokenizer.json beside vocab.json and merges.txt) against a copy of its vocab.json and merges.txt. */
static void test_same_hash(void) {
  char hf[4200], dir[4200], from[4300], to[4300];
  const char *top = getenv("TOP_SRCDIR");
  snprintf(hf, sizeof hf, "%s/tests/reference/hf-gpt2", top ? top : ".");
  snprintf(dir, sizeof dir, "%s/gpt2-files", tmpdir);
  util_mkdir_p(dir);
  static const char *const names[] = {"vocab.json", "merges.txt"};
  for (int i = 0; i < 2; i++) {
    snprintf(from, sizeof from, "%s/%s", hf, names[i]);
    snprintf(to, sizeof to, "%s/%s", dir, names[i]);
    copy_file(from, to);
  }
  tok_tokenizer a, b;
  err_list errs = {0};
  int ra = tok_load_bpe(&a, hf, &errs), rb = tok_load_bpe(&b, dir, &errs);
  T_CHECK(ra == 0 && rb == 0, "GPT-2 fixture does not load: %s", errs.n ? errs.v[0].msg : "");
  if (ra == 0 && rb == 0) {
    T_CHECK(strstr(a.desc, "tokenizer.json") && !strstr(b.desc, "tokenizer.json"), "read from %s and %s", a.desc, b.desc);
    T_CHECK(a.hash == b.hash && a.eot == b.eot && a.vocab_size == b.vocab_size, "GPT-2's tokenizer.json: hash %s eot %d "
            "vocabulary %d; vocab.json: %s %d %d", a.hash_hex, a.eot, a.vocab_size, b.hash_hex, b.eot, b.vocab_size);
  }
  if (ra == 0) tok_free(&a);
  if (rb == 0) tok_free(&b);
  err_free(&errs);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *out = getenv("TEST_OUT"), *top = getenv("TOP_SRCDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/tokjson", out ? out : "tests/out");
  snprintf(datadir, sizeof datadir, "%s/tests/data/tokjson", top ? top : ".");
  util_mkdir_p(tmpdir);
  test_nfc();
  test_fixture("neox", 0, 723, 0);
  test_fixture("llama3", 702, 703, 1);
  test_refusals();
  test_malformed();
  test_loading_rule();
  test_same_hash();
  int rc = t_done("test_tokjson");
  MPI_Finalize();
  return rc;
}
