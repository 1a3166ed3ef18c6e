/* tok: byte and byte-level BPE tokenizers (GPT-2's files; a tokenizer.json's settings from tokjson.c). */
#include "text/tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "text/nfc.h"
#include "text/tokjson.h"

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char EOT_TEXT[] = "<|endoftext|>";

const char *tok_gpt2_pattern(void) { return GPT2_PATTERN; }

int tok_is_gpt2(const tok_tokenizer *t) { return !t->pattern && !t->ignore_merges && !t->nfc && t->nadded == 0; }
static const char TOKJSON[] = "tokenizer.json";

void tok_ids_push(tok_ids *l, int32_t id) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 256;
    l->v = util_realloc(l->v, l->cap * sizeof *l->v, "token ids");
  }
  l->v[l->n++] = id;
}

void tok_ids_free(tok_ids *l) {
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

/* ---- GPT-2's byte <-> character map ------------------------------------------------------------ */

int tok_byte_to_char(int b) {
  /* printable Latin-1 bytes stand for themselves; the other 68 bytes map to 256, 257, ... in order */
  if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
  int n = 0;
  for (int c = 0; c < b; c++)
    if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
  return 256 + n;
}

static int char_to_byte(int cp) {
  static int table[324];
  static int ready = 0;
  if (!ready) {
    for (int i = 0; i < 324; i++) table[i] = -1;
    for (int b = 0; b < 256; b++) table[tok_byte_to_char(b)] = b;
    ready = 1;
  }
  return cp >= 0 && cp < 324 ? table[cp] : -1;
}

/* Decode one UTF-8 code point; returns its length or -1. */
static int utf8_next(const unsigned char *s, int n, int *cp) {
  if (n < 1) return -1;
  if (s[0] < 0x80) return *cp = s[0], 1;
  if ((s[0] & 0xE0) == 0xC0 && n >= 2 && (s[1] & 0xC0) == 0x80) return *cp = ((s[0] & 0x1F) << 6) | (s[1] & 0x3F), 2;
  if ((s[0] & 0xF0) == 0xE0 && n >= 3 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80)
    return *cp = ((s[0] & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F), 3;
  return -1; /* GPT-2's alphabet needs no 4-byte sequences */
}

int tok_chars_to_bytes(const char *s, char *out, int outlen) {
  int n = (int)strlen(s), k = 0;
  for (int i = 0; i < n;) {
    int cp, l = utf8_next((const unsigned char *)s + i, n - i, &cp);
    if (l < 0) return -1;
    int b = char_to_byte(cp);
    if (b < 0 || k >= outlen) return -1;
    out[k++] = (char)b;
    i += l;
  }
  return k;
}

int tok_bytes_to_chars(const char *b, int n, char *out, int outlen) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    int cp = tok_byte_to_char((unsigned char)b[i]);
    if (cp < 0x80) {
      if (k + 1 >= outlen) break;
      out[k++] = (char)cp;
    } else {
      if (k + 2 >= outlen) break;
      out[k++] = (char)(0xC0 | (cp >> 6));
      out[k++] = (char)(0x80 | (cp & 0x3F));
    }
  }
  out[k] = '\0';
  return k;
}

/* ---- identity ---------------------------------------------------------------------------------- */

static uint64_t hash_u32(uint64_t h, uint32_t x) {
  unsigned char b[4] = {(unsigned char)x, (unsigned char)(x >> 8), (unsigned char)(x >> 16), (unsigned char)(x >> 24)};
  return util_hash64(b, 4, h);
}

uint32_t *tok_merge_list(const tok_tokenizer *t) {
  uint32_t *pairs = util_calloc((size_t)t->nmerges * 2 + 1, sizeof(uint32_t), "merge list");
  for (size_t i = 0; i < t->merges.cap; i++) {
    uint64_t k = t->merges.keys[i];
    if (k == HMAP_EMPTY) continue;
    uint32_t rank = (uint32_t)(t->merges.vals[i] >> 32);
    pairs[2 * rank] = (uint32_t)(k >> 32);
    pairs[2 * rank + 1] = (uint32_t)k;
  }
  return pairs;
}

