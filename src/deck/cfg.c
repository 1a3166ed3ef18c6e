/* cfg: deck tables -> typed configuration, validation, resolved echo and reference docs. */
#include "deck/cfg.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "base/util.h"

/* ---- tables ---------------------------------------------------------------------------------- */

#define CFG_KEY(g, type, n, def, range, doc) {#n, CFG_T_##type, offsetof(cfg_config, g.n), def, range, doc},
#define CFG_GROUP_KEYS(gname, GMACRO, gdoc) GMACRO(CFG_KEY, gname)
static const cfg_key cfg_key_table[CFG_NKEYS] = {CFG_GROUPS(CFG_GROUP_KEYS)};

#define CFG_GROUP_SIZE(g, type, n, def, range, doc) +1
#define CFG_GROUP_ENTRY(gname, GMACRO, gdoc) {#gname, gdoc, 0, 0 GMACRO(CFG_GROUP_SIZE, gname)},
static cfg_group cfg_group_table[] = {CFG_GROUPS(CFG_GROUP_ENTRY)};
enum { CFG_NGROUPS = sizeof cfg_group_table / sizeof cfg_group_table[0] };

const cfg_key *cfg_keys(void) { return cfg_key_table; }

const cfg_group *cfg_groups(int *ngroups) {
  int first = 0;
  for (int g = 0; g < CFG_NGROUPS; g++) {
    cfg_group_table[g].first = first;
    first += cfg_group_table[g].nkeys;
  }
  if (ngroups) *ngroups = CFG_NGROUPS;
  return cfg_group_table;
}

static int find_group(const char *name) {
  cfg_groups(NULL);
  for (int g = 0; g < CFG_NGROUPS; g++)
    if (util_strieq(cfg_group_table[g].name, name)) return g;
  return -1;
}

static int find_key_in(int g, const char *key) {
  const cfg_group *gr = &cfg_groups(NULL)[g];
  for (int k = gr->first; k < gr->first + gr->nkeys; k++)
    if (util_strieq(cfg_key_table[k].name, key)) return k;
  return -1;
}

unsigned long long cfg_table_hash(void) {
  uint64_t h = util_hash64(PACKAGE_VERSION, strlen(PACKAGE_VERSION), sizeof(cfg_config));
  for (int k = 0; k < CFG_NKEYS; k++) {
    const cfg_key *key = &cfg_key_table[k];
    uint64_t shape[2] = {(uint64_t)key->type, (uint64_t)key->offset};
    h = util_hash64(key->name, strlen(key->name), h);
    h = util_hash64(shape, sizeof shape, h);
    h = util_hash64(key->def, strlen(key->def), h);
  }
  return h;
}

int cfg_find(const char *group, const char *key) {
  int g = find_group(group);
  return g < 0 ? -1 : find_key_in(g, key);
}

/* ---- ranges ---------------------------------------------------------------------------------- */

typedef struct {
  double lo, hi;
  int lo_open, hi_open;
} cfg_interval;

/* "[a, b]", "(a, b)", "[a, inf)"; returns 0 when r is an interval. */
static int parse_interval(const char *r, cfg_interval *iv) {
  if (!r || (r[0] != '[' && r[0] != '(')) return -1;
  iv->lo_open = r[0] == '(';
  char *end;
  const char *p = r + 1;
  while (*p == ' ') p++;
  if (strncmp(p, "-inf", 4) == 0) {
    iv->lo = -INFINITY;
    end = (char *)p + 4;
  } else {
    iv->lo = strtod(p, &end);
  }
  p = strchr(end, ',');
  if (!p) return -1;
  p++;
  while (*p == ' ') p++;
  if (strncmp(p, "inf", 3) == 0) {
    iv->hi = INFINITY;
    end = (char *)p + 3;
  } else {
    iv->hi = strtod(p, &end);
  }
  iv->hi_open = strchr(end, ')') != NULL;
  return 0;
}

double cfg_key_max(const char *group, const char *key) {
  int k = cfg_find(group, key);
  cfg_interval iv;
  UTIL_CHECK(k >= 0 && parse_interval(cfg_keys()[k].range, &iv) == 0, NULL, "internal: %s.%s has no interval", group, key);
  return iv.hi;
}

static int in_interval(double x, const cfg_interval *iv) {
  if (iv->lo_open ? !(x > iv->lo) : !(x >= iv->lo)) return 0;
  if (iv->hi_open ? !(x < iv->hi) : !(x <= iv->hi)) return 0;
  return 1;
}

/* Canonical spelling of word among "a|b|c" (case-insensitive), or NULL. */
static const char *match_choice(const char *word, const char *choices, char *buf, size_t len) {
  const char *p = choices;
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (n < len) {
      memcpy(buf, p, n);
      buf[n] = '\0';
      if (util_strieq(buf, word)) return buf;
    }
    if (!bar) break;
    p = bar + 1;
  }
  return NULL;
}

/* "'a', 'b' or 'c'" for messages. */
static void choices_text(const char *choices, char *out, size_t len) {
  out[0] = '\0';
  const char *p = choices;
  int first = 1;
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    size_t o = strlen(out);
    snprintf(out + o, len - o, "%s'%.*s'", first ? "" : (bar ? ", " : " or "), (int)n, p);
    first = 0;
    if (!bar) break;
    p = bar + 1;
  }
}

static const char *type_name(cfg_type t) {
  switch (t) {
  case CFG_T_INT: return "integer";
  case CFG_T_REAL: return "real";
  case CFG_T_BOOL: return "logical";
  case CFG_T_STR: return "string";
  case CFG_T_STRLIST: return "list of strings";
  case CFG_T_REALLIST: return "list of reals";
  }
  return "?";
}

/* "n_layer is an integer in [1, 4096]: Number of transformer blocks L" */
static void key_hint(int k, char *out, size_t len) {
  const cfg_key *key = &cfg_key_table[k];
  char allowed[256] = "";
  if (key->range[0] == '[' || key->range[0] == '(') {
    snprintf(allowed, sizeof allowed, " in %s", key->range);
  } else if (key->range[0]) {
    char c[200];
    choices_text(key->range, c, sizeof c);
    snprintf(allowed, sizeof allowed, ", one of %s", c);
  }
  snprintf(out, len, "%s is a%s %s%s: %s", key->name, key->type == CFG_T_INT ? "n" : "", type_name(key->type),
           allowed, key->doc);
}

/* ---- assignment ------------------------------------------------------------------------------ */

static void *field(cfg_config *cfg, int k) { return (char *)cfg + cfg_key_table[k].offset; }
static const void *cfield(const cfg_config *cfg, int k) { return (const char *)cfg + cfg_key_table[k].offset; }

/* One entry being assigned: its key, its place, the hint its errors carry. */
typedef struct {
  cfg_config *cfg;
  int k;
  const cfg_key *key;
  const nml_entry *e;
  const char *group;
  char hint[600];
  err_list *errs;
} assign_ctx;

/* An error at value v: the user's text quoted short, so the reason after it is never cut. */
#define assign_error(a, v, fmt, ...)                                                               \
  do {                                                                                             \
    char q_[72];                                                                                   \
    err_quote(q_, sizeof q_, (v)->text ? (v)->text : "", (v)->text ? strlen((v)->text) : 0);       \
    err_add((a)->errs, (a)->e->file, (v)->line, (v)->col, (a)->hint, "&%s %s" fmt, (a)->group,     \
            (a)->key->name, q_, __VA_ARGS__);                                                      \
  } while (0)

