/* bench: benchmark files (LAMBADA, HellaSwag, PIQA, ARC, Winogrande, generic mc) to scoring requests, and their scores. */
#include "eval/bench.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/util.h"

/* The rng purpose of few-shot draws: apart from rng.h's RNG_INIT, RNG_DATA and RNG_SAMPLE. */
#define BENCH_RNG_FEWSHOT 0x62656e6368ULL /* "bench" */

enum { WHY = 320 };

/* One line of the file: n choices; the contexts and the continuations are either one shared by all
 * choices (nctx or ncont 1) or one per choice (n). */
struct bench_item {
  int n, gold, nctx, ncont;
  char **ctx, **cont;
  long *normlen; /* [n]: Unicode characters of each choice's text (acc_norm) */
};

/* ---- strings ------------------------------------------------------------------------------------ */

/* a + b + c (NULL: nothing), newly allocated. */
static char *cat3(const char *a, const char *b, const char *c) {
  size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0, lc = c ? strlen(c) : 0;
  char *s = util_malloc(la + lb + lc + 1, "benchmark text");
  memcpy(s, a ? a : "", la);
  memcpy(s + la, b ? b : "", lb);
  memcpy(s + la + lb, c ? c : "", lc);
  s[la + lb + lc] = '\0';
  return s;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The len bytes at s, newly allocated. */
static char *dup_n(const char *s, size_t len) {
  char *out = util_malloc(len + 1, "benchmark text");
  memcpy(out, s, len);
  out[len] = '\0';
  return out;
}

/* Python's str.strip() (ASCII white space), of len bytes at s, newly allocated. */
static char *strip_n(const char *s, size_t len) {
  while (len > 0 && is_space(*s)) s++, len--;
  while (len > 0 && is_space(s[len - 1])) len--;
  return dup_n(s, len);
}

/* Unicode characters of a UTF-8 string (Python's len()). */
static long utf8_len(const char *s) {
  long n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
  return n;
}

/* In place: every non-overlapping `from` (left to right) replaced by the shorter or equal `to`. */
static void replace_all(char *s, const char *from, const char *to) {
  size_t lf = strlen(from), lt = strlen(to);
  char *w = s;
  for (const char *r = s; *r;) {
    if (strncmp(r, from, lf) == 0) {
      memmove(w, to, lt), w += lt, r += lf;
    } else {
      *w++ = *r++;
    }
  }
  *w = '\0';
}

/* In place: remove every "[...]" that has no newline inside (Python's re.sub(r"\[.*?\]", "", s)). */
static void remove_tags(char *s) {
  char *w = s;
  for (const char *r = s; *r;) {
    size_t close = *r == '[' ? strcspn(r + 1, "]\n") + 1 : 0;
    if (close && r[close] == ']') {
      r += close + 1;
    } else {
      *w++ = *r++;
    }
  }
  *w = '\0';
}

/* lm-eval's HellaSwag preprocess(): strip, " [title]" -> ". ", drop "[...]", "  " -> " ". */
static char *hellaswag_pre(const char *text) {
  char *s = strip_n(text, strlen(text));
  replace_all(s, " [title]", ". ");
  remove_tags(s);
  replace_all(s, "  ", " ");
  return s;
}

/* Python's str.capitalize() on ASCII letters: the first upper case, the rest lower case. */
static char *capitalize(const char *text) {
  char *s = util_strdup(text);
  for (char *p = s; *p; p++)
    if (*p >= 'a' && *p <= 'z' && p == s)
      *p = (char)(*p - 'a' + 'A');
    else if (*p >= 'A' && *p <= 'Z' && p != s)
      *p = (char)(*p - 'A' + 'a');
  return s;
}

/* ---- fields ------------------------------------------------------------------------------------- */

static int fail(char *why, const char *fmt, ...) UTIL_PRINTF(2, 3);
static int fail(char *why, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, WHY, fmt, ap);
  va_end(ap);
  return -1;
}

