/* tokjson: Hugging Face's tokenizer.json read into a byte-level BPE tok_tokenizer. */
#include "text/tokjson.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static const char HINT_BPE[] = "greenlm reproduces byte-level BPE tokenizers exactly (GPT-2's, GPT-NeoX's, Llama 3's); "
                               "for this one, tokenize the text with Hugging Face's tokenizers or train a greenlm vocabulary "
                               "with the 'tokenizer' task (doc/interop.md)";
static const char HINT_FILE[] = "give the tokenizer.json that transformers' save_pretrained writes (doc/interop.md)";

/* The file being read: where errors go. */
typedef struct {
  const char *path;
  err_list *errs;
} tj_src;

/* Add "FIELD = VALUE: WHY" (the value as compact JSON, cut to 80 characters). Returns -1. */
static int refuse(const tj_src *s, const char *field, const json_t *v, const char *hint, const char *why) {
  char *js = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
  char shown[96];
  err_quote(shown, sizeof shown, js ? js : "(missing)", js ? strlen(js) : 9);
  if (strlen(shown) > 80) strcpy(shown + 77, "...");
  free(js);
  err_add(s->errs, s->path, 0, 0, hint, "%s = %s: %s", field, shown, why);
  return -1;
}

/* refuse() for a value made for the message (its reference is dropped). */
static int refuse_new(const tj_src *s, const char *field, json_t *v, const char *hint, const char *why) {
  refuse(s, field, v, hint, why);
  json_decref(v);
  return -1;
}

static const char *type_of(const json_t *o) { return json_string_value(json_object_get(o, "type")); }

/* A flag that must be false (or absent, or null). */
static int must_be_off(const tj_src *s, const json_t *o, const char *key, const char *field, const char *why) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_false(v) || json_is_null(v)) return 0;
  char f[128];
  util_snprintf(f, sizeof f, "%s.%s", field, key);
  return refuse(s, f, v, HINT_BPE, why);
}

/* ---- the pipeline: normalizer, pre-tokenizer, decoder, model settings ---------------------------- */

static int read_normalizer(const tj_src *s, const json_t *root, tok_tokenizer *t) {
  const json_t *n = json_object_get(root, "normalizer");
  if (!n || json_is_null(n)) return 0;
  const char *type = type_of(n);
  if (type && strcmp(type, "NFC") == 0) return t->nfc = 1, 0;
  const json_t *list = json_object_get(n, "normalizers");
  if (type && strcmp(type, "Sequence") == 0 && json_is_array(list)) {
    size_t i;
    const json_t *e;
    json_array_foreach(list, i, e) {
      if (!type_of(e) || strcmp(type_of(e), "NFC") != 0) {
        char f[64];
        util_snprintf(f, sizeof f, "normalizer.normalizers[%zu].type", i);
        return refuse(s, f, json_object_get(e, "type"), HINT_BPE, "greenlm applies no normalizer but NFC");
      }
      t->nfc = 1;
    }
    return 0;
  }
  return refuse(s, "normalizer.type", json_object_get(n, "type"), HINT_BPE, "greenlm applies no normalizer but NFC");
}

/* A ByteLevel pre-tokenizer at field: *use_regex = its use_regex (true when absent). */
static int read_bytelevel(const tj_src *s, const json_t *b, const char *field, int *use_regex) {
  char f[96];
  util_snprintf(f, sizeof f, "%s.type", field);
  if (!type_of(b) || strcmp(type_of(b), "ByteLevel") != 0)
    return refuse(s, f, json_object_get(b, "type"), HINT_BPE, "greenlm's pre-tokenizers are ByteLevel, or Split then "
                  "ByteLevel");
  if (must_be_off(s, b, "add_prefix_space", field, "a space would be put before every text, and decoding would keep it"))
    return -1;
  const json_t *r = json_object_get(b, "use_regex");
  *use_regex = !r || json_is_true(r);
  return 0;
}