/* One number checked against the key's type and range into out (a long or a double). Returns 0 or -1. */
static int number_value(assign_ctx *a, const nml_value *v, void *out) {
  cfg_interval iv;
  int has_iv = parse_interval(a->key->range, &iv) == 0, is_int = a->key->type == CFG_T_INT;
  if (is_int && (v->kind == NML_BOOL || v->kind == NML_STR ||
                 (v->kind == NML_REAL && (v->r != floor(v->r) || fabs(v->r) > 9.007199254740992e15))))
    assign_error(a, v, ": expected an integer, got '%s'%s", "");
  else if (!is_int && v->kind != NML_INT && v->kind != NML_REAL)
    assign_error(a, v, ": expected a real number, got '%s'%s", "");
  else if (has_iv && !in_interval(v->r, &iv))
    assign_error(a, v, " = %s is out of range %s", a->key->range);
  else {
    if (is_int) *(long *)out = v->kind == NML_INT ? (long)v->i : (long)v->r;
    else *(double *)out = v->r;
    return 0;
  }
  return -1;
}

/* One string value (of a string, or an entry of a list) checked and canonicalised into out. */
static int string_value(assign_ctx *a, const nml_value *v, int entry, char *out) {
  const char *what = entry ? "quoted strings" : "a quoted string";
  char canon[CFG_ITEM_LEN], c[200];
  const char *text = v->text;
  if (v->kind != NML_STR) {
    assign_error(a, v, ": expected %s, got %s", what);
    return -1;
  }
  if (strlen(v->text) >= CFG_ITEM_LEN) {
    assign_error(a, v, ": '%s' is longer than %d characters", CFG_ITEM_LEN - 1);
    return -1;
  }
  if (a->key->range[0] && !(text = match_choice(v->text, a->key->range, canon, sizeof canon))) {
    choices_text(a->key->range, c, sizeof c);
    if (entry) assign_error(a, v, ": entry '%s' is not allowed (expected %s)", c);
    else assign_error(a, v, " = '%s' is not allowed (expected %s)", c);
    return -1;
  }
  util_strlcpy(out, text, CFG_ITEM_LEN);
  return 0;
}

static void assign_list(assign_ctx *a) {
  const nml_entry *e = a->e;
  if (e->nvals > CFG_LIST_MAX) {
    err_add(a->errs, e->file, e->line, e->col, a->hint, "&%s %s: at most %d entries, got %d", a->group, a->key->name,
            CFG_LIST_MAX, e->nvals);
    return;
  }
  int bad = 0;
  if (a->key->type == CFG_T_REALLIST) {
    cfg_reallist tmp = {0};
    for (int i = 0; i < e->nvals; i++)
      if (number_value(a, &e->vals[i], &tmp.v[tmp.n]) == 0) tmp.n++;
      else bad = 1;
    if (!bad) *(cfg_reallist *)field(a->cfg, a->k) = tmp;
    return;
  }
  cfg_strlist tmp;
  memset(&tmp, 0, sizeof tmp);
  for (int i = 0; i < e->nvals; i++)
    if (string_value(a, &e->vals[i], 1, tmp.v[tmp.n]) == 0) tmp.n++;
    else bad = 1;
  if (!bad) *(cfg_strlist *)field(a->cfg, a->k) = tmp;
}

/* Assign entry e (already matched to key k) into cfg. Returns 0 or the number of errors added. */
static int assign(cfg_config *cfg, int k, const nml_entry *e, const char *group, err_list *errs) {
  assign_ctx a = {cfg, k, &cfg_key_table[k], e, group, "", errs};
  key_hint(k, a.hint, sizeof a.hint);
  long n0 = err_count(errs);
  const nml_value *v = &e->vals[0];
  int list = a.key->type == CFG_T_STRLIST || a.key->type == CFG_T_REALLIST;
  if (!list && e->nvals != 1)
    err_add(errs, e->file, e->line, e->col, a.hint, "&%s %s: takes one value, got %d", group, a.key->name, e->nvals);
  else if (a.key->type == CFG_T_INT || a.key->type == CFG_T_REAL)
    number_value(&a, v, field(cfg, k));
  else if (a.key->type == CFG_T_BOOL && v->kind != NML_BOOL)
    assign_error(&a, v, ": expected .true. or .false., got '%s'%s", "");
  else if (a.key->type == CFG_T_BOOL)
    *(int *)field(cfg, k) = (int)v->i;
  else if (a.key->type == CFG_T_STR)
    string_value(&a, v, 0, (char *)field(cfg, k));
  else
    assign_list(&a);
  return (int)(err_count(errs) - n0);
}

static void set_origin(cfg_config *cfg, int k, const char *file, int line, int col) {
  util_strlcpy(cfg->origin[k].file, file, sizeof cfg->origin[k].file);
  cfg->origin[k].line = line;
  cfg->origin[k].col = col;
  cfg->origin[k].derived = 0;
}

/* Closest name among the keys of group g (or all groups when g < 0) within a small distance. */
static const char *closest_key(int g, const char *key, int *dist) {
  const char *best = NULL;
  int bd = 99;
  int lo = 0, hi = CFG_NKEYS;
  if (g >= 0) {
    lo = cfg_groups(NULL)[g].first;
    hi = lo + cfg_groups(NULL)[g].nkeys;
  }
  for (int k = lo; k < hi; k++) {
    const char *name = cfg_key_table[k].name;
    size_t lk = strlen(key), ln = strlen(name), m = lk < ln ? lk : ln;
    /* a name that starts the other ("lrate" / "lr") counts as one edit away */
    int d = m >= 2 && strncmp(key, name, m) == 0 ? 1 : util_edit_distance(key, name);
    if (d < bd) {
      bd = d;
      best = cfg_key_table[k].name;
    }
  }
  *dist = bd;
  return best;
}

static int close_enough(const char *a, int d) {
  int n = (int)strlen(a);
  return d <= (n <= 4 ? 1 : n <= 8 ? 2 : 3);
}

/* Apply one parsed document (deck or override) to cfg. */
/* Keys renamed since a release: the old name still sets the new key, with a warning at its place. */
static const struct {
  const char *group, *old, *now, *why;
} renamed[] = {
    {"comm", "bucket", "quant_bucket", "the values per quantization bucket; gradient buckets are &parallel bucket_mb"},
};

/* The key an old name of group g stands for (after the warning), or -1. */
static int renamed_key(int g, const nml_entry *e) {
  const char *group = cfg_groups(NULL)[g].name;
  for (size_t i = 0; i < sizeof renamed / sizeof renamed[0]; i++) {
    if (strcmp(renamed[i].group, group) != 0 || !util_strieq(renamed[i].old, e->key)) continue;
    char place[CFG_STR_LEN + 32] = "--set"; /* an override's text has no lines of its own */
    if (strcmp(e->file, "--set") != 0) util_snprintf(place, sizeof place, "%s:%d:%d", e->file, e->line, e->col);
    fprintf(stderr, "%s: warning: &%s %s is now %s (%s); the old name still works\n", place, group, renamed[i].old,
            renamed[i].now, renamed[i].why);
    return cfg_find(group, renamed[i].now);
  }
  return -1;
}