/* The string field key of o, or NULL with why. */
static const char *get_str(const json_t *o, const char *key, char *why) {
  const json_t *v = json_object_get(o, key);
  if (!v) fail(why, "missing field \"%s\"", key);
  else if (!json_is_string(v)) fail(why, "field \"%s\" is not a string", key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Whether v is a non-empty array of strings (named name in why). */
static int str_array_ok(const json_t *v, const char *name, char *why) {
  if (!json_is_array(v) || json_array_size(v) == 0)
    return fail(why, "field \"%s\" is missing or not a non-empty array of strings", name) + 1;
  for (size_t i = 0; i < json_array_size(v); i++)
    if (!json_is_string(json_array_get(v, i))) return fail(why, "element %zu of \"%s\" is not a string", i, name) + 1;
  return 1;
}

/* The array field key of o whose elements are all strings (at least 1), or NULL with why. */
static const json_t *get_str_array(const json_t *o, const char *key, char *why) {
  const json_t *v = json_object_get(o, key);
  if (!v) return fail(why, "missing field \"%s\"", key), NULL;
  return str_array_ok(v, key, why) ? v : NULL;
}

/* The label field key: an integer or a string of digits, base .. base + n - 1, as 0 .. n - 1;
 * -1 with why. */
static int get_label(const json_t *o, const char *key, int base, int n, char *why) {
  const json_t *v = json_object_get(o, key);
  long long x = -1;
  if (!v) return fail(why, "missing field \"%s\"", key);
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else if (json_is_string(v)) {
    const char *s = json_string_value(v);
    if (!*s) return fail(why, "field \"%s\" is empty (an unlabelled test split?)", key);
    if (strspn(s, "0123456789") != strlen(s) || strlen(s) > 9)
      return fail(why, "field \"%s\" = \"%s\" is not a number", key, s);
    x = atoll(s);
  } else {
    return fail(why, "field \"%s\" is neither an integer nor a string of digits", key);
  }
  if (x < base || x >= base + n) return fail(why, "field \"%s\" = %lld is not in %d .. %d", key, x, base, base + n - 1);
  return (int)(x - base);
}

/* ---- items -------------------------------------------------------------------------------------- */

static void item_alloc(bench_item *it, int n, int nctx, int ncont) {
  it->n = n, it->nctx = nctx, it->ncont = ncont;
  it->ctx = util_calloc((size_t)nctx, sizeof *it->ctx, "benchmark item");
  it->cont = util_calloc((size_t)ncont, sizeof *it->cont, "benchmark item");
  it->normlen = util_calloc((size_t)n, sizeof *it->normlen, "benchmark item");
}

static void item_free(bench_item *it) {
  for (int i = 0; i < it->nctx; i++) free(it->ctx[i]);
  for (int i = 0; i < it->ncont; i++) free(it->cont[i]);
  free(it->ctx), free(it->cont), free(it->normlen);
  memset(it, 0, sizeof *it);
}

static const char *item_ctx(const bench_item *it, int c) { return it->ctx[it->nctx == 1 ? 0 : c]; }
static const char *item_cont(const bench_item *it, int c) { return it->cont[it->ncont == 1 ? 0 : c]; }

/* Choice c of a one-context item: continuation " " + text (as given when lead_space is 0). */
static int set_choice(bench_item *it, int c, const char *text, int lead_space, char *why) {
  if (!*text) return fail(why, "choice %d is empty", c);
  it->cont[c] = lead_space ? cat3(" ", text, NULL) : util_strdup(text);
  it->normlen[c] = utf8_len(text);
  return 0;
}

/* Choices " " + s for each string of arr (the common multiple-choice layout), with context ctx. */
static int set_choices(bench_item *it, char *ctx, const json_t *arr, int gold, char *why) {
  item_alloc(it, (int)json_array_size(arr), 1, (int)json_array_size(arr));
  it->ctx[0] = ctx, it->gold = gold;
  for (int c = 0; c < it->n; c++)
    if (set_choice(it, c, json_string_value(json_array_get(arr, c)), 1, why) != 0) return -1;
  return 0;
}

/* ---- the formats -------------------------------------------------------------------------------- */

static int parse_lambada(const json_t *o, bench_item *it, char *why) {
  const char *text = get_str(o, "text", why);
  if (!text) return -1;
  const char *sp = strrchr(text, ' ');
  if (!sp || sp == text) return fail(why, "field \"text\" has no space before its last word");
  if (!sp[1]) return fail(why, "field \"text\" ends with a space: no last word");
  item_alloc(it, 1, 1, 1);
  it->ctx[0] = dup_n(text, (size_t)(sp - text));
  it->cont[0] = util_strdup(sp);
  return 0;
}

static int parse_hellaswag(const json_t *o, bench_item *it, char *why) {
  const char *label = get_str(o, "activity_label", why), *a = label ? get_str(o, "ctx_a", why) : NULL;
  const char *b = a ? get_str(o, "ctx_b", why) : NULL;
  const json_t *endings = b ? get_str_array(o, "endings", why) : NULL;
  int gold = endings ? get_label(o, "label", 0, (int)json_array_size(endings), why) : -1;
  if (gold < 0) return -1;
  char *cap = capitalize(b), *raw = cat3(label, ": ", a);
  char *raw2 = cat3(raw, " ", cap), *query = hellaswag_pre(raw2);
  free(cap), free(raw), free(raw2);
  item_alloc(it, (int)json_array_size(endings), 1, (int)json_array_size(endings));
  it->ctx[0] = query, it->gold = gold;
  for (int c = 0; c < it->n; c++) {
    char *ending = hellaswag_pre(json_string_value(json_array_get(endings, c)));
    int rc = set_choice(it, c, ending, 1, why);
    free(ending);
    if (rc != 0) return -1;
  }
  return 0;
}

static int parse_piqa(const json_t *o, bench_item *it, char *why) {
  const char *goal = get_str(o, "goal", why), *s1 = goal ? get_str(o, "sol1", why) : NULL;
  const char *s2 = s1 ? get_str(o, "sol2", why) : NULL;
  if (!s2) return -1;
  if (!json_object_get(o, "label"))
    return fail(why, "missing field \"label\" (the original PIQA files keep the labels apart, in *-labels.lst)");
  int gold = get_label(o, "label", 0, 2, why);
  if (gold < 0) return -1;
  item_alloc(it, 2, 1, 2);
  it->ctx[0] = cat3("Question: ", goal, "\nAnswer:"), it->gold = gold;
  return set_choice(it, 0, s1, 1, why) != 0 || set_choice(it, 1, s2, 1, why) != 0 ? -1 : 0;
}

/* ARC's question text, and its choices' texts and labels (new references) in either layout; -1
 * with why. */
static int arc_fields(const json_t *o, const char **stem, json_t **text, json_t **labels, char *why) {
  const json_t *q = json_object_get(o, "question"), *ch;
  if (json_is_object(q)) { /* AI2: {"question": {"stem", "choices": [{"text", "label"}]}} */
    if (!(*stem = get_str(q, "stem", why))) return -1;
    ch = json_object_get(q, "choices");
    if (!json_is_array(ch)) return fail(why, "field \"question\".\"choices\" is missing or not an array");
    *text = json_array(), *labels = json_array();
    for (size_t i = 0; i < json_array_size(ch); i++) {
      json_t *t = json_object_get(json_array_get(ch, i), "text"), *l = json_object_get(json_array_get(ch, i), "label");
      json_array_append(*text, t ? t : json_null()), json_array_append(*labels, l ? l : json_null());
    }
  } else { /* Hugging Face: {"question": str, "choices": {"text": [], "label": []}} */
    if (!(*stem = get_str(o, "question", why))) return -1;
    ch = json_object_get(o, "choices");
    if (!json_is_object(ch)) return fail(why, "field \"choices\" is missing or not an object");
    *text = json_incref(json_object_get(ch, "text")), *labels = json_incref(json_object_get(ch, "label"));
  }
  if (!str_array_ok(*text, "choices text", why) || !str_array_ok(*labels, "choices label", why)) return -1;
  if (json_array_size(*text) != json_array_size(*labels))
    return fail(why, "the choices have %zu texts but %zu labels", json_array_size(*text), json_array_size(*labels));
  return 0;
}

static int parse_arc(const json_t *o, bench_item *it, char *why) {
  const char *stem, *key;
  json_t *text = NULL, *labels = NULL;
  int gold = -1, rc = arc_fields(o, &stem, &text, &labels, why);
  if (rc == 0 && (key = get_str(o, "answerKey", why)) != NULL) {
    for (size_t i = 0; i < json_array_size(labels) && gold < 0; i++)
      if (strcmp(json_string_value(json_array_get(labels, i)), key) == 0) gold = (int)i;
    rc = gold < 0 ? fail(why, "answerKey \"%s\" is not the label of any choice", key)
                  : set_choices(it, cat3("Question: ", stem, "\nAnswer:"), text, gold, why);
  } else {
    rc = -1;
  }
  json_decref(text), json_decref(labels);
  return rc;
}

static int parse_winogrande(const json_t *o, bench_item *it, char *why) {
  const char *s = get_str(o, "sentence", why), *o1 = s ? get_str(o, "option1", why) : NULL;
  const char *o2 = o1 ? get_str(o, "option2", why) : NULL;
  int gold = o2 ? get_label(o, "answer", 1, 2, why) : -1;
  if (gold < 0) return -1;
  const char *blank = strchr(s, '_');
  if (!blank) return fail(why, "field \"sentence\" has no \"_\" to put the options in");
  item_alloc(it, 2, 2, 1);
  it->gold = gold;
  char *before = dup_n(s, (size_t)(blank - s));
  it->ctx[0] = cat3(before, o1, NULL), it->ctx[1] = cat3(before, o2, NULL);
  free(before);
  char *rest = strip_n(blank + 1, strlen(blank + 1));
  it->cont[0] = cat3(" ", rest, NULL);
  free(rest);
  it->normlen[0] = utf8_len(it->ctx[0]), it->normlen[1] = utf8_len(it->ctx[1]);
  return 0;
}

static int parse_mc(const json_t *o, bench_item *it, char *why) {
  const char *ctx = get_str(o, "context", why);
  const json_t *choices = ctx ? get_str_array(o, "choices", why) : NULL;
  int gold = choices ? get_label(o, "label", 0, (int)json_array_size(choices), why) : -1;
  if (gold < 0) return -1;
  item_alloc(it, (int)json_array_size(choices), 1, (int)json_array_size(choices));
  it->ctx[0] = util_strdup(ctx), it->gold = gold;
  for (int c = 0; c < it->n; c++) {
    const char *t = json_string_value(json_array_get(choices, c));
    if (set_choice(it, c, t, !is_space(*t), why) != 0) return -1;
  }
  return 0;
}

static const struct {
  const char *name;
  int (*parse)(const json_t *o, bench_item *it, char *why);
  const char *hint;
} KINDS[] = {
    [BENCH_LAMBADA] = {"lambada", parse_lambada, "lambada lines are {\"text\": \"... last word\"} (EleutherAI/lambada_openai)"},
    [BENCH_HELLASWAG] = {"hellaswag", parse_hellaswag,
                         "hellaswag lines are {\"activity_label\", \"ctx_a\", \"ctx_b\", \"endings\": [4 strings], \"label\": 0..3} "
                         "(rowanz/hellaswag's hellaswag_val.jsonl or Rowan/hellaswag)"},
    [BENCH_PIQA] = {"piqa", parse_piqa, "piqa lines are {\"goal\", \"sol1\", \"sol2\", \"label\": 0|1} (ybisk/piqa as exported by Hugging Face)"},
    [BENCH_ARC] = {"arc", parse_arc,
                   "arc lines are {\"question\": {\"stem\", \"choices\": [{\"text\", \"label\"}]}, \"answerKey\"} (AI2) or "
                   "{\"question\", \"choices\": {\"text\": [], \"label\": []}, \"answerKey\"} (allenai/ai2_arc)"},
    [BENCH_WINOGRANDE] = {"winogrande", parse_winogrande,
                          "winogrande lines are {\"sentence\" with one \"_\", \"option1\", \"option2\", \"answer\": \"1\"|\"2\"} (allenai/winogrande)"},
    [BENCH_MC] = {"mc", parse_mc, "mc lines are {\"context\", \"choices\": [strings], \"label\": index of the right choice}"},
};
enum { NKINDS = sizeof KINDS / sizeof KINDS[0] };

int bench_kind_parse(const char *name) {
  for (int k = 0; k < NKINDS; k++)
    if (strcmp(KINDS[k].name, name) == 0) return k;
  return -1;
}

const char *bench_kind_name(bench_kind kind) { return KINDS[kind].name; }

/* ---- loading ------------------------------------------------------------------------------------ */

/* Parse the JSON Lines text of path (len bytes) into set->items; each bad line is an error at
 * path:line. Blank lines are skipped. */
static void parse_lines(bench_set *set, const char *path, const char *text, size_t len, err_list *errs) {
  const char *hint = KINDS[set->kind].hint, *name = KINDS[set->kind].name;
  long cap = 0;
  int line = 0;
  for (const char *p = text, *end = text + len; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p)), *q = p;
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p), blank = 0;
    p = nl ? nl + 1 : end;
    line++;
    while (blank < n && is_space(q[blank])) blank++;
    if (blank == n) continue;
    json_error_t jerr;
    json_t *o = json_loadb(q, n, 0, &jerr);
    char why[WHY];
    if (!o) {
      err_add(errs, path, line, jerr.column > 0 ? jerr.column : 0, hint, "%s item is not JSON: %s", name, jerr.text);
      continue;
    }
    if (set->nfile == cap) {
      cap = cap ? 2 * cap : 1024;
      set->items = util_realloc(set->items, (size_t)cap * sizeof *set->items, "benchmark items");
    }
    bench_item *it = memset(&set->items[set->nfile], 0, sizeof *it);
    if (!json_is_object(o)) {
      err_add(errs, path, line, 0, hint, "%s item is not a JSON object", name);
    } else if (KINDS[set->kind].parse(o, it, why) != 0) {
      err_add(errs, path, line, 0, hint, "%s item: %s", name, why);
      item_free(it);
    } else {
      set->nfile++;
    }
    json_decref(o);
  }
}