/* Split (field) with a Regex pattern, behavior Isolated, not inverted: its pattern into t->pattern. */
static int read_split(const tj_src *s, const json_t *sp, const char *field, tok_tokenizer *t) {
  char f[96];
  const json_t *p = json_object_get(sp, "pattern"), *re = json_object_get(p, "Regex");
  const json_t *beh = json_object_get(sp, "behavior");
  if (!json_is_string(re)) {
    util_snprintf(f, sizeof f, "%s.pattern", field);
    return refuse(s, f, p, HINT_BPE, "greenlm splits on a Regex pattern, not on a literal String");
  }
  if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated") != 0) {
    util_snprintf(f, sizeof f, "%s.behavior", field);
    return refuse(s, f, beh, HINT_BPE, "greenlm splits with behavior Isolated (each match a piece of its own)");
  }
  if (must_be_off(s, sp, "invert", field, "greenlm splits at the matches, not between them")) return -1;
  t->pattern = util_strdup(json_string_value(re));
  return 0;
}

/* ByteLevel (GPT-2's pattern), or Sequence [ByteLevel] or [Split, ByteLevel without its pattern]. */
static int read_pre_tokenizer(const tj_src *s, const json_t *root, tok_tokenizer *t) {
  const json_t *p = json_object_get(root, "pre_tokenizer"), *list = json_object_get(p, "pretokenizers");
  int use_regex;
  if (!json_is_object(p))
    return refuse(s, "pre_tokenizer", p, HINT_BPE, "greenlm's BPE needs the ByteLevel pre-tokenizer");
  const char *type = type_of(p);
  if (!type || strcmp(type, "Sequence") != 0 || !json_is_array(list)) {
    if (read_bytelevel(s, p, "pre_tokenizer", &use_regex)) return -1;
    return use_regex ? 0 : refuse(s, "pre_tokenizer.use_regex", json_object_get(p, "use_regex"), HINT_BPE,
                                  "ByteLevel without a pattern and no Split before it would take a text as one piece");
  }
  size_t n = json_array_size(list);
  if (n == 1) {
    if (read_bytelevel(s, json_array_get(list, 0), "pre_tokenizer.pretokenizers[0]", &use_regex)) return -1;
    return use_regex ? 0 : refuse(s, "pre_tokenizer.pretokenizers[0].use_regex", json_false(), HINT_BPE,
                                  "ByteLevel without a pattern and no Split before it would take a text as one piece");
  }
  if (n != 2 || !type_of(json_array_get(list, 0)) || strcmp(type_of(json_array_get(list, 0)), "Split") != 0)
    return refuse(s, "pre_tokenizer.pretokenizers", list, HINT_BPE, "greenlm's sequences are [ByteLevel] or [Split, "
                  "ByteLevel] (Llama 3's)");
  if (read_split(s, json_array_get(list, 0), "pre_tokenizer.pretokenizers[0]", t) ||
      read_bytelevel(s, json_array_get(list, 1), "pre_tokenizer.pretokenizers[1]", &use_regex))
    return -1;
  return use_regex ? refuse(s, "pre_tokenizer.pretokenizers[1].use_regex", json_true(), HINT_BPE,
                            "a ByteLevel pattern after a Split cuts the pieces again, which greenlm does not")
                   : 0;
}

static int read_decoder(const tj_src *s, const json_t *root) {
  const json_t *d = json_object_get(root, "decoder");
  if (json_is_object(d) && type_of(d) && strcmp(type_of(d), "ByteLevel") == 0) return 0;
  return refuse(s, "decoder", d ? json_object_get(d, "type") : NULL, HINT_BPE,
                "greenlm decodes tokens into their bytes, as the ByteLevel decoder does");
}

/* model: type BPE (or no type, as older files have it), without the settings greenlm does not apply. */
static int read_model_settings(const tj_src *s, const json_t *m, tok_tokenizer *t) {
  const char *type = type_of(m);
  if (!json_is_object(m)) return refuse(s, "model", m, HINT_FILE, "not an object");
  if (type ? strcmp(type, "BPE") != 0 : !json_object_get(m, "merges"))
    return refuse(s, "model.type", json_object_get(m, "type"), HINT_BPE,
                  "greenlm reads BPE tokenizers only (Unigram and WordPiece encode differently)");
  static const struct {
    const char *key, *why;
  } off[] = {{"dropout", "BPE dropout makes encoding random"},
             {"byte_fallback", "SentencePiece-style BPE (Llama 2's) with <0xNN> byte tokens is not byte-level BPE"}};
  for (size_t i = 0; i < sizeof off / sizeof *off; i++)
    if (must_be_off(s, m, off[i].key, "model", off[i].why)) return -1;
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const json_t *v = json_object_get(m, affixes[i]);
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
      char f[64];
      util_snprintf(f, sizeof f, "model.%s", affixes[i]);
      return refuse(s, f, v, HINT_BPE, "word-piece affixes are not byte-level BPE");
    }
  }
  t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
  if (!json_is_object(json_object_get(m, "vocab"))) return refuse(s, "model.vocab", json_object_get(m, "vocab"), HINT_FILE, "not an object of token strings -> ids");
  if (!json_is_array(json_object_get(m, "merges"))) return refuse(s, "model.merges", json_object_get(m, "merges"), HINT_FILE, "not an array");
  return 0;
}