static void apply_doc(cfg_config *cfg, const nml_doc *doc, err_list *errs) {
  for (int i = 0; i < doc->n; i++) {
    const nml_group *gr = &doc->groups[i];
    int g = find_group(gr->name);
    if (g < 0) {
      const cfg_group *all = cfg_groups(NULL);
      const char *best = NULL;
      int bd = 99;
      char list[512] = "";
      for (int j = 0; j < CFG_NGROUPS; j++) {
        int d = util_edit_distance(gr->name, all[j].name);
        if (d < bd) {
          bd = d;
          best = all[j].name;
        }
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, "%s&%s", j ? ", " : "", all[j].name);
      }
      char hint[640];
      snprintf(hint, sizeof hint, "the groups are %s", list);
      if (best && close_enough(gr->name, bd))
        err_add(errs, gr->file, gr->line, gr->col, hint, "unknown group '&%s'; did you mean '&%s'?",
                      gr->name, best);
      else
        err_add(errs, gr->file, gr->line, gr->col, hint, "unknown group '&%s'", gr->name);
      continue;
    }
    for (int j = 0; j < gr->n; j++) {
      const nml_entry *e = &gr->entries[j];
      int k = find_key_in(g, e->key);
      if (k < 0) k = renamed_key(g, e);
      if (k < 0) {
        int d;
        const char *best = closest_key(g, e->key, &d);
        int other = -1;
        for (int h = 0; h < CFG_NGROUPS; h++)
          if (h != g && find_key_in(h, e->key) >= 0) other = h;
        char hint[1024];
        if (other >= 0) {
          snprintf(hint, sizeof hint, "'%s' belongs to &%s; move it there", e->key, cfg_groups(NULL)[other].name);
        } else {
          const cfg_group *cg = &cfg_groups(NULL)[g];
          int o = snprintf(hint, sizeof hint, "keys of &%s:", cg->name);
          for (int m = cg->first; m < cg->first + cg->nkeys && o < (int)sizeof hint; m++)
            o += snprintf(hint + o, sizeof hint - (size_t)o, " %s", cfg_key_table[m].name);
        }
        if (best && close_enough(e->key, d))
          err_add(errs, e->file, e->line, e->col, hint, "&%s: unknown key '%s'; did you mean '%s'?", gr->name,
                        e->key, best);
        else
          err_add(errs, e->file, e->line, e->col, hint, "&%s: unknown key '%s'", gr->name, e->key);
        continue;
      }
      if (assign(cfg, k, e, cfg_group_table[g].name, errs) == 0) set_origin(cfg, k, e->file, e->line, e->col);
    }
  }
}

void cfg_error_at(const cfg_config *cfg, err_list *errs, const char *group, const char *key, const char *hint,
                  const char *fmt, ...) {
  int k = cfg_find(group, key);
  UTIL_CHECK(k >= 0, NULL, "internal: no key %s.%s", group, key);
  char msg[640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const cfg_origin *o = &cfg->origin[k];
  if (o->derived && o->line > 0) /* the place of the key it was derived from */
    err_add(errs, o->file, o->line, o->col, hint, "&%s %s (derived from this key): %s", group, key, msg);
  else if (o->file[0] && o->line > 0)
    err_add(errs, o->file, o->line, o->col, hint, "&%s %s: %s", group, key, msg);
  else if (o->file[0])
    err_add(errs, o->file, 0, 0, hint, "&%s %s: %s", group, key, msg);
  else
    err_add(errs, cfg->deck_path, 0, 0, hint, "&%s %s (default): %s", group, key, msg);
}

void cfg_relocate(const cfg_config *cfg, err_list *errs, int from, const char *group, const char *key) {
  for (int i = from; i < errs->n; i++) {
    err_item *e = &errs->v[i];
    if (e->line > 0 || !e->file[0]) continue;
    err_item moved = *e;
    int n = errs->n;
    cfg_error_at(cfg, errs, group, key, moved.hint[0] ? moved.hint : NULL, "'%s': %s", moved.file, moved.msg);
    if (errs->n == n) continue; /* the list is full: keep the error where it was */
    errs->v[i] = errs->v[errs->n - 1];
    errs->n--;
  }
}

/* ---- cross-field checks and derived values --------------------------------------------------- */

int cfg_choice_index(const char *words, const char *value) {
  char w[CFG_ITEM_LEN];
  int i = 0;
  for (const char *p = words;; i++) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (n < sizeof w) {
      memcpy(w, p, n), w[n] = '\0';
      if (strcmp(w, value) == 0) return i;
    }
    if (!bar) return -1;
    p = bar + 1;
  }
}

/* The index of a checked key's value among its words (the range check stored the word as the
 * range spells it). */
static int choice_index(const char *words, const char *value) {
  int i = cfg_choice_index(words, value);
  UTIL_CHECK(i >= 0, NULL, "internal: '%s' is none of %s: the key was not checked", value, words);
  return i;
}

#define CFG_CHOICE_FN(g, key, LIST)                                                                  \
  cfg_##g##_##key cfg_##g##_##key##_of(const cfg_##g *group) {                                       \
    return (cfg_##g##_##key)choice_index(CFG_CHOICES(LIST), group->key);                              \
  }
CFG_CHOICE_KEYS(CFG_CHOICE_FN)
#undef CFG_CHOICE_FN

long cfg_comm_bucket(const cfg_comm *c) {
  if (c->quant_bucket) return c->quant_bucket;
  cfg_comm_method m = cfg_comm_method_of(c); /* the papers' settings: L2 norms and top-k 8192, the others 512 */
  return m == CFG_COMM_QSGD || m == CFG_COMM_NUQSGD || m == CFG_COMM_ALQ || m == CFG_COMM_AMQ || m == CFG_COMM_TOPK ? 8192 : 512;
}

int cfg_comm_compressed(const cfg_comm *c) {
  cfg_comm_method m = cfg_comm_method_of(c);
  return m == CFG_COMM_TOPK || m == CFG_COMM_POWERSGD || (m != CFG_COMM_NONE && c->bits != 32); /* bits mean nothing to them */
}

cfg_task cfg_task_of(const char *word) { return (cfg_task)choice_index(CFG_CHOICES(CFG_TASKS), word); }

const char *cfg_task_name(cfg_task task) {
#define CFG_TASK_WORD(E, w) w,
  static const char *const words[CFG_NTASKS] = {CFG_TASKS(CFG_TASK_WORD)};
#undef CFG_TASK_WORD
  return words[task];
}

int cfg_has_task(const cfg_config *cfg, cfg_task task) {
  for (int i = 0; i < cfg->job.task.n; i++)
    if (cfg_task_of(cfg->job.task.v[i]) == task) return 1;
  return 0;
}

int cfg_restart_latest(const cfg_checkpoint *c) { return strcmp(c->restart, CFG_RESTART_LATEST) == 0; }

int cfg_eval_skips_val(const cfg_config *cfg) {
  return cfg->eval.val.n == 1 && strcmp(cfg->eval.val.v[0], "none") == 0;
}