/* k distinct items of the file other than item, drawn from the stream (seed, few-shot, item). */
static void draw_shots(long nfile, long item, int k, uint64_t seed, long *shot) {
  rng_state r;
  rng_seed(&r, seed, BENCH_RNG_FEWSHOT, (uint64_t)item);
  for (int j = 0; j < k; j++) {
    int again;
    do {
      shot[j] = (long)rng_below(&r, (uint64_t)(nfile - 1));
      shot[j] += shot[j] >= item;
      again = 0;
      for (int i = 0; i < j; i++) again |= shot[i] == shot[j];
    } while (again);
  }
}

/* Item i's few-shot examples: each its gold context and continuation, followed by "\n\n". */
static char *fewshot_prefix(const bench_set *set, long i, int k, uint64_t seed) {
  long shot[BENCH_MAX_FEWSHOT];
  size_t len = 0;
  draw_shots(set->nfile, i, k, seed, shot);
  for (int j = 0; j < k; j++) {
    const bench_item *e = &set->items[shot[j]];
    len += strlen(item_ctx(e, e->gold)) + strlen(item_cont(e, e->gold)) + 2;
  }
  char *s = util_malloc(len + 1, "few-shot prompt"), *w = s;
  *w = '\0';
  for (int j = 0; j < k; j++) {
    const bench_item *e = &set->items[shot[j]];
    w = stpcpy(stpcpy(stpcpy(w, item_ctx(e, e->gold)), item_cont(e, e->gold)), "\n\n");
  }
  return s;
}