uint64_t tok_hash_of(const tok_tokenizer *t) {
  uint64_t h = 0;
  for (int i = 0; i < t->vocab_size; i++) {
    uint32_t len = (uint32_t)(t->off[i + 1] - t->off[i]);
    h = hash_u32(h, len);
    h = util_hash64(t->bytes + t->off[i], len, h);
  }
  uint32_t *pairs = tok_merge_list(t);
  for (int r = 0; r < t->nmerges; r++) h = hash_u32(hash_u32(h, pairs[2 * r]), pairs[2 * r + 1]);
  free(pairs);
  if (tok_is_gpt2(t)) return h;
  if (t->pattern) h = util_hash64(t->pattern, strlen(t->pattern), hash_u32(h, 1));
  if (t->ignore_merges || t->nfc) h = hash_u32(hash_u32(h, 2), (uint32_t)(t->ignore_merges | t->nfc << 1));
  for (int i = 0; i < t->nadded; i++) h = hash_u32(hash_u32(h, (uint32_t)t->added[i].id), (uint32_t)t->added[i].normalized);
  return h;
}

static void finish_identity(tok_tokenizer *t) {
  t->hash = tok_hash_of(t);
  snprintf(t->hash_hex, sizeof t->hash_hex, "%016llx", (unsigned long long)t->hash);
  t->max_len = 1;
  for (int i = 0; i < t->vocab_size; i++)
    if ((int)(t->off[i + 1] - t->off[i]) > t->max_len) t->max_len = (int)(t->off[i + 1] - t->off[i]);
}

/* ---- construction ------------------------------------------------------------------------------ */

void tok_init_bytes(tok_tokenizer *t) {
  memset(t, 0, sizeof *t);
  t->kind = TOK_BYTES;
  t->vocab_size = 256;
  t->eot = -1;
  t->bytes = util_malloc(256, "byte tokens");
  t->off = util_malloc(257 * sizeof *t->off, "byte tokens");
  for (int b = 0; b < 256; b++) {
    t->bytes[b] = (char)b;
    t->off[b] = (size_t)b;
    t->byte_id[b] = b;
  }
  t->off[256] = 256;
  hmap_u64_init(&t->merges, 1);
  finish_identity(t);
  snprintf(t->desc, sizeof t->desc, "bytes (vocabulary 256)");
}

int tok_compile_pattern(tok_tokenizer *t, const char *file, const char *field, err_list *errs) {
  int code;
  PCRE2_SIZE at;
  const char *pattern = t->pattern ? t->pattern : GPT2_PATTERN;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    if (t->pattern)
      err_add(errs, file, 0, 0, "greenlm compiles the pattern with PCRE2 (Perl syntax, Unicode properties)",
              "%s: PCRE2 cannot compile the pattern at offset %zu: %s", field, (size_t)at, (char *)msg);
    else
      err_add(errs, NULL, 0, 0, "rebuild against a PCRE2 with Unicode support (libpcre2-dev)",
              "PCRE2 cannot compile the GPT-2 pattern: %s", (char *)msg);
    return -1;
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter when JIT is missing */
  t->re = re;
  t->md = pcre2_match_data_create_from_pattern(re, NULL);
  return 0;
}

static const char TOK_HINT[] = "run the 'tokenizer' task to learn a vocabulary, or point &tokenizer dir at GPT-2's "
                               "encoder.json and vocab.bpe (or a Hugging Face model's tokenizer.json, or its vocab.json "
                               "and merges.txt)";

/* encoder.json (its text, len bytes): a JSON object of token strings -> ids 0..n-1, each once. Fills
 * t->bytes, t->off, t->vocab_size, t->eot, t->byte_id, and by_bytes (token bytes -> id,
 * <|endoftext|> left out). Returns 0, or -1 after adding an error at the file. */