/* The tasks' order and what each task needs. */
static void check_tasks(const cfg_config *cfg, err_list *errs) {
  const cfg_strlist *t = &cfg->job.task;
  int last = -1;
  for (int i = 0; i < t->n; i++) {
    int k = (int)cfg_task_of(t->v[i]);
    if (k <= last) {
      char order[256];
      choices_text(CFG_CHOICES(CFG_TASKS), order, sizeof order);
      char hint[300];
      snprintf(hint, sizeof hint, "list each task once, in the order they run: %s", order);
      cfg_error_at(cfg, errs, "job", "task", hint, "task '%s' is listed twice or out of order", t->v[i]);
      return;
    }
    last = k;
  }
  if (t->n == 0) cfg_error_at(cfg, errs, "job", "task", "e.g. task = 'train'", "no task given");
  const cfg_tokenizer *tk = &cfg->tokenizer;
  int bpe = cfg_tokenizer_kind_of(tk) == CFG_TOK_BPE;
  if (cfg_has_task(cfg, CFG_TASK_TOKENIZER)) {
    if (!bpe)
      cfg_error_at(cfg, errs, "tokenizer", "kind", "set kind = 'bpe' (the 'tokenizer' task learns a BPE vocabulary)",
                   "kind = '%s' has no vocabulary to learn", tk->kind);
    if (tk->corpus.n == 0 && cfg->prepare.input.n == 0)
      cfg_error_at(cfg, errs, "tokenizer", "corpus", "list text files in &tokenizer corpus or &prepare input",
                   "the 'tokenizer' task has no text to learn from");
  }
  if (bpe && !tk->dir[0] && !cfg->model.init_from[0])
    cfg_error_at(cfg, errs, "tokenizer", "dir", "give the directory of encoder.json and vocab.bpe, e.g. dir = 'runs/tok'",
                 "kind = 'bpe' needs a tokenizer directory");
  if (cfg_has_task(cfg, CFG_TASK_PREPARE)) {
    const cfg_prepare *pr = &cfg->prepare;
    if (pr->input.n == 0)
      cfg_error_at(cfg, errs, "prepare", "input", "list text files, directories or glob patterns, e.g. input = 'data/*.txt'",
                   "the 'prepare' task has no input");
    if (!pr->train_out[0])
      cfg_error_at(cfg, errs, "prepare", "train_out", "e.g. train_out = 'runs/data/train.nc'",
                   "the 'prepare' task needs a training dataset name");
    if (!pr->val_out[0] && pr->val_fraction > 0)
      cfg_error_at(cfg, errs, "prepare", "val_out", "e.g. val_out = 'runs/data/val.nc', or val_fraction = 0",
                   "val_fraction = %g needs a validation dataset name", pr->val_fraction);
    if (cfg_prepare_documents_of(pr) == CFG_DOCS_SEPARATOR_LINE && !pr->separator[0])
      cfg_error_at(cfg, errs, "prepare", "separator", "give the separator line, or documents = 'blank_line'",
                   "documents = 'separator_line' needs a separator");
  }
  if (cfg_has_task(cfg, CFG_TASK_TRAIN)) {
    if (!cfg->data.train.n && !cfg->prepare.train_out[0])
      cfg_error_at(cfg, errs, "data", "train", "give a dataset from the 'prepare' task, e.g. train = 'runs/data/train.nc'",
                   "task 'train' needs a training dataset");
    if (!cfg->data.val.n && !cfg->prepare.val_out[0])
      cfg_error_at(cfg, errs, "data", "val", "give a validation dataset, e.g. val = 'runs/data/val.nc'",
                   "task 'train' needs a validation dataset");
  }
  if (cfg_has_task(cfg, CFG_TASK_EVAL) && !cfg->eval.benchmarks.n && (cfg_eval_skips_val(cfg) || (!cfg->eval.val.n && !cfg->data.val.n && !cfg->prepare.val_out[0])))
    cfg_error_at(cfg, errs, "eval", "benchmarks", "give a dataset (&eval val or &data val) or benchmarks, e.g. benchmarks = "
                 "'lambada:data/lambada_test.jsonl'", "task 'eval' has nothing to score");
  const cfg_parallel *pa = &cfg->parallel;
  if (cfg->eval.during_training && (pa->pipeline_stages > 1 || pa->tensor_parallel > 1))
    cfg_error_at(cfg, errs, "eval", "during_training", "score the benchmarks with the 'eval' task after training, or train "
                 "with pipeline_stages = 1 and tensor_parallel = 1", "benchmarks during training need the whole model on "
                 "every rank; pipeline_stages = %ld, tensor_parallel = %ld", pa->pipeline_stages, pa->tensor_parallel);
  if (cfg->eval.seq_len > cfg->model.block_size)
    cfg_error_at(cfg, errs, "eval", "seq_len", "lower seq_len to at most &model block_size", "seq_len = %ld exceeds "
                 "&model block_size = %ld", cfg->eval.seq_len, cfg->model.block_size);
}

/* Tensor parallelism cuts heads, MLP units and vocabulary rows into tp pieces: the first two evenly. */
static void check_tensor_parallel(cfg_config *cfg, err_list *errs) {
  const cfg_model *m = &cfg->model;
  const long tp = cfg->parallel.tensor_parallel, F = m->n_inner ? m->n_inner : 4 * m->n_embd, kv = cfg_kv_heads(m);
  if (tp == 1) return;
  char hint[320];
  int o = kv == m->n_head
              ? snprintf(hint, sizeof hint, "tensor_parallel must divide n_head = %ld and the MLP width %ld; these do:",
                         m->n_head, F)
              : snprintf(hint, sizeof hint, "tensor_parallel must divide n_head = %ld, n_kv_head = %ld and the MLP "
                         "width %ld; these do:", m->n_head, kv, F);
  for (long d = 1; d <= m->n_head && o < (int)sizeof hint - 8; d++)
    if (m->n_head % d == 0 && kv % d == 0 && F % d == 0) o += snprintf(hint + o, sizeof hint - (size_t)o, " %ld", d);
  if (m->n_head % tp != 0)
    cfg_error_at(cfg, errs, "parallel", "tensor_parallel", hint, "n_head = %ld heads cannot be split evenly across "
                 "tensor_parallel = %ld ranks", m->n_head, tp);
  else if (kv % tp != 0) /* a rank holds whole groups: its query heads and the key/value heads they read */
    cfg_error_at(cfg, errs, "parallel", "tensor_parallel", hint, "n_kv_head = %ld key/value heads cannot be split "
                 "evenly across tensor_parallel = %ld ranks", kv, tp);
  else if (F % tp != 0)
    cfg_error_at(cfg, errs, "parallel", "tensor_parallel", hint, "the MLP width (n_inner, or 4 x n_embd) = %ld cannot be "
                 "split evenly across tensor_parallel = %ld ranks", F, tp);
  if (m->vocab_size < tp)
    cfg_error_at(cfg, errs, "parallel", "tensor_parallel", "every tensor rank needs vocabulary rows: tensor_parallel <= "
                 "vocab_size", "vocab_size = %ld is smaller than tensor_parallel = %ld", m->vocab_size, tp);
}

/* A blend (&data `key`, with weights `wkey`): one weight per dataset when weights are given, no dataset
 * twice. `what` names the datasets in messages. */
static void check_blend(const cfg_config *cfg, const cfg_strlist *sets, const cfg_reallist *w, const char *key,
                        const char *wkey, const char *what, err_list *errs) {
  int n = sets->n ? sets->n : 1;
  char hint[128];
  snprintf(hint, sizeof hint, "give one weight per dataset of &data %s, or none to weight each by its size", key);
  if (w->n && w->n != n)
    cfg_error_at(cfg, errs, "data", wkey, hint, "%d weights for %d %s dataset%s", w->n, n, what, n > 1 ? "s" : "");
  for (int i = 0; i < sets->n; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(sets->v[i], sets->v[j]) == 0)
        cfg_error_at(cfg, errs, "data", key, "list each dataset once; its weight sets its share",
                     "'%s' is listed twice (entries %d and %d)", sets->v[i], j + 1, i + 1);
}

static void check_data(const cfg_config *cfg, err_list *errs) {
  check_blend(cfg, &cfg->data.train, &cfg->data.train_weights, "train", "train_weights", "training", errs);
  check_blend(cfg, &cfg->data.val, &cfg->data.val_weights, "val", "val_weights", "validation", errs);
}

/* Grouped-query attention (llama): n_kv_head divides n_head; other architectures have a key/value head per head. */
static void check_kv_heads(const cfg_config *cfg, err_list *errs) {
  const cfg_model *m = &cfg->model;
  const long kv = m->n_kv_head;
  if (kv == 0 || kv == m->n_head) return;
  if (cfg_model_arch_of(m) != CFG_ARCH_LLAMA) {
    cfg_error_at(cfg, errs, "model", "n_kv_head", "leave n_kv_head = 0 (or set arch = 'llama')",
                 "arch = '%s' has a key/value head per query head; n_kv_head = %ld with n_head = %ld", m->arch, kv,
                 m->n_head);
    return;
  }
  if (m->n_head % kv == 0) return;
  char hint[256];
  int o = snprintf(hint, sizeof hint, "each key/value head serves the same number of query heads: n_kv_head must "
                   "divide n_head = %ld; these do:", m->n_head);
  for (long d = 1; d <= m->n_head && o < (int)sizeof hint - 8; d++)
    if (m->n_head % d == 0) o += snprintf(hint + o, sizeof hint - (size_t)o, " %ld", d);
  cfg_error_at(cfg, errs, "model", "n_kv_head", hint, "n_head = %ld is not a multiple of n_kv_head = %ld", m->n_head,
               kv);
}

/* What an architecture allows: local layers only in GPT-Neo; GPT-NeoX's rotary dims even; Llama's activation its
 * own (SwiGLU). */