/* ---- tokens: ids 0..n-1 from model.vocab and added_tokens ---------------------------------------- */

/* The id of a vocab or added_tokens entry, in [0, TOK_MAX_VOCAB), or -1 after an error at field. */
static int32_t id_of(const tj_src *s, const json_t *v, const char *field) {
  json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
  if (id >= 0 && id < TOK_MAX_VOCAB) return (int32_t)id;
  refuse(s, field, v, HINT_FILE, "an id is an integer from 0 to 16777215");
  return -1;
}

/* The bytes a token string stands for, as the ByteLevel decoder gives them: the bytes of its
 * characters in GPT-2's byte alphabet, else (an added token such as a run of spaces) its UTF-8. */
static int token_bytes(const char *str, char *out) {
  int n = tok_chars_to_bytes(str, out, TOK_MAX_BYTES);
  if (n >= 0) return n;
  size_t l = strlen(str);
  if (l > TOK_MAX_BYTES) return -1;
  memcpy(out, str, l);
  return (int)l;
}

/* added_tokens: ids and bytes into tok/tlen (n entries); special[id] = 1 or 0 for each added token.
 * Non-special ones are listed in t->added. */
static int read_added(const tj_src *s, const json_t *list, int n, char **tok, int *tlen, signed char *special,
                      tok_tokenizer *t) {
  size_t i;
  const json_t *a;
  char f[64], buf[TOK_MAX_BYTES];
  t->added = util_calloc(json_array_size(list) + 1, sizeof *t->added, "added tokens");
  json_array_foreach(list, i, a) {
    util_snprintf(f, sizeof f, "added_tokens[%zu]", i);
    const char *content = json_string_value(json_object_get(a, "content"));
    int32_t id = id_of(s, json_object_get(a, "id"), f);
    int len = content ? token_bytes(content, buf) : -1;
    if (id < 0) return -1;
    if (id >= n || len <= 0 || special[id] >= 0)
      return refuse(s, f, a, HINT_FILE, id >= n ? "the id is beyond the vocabulary's" : len <= 0 ? "no content of 1 to 1024 "
                    "bytes" : "another added token has this id");
    tok[id] = util_malloc((size_t)len + 1, "token");
    memcpy(tok[id], buf, (size_t)len);
    tlen[id] = len;
    special[id] = (signed char)json_is_true(json_object_get(a, "special"));
    if (special[id]) continue;
    static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
    for (int k = 0; k < 3; k++)
      if (must_be_off(s, a, flags[k], f, "greenlm matches non-special added tokens exactly as they are written")) return -1;
    t->added[t->nadded++] = (tok_added){id, !json_is_false(json_object_get(a, "normalized"))};
    t->added_first[(unsigned char)buf[0]] = 1;
  }
  return 0;
}

/* The vocabulary size: the largest id + 1, which must not exceed the entries there are. */
static int count_ids(const tj_src *s, const json_t *vocab, const json_t *added) {
  const char *key;
  const json_t *v, *a;
  size_t i;
  int32_t top = -1;
  if (json_object_size(vocab) + json_array_size(added) > TOK_MAX_VOCAB)
    return refuse_new(s, "model.vocab", json_integer((json_int_t)json_object_size(vocab)), HINT_FILE,
                  "more tokens than greenlm's limit of 16777216");
  json_object_foreach((json_t *)vocab, key, v) {
    int32_t id = id_of(s, v, "model.vocab");
    if (id < 0) return -1;
    top = id > top ? id : top;
  }
  json_array_foreach(added, i, a) {
    int32_t id = id_of(s, json_object_get(a, "id"), "added_tokens");
    if (id < 0) return -1;
    top = id > top ? id : top;
  }
  if ((size_t)top + 1 > json_object_size(vocab) + json_array_size(added) || top < 255)
    return refuse_new(s, "model.vocab", json_integer(top), HINT_FILE, "the ids must be 0..n-1 with n of at least 256, each "
                  "a token of model.vocab or added_tokens; the largest id leaves gaps");
  return (int)top + 1;
}