/* The requests of the first nitems items, with k few-shot examples each. */
static void build_requests(bench_set *set, int k, uint64_t seed) {
  long nprompts = 0;
  set->first = util_calloc((size_t)set->nitems + 1, sizeof *set->first, "benchmark requests");
  for (long i = 0; i < set->nitems; i++) {
    set->first[i + 1] = set->first[i] + set->items[i].n;
    nprompts += k > 0 ? set->items[i].nctx : 0;
  }
  set->nreq = set->first[set->nitems];
  set->req = util_calloc((size_t)set->nreq, sizeof *set->req, "benchmark requests");
  set->prompts = util_calloc((size_t)nprompts + 1, sizeof *set->prompts, "benchmark requests");
  for (long i = 0; i < set->nitems; i++) {
    const bench_item *it = &set->items[i];
    char *prefix = k > 0 ? fewshot_prefix(set, i, k, seed) : NULL;
    long base = set->nprompts;
    for (int c = 0; c < it->n; c++) {
      if (prefix && c < it->nctx) set->prompts[set->nprompts++] = cat3(prefix, item_ctx(it, c), NULL);
      bench_request *r = &set->req[set->first[i] + c];
      r->context = prefix ? set->prompts[base + (it->nctx == 1 ? 0 : c)] : item_ctx(it, c);
      r->continuation = item_cont(it, c);
      r->greedy = set->kind == BENCH_LAMBADA;
      r->item = i, r->choice = c;
    }
    free(prefix);
  }
}