static void check_arch(const cfg_config *cfg, err_list *errs) {
  const cfg_model *m = &cfg->model;
  const cfg_model_arch arch = cfg_model_arch_of(m);
  for (int i = 0; arch != CFG_ARCH_GPT_NEO && i < m->attention_types.n; i++)
    if (strcmp(m->attention_types.v[i], "local") == 0) {
      cfg_error_at(cfg, errs, "model", "attention_types",
                   "only GPT-Neo has local layers: set attention_types = 'global' or arch = 'gpt-neo'",
                   "arch = '%s' has no local attention layers", m->arch);
      break;
    }
  if (arch == CFG_ARCH_LLAMA && cfg_model_activation_of(m) != CFG_ACT_AUTO)
    cfg_error_at(cfg, errs, "model", "activation", "leave activation = 'auto' (or set arch = 'gpt-neo', 'gpt2' or 'gpt-neox')",
                 "arch = 'llama' has the SwiGLU MLP (silu), not activation = '%s'", m->activation);
  check_kv_heads(cfg, errs);
  if (cfg_model_rope_scaling_of(m) == CFG_ROPE_LLAMA3 && arch != CFG_ARCH_LLAMA)
    cfg_error_at(cfg, errs, "model", "rope_scaling", "leave rope_scaling = 'none' (or set arch = 'llama')",
                 "rope_scaling = 'llama3' is Llama's; arch = '%s' turns its rotary dims unscaled", m->arch);
  if (cfg_model_rope_scaling_of(m) == CFG_ROPE_LLAMA3 && m->rope_high_freq_factor <= m->rope_low_freq_factor)
    cfg_error_at(cfg, errs, "model", "rope_high_freq_factor", "the blend runs between the two: rope_high_freq_factor > "
                 "rope_low_freq_factor (Llama 3.1: 4 and 1)", "rope_high_freq_factor = %g is not more than "
                 "rope_low_freq_factor = %g", m->rope_high_freq_factor, m->rope_low_freq_factor);
  if (arch == CFG_ARCH_LLAMA && m->n_embd % m->n_head == 0 && (m->n_embd / m->n_head) % 2 != 0)
    cfg_error_at(cfg, errs, "model", "n_head", "the rotated dims pair up: choose n_head so that n_embd / n_head is even",
                 "head size n_embd / n_head = %ld is odd; llama's rotary embedding turns every dim in pairs",
                 m->n_embd / m->n_head);
  if (arch != CFG_ARCH_GPT_NEOX || m->n_embd % m->n_head != 0) return;
  const long hs = m->n_embd / m->n_head, rot = cfg_rotary_dims(m);
  if (rot % 2 != 0) {
    char hint[160];
    snprintf(hint, sizeof hint, "the rotated dims pair up: rotary_pct = %.17g or %.17g turns %ld or %ld of the %ld",
             (double)(rot - 1) / (double)hs, (double)(rot + 1) / (double)hs, rot - 1, rot + 1, hs);
    cfg_error_at(cfg, errs, "model", "rotary_pct", hint,
                 "head size %ld x rotary_pct %g = %ld rotary dims, an odd number", hs, m->rotary_pct, rot);
  }
}

long cfg_kv_heads(const cfg_model *m) { return m->n_kv_head ? m->n_kv_head : m->n_head; }

long cfg_rotary_dims(const cfg_model *m) { return (long)((double)(m->n_embd / m->n_head) * m->rotary_pct); }

int cfg_model_gelu_erf(const cfg_model *m) {
  const cfg_model_activation a = cfg_model_activation_of(m);
  return a == CFG_ACT_GELU || (a == CFG_ACT_AUTO && cfg_model_arch_of(m) == CFG_ARCH_GPT_NEOX);
}

int cfg_model_untied(const cfg_model *m) {
  const cfg_model_head h = cfg_model_head_of(m);
  const cfg_model_arch a = cfg_model_arch_of(m);
  return h == CFG_HEAD_UNTIED || (h == CFG_HEAD_AUTO && (a == CFG_ARCH_GPT_NEOX || a == CFG_ARCH_LLAMA));
}

/* &comm method = 'powersgd': a rank that factors the model's square matrices (n_embd x n_embd) to at
 * most half; whole matrices on one rank of each replica (not split by tensor parallelism, whose Q a
 * checkpoint could not carry to another layout). */
static void check_powersgd(const cfg_config *cfg, err_list *errs) {
  const cfg_comm *c = &cfg->comm;
  const long most = cfg->model.n_embd / 4;
  if (c->powersgd_rank > most) {
    char hint[96];
    snprintf(hint, sizeof hint, "set powersgd_rank to at most n_embd / 4 = %ld", most);
    cfg_error_at(cfg, errs, "comm", "powersgd_rank", hint,
                 "powersgd_rank = %ld is out of range: factors of rank %ld of an n_embd x n_embd = %ld x %ld gradient "
                 "would not be half its size", c->powersgd_rank, c->powersgd_rank, cfg->model.n_embd, cfg->model.n_embd);
  }
  if (cfg->parallel.tensor_parallel > 1)
    cfg_error_at(cfg, errs, "parallel", "tensor_parallel", "set tensor_parallel = 1, or another &comm method",
                 "method = 'powersgd' factors whole matrices; tensor_parallel = %ld splits them",
                 cfg->parallel.tensor_parallel);
}

/* &comm method = 'topk' and 'powersgd': biased, so with error feedback; top-k keeps at least one
 * value of every full bucket by the fraction itself (else the share sent is not the one asked for). */
static void check_biased(const cfg_config *cfg, err_list *errs) {
  const cfg_comm *c = &cfg->comm;
  const cfg_comm_method m = cfg_comm_method_of(c);
  if (m != CFG_COMM_TOPK && m != CFG_COMM_POWERSGD) return;
  if (!c->error_feedback)
    cfg_error_at(cfg, errs, "comm", "method", "set &comm error_feedback = .true.",
                 "method = '%s' drops what it does not send (a biased compressor): it needs error_feedback, which "
                 "carries the rest to the next steps", c->method);
  if (m == CFG_COMM_POWERSGD) {
    check_powersgd(cfg, errs);
    return;
  }
  const double bucket = (double)cfg_comm_bucket(c);
  if (c->topk_fraction * bucket < 1.0 || c->topk_fraction < 1e-6) {
    char hint[160];
    snprintf(hint, sizeof hint, "raise topk_fraction to at least %.3g, or quant_bucket to at least %.0f",
             fmax(1.0 / bucket, 1e-6), ceil(1.0 / fmax(c->topk_fraction, 1e-6)));
    cfg_error_at(cfg, errs, "comm", "topk_fraction", hint,
                 "topk_fraction = %g keeps %.3g of a bucket of %.0f values: less than one (k out of range)",
                 c->topk_fraction, c->topk_fraction * bucket, bucket);
  }
}