/* model.vocab into tok/tlen and by_bytes (token bytes -> id); an id that added_tokens gives is left
 * to them (special[id] >= 0), whose bytes it must have where it is a byte-level string. */
static int read_vocab(const tj_src *s, const json_t *vocab, char **tok, int *tlen, const signed char *special,
                      hmap_str *by_bytes) {
  const char *key;
  const json_t *v;
  char buf[TOK_MAX_BYTES];
  json_object_foreach((json_t *)vocab, key, v) {
    int32_t id = (int32_t)json_integer_value(v);
    int len = tok_chars_to_bytes(key, buf, sizeof buf);
    if (len > 0) *hmap_str_put(by_bytes, buf, (size_t)len, id, NULL) = id;
    if (special[id] >= 0 && len > 0 && (len != tlen[id] || memcmp(buf, tok[id], (size_t)len) != 0))
      return refuse_new(s, "model.vocab", json_string(key), HINT_FILE, "its id is an added token's with other text: the "
                        "two would not decode alike");
    if (special[id] >= 0) continue;
    if (tok[id] || len <= 0)
      return refuse_new(s, "model.vocab", json_string(key), HINT_BPE, tok[id] ? "the id is given twice" :
                    "not a byte-level token string (GPT-2's byte alphabet, at most 1024 bytes): a SentencePiece-style "
                    "vocabulary is not byte-level BPE");
    tok[id] = util_malloc((size_t)len + 1, "token");
    memcpy(tok[id], buf, (size_t)len);
    tlen[id] = len;
  }
  return 0;
}

/* ---- merges ------------------------------------------------------------------------------------ */

/* Merge i: "left right" or [left, right] into *l and *r (pointing into m or buf). */
static int merge_parts(const tj_src *s, const json_t *m, size_t i, char *buf, size_t len, const char **l, const char **r) {
  char f[64];
  util_snprintf(f, sizeof f, "model.merges[%zu]", i);
  if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
      json_is_string(json_array_get(m, 1))) {
    *l = json_string_value(json_array_get(m, 0));
    *r = json_string_value(json_array_get(m, 1));
    return 0;
  }
  const char *str = json_string_value(m), *sp = str ? strchr(str, ' ') : NULL;
  if (!sp || sp == str || !sp[1] || strchr(sp + 1, ' ') || strlen(str) >= len)
    return refuse(s, f, m, HINT_FILE, "a merge is \"left right\" (two tokens, one space) or [\"left\", \"right\"]");
  memcpy(buf, str, strlen(str) + 1);
  buf[sp - str] = '\0';
  *l = buf;
  *r = buf + (sp - str) + 1;
  return 0;
}

/* model.merges in rank order into t->merges; each token of a merge and their concatenation must be
 * in model.vocab. */
static int read_merges(const tj_src *s, const json_t *vocab, const json_t *merges, tok_tokenizer *t) {
  enum { MAXSTR = 4 * TOK_MAX_BYTES + 1 }; /* a token string: up to 2 UTF-8 bytes per byte */
  char buf[2 * MAXSTR], ab[2 * MAXSTR];
  size_t i;
  const json_t *m;
  json_array_foreach(merges, i, m) {
    const char *l = NULL, *r = NULL;
    if (merge_parts(s, m, i, buf, sizeof buf, &l, &r)) return -1;
    size_t ll = strlen(l), rl = strlen(r);
    const json_t *il = json_object_get(vocab, l), *ir = json_object_get(vocab, r), *iab = NULL;
    if (il && ir && ll + rl < sizeof ab) {
      memcpy(ab, l, ll);
      memcpy(ab + ll, r, rl + 1);
      iab = json_object_get(vocab, ab);
    }
    char f[64];
    util_snprintf(f, sizeof f, "model.merges[%zu]", i);
    if (!iab)
      return refuse(s, f, m, HINT_FILE, !il ? "the left token is not in model.vocab" : !ir ? "the right token is not in "
                    "model.vocab" : "the merged token is not in model.vocab");
    if (tok_put_merge(t, (int32_t)json_integer_value(il), (int32_t)json_integer_value(ir),
                      (int32_t)json_integer_value(iab)) != 0)
      return refuse(s, f, m, HINT_FILE, "the merge appears twice");
  }
  if (t->nmerges == 0) return refuse(s, "model.merges", merges, HINT_FILE, "no merges: a BPE vocabulary needs at least one");
  return 0;
}