/* "kind:stem" of path. */
static char *set_name(const char *kind, const char *path) {
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  size_t n = strlen(base);
  const char *ext[] = {".jsonl", ".json"};
  for (int e = 0; e < 2; e++)
    if (n > strlen(ext[e]) && strcmp(base + n - strlen(ext[e]), ext[e]) == 0) {
      n -= strlen(ext[e]);
      break;
    }
  char *stem = dup_n(base, n), *name = cat3(kind, ":", stem);
  free(stem);
  return name;
}

static const char KINDS_HINT[] = "write 'kind:path' with kind one of lambada, hellaswag, piqa, arc, winogrande, mc "
                                 "(doc/evaluation.md)";

int bench_load(bench_set *set, const char *spec, long limit, int num_fewshot, uint64_t seed, err_list *errs) {
  memset(set, 0, sizeof *set);
  long before = err_count(errs);
  const char *colon = strchr(spec, ':');
  char kind[32] = "";
  if (colon && colon > spec && (size_t)(colon - spec) < sizeof kind) util_strlcpy(kind, spec, (size_t)(colon - spec) + 1);
  int k = bench_kind_parse(kind);
  if (!colon || !colon[1]) {
    err_add(errs, NULL, 0, 0, KINDS_HINT, "benchmark '%s' is not 'kind:path'", spec);
    return -1;
  }
  if (k < 0 || num_fewshot < 0 || num_fewshot > BENCH_MAX_FEWSHOT) {
    err_add(errs, NULL, 0, 0, k < 0 ? KINDS_HINT : "&eval num_fewshot is 0 .. 64",
            k < 0 ? "benchmark '%s': unknown kind" : "benchmark '%s': num_fewshot out of range", spec);
    return -1;
  }
  const char *path = colon + 1;
  size_t len;
  char *text = util_read_file(path, (size_t)1 << 34, &len, "benchmark", KINDS[k].hint, errs);
  if (!text) return -1;
  set->kind = (bench_kind)k;
  parse_lines(set, path, text, len, errs);
  free(text);
  if (err_count(errs) == before && set->nfile == 0)
    err_add(errs, path, 0, 0, KINDS[k].hint, "the %s file has no items", kind);
  else if (err_count(errs) == before && num_fewshot > set->nfile - 1)
    err_add(errs, path, 0, 0, "lower &eval num_fewshot, or use a larger file",
            "num_fewshot = %d needs %d items besides each scored one; the file has %ld items", num_fewshot,
            num_fewshot, set->nfile);
  if (err_count(errs) > before) {
    bench_free(set);
    return -1;
  }
  set->name = set_name(kind, path);
  set->nitems = limit > 0 && limit < set->nfile ? limit : set->nfile;
  build_requests(set, num_fewshot, seed);
  return 0;
}