static int load_encoder(tok_tokenizer *t, const char *path, const char *text, size_t len, hmap_str *by_bytes,
                        err_list *errs) {
  json_error_t je;
  json_t *enc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!enc) {
    err_add(errs, path, je.line > 0 ? je.line : 0, je.line > 0 ? je.column : 0, TOK_HINT, "not valid JSON: %s", je.text);
    return -1;
  }
  if (!json_is_object(enc) || json_object_size(enc) < 256 || json_object_size(enc) > TOK_MAX_VOCAB) {
    err_add(errs, path, 0, 0, TOK_HINT, "not a GPT-2 encoder: expected a JSON object of 256 to %d tokens, got %s of %zu",
            TOK_MAX_VOCAB, json_is_object(enc) ? "an object" : "another JSON value", json_is_object(enc) ? json_object_size(enc) : 0);
    json_decref(enc);
    return -1;
  }
  int n = (int)json_object_size(enc), rc = 0;
  t->vocab_size = n;
  char **tok = util_calloc((size_t)n, sizeof(char *), "tokens");
  int *tlen = util_calloc((size_t)n, sizeof(int), "tokens");
  const char *key;
  json_t *val;
  json_object_foreach(enc, key, val) {
    json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
    char buf[TOK_MAX_BYTES], shown[80];
    int len = tok_chars_to_bytes(key, buf, sizeof buf);
    err_quote(shown, sizeof shown, key, strlen(key));
    if (id < 0 || id >= n || tok[id]) {
      err_add(errs, path, 0, 0, TOK_HINT, "ids must be the integers 0..%d, each once: token \"%s\" has %s", n - 1, shown,
              !json_is_integer(val) ? "an id that is not an integer" : id < 0 || id >= n ? "an id out of range" : "a repeated id");
      rc = -1;
      break;
    }
    if (len < 0) {
      err_add(errs, path, 0, 0, TOK_HINT, "token %lld is not a GPT-2 token string (longer than %d bytes or characters "
              "outside GPT-2's byte alphabet): \"%s\"", (long long)id, TOK_MAX_BYTES, shown);
      rc = -1;
      break;
    }
    tok[id] = util_malloc((size_t)len + 1, "token");
    memcpy(tok[id], buf, (size_t)len);
    tlen[id] = len;
    if (len == (int)sizeof EOT_TEXT - 1 && memcmp(buf, EOT_TEXT, (size_t)len) == 0) t->eot = (int)id;
  }
  json_decref(enc);
  if (rc == 0) {
    tok_set_tokens(t, tok, tlen);
    for (int i = 0; i < n; i++)
      if (i != t->eot) *hmap_str_put(by_bytes, tok[i], (size_t)tlen[i], i, NULL) = i;
  }
  for (int i = 0; i < n; i++) free(tok[i]);
  free(tok), free(tlen);
  return rc == 0 ? tok_set_byte_ids(t, by_bytes, path, TOK_HINT, errs) : -1;
}

void tok_set_tokens(tok_tokenizer *t, char *const *tok, const int *tlen) {
  int n = t->vocab_size;
  size_t total = 0, o = 0;
  for (int i = 0; i < n; i++) total += (size_t)tlen[i];
  t->bytes = util_malloc(total + 1, "token bytes");
  t->off = util_malloc(((size_t)n + 1) * sizeof *t->off, "token offsets");
  for (int i = 0; i < n; i++) {
    t->off[i] = o;
    memcpy(t->bytes + o, tok[i], (size_t)tlen[i]);
    o += (size_t)tlen[i];
  }
  t->off[n] = o;
}

int tok_set_byte_ids(tok_tokenizer *t, const hmap_str *by_bytes, const char *path, const char *hint, err_list *errs) {
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    int64_t *id = hmap_str_get(by_bytes, &c, 1);
    if (!id) {
      err_add(errs, path, 0, 0, hint, "no single-byte token for byte 0x%02x: a byte-level vocabulary needs all 256", b);
      return -1;
    }
    t->byte_id[b] = (int)*id;
  }
  return 0;
}