/* ---- the whole file ------------------------------------------------------------------------------ */

/* The end-of-text token: the special added token "<|endoftext|>", else "<|end_of_text|>", else -1. */
static int find_eot(const tok_tokenizer *t, const signed char *special) {
  static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>"};
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < t->vocab_size; i++) {
      size_t l = t->off[i + 1] - t->off[i];
      if (special[i] == 1 && l == strlen(names[k]) && memcmp(t->bytes + t->off[i], names[k], l) == 0) return i;
    }
  return -1;
}

/* The tokens and merges of model (checked by read_model_settings) and added_tokens. */
static int read_tokens(const tj_src *s, const json_t *model, const json_t *added, tok_tokenizer *t) {
  const json_t *vocab = json_object_get(model, "vocab");
  if (added && !json_is_array(added)) return refuse(s, "added_tokens", added, HINT_FILE, "not an array");
  int n = count_ids(s, vocab, added);
  if (n < 0) return -1;
  t->vocab_size = n;
  char **tok = util_calloc((size_t)n, sizeof *tok, "tokens");
  int *tlen = util_calloc((size_t)n, sizeof *tlen, "tokens");
  signed char *special = util_malloc((size_t)n, "tokens");
  memset(special, -1, (size_t)n);
  hmap_str by_bytes;
  hmap_str_init(&by_bytes, (size_t)n);
  int rc = read_added(s, added, n, tok, tlen, special, t);
  if (rc == 0) rc = read_vocab(s, vocab, tok, tlen, special, &by_bytes);
  for (int i = 0; i < n && rc == 0; i++)
    if (!tok[i]) rc = refuse_new(s, "model.vocab", json_integer(i), HINT_FILE, "no token has this id: the ids must be 0..n-1");
  if (rc == 0) {
    tok_set_tokens(t, tok, tlen);
    t->eot = find_eot(t, special);
    rc = tok_set_byte_ids(t, &by_bytes, s->path, HINT_BPE, s->errs);
  }
  if (rc == 0) rc = read_merges(s, vocab, json_object_get(model, "merges"), t);
  if (rc == 0 && t->ignore_merges) t->vocab = by_bytes;
  else hmap_str_free(&by_bytes);
  for (int i = 0; i < n; i++) free(tok[i]);
  free(tok), free(tlen), free(special);
  return rc;
}

static int read_root(const tj_src *s, const json_t *root, tok_tokenizer *t) {
  if (!json_is_object(root)) return refuse(s, "(the file)", root, HINT_FILE, "not a JSON object");
  const json_t *model = json_object_get(root, "model");
  if (read_model_settings(s, model, t) || read_normalizer(s, root, t) || read_pre_tokenizer(s, root, t) ||
      read_decoder(s, root) || read_tokens(s, model, json_object_get(root, "added_tokens"), t))
    return -1;
  if (t->pattern && strcmp(t->pattern, tok_gpt2_pattern()) == 0) { /* GPT-2's own, given as a Split */
    free(t->pattern);
    t->pattern = NULL;
  }
  return tok_compile_pattern(t, s->path, "pre_tokenizer.pretokenizers[0].pattern.Regex", s->errs);
}

int tokjson_load(tok_tokenizer *t, const char *path, err_list *errs) {
  memset(t, 0, sizeof *t);
  t->kind = TOK_BPE;
  t->eot = -1;
  hmap_u64_init(&t->merges, 1024);
  tj_src s = {path, errs};
  size_t len;
  char *text = util_read_file(path, TOK_MAX_FILE, &len, "tokenizer", HINT_FILE, errs);
  json_error_t je;
  json_t *root = text ? json_loadb(text, len, 0, &je) : NULL;
  int read = text != NULL;
  free(text);
  if (read && !root)
    err_add(errs, path, je.line > 0 ? je.line : 0, je.line > 0 ? je.column : 0, HINT_FILE, "not valid JSON: %s", je.text);
  int rc = root ? read_root(&s, root, t) : -1;
  json_decref(root);
  if (rc != 0) {
    tok_free(t);
    return -1;
  }
  tok_finish(t);
  t->json_path = util_strdup(path);
  util_snprintf(t->desc, sizeof t->desc, "byte-level BPE (vocabulary %d, %d merges) from %s", t->vocab_size, t->nmerges,
                path);
  return 0;
}