static void check_consistency(cfg_config *cfg, err_list *errs) {
  cfg_model *m = &cfg->model;
  if (m->n_embd % m->n_head != 0) {
    char hint[256];
    int o = snprintf(hint, sizeof hint, "n_head must divide n_embd = %ld; divisors:", m->n_embd);
    int shown = 0;
    for (long d = 1; d <= m->n_embd && shown < 12 && o < (int)sizeof hint; d++)
      if (m->n_embd % d == 0) {
        o += snprintf(hint + o, sizeof hint - (size_t)o, " %ld", d);
        shown++;
      }
    cfg_error_at(cfg, errs, "model", "n_head", hint, "n_embd = %ld is not divisible by n_head = %ld", m->n_embd,
                 m->n_head);
  }
  if (m->attention_types.n < 1)
    cfg_error_at(cfg, errs, "model", "attention_types", "give at least one of 'global' or 'local'",
                 "the attention pattern is empty");
  check_arch(cfg, errs);
  cfg_training *t = &cfg->training;
  if (t->seq_len > m->block_size) {
    char hint[160];
    snprintf(hint, sizeof hint, "lower seq_len to at most %ld or raise &model block_size", m->block_size);
    cfg_error_at(cfg, errs, "training", "seq_len", hint, "seq_len = %ld exceeds &model block_size = %ld", t->seq_len,
                 m->block_size);
  }
  long rows_T = cfg->eval.seq_len > t->seq_len ? cfg->eval.seq_len : t->seq_len; /* both at most 2^20 */
  if (t->micro_batch_size * rows_T > INT_MAX)
    cfg_error_at(cfg, errs, "training", "micro_batch_size", "lower micro_batch_size: the ops take B x T rows as a 32-bit count",
                 "micro_batch_size x seq_len = %ld x %ld = %ld rows exceeds 2^31 - 1", t->micro_batch_size, rows_T,
                 t->micro_batch_size * rows_T);
  check_tensor_parallel(cfg, errs);
  if (cfg->parallel.pipeline_stages > m->n_layer)
    cfg_error_at(cfg, errs, "parallel", "pipeline_stages", "every stage needs at least one layer: pipeline_stages <= n_layer",
                 "pipeline_stages = %ld is more than n_layer = %ld", cfg->parallel.pipeline_stages, m->n_layer);
  if (t->min_lr > t->lr)
    cfg_error_at(cfg, errs, "training", "min_lr", "the floor must not exceed the peak: min_lr <= lr",
                 "min_lr = %g is larger than lr = %g", t->min_lr, t->lr);
  if (t->decay_steps > 0 && t->decay_steps < t->warmup_steps)
    cfg_error_at(cfg, errs, "training", "decay_steps", "decay_steps counts from step 0 and must be >= warmup_steps",
                 "decay_steps = %ld ends before the warm-up (warmup_steps = %ld)", t->decay_steps, t->warmup_steps);
  if (cfg_tokenizer_kind_of(&cfg->tokenizer) == CFG_TOK_BYTES && m->vocab_size < 256)
    cfg_error_at(cfg, errs, "model", "vocab_size", "the 'bytes' tokenizer needs vocab_size >= 256",
                 "vocab_size = %ld is smaller than the 256 byte tokens of &tokenizer kind = 'bytes'", m->vocab_size);
  check_tasks(cfg, errs);
  check_data(cfg, errs);
  if (cfg->sample.top_k > m->vocab_size)
    cfg_error_at(cfg, errs, "sample", "top_k", "top_k must not exceed &model vocab_size (0 means all tokens)",
                 "top_k = %ld exceeds vocab_size = %ld", cfg->sample.top_k, m->vocab_size);
  if (cfg->job.run_dir[0] == '\0')
    cfg_error_at(cfg, errs, "job", "run_dir", "give a directory, e.g. run_dir = 'runs/test'", "run_dir is empty");
  if (cfg->comm.bits > 8 && cfg->comm.bits != 32)
    cfg_error_at(cfg, errs, "comm", "bits", "2 to 8 bits per value, or 32 (no compression)",
                 "bits = %ld is not a width the quantizer packs", cfg->comm.bits);
  cfg_comm_method method = cfg_comm_method_of(&cfg->comm);
  if (cfg_comm_exchange_of(&cfg->comm) == CFG_EXCHANGE_INTSUM && method != CFG_COMM_QSGD && method != CFG_COMM_QSGDINF &&
      method != CFG_COMM_NONE)
    cfg_error_at(cfg, errs, "comm", "exchange", "method = 'qsgd' or 'qsgdinf' (uniform levels), or exchange = 'allgather'",
                 "exchange = 'intsum' sums integer codes, which needs uniform levels; method = '%s' has none",
                 cfg->comm.method);
  check_biased(cfg, errs);
}

/* group.key now holds a value derived from from_group.from_key: errors point at the latter. */
static void set_derived(cfg_config *cfg, const char *group, const char *key, const char *from_group,
                        const char *from_key) {
  int k = cfg_find(group, key);
  cfg->origin[k] = cfg->origin[cfg_find(from_group, from_key)];
  cfg->origin[k].derived = 1;
}

/* The defaults an architecture sets, before the checks: attention_types left unset is 'global' for every architecture
 * but GPT-Neo (the only one with local layers). */
static void arch_defaults(cfg_config *cfg) {
  if (cfg_model_arch_of(&cfg->model) != CFG_ARCH_GPT_NEO && !cfg->origin[cfg_find("model", "attention_types")].file[0]) {
    cfg->model.attention_types.n = 1;
    util_strlcpy(cfg->model.attention_types.v[0], "global", CFG_ITEM_LEN);
    set_derived(cfg, "model", "attention_types", "model", "arch");
  }
}

static void derive(cfg_config *cfg) {
  if (cfg_model_arch_of(&cfg->model) == CFG_ARCH_LLAMA && !cfg->origin[cfg_find("model", "attention_bias")].file[0]) {
    cfg->model.attention_bias = 0; /* unset: Llama's own default */
    set_derived(cfg, "model", "attention_bias", "model", "arch");
  }
  if (cfg->model.n_inner == 0) {
    cfg->model.n_inner = 4 * cfg->model.n_embd;
    set_derived(cfg, "model", "n_inner", "model", "n_embd");
  }
  if (!cfg->data.train.n && cfg->prepare.train_out[0]) {
    util_strlcpy(cfg->data.train.v[0], cfg->prepare.train_out, sizeof cfg->data.train.v[0]);
    cfg->data.train.n = 1;
    set_derived(cfg, "data", "train", "prepare", "train_out");
  }
  if (!cfg->data.val.n && cfg->prepare.val_out[0]) {
    util_strlcpy(cfg->data.val.v[0], cfg->prepare.val_out, sizeof cfg->data.val.v[0]);
    cfg->data.val.n = 1;
    set_derived(cfg, "data", "val", "prepare", "val_out");
  }
  if (cfg_tokenizer_kind_of(&cfg->tokenizer) == CFG_TOK_BPE && !cfg->tokenizer.dir[0] && cfg->model.init_from[0]) {
    util_strlcpy(cfg->tokenizer.dir, cfg->model.init_from, sizeof cfg->tokenizer.dir); /* tokenizer.json or vocab.json */
    set_derived(cfg, "tokenizer", "dir", "model", "init_from");
  }
  if (!cfg->eval.val.n && cfg->data.val.n) {
    cfg->eval.val = cfg->data.val;
    set_derived(cfg, "eval", "val", "data", "val");
  }
  if (cfg->eval.seq_len == 0) {
    cfg->eval.seq_len = cfg->training.seq_len;
    set_derived(cfg, "eval", "seq_len", "training", "seq_len");
  }
  if (cfg->training.decay_steps == 0) {
    cfg->training.decay_steps = cfg->training.max_steps;
    set_derived(cfg, "training", "decay_steps", "training", "max_steps");
  }
}

/* ---- the layout ------------------------------------------------------------------------------ */