/* One merge line "left right" of vocab.bpe (line number lineno, NUL-terminated, no newline) into
 * t->merges. Returns 0, or -1 after adding an error at path:lineno. */
static int add_merge(tok_tokenizer *t, const hmap_str *by_bytes, char *line, const char *path, int lineno, err_list *errs) {
  char shown[120];
  err_quote(shown, sizeof shown, line, strlen(line));
  char *sp = strchr(line, ' ');
  if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' ')) {
    err_add(errs, path, lineno, 0, TOK_HINT, "a merge is two tokens and one space (\"left right\"), got \"%s\"", shown);
    return -1;
  }
  *sp = '\0';
  char a[TOK_MAX_BYTES], b[TOK_MAX_BYTES], ab[2 * TOK_MAX_BYTES];
  int la = tok_chars_to_bytes(line, a, sizeof a), lb = tok_chars_to_bytes(sp + 1, b, sizeof b);
  int64_t *ia = la > 0 ? hmap_str_get(by_bytes, a, (size_t)la) : NULL;
  int64_t *ib = lb > 0 ? hmap_str_get(by_bytes, b, (size_t)lb) : NULL;
  int64_t *iab = NULL;
  if (ia && ib) {
    memcpy(ab, a, (size_t)la);
    memcpy(ab + la, b, (size_t)lb);
    iab = hmap_str_get(by_bytes, ab, (size_t)(la + lb));
  }
  if (!ia || !ib || !iab) {
    err_add(errs, path, lineno, 0, TOK_HINT, "%s of the merge is not in encoder.json: \"%s\"",
            !ia ? "the left token" : !ib ? "the right token" : "the merged token", shown);
    return -1;
  }
  if (tok_put_merge(t, (int32_t)*ia, (int32_t)*ib, (int32_t)*iab) != 0) {
    err_add(errs, path, lineno, 0, TOK_HINT, "the merge appears twice: \"%s\"", shown);
    return -1;
  }
  return 0;
}

int tok_put_merge(tok_tokenizer *t, int32_t left, int32_t right, int32_t merged) {
  int added;
  uint64_t *v = hmap_u64_put(&t->merges, ((uint64_t)(uint32_t)left << 32) | (uint32_t)right, 0, &added);
  if (!added) return -1;
  *v = ((uint64_t)t->nmerges << 32) | (uint32_t)merged;
  t->nmerges++;
  return 0;
}

/* vocab.bpe (its text, len bytes, NUL-terminated; changed in place): "#version: 0.2" then one merge
 * "left right" per line, in rank order. */
static int load_merges(tok_tokenizer *t, const char *path, char *text, size_t len, const hmap_str *by_bytes,
                       err_list *errs) {
  int lineno = 0, rc = 0;
  for (size_t at = 0; at < len && rc == 0;) {
    char *line = text + at, *nl = memchr(line, '\n', len - at);
    size_t l = nl ? (size_t)(nl - line) : len - at;
    at += l + (nl != NULL);
    lineno++;
    if (l && line[l - 1] == '\r') l--;
    line[l] = '\0';
    if (memchr(line, '\0', l)) {
      err_add(errs, path, lineno, 0, TOK_HINT, "a NUL byte in a merge line: vocab.bpe is a text file");
      rc = -1;
    } else if (l > 2 * 4 * TOK_MAX_BYTES) {
      err_add(errs, path, lineno, 0, TOK_HINT, "a merge line of %zu bytes, longer than any two tokens can be", l);
      rc = -1;
    } else if (l && !(lineno == 1 && line[0] == '#')) {
      rc = add_merge(t, by_bytes, line, path, lineno, errs);
    }
  }
  if (rc == 0 && t->nmerges == 0) {
    err_add(errs, path, 0, 0, TOK_HINT, "no merges: a BPE vocabulary needs at least one");
    rc = -1;
  }
  return rc;
}

/* ---- the manifest of a learned pair ------------------------------------------------------------- */

static const char MANIFEST_HEADER[] = "greenlm tokenizer manifest 1\n";