void bench_free(bench_set *set) {
  for (long i = 0; i < set->nfile; i++) item_free(&set->items[i]);
  for (long i = 0; i < set->nprompts; i++) free(set->prompts[i]);
  free(set->items), free(set->prompts), free(set->req), free(set->first), free(set->name);
  memset(set, 0, sizeof *set);
}

int bench_gold(const bench_set *set, long i) { return set->items[i].gold; }

/* ---- scores ------------------------------------------------------------------------------------- */

/* lm-eval's mean_stderr of n values 0/1 of which hits are 1: sample standard deviation / sqrt(n). */
static double mean_stderr(long hits, long n) {
  if (n < 2) return NAN;
  double p = (double)hits / (double)n;
  return sqrt(p * (1 - p) / (double)(n - 1));
}

/* The first choice with the highest log-likelihood (divided by norm[c] when norm is given). */
static int argmax(const bench_result *res, const long *norm, int n) {
  int best = 0;
  for (int c = 1; c < n; c++)
    if (res[c].loglik / (norm ? (double)norm[c] : 1.0) > res[best].loglik / (norm ? (double)norm[best] : 1.0)) best = c;
  return best;
}

void bench_score(const bench_set *set, const bench_result *res, bench_scores *out) {
  long hits = 0, hits_norm = 0, n = set->nitems;
  double llsum = 0;
  memset(out, 0, sizeof *out);
  for (long r = 0; r < set->nreq; r++) out->tokens += res[r].ntokens;
  for (long i = 0; i < n; i++) {
    const bench_item *it = &set->items[i];
    const bench_result *ri = res + set->first[i];
    if (set->kind == BENCH_LAMBADA) {
      hits += ri[0].greedy_ok != 0, llsum += ri[0].loglik;
    } else {
      hits += argmax(ri, NULL, it->n) == it->gold;
      hits_norm += argmax(ri, it->normlen, it->n) == it->gold;
    }
  }
  int normed = set->kind != BENCH_LAMBADA && set->kind != BENCH_WINOGRANDE;
  out->n = n;
  out->acc = (double)hits / (double)n, out->acc_stderr = mean_stderr(hits, n);
  out->acc_norm = normed ? (double)hits_norm / (double)n : NAN;
  out->acc_norm_stderr = normed ? mean_stderr(hits_norm, n) : NAN;
  out->ppl = set->kind == BENCH_LAMBADA ? exp(-llsum / (double)n) : NAN;
}