int cfg_resolve_layout(cfg_config *cfg, int nranks, err_list *errs) {
  long n0 = err_count(errs);
  cfg_parallel *p = &cfg->parallel;
  cfg_training *t = &cfg->training;
  const long tp = p->tensor_parallel, per_replica = p->pipeline_stages * tp; /* ranks per replica */
  char fits[256] = "";
  int o = snprintf(fits, sizeof fits, "with %d rank%s and tensor_parallel = %ld: pipeline_stages =", nranks,
                   nranks == 1 ? "" : "s", tp);
  int any = 0;
  for (long q = 1; q * tp <= nranks && q <= cfg->model.n_layer && o < (int)sizeof fits - 8; q++)
    if (nranks % (q * tp) == 0) o += snprintf(fits + o, sizeof fits - (size_t)o, " %ld", q), any = 1;
  if (!any)
    snprintf(fits, sizeof fits, "start a multiple of tensor_parallel = %ld ranks, or lower tensor_parallel", tp);
  if (nranks % per_replica != 0) {
    cfg_error_at(cfg, errs, "parallel", "pipeline_stages", fits,
                 "%d rank%s cannot form pipelines of %ld stages x %ld tensor rank%s (pipeline_stages x tensor_parallel x "
                 "data_parallel must equal the rank count)", nranks, nranks == 1 ? "" : "s", p->pipeline_stages, tp,
                 tp == 1 ? "" : "s");
    return (int)(err_count(errs) - n0);
  }
  if (p->data_parallel == 0) {
    p->data_parallel = nranks / per_replica;
    set_derived(cfg, "parallel", "data_parallel", "parallel", "pipeline_stages");
  } else if (p->data_parallel * per_replica != nranks) {
    char hint[300];
    snprintf(hint, sizeof hint, "set data_parallel = %ld (or 0 to derive it), or start %ld ranks", nranks / per_replica,
             p->data_parallel * per_replica);
    cfg_error_at(cfg, errs, "parallel", "data_parallel", hint,
                 "pipeline_stages x tensor_parallel x data_parallel = %ld x %ld x %ld = %ld, not the %d rank%s of the job",
                 p->pipeline_stages, tp, p->data_parallel, per_replica * p->data_parallel, nranks, nranks == 1 ? "" : "s");
    return (int)(err_count(errs) - n0);
  }
  long D = p->data_parallel, B = t->micro_batch_size, per = B * D; /* sequences per micro-batch round */
  if (t->global_batch_size == 0) {
    long m = p->micro_batches ? p->micro_batches : 1;
    const double most = cfg_key_max("training", "global_batch_size");
    if ((double)per * (double)m > most) { /* a derived value the deck could not hold */
      char hint[200];
      snprintf(hint, sizeof hint, "lower micro_batches to at most %.0f, or micro_batch_size", floor(most / (double)per));
      cfg_error_at(cfg, errs, "parallel", "micro_batches", hint,
                   "micro_batch_size x data_parallel x micro_batches = %ld x %ld x %ld sequences a step is beyond "
                   "global_batch_size's largest value, %.0f", B, D, m, most);
      return (int)(err_count(errs) - n0);
    }
    t->global_batch_size = per * m;
    set_derived(cfg, "training", "global_batch_size", "training", "micro_batch_size");
  }
  if (t->global_batch_size % per != 0) {
    char hint[300];
    long lo = t->global_batch_size / per * per;
    snprintf(hint, sizeof hint, "use a multiple of micro_batch_size x data_parallel = %ld x %ld = %ld, e.g. %ld or %ld", B,
             D, per, lo > 0 ? lo : per, lo > 0 ? lo + per : 2 * per);
    cfg_error_at(cfg, errs, "training", "global_batch_size", hint,
                 "global_batch_size = %ld is not a multiple of micro_batch_size x data_parallel = %ld",
                 t->global_batch_size, per);
    return (int)(err_count(errs) - n0);
  }
  long m = t->global_batch_size / per;
  if (p->micro_batches == 0) {
    p->micro_batches = m;
    set_derived(cfg, "parallel", "micro_batches", "training", "global_batch_size");
  } else if (p->micro_batches != m) {
    char hint[200];
    snprintf(hint, sizeof hint, "set micro_batches = %ld or 0 to derive it, or global_batch_size = %ld", m,
             p->micro_batches * per);
    cfg_error_at(cfg, errs, "parallel", "micro_batches", hint,
                 "micro_batches = %ld disagrees with global_batch_size / (micro_batch_size x data_parallel) = %ld",
                 p->micro_batches, m);
  }
  return (int)(err_count(errs) - n0);
}

/* ---- loading --------------------------------------------------------------------------------- */

/* Deck text holding every default: "&job\n task = 'train'\n ... /\n..." */
static char *defaults_text(void) {
  size_t cap = 8192, n = 0;
  char *s = util_malloc(cap, "defaults");
  int ng;
  const cfg_group *gr = cfg_groups(&ng);
  for (int g = 0; g < ng; g++) {
    for (int k = gr[g].first - 1; k < gr[g].first + gr[g].nkeys + 1; k++) {
      char line[512];
      if (k < gr[g].first)
        snprintf(line, sizeof line, "&%s\n", gr[g].name);
      else if (k == gr[g].first + gr[g].nkeys)
        snprintf(line, sizeof line, "/\n");
      else if (cfg_key_table[k].def[0])
        snprintf(line, sizeof line, " %s = %s\n", cfg_key_table[k].name, cfg_key_table[k].def);
      else
        line[0] = '\0'; /* an empty list: nothing to set */
      size_t l = strlen(line);
      if (n + l + 1 > cap) s = util_realloc(s, cap *= 2, "defaults");
      memcpy(s + n, line, l + 1);
      n += l;
    }
  }
  return s;
}

/* Turn "group.key=value" into a one-group deck; returns NULL when malformed. A string (or list of
 * strings) value given without quotes on the command line is quoted here: --set job.run_dir=runs/a
 * means what it says. */
static char *override_text(const char *ov) {
  const char *dot = strchr(ov, '.'), *eq = strchr(ov, '=');
  if (!dot || !eq || dot > eq || dot == ov || eq == dot + 1) return NULL;
  char group[64], key[64];
  util_snprintf(group, sizeof group, "%.*s", (int)(dot - ov), ov);
  util_snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
  const char *val = eq + 1;
  int k = cfg_find(group, key);
  int quote = k >= 0 && (cfg_key_table[k].type == CFG_T_STR || cfg_key_table[k].type == CFG_T_STRLIST) &&
              !strchr(val, '\'') && !strchr(val, '"');
  size_t n = 4 * strlen(ov) + 32; /* a list value: each comma becomes four characters */
  char *s = util_malloc(n, "override");
  int o = snprintf(s, n, "&%s\n%s = ", group, key);
  if (!quote) {
    o += snprintf(s + o, n - (size_t)o, "%s", val);
  } else { /* 'a', 'b' for a comma-separated list; one string otherwise */
    int list = cfg_key_table[k].type == CFG_T_STRLIST;
    s[o++] = '\'';
    for (const char *c = val; *c; c++) {
      if (list && *c == ',') o += snprintf(s + o, n - (size_t)o, "', '");
      else s[o++] = *c;
    }
    s[o++] = '\'';
    s[o] = '\0';
  }
  snprintf(s + o, n - (size_t)o, "\n/\n");
  return s;
}

/* The built-in defaults, parsed like a deck; every key's origin "default". */
static void load_defaults(cfg_config *cfg) {
  err_list errs = {0};
  char *dtext = defaults_text();
  nml_doc ddoc = {0};
  nml_parse(dtext, strlen(dtext), "(defaults)", &ddoc, &errs);
  apply_doc(cfg, &ddoc, &errs);
  UTIL_CHECK(errs.n == 0, NULL, "internal: the built-in defaults do not parse: %s", errs.n ? errs.v[0].msg : "");
  nml_doc_free(&ddoc);
  free(dtext);
  err_free(&errs);
  for (int k = 0; k < CFG_NKEYS; k++) set_origin(cfg, k, "", 0, 0);
}

void cfg_model_defaults(cfg_model *m) {
  cfg_config *c = util_calloc(1, sizeof *c, "default configuration");
  load_defaults(c);
  *m = c->model;
  free(c);
}