/* The manifest's line for a file's bytes: its name, hash and length. */
static void manifest_line(char *out, size_t len, const char *name, const char *data, size_t n) {
  util_snprintf(out, len, "%s %016llx %zu\n", name, (unsigned long long)util_hash64(data, n, 0), n);
}

void tok_manifest_text(const char *enc, size_t enc_len, const char *voc, size_t voc_len, char *out, size_t len) {
  char e[160], v[160];
  manifest_line(e, sizeof e, "encoder.json", enc, enc_len);
  manifest_line(v, sizeof v, "vocab.bpe", voc, voc_len);
  util_snprintf(out, len, "%s%s%s", MANIFEST_HEADER, e, v);
}

/* When dir has a manifest, the pair read (enc, voc) must be the one it lists. Returns 0 or -1 after
 * adding an error at the manifest. */
static int check_manifest(const char *dir, const char *enc, size_t el, const char *voc, size_t vl, err_list *errs) {
  char path[UTIL_PATH_MAX], e[160], v[160];
  util_snprintf(path, sizeof path, "%s/%s", dir, TOK_MANIFEST);
  if (access(path, F_OK) != 0) return 0; /* GPT-2's files, or files of an older greenlm */
  size_t n;
  char *m = util_read_file(path, 4096, &n, "tokenizer manifest", TOK_HINT, errs);
  if (!m) return -1;
  manifest_line(e, sizeof e, "encoder.json", enc, el);
  manifest_line(v, sizeof v, "vocab.bpe", voc, vl);
  int header = strncmp(m, MANIFEST_HEADER, sizeof MANIFEST_HEADER - 1) == 0, e_ok = strstr(m, e) != NULL,
      v_ok = strstr(m, v) != NULL;
  free(m);
  if (!header)
    err_add(errs, path, 1, 0, "delete it, or run the 'tokenizer' task again", "not a greenlm tokenizer manifest");
  else if (!e_ok || !v_ok)
    err_add(errs, path, 0, 0, "run the 'tokenizer' task again to write both files, or delete " TOK_MANIFEST
            " to load them as they are", "%s %s not the file%s this manifest lists (hash and length): the pair was "
            "replaced one file at a time, or writing it was interrupted", !e_ok && !v_ok ? "encoder.json and vocab.bpe"
            : !e_ok ? "encoder.json" : "vocab.bpe", !e_ok && !v_ok ? "are" : "is", !e_ok && !v_ok ? "s" : "");
  return header && e_ok && v_ok ? 0 : -1;
}

void tok_finish(tok_tokenizer *t) {
  hmap_str_init(&t->cache, 1 << 14);
  finish_identity(t);
}

int tok_load_bpe(tok_tokenizer *t, const char *dir, err_list *errs) {
  memset(t, 0, sizeof *t);
  t->kind = TOK_BPE;
  t->eot = -1;
  char path[UTIL_PATH_MAX], vpath[UTIL_PATH_MAX], json_path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/encoder.json", dir);
  util_snprintf(vpath, sizeof vpath, "%s/vocab.bpe", dir);
  util_snprintf(json_path, sizeof json_path, "%s/%s", dir, TOKJSON);
  /* GPT-2's names (and a learned pair) first; then the fast tokenizer's file, which transformers reads
   * before vocab.json and merges.txt and which alone says how a model's text is cut */
  if (access(path, F_OK) != 0 && access(vpath, F_OK) != 0 && access(json_path, F_OK) == 0)
    return tokjson_load(t, json_path, errs);
  char hf_path[UTIL_PATH_MAX]; /* a Hugging Face model directory has the same files under other names */
  util_snprintf(hf_path, sizeof hf_path, "%s/vocab.json", dir);
  if (access(path, F_OK) != 0 && access(vpath, F_OK) != 0 && access(hf_path, F_OK) == 0) {
    util_strlcpy(path, hf_path, sizeof path);
    util_snprintf(vpath, sizeof vpath, "%s/merges.txt", dir);
  }
  int hf = strcmp(path, hf_path) == 0;
  size_t el = 0, vl = 0;
  char *enc = util_read_file(path, TOK_MAX_FILE, &el, "tokenizer", TOK_HINT, errs);
  char *voc = enc ? util_read_file(vpath, TOK_MAX_FILE, &vl, "tokenizer", TOK_HINT, errs) : NULL;
  int rc = enc && voc ? 0 : -1;
  if (rc == 0 && !hf) rc = check_manifest(dir, enc, el, voc, vl, errs);
  hmap_str by_bytes;
  hmap_str_init(&by_bytes, 1024);
  hmap_u64_init(&t->merges, 1024);
  if (rc == 0) rc = load_encoder(t, path, enc, el, &by_bytes, errs);
  if (rc == 0) rc = load_merges(t, vpath, voc, vl, &by_bytes, errs);
  hmap_str_free(&by_bytes);
  free(enc), free(voc);
  if (rc == 0) rc = tok_compile_pattern(t, NULL, NULL, errs);
  if (rc != 0) {
    tok_free(t);
    return -1;
  }
  tok_finish(t);
  util_snprintf(t->desc, sizeof t->desc, "byte-level BPE (vocabulary %d, %d merges) from %s", t->vocab_size, t->nmerges,
                dir);
  return 0;
}