/* One --set group.key=value: exactly one key of one group, reported at the option. */
static void apply_override(cfg_config *cfg, const char *ov, err_list *errs) {
  char where[CFG_STR_LEN], shown[200];
  util_snprintf(where, sizeof where, "--set %s", err_quote(shown, sizeof shown, ov, strlen(ov)));
  char *text = override_text(ov);
  if (!text) {
    err_add(errs, where, 0, 0, "write --set group.key=value, e.g. --set training.lr=3e-4", "malformed override");
    return;
  }
  nml_doc odoc = {0};
  int e0 = errs->n;
  long c0 = err_count(errs);
  nml_parse(text, strlen(text), "--set", &odoc, errs);
  if (err_count(errs) == c0 && (odoc.n != 1 || odoc.groups[0].n != 1))
    err_add(errs, where, 0, 0, "one --set sets one key; quote a value that holds '/' or '&': --set \"job.name='a/b'\"",
            "the value reaches beyond its key (into %s)", odoc.n != 1 ? "another group" : "another key");
  else
    apply_doc(cfg, &odoc, errs);
  for (int k = 0; k < CFG_NKEYS; k++)
    if (strcmp(cfg->origin[k].file, "--set") == 0) set_origin(cfg, k, where, 0, 0);
  for (int e = e0; e < errs->n; e++) { /* an override has no lines: name the option instead */
    util_strlcpy(errs->v[e].file, where, sizeof errs->v[e].file);
    errs->v[e].line = errs->v[e].col = 0;
  }
  nml_doc_free(&odoc);
  free(text);
}

int cfg_load_sources(cfg_config *cfg, const cfg_source *src, int nsrc, char *const *overrides, int noverrides,
                     err_list *errs) {
  memset(cfg, 0, sizeof *cfg);
  util_strlcpy(cfg->deck_path, src[0].name, sizeof cfg->deck_path);
  long n0 = err_count(errs);
  load_defaults(cfg);
  nml_doc doc = {0};
  for (int i = 0; i < nsrc; i++) {
    int before = doc.n;
    if (nml_parse(src[i].text, src[i].len, src[i].name, &doc, errs) == 0 && doc.n == before)
      err_add(errs, src[i].name, 0, 0, "a deck holds groups such as &job task = 'train' /; input/tiny.nml is one",
              "the %s is empty: no &group in it", i ? "file" : "deck");
  }
  apply_doc(cfg, &doc, errs);
  nml_doc_free(&doc);
  for (int i = 0; i < noverrides; i++) apply_override(cfg, overrides[i], errs);
  if (err_count(errs) > n0) return (int)(err_count(errs) - n0);
  arch_defaults(cfg);
  check_consistency(cfg, errs);
  if (err_count(errs) > n0) return (int)(err_count(errs) - n0);
  derive(cfg);
  return 0;
}

int cfg_load(cfg_config *cfg, const char *deck_text, size_t deck_len, const char *deck_name, char *const *overrides,
             int noverrides, err_list *errs) {
  cfg_source src = {deck_text, deck_len, deck_name};
  return cfg_load_sources(cfg, &src, 1, overrides, noverrides, errs);
}

/* ---- echo and reference ---------------------------------------------------------------------- */

/* Key k's value as deck text on fp, however long (a list of long paths can run to many kilobytes). */
static void write_value(const cfg_config *cfg, int k, FILE *fp) {
  const void *p = cfield(cfg, k);
  char w[64];
  switch (cfg_key_table[k].type) {
  case CFG_T_INT: fprintf(fp, "%ld", *(const long *)p); break;
  case CFG_T_REAL:
    nml_format_real(*(const double *)p, w, sizeof w);
    fputs(w, fp);
    break;
  case CFG_T_BOOL: fputs(*(const int *)p ? ".true." : ".false.", fp); break;
  case CFG_T_STR: nml_write_string((const char *)p, fp); break;
  case CFG_T_STRLIST:
    for (int i = 0; i < ((const cfg_strlist *)p)->n; i++) {
      if (i) fputs(", ", fp);
      nml_write_string(((const cfg_strlist *)p)->v[i], fp);
    }
    break;
  case CFG_T_REALLIST:
    for (int i = 0; i < ((const cfg_reallist *)p)->n; i++) {
      nml_format_real(((const cfg_reallist *)p)->v[i], w, sizeof w);
      fprintf(fp, "%s%s", i ? ", " : "", w);
    }
    break;
  }
}

void cfg_write_deck(const cfg_config *cfg, FILE *fp, const char *header) {
  if (header) {
    const char *p = header;
    while (*p) {
      const char *nl = strchr(p, '\n');
      int n = nl ? (int)(nl - p) : (int)strlen(p);
      fprintf(fp, "! %.*s\n", n, p);
      p += n + (nl != NULL);
    }
    fprintf(fp, "\n");
  }
  int ng;
  const cfg_group *gr = cfg_groups(&ng);
  for (int g = 0; g < ng; g++) {
    int w = 0;
    for (int k = gr[g].first; k < gr[g].first + gr[g].nkeys; k++)
      if ((int)strlen(cfg_key_table[k].name) > w) w = (int)strlen(cfg_key_table[k].name);
    fprintf(fp, "&%s\n", gr[g].name);
    for (int k = gr[g].first; k < gr[g].first + gr[g].nkeys; k++) {
      const cfg_origin *o = &cfg->origin[k];
      const char *mark = o->derived ? "  ! derived" : !o->file[0] ? "  ! default" : "";
      if ((cfg_key_table[k].type == CFG_T_STRLIST && ((const cfg_strlist *)cfield(cfg, k))->n == 0) ||
          (cfg_key_table[k].type == CFG_T_REALLIST && ((const cfg_reallist *)cfield(cfg, k))->n == 0))
        fprintf(fp, "  ! %-*s   (empty list)%s\n", w, cfg_key_table[k].name, mark); /* a namelist cannot say "empty" */
      else {
        fprintf(fp, "  %-*s = ", w, cfg_key_table[k].name);
        write_value(cfg, k, fp);
        fprintf(fp, "%s\n", mark);
      }
    }
    fprintf(fp, "/\n\n");
  }
}

void cfg_write_reference(FILE *fp) {
  fprintf(fp, "# Deck reference\n\n"
              "Generated by `greenlm --deck-reference` from the tables in `src/deck/cfg.h`; `make check` fails\n"
              "when this file and the tables disagree (regenerate it with `make deck-reference`).\n\n"
              "A deck is a Fortran namelist file: groups `&name ... /`, entries `key = value` separated\n"
              "by commas or newlines, `!` comments, quoted strings, logicals (`.true.`, `.false.`, `T`,\n"
              "`F`), integers, reals (`1e-4`, `1.0d-4`), lists (`'global', 'local'`) and repeat counts\n"
              "(`4*0.5`). Names are case-insensitive. Every key has a default; a deck names only what it\n"
              "changes. `greenlm --set group.key=value` overrides a key from the command line.\n\n"
              "Ranges: `[a, b]` includes its ends, `(a, b)` excludes them.\n\n");
  int ng;
  const cfg_group *gr = cfg_groups(&ng);
  for (int g = 0; g < ng; g++) {
    fprintf(fp, "## &%s\n\n%s.\n\n", gr[g].name, gr[g].doc);
    fprintf(fp, "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n");
    for (int k = gr[g].first; k < gr[g].first + gr[g].nkeys; k++) {
      const cfg_key *key = &cfg_key_table[k];
      char allowed[256];
      if (!key->range[0])
        snprintf(allowed, sizeof allowed, "any");
      else if (key->range[0] == '[' || key->range[0] == '(')
        snprintf(allowed, sizeof allowed, "`%s`", key->range);
      else {
        int o = 0;
        const char *p = key->range;
        while (*p && o < (int)sizeof allowed - 40) {
          const char *bar = strchr(p, '|');
          int n = bar ? (int)(bar - p) : (int)strlen(p);
          o += snprintf(allowed + o, sizeof allowed - (size_t)o, "%s`'%.*s'`", o ? ", " : "", n, p);
          if (!bar) break;
          p = bar + 1;
        }
      }
      char def[300];
      snprintf(def, sizeof def, key->def[0] ? "`%s`" : "(empty)", key->def);
      fprintf(fp, "| `%s` | %s | %s | %s | %s |\n", key->name, type_name(key->type), def, allowed, key->doc);
    }
    fprintf(fp, "\n");
  }
}