int tok_open(tok_tokenizer *t, cfg_tokenizer_kind kind, const char *dir, err_list *errs) {
  if (kind == CFG_TOK_BPE) return tok_load_bpe(t, dir, errs);
  tok_init_bytes(t);
  return 0;
}

int tok_init_pretokenizer(tok_tokenizer *t, err_list *errs) {
  memset(t, 0, sizeof *t);
  t->kind = TOK_BPE;
  t->eot = -1;
  hmap_u64_init(&t->merges, 1);
  return tok_compile_pattern(t, NULL, NULL, errs);
}

void tok_free(tok_tokenizer *t) {
  free(t->bytes);
  free(t->off);
  hmap_u64_free(&t->merges);
  if (t->md) pcre2_match_data_free(t->md);
  if (t->re) pcre2_code_free(t->re);
  if (t->cache.slots) hmap_str_free(&t->cache);
  tok_ids_free(&t->cache_ids);
  if (t->vocab.slots) hmap_str_free(&t->vocab);
  free(t->pattern);
  free(t->added);
  free(t->json_path);
  memset(t, 0, sizeof *t);
}

/* ---- BPE ---------------------------------------------------------------------------------------- */

typedef struct {
  uint32_t rank, pos;
} bpe_cand;

static int cand_less(bpe_cand a, bpe_cand b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(bpe_cand *h, int *n, bpe_cand c) {
  int i = (*n)++;
  while (i > 0 && cand_less(c, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, int *n) {
  bpe_cand top = h[0], last = h[--(*n)];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
    if (!cand_less(h[c], last)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = last;
  return top;
}

/* Merge rank and result of the pair (a, b), or 0 when they do not merge. */
static int pair_merge(const tok_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
  const uint64_t *v = hmap_u64_get(&t->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
  if (!v) return 0;
  *rank = (uint32_t)(*v >> 32);
  *id = (int32_t)(uint32_t)*v;
  return 1;
}

/* BPE of one piece: repeatedly merge the lowest-ranked adjacent pair (leftmost first). A heap keeps
 * it O(n log n) however long the piece is. */
static void bpe_piece(const tok_tokenizer *t, const unsigned char *p, size_t n, tok_ids *out) {
  int32_t stack_id[64];
  int stack_nx[64], stack_pv[64];
  bpe_cand stack_h[128];
  int32_t *id = n <= 64 ? stack_id : util_malloc(n * sizeof *id, "bpe");
  int *nx = n <= 64 ? stack_nx : util_malloc(n * sizeof *nx, "bpe");
  int *pv = n <= 64 ? stack_pv : util_malloc(n * sizeof *pv, "bpe");
  bpe_cand *h = n <= 64 ? stack_h : util_malloc(2 * n * sizeof *h, "bpe");
  int nh = 0;
  for (size_t i = 0; i < n; i++) {
    id[i] = t->byte_id[p[i]];
    nx[i] = i + 1 < n ? (int)i + 1 : -1;
    pv[i] = (int)i - 1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    uint32_t r;
    int32_t m;
    if (pair_merge(t, id[i], id[i + 1], &r, &m)) heap_push(h, &nh, (bpe_cand){r, (uint32_t)i});
  }
  while (nh > 0) {
    bpe_cand c = heap_pop(h, &nh);
    int i = (int)c.pos, j = nx[i];
    uint32_t r;
    int32_t m;
    if (id[i] < 0 || j < 0 || !pair_merge(t, id[i], id[j], &r, &m) || r != c.rank) continue; /* stale */
    id[i] = m; /* merge j into i */
    id[j] = -1;
    nx[i] = nx[j];
    if (nx[j] >= 0) pv[nx[j]] = i;
    if (pv[i] >= 0 && pair_merge(t, id[pv[i]], id[i], &r, &m)) heap_push(h, &nh, (bpe_cand){r, (uint32_t)pv[i]});
    if (nx[i] >= 0 && pair_merge(t, id[i], id[nx[i]], &r, &m)) heap_push(h, &nh, (bpe_cand){r, (uint32_t)i});
  }
  for (int i = 0; i >= 0; i = nx[i]) tok_ids_push(out, id[i]);
  if (n > 64) free(id), free(nx), free(pv), free(h);
}

/* BPE with a cache of pieces already seen (ignore_merges: a whole token is taken as it is). An empty piece (a
 * tokenizer.json pattern may match the empty string) has no tokens. */
static void encode_piece(tok_tokenizer *t, const char *p, size_t n, tok_ids *out) {
  if (n == 0) return;
  int64_t *whole = t->ignore_merges ? hmap_str_get(&t->vocab, p, n) : NULL;
  if (whole) {
    tok_ids_push(out, (int32_t)*whole);
    return;
  }
  int64_t *at = hmap_str_get(&t->cache, p, n);
  if (at) {
    /* stored as [count, ids...] */
    const int32_t *c = t->cache_ids.v + *at;
    for (int32_t k = 1; k <= c[0]; k++) tok_ids_push(out, c[k]);
    return;
  }
  size_t start = out->n;
  bpe_piece(t, (const unsigned char *)p, n, out);
  if (n <= 256) {
    if (t->cache.n > (1u << 20)) { /* bound the memory: start over */
      hmap_str_clear(&t->cache);
      t->cache_ids.n = 0;
    }
    *hmap_str_put(&t->cache, p, n, 0, NULL) = (int64_t)t->cache_ids.n;
    tok_ids_push(&t->cache_ids, (int32_t)(out->n - start));
    for (size_t k = start; k < out->n; k++) tok_ids_push(&t->cache_ids, out->v[k]);
  }
}

/* Bytes of the character at s (n > 0 bytes left): a UTF-8 sequence's length by its lead byte, 1 for a byte
 * that leads none; at most n. */
static size_t char_bytes(const unsigned char *s, size_t n) {
  size_t k = s[0] < 0xC0 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] < 0xF8 ? 4 : 1;
  return k < n ? k : n;
}

void tok_pieces(tok_tokenizer *t, const char *text, size_t len, void (*fn)(const char *, size_t, void *), void *ctx) {
  pcre2_code *re = t->re;
  pcre2_match_data *md = t->md;
  size_t from = 0, pos = 0; /* text before `from` is given to fn; the next search starts at pos */
  while (pos < len) {
    int rc = pcre2_match(re, (PCRE2_SPTR)text, len, pos, 0, md, NULL);
    if (rc < 0) break; /* nothing more matches: the rest is bytes that are not valid UTF-8 */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) { /* an empty match (a tokenizer.json pattern may allow one) makes no piece: on by a character */
      pos = ov[0] + (ov[0] < len ? char_bytes((const unsigned char *)text + ov[0], len - ov[0]) : 1);
      continue;
    }
    if (ov[0] > from) fn(text + from, ov[0] - from, ctx); /* bytes before the match that no match took */
    fn(text + ov[0], ov[1] - ov[0], ctx);
    from = pos = ov[1];
  }
  if (from < len) fn(text + from, len - from, ctx);
}

typedef struct {
  tok_tokenizer *t;
  tok_ids *out;
} encode_ctx;

static void encode_cb(const char *p, size_t n, void *ctx) {
  encode_ctx *c = ctx;
  encode_piece(c->t, p, n, c->out);
}

/* The longest added token of the kind normalized (0 or 1) that starts at s (n bytes left): its length,
 * its id in *id; 0 when none does. */
static size_t added_at(const tok_tokenizer *t, const char *s, size_t n, int normalized, int32_t *id) {
  size_t best = 0;
  for (int k = 0; k < t->nadded; k++) {
    const tok_added *a = &t->added[k];
    size_t l = t->off[a->id + 1] - t->off[a->id];
    if (a->normalized == normalized && l > best && l <= n && memcmp(s, t->bytes + t->off[a->id], l) == 0) {
      best = l;
      *id = a->id;
    }
  }
  return best;
}

/* A tokenizer.json's stages for text (len bytes): 0 cut out the added tokens matched in the text as
 * given, 1 NFC-normalize what is left, 2 cut out those matched in normalized text, 3 pieces and BPE. */
static void encode_stage(tok_tokenizer *t, const char *text, size_t len, int stage, tok_ids *out) {
  if (stage == 1) {
    if (!t->nfc || nfc_quick(text, len)) {
      encode_stage(t, text, len, 2, out);
    } else {
      size_t n;
      char *norm = nfc_normalize(text, len, &n);
      encode_stage(t, norm, n, 2, out);
      free(norm);
    }
    return;
  }
  if (stage == 3) {
    encode_ctx c = {t, out};
    tok_pieces(t, text, len, encode_cb, &c);
    return;
  }
  if (t->nadded == 0) {
    encode_stage(t, text, len, stage + 1, out);
    return;
  }
  size_t from = 0;
  for (size_t i = 0; i < len; i++) {
    int32_t id;
    size_t l = t->added_first[(unsigned char)text[i]] ? added_at(t, text + i, len - i, stage == 2, &id) : 0;
    if (l == 0) continue;
    encode_stage(t, text + from, i - from, stage + 1, out);
    tok_ids_push(out, id);
    from = i + l;
    i = from - 1;
  }
  encode_stage(t, text + from, len - from, stage + 1, out);
}

static void encode_ordinary(tok_tokenizer *t, const char *text, size_t len, tok_ids *out) {
  if (t->kind == TOK_BYTES) {
    for (size_t i = 0; i < len; i++) tok_ids_push(out, (unsigned char)text[i]);
    return;
  }
  encode_stage(t, text, len, 0, out);
}

void tok_encode(tok_tokenizer *t, const char *text, size_t len, int special, tok_ids *out) {
  if (!special || t->eot < 0) {
    encode_ordinary(t, text, len, out);
    return;
  }
  const char *eot = t->bytes + t->off[t->eot];
  const size_t el = t->off[t->eot + 1] - t->off[t->eot];
  size_t pos = 0;
  for (size_t i = 0; el > 0 && i + el <= len;) {
    const char *hit = memchr(text + i, eot[0], len - i - el + 1);
    if (!hit) break;
    i = (size_t)(hit - text);
    if (memcmp(hit, eot, el) == 0) {
      encode_ordinary(t, text + pos, i - pos, out);
      tok_ids_push(out, t->eot);
      pos = i = i + el;
    } else {
      i++;
    }
  }
  encode_ordinary(t, text + pos, len - pos, out);
}

size_t tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, char *out) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->vocab_size) continue;
    size_t l = t->off[ids[i] + 1] - t->off[ids[i]];
    memcpy(out + k, t->bytes + t->off[ids[i]], l);
    k += l;
  }
  return k;
}
