/* nml: namelist lexer and parser with file:line:column errors. */
#include "deck/nml.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* ---- lexer state ---------------------------------------------------------------------------- */

typedef struct {
  const char *p;
  const char *file;
  int line, col;
  err_list *errs;
  int nerr0;    /* errors kept before this parse (for the check of a line already reported) */
  long count0;  /* errors counted before this parse */
} nml_lexer;

static int lx_peek(const nml_lexer *lx) { return (unsigned char)*lx->p; }

static void lx_next(nml_lexer *lx) {
  if (*lx->p == '\n') {
    lx->line++;
    lx->col = 1;
  } else {
    lx->col++;
  }
  lx->p++;
}

/* Skip blanks, newlines and '!' comments; commas too when skip_commas. */
static void lx_skip(nml_lexer *lx, int skip_commas) {
  for (;;) {
    int c = lx_peek(lx);
    if (c == '!') {
      while (*lx->p && *lx->p != '\n') lx_next(lx);
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v' ||
               (skip_commas && c == ',')) {
      lx_next(lx);
    } else {
      return;
    }
  }
}

static int is_ident_start(int c) { return isalpha(c) || c == '_'; }
static int is_ident_char(int c) { return isalnum(c) || c == '_'; }
static int is_separator(int c) {
  return c == 0 || c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',' || c == '/' || c == '!' ||
         c == '&';
}

/* Read an identifier into buf (lower-cased). */
static void lx_ident(nml_lexer *lx, char *buf, size_t len) {
  size_t n = 0;
  while (is_ident_char(lx_peek(lx))) {
    if (n + 1 < len) buf[n++] = (char)tolower(lx_peek(lx));
    lx_next(lx);
  }
  buf[n] = '\0';
}

/* Copy the rest of a bad token (up to a separator) for messages; a long one is cut with "...". */
static void lx_rest(nml_lexer *lx, char *buf, size_t len) {
  size_t n = 0, all = 0;
  while (!is_separator(lx_peek(lx)) && lx_peek(lx) != '=' && lx_peek(lx) != '\'' && lx_peek(lx) != '"') {
    if (n + 4 < len) buf[n++] = *lx->p;
    all++;
    lx_next(lx);
  }
  if (all > n) memcpy(buf + n, "...", 3), n += 3;
  buf[n] = '\0';
}

/* Is the text at p an identifier followed by '=' (the start of the next key)? */
static int lx_at_key(const nml_lexer *lx) {
  const char *q = lx->p;
  if (!is_ident_start((unsigned char)*q)) return 0;
  while (is_ident_char((unsigned char)*q)) q++;
  while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
  return *q == '=' || *q == '(';
}

/* ---- values --------------------------------------------------------------------------------- */

/* Room for one more element in an array of n, grown geometrically (cap: its capacity). */
static void *grow(void *p, int n, int *cap, size_t size, const char *what) {
  if (n < *cap) return p;
  *cap = *cap ? 2 * *cap : 8;
  return util_realloc(p, (size_t)*cap * size, what);
}

static void value_push(nml_entry *e, const nml_value *v) {
  e->vals = grow(e->vals, e->nvals, &e->cap, sizeof *e->vals, "deck values");
  e->vals[e->nvals++] = *v;
}

static char *dup_range(const char *a, size_t n) {
  char *s = util_malloc(n + 1, "deck text");
  memcpy(s, a, n);
  s[n] = '\0';
  return s;
}

/* Parse a quoted string at the lexer (which points at the quote). Returns 0 on success. */
static int lx_string(nml_lexer *lx, nml_value *v) {
  char q = *lx->p;
  int line = lx->line, col = lx->col;
  lx_next(lx);
  size_t cap = 64, n = 0;
  char *buf = util_malloc(cap, "deck string");
  for (;;) {
    int c = lx_peek(lx);
    if (c == 0 || c == '\n') {
      err_add(lx->errs, lx->file, line, col, "close the string with a matching quote on the same line",
                    "unterminated string starting with %c", q);
      free(buf);
      return -1;
    }
    if (c == q) {
      lx_next(lx);
      if (lx_peek(lx) == q) { /* doubled quote */
        c = q;
      } else {
        break;
      }
    }
    if (n + 2 > cap) buf = util_realloc(buf, cap *= 2, "deck string");
    buf[n++] = (char)c;
    lx_next(lx);
  }
  buf[n] = '\0';
  v->kind = NML_STR;
  v->text = buf;
  v->line = line;
  v->col = col;
  return 0;
}

/* Scan a number (optionally signed). On success fills v and returns 0. */
static int lx_number(nml_lexer *lx, nml_value *v) {
  const char *start = lx->p;
  int line = lx->line, col = lx->col;
  int is_real = 0, digits = 0;
  if (*lx->p == '+' || *lx->p == '-') lx_next(lx);
  while (isdigit(lx_peek(lx))) {
    lx_next(lx);
    digits++;
  }
  if (lx_peek(lx) == '.') {
    is_real = 1;
    lx_next(lx);
    while (isdigit(lx_peek(lx))) {
      lx_next(lx);
      digits++;
    }
  }
  if (digits && strchr("eEdD", lx_peek(lx)) && lx_peek(lx)) {
    const char *save = lx->p;
    int sl = lx->line, sc = lx->col;
    lx_next(lx);
    if (lx_peek(lx) == '+' || lx_peek(lx) == '-') lx_next(lx);
    if (isdigit(lx_peek(lx))) {
      is_real = 1;
      while (isdigit(lx_peek(lx))) lx_next(lx);
    } else {
      lx->p = save;
      lx->line = sl;
      lx->col = sc;
    }
  }
  if (!digits || !is_separator(lx_peek(lx))) {
    int head = (int)(lx->p - start); /* what was read as the number; the rest follows */
    char rest[64], shown[160];
    lx_rest(lx, rest, sizeof rest);
    snprintf(shown, sizeof shown, "%.*s%s", head < 64 ? head : 64, start, rest);
    err_add(lx->errs, lx->file, line, col, "numbers look like 12, -3, 0.5, 1e-4 or 1.0d-4",
                  "malformed number '%s'", shown);
    return -1;
  }
  size_t n = (size_t)(lx->p - start);
  v->text = dup_range(start, n);
  v->line = line;
  v->col = col;
  char *num = dup_range(start, n), shown[80]; /* Fortran's exponent letter d, as C reads it */
  for (char *t = num; *t; t++)
    if (*t == 'd' || *t == 'D') *t = 'e';
  errno = 0;
  int bad = 0;
  if (is_real) {
    v->kind = NML_REAL;
    v->r = strtod(num, NULL);
    bad = errno == ERANGE && fabs(v->r) > 1.0;
  } else {
    v->kind = NML_INT;
    v->i = strtoll(num, NULL, 10);
    bad = errno == ERANGE;
    v->r = (double)v->i;
  }
  free(num);
  if (bad) {
    err_add(lx->errs, lx->file, line, col, NULL, "%s '%s' is out of range", is_real ? "real" : "integer",
            err_quote(shown, sizeof shown, v->text, n));
    free(v->text);
    v->text = NULL;
    return -1;
  }
  return 0;
}

static int logical_word(const char *w, long long *out) {
  static const char *t[] = {"t", "true", ".t.", ".true."}, *f[] = {"f", "false", ".f.", ".false."};
  for (int i = 0; i < 4; i++) {
    if (util_strieq(w, t[i])) {
      *out = 1;
      return 1;
    }
    if (util_strieq(w, f[i])) {
      *out = 0;
      return 1;
    }
  }
  return 0;
}

/* Parse one value (possibly with a repeat count) and push it (count times) onto e.
 * Returns 0 on success, -1 after reporting an error (the lexer is moved past the bad token). */
static int lx_value(nml_lexer *lx, nml_entry *e) {
  int c = lx_peek(lx);
  nml_value v;
  memset(&v, 0, sizeof v);
  long long repeat = 1;
  /* repeat count: digits followed by '*' */
  if (isdigit(c)) {
    const char *q = lx->p;
    while (isdigit((unsigned char)*q)) q++;
    if (*q == '*') {
      repeat = strtoll(lx->p, NULL, 10);
      int line = lx->line, col = lx->col;
      while (lx->p < q) lx_next(lx);
      lx_next(lx); /* '*' */
      if (repeat < 1 || repeat > NML_MAX_VALUES) {
        err_add(lx->errs, lx->file, line, col, "write n*value with 1 <= n <= 4096", "bad repeat count %lld", repeat);
        return -1;
      }
      if (is_separator(lx_peek(lx))) {
        err_add(lx->errs, lx->file, line, col, "write the value right after the '*', as in 4*0.5",
                      "repeat count %lld* has no value", repeat);
        return -1;
      }
      c = lx_peek(lx);
    }
  }
  int rc;
  if (c == '\'' || c == '"') {
    rc = lx_string(lx, &v);
  } else if (isdigit(c) || c == '+' || c == '-' || (c == '.' && isdigit((unsigned char)lx->p[1]))) {
    rc = lx_number(lx, &v);
  } else if (c == '.' || is_ident_start(c)) {
    int line = lx->line, col = lx->col;
    char word[64];
    size_t n = 0, cut = 0;
    if (c == '.') {
      word[n++] = '.';
      lx_next(lx);
    }
    while (is_ident_char(lx_peek(lx)) || lx_peek(lx) == '.') {
      if (n + 4 < sizeof word) word[n++] = *lx->p;
      else cut = 1;
      int dot = *lx->p == '.';
      lx_next(lx);
      if (dot && c == '.') break;
    }
    if (cut) memcpy(word + n, "...", 3), n += 3; /* never a logical: reported as cut below */
    word[n] = '\0';
    if (logical_word(word, &v.i) && is_separator(lx_peek(lx))) {
      v.kind = NML_BOOL;
      v.r = (double)v.i;
      v.text = util_strdup(word);
      v.line = line;
      v.col = col;
      rc = 0;
    } else {
      char rest[64];
      lx_rest(lx, rest, sizeof rest);
      char hint[200];
      snprintf(hint, sizeof hint, "put text in quotes ('%s%s'); logicals are .true. or .false.", word, rest);
      err_add(lx->errs, lx->file, line, col, hint, "unquoted value '%s%s'", word, rest);
      rc = -1;
    }
  } else {
    int line = lx->line, col = lx->col;
    err_add(lx->errs, lx->file, line, col, "values are numbers, quoted strings or logicals",
                  "unexpected character '%c' in a value", c);
    lx_next(lx);
    return -1;
  }
  if (rc != 0) return -1;
  if (e->nvals + repeat > NML_MAX_VALUES) {
    err_add(lx->errs, lx->file, v.line, v.col, "a key takes at most 4096 values", "too many values for '%s'", e->key);
    free(v.text);
    return -1;
  }
  for (long long k = 0; k < repeat; k++) {
    nml_value copy = v;
    if (k > 0) copy.text = util_strdup(v.text);
    value_push(e, &copy);
  }
  return 0;
}

/* ---- groups --------------------------------------------------------------------------------- */

static nml_group *group_push(nml_doc *doc, const char *name, const char *file, int line, int col) {
  doc->groups = grow(doc->groups, doc->n, &doc->cap, sizeof *doc->groups, "deck groups");
  nml_group *g = &doc->groups[doc->n++];
  memset(g, 0, sizeof *g);
  g->name = util_strdup(name);
  g->file = file;
  g->line = line;
  g->col = col;
  return g;
}

static nml_entry *entry_push(nml_group *g, const char *key, const char *file, int line, int col) {
  g->entries = grow(g->entries, g->n, &g->cap, sizeof *g->entries, "deck entries");
  nml_entry *e = &g->entries[g->n++];
  memset(e, 0, sizeof *e);
  e->key = util_strdup(key);
  e->file = file;
  e->line = line;
  e->col = col;
  return e;
}

static void entry_free(nml_entry *e) {
  for (int k = 0; k < e->nvals; k++) free(e->vals[k].text);
  free(e->vals);
  free(e->key);
}

/* Parse the body of group g until '/' or '&end'. Returns 1 when closed, 0 at EOF or when the next
 * group starts (an error has then been reported). */
static int parse_group_body(nml_lexer *lx, nml_group *g) {
  for (;;) {
    lx_skip(lx, 1);
    int c = lx_peek(lx);
    if (c == 0) {
      err_add(lx->errs, lx->file, g->line, g->col, "end the group with '/' after its last entry",
                    "group &%s is never closed", g->name);
      return 0;
    }
    if (c == '/') {
      lx_next(lx);
      return 1;
    }
    if (c == '&' || c == '$') {
      const char *save = lx->p;
      int sl = lx->line, sc = lx->col;
      lx_next(lx);
      char name[64];
      lx_ident(lx, name, sizeof name);
      if (strcmp(name, "end") == 0) return 1;
      lx->p = save;
      lx->line = sl;
      lx->col = sc;
      err_add(lx->errs, lx->file, g->line, g->col, "end each group with '/' before the next '&group'",
                    "group &%s is not closed before &%s starts at line %d", g->name, name, sl);
      return 0;
    }
    if (!is_ident_start(c)) {
      int line = lx->line, col = lx->col;
      char rest[64];
      lx_rest(lx, rest, sizeof rest);
      if (!rest[0]) {
        rest[0] = (char)c;
        rest[1] = '\0';
        lx_next(lx);
      }
      err_add(lx->errs, lx->file, line, col, "entries look like: key = value", "expected a key, found '%s'",
                    rest);
      continue;
    }
    int line = lx->line, col = lx->col;
    char key[64];
    lx_ident(lx, key, sizeof key);
    lx_skip(lx, 0);
    if (lx_peek(lx) == '(') {
      err_add(lx->errs, lx->file, line, col, "give the whole list: key = 'a', 'b', ...",
                    "element syntax %s(...) is not supported", key);
      while (*lx->p && *lx->p != '\n') lx_next(lx);
      continue;
    }
    if (lx_peek(lx) != '=') {
      char hint[160];
      snprintf(hint, sizeof hint, "write %s = value", key);
      err_add(lx->errs, lx->file, line, col, hint, "expected '=' after key '%s'", key);
      while (*lx->p && *lx->p != '\n') lx_next(lx);
      continue;
    }
    lx_next(lx); /* '=' */
    for (int k = 0; k < g->n; k++) {
      if (strcmp(g->entries[k].key, key) == 0) {
        char hint[160];
        snprintf(hint, sizeof hint, "keep one of the two (the first is at line %d)", g->entries[k].line);
        err_add(lx->errs, lx->file, line, col, hint, "duplicate key '%s' in &%s", key, g->name);
        break;
      }
    }
    nml_entry *e = entry_push(g, key, lx->file, line, col);
    /* values until the next key, '/', '&' or EOF */
    for (;;) {
      lx_skip(lx, 1);
      c = lx_peek(lx);
      if (c == 0 || c == '/' || c == '&' || c == '$' || lx_at_key(lx)) break;
      if (lx_value(lx, e) != 0) {
        while (!is_separator(lx_peek(lx))) lx_next(lx);
      }
    }
    if (e->nvals == 0) {
      char hint[160];
      snprintf(hint, sizeof hint, "give a value: %s = ...", key);
      int dup_err = 0; /* a bad value on this line was already reported */
      for (int k = lx->nerr0; k < lx->errs->n; k++)
        if (lx->errs->v[k].line == line && lx->errs->v[k].col > col) dup_err = 1;
      if (!dup_err) err_add(lx->errs, lx->file, line, col, hint, "key '%s' has no value", key);
      entry_free(e);
      g->n--;
    }
  }
}

/* Length of the UTF-8 sequence at s (n bytes left), or 0 when it is not valid UTF-8. */
static int utf8_len(const unsigned char *s, size_t n) {
  int len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (!len || (size_t)len > n || (len == 2 && s[0] < 0xC2)) return 0;
  for (int k = 1; k < len; k++)
    if ((s[k] & 0xC0) != 0x80) return 0;
  return len;
}

/* A deck is text: UTF-8 without NUL bytes or control characters other than tab, newline, carriage
 * return and form feed. Returns the error (at the first offending byte) count: 0 or 1. */
static int check_text(const char *text, size_t len, const char *file, err_list *errs) {
  const unsigned char *s = (const unsigned char *)text;
  int line = 1, col = 1;
  for (size_t i = 0; i < len;) {
    int c = s[i], n = utf8_len(s + i, len - i);
    if (n == 0 || c == 0 || c == 0x7f || (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v')) {
      err_add(errs, file, line, col, "a deck is a text file (UTF-8); is this the right file?",
              "byte 0x%02x is not text%s", c, c == 0 ? " (a NUL byte)" : n == 0 ? " (not UTF-8)" : " (a control character)");
      return 1;
    }
    if (c == '\n') line++, col = 1;
    else col++;
    i += (size_t)n;
  }
  return 0;
}

int nml_parse(const char *text, size_t len, const char *file, nml_doc *doc, err_list *errs) {
  if (check_text(text, len, file, errs)) return 1;
  nml_lexer lx = {text, file, 1, 1, errs, errs->n, err_count(errs)};
  for (;;) {
    lx_skip(&lx, 0);
    int c = lx_peek(&lx);
    if (c == 0) break;
    if (c == '&' || c == '$') {
      int line = lx.line, col = lx.col;
      lx_next(&lx);
      char name[64];
      lx_ident(&lx, name, sizeof name);
      if (!name[0]) {
        err_add(errs, file, line, col, "groups start with &name, as in &model", "'&' without a group name");
        continue;
      }
      if (strcmp(name, "end") == 0) {
        err_add(errs, file, line, col, "remove it, or open a group first", "&end without an open group");
        continue;
      }
      for (int k = 0; k < doc->n; k++) {
        if (strcmp(doc->groups[k].name, name) == 0 && doc->groups[k].file == file) {
          char hint[160];
          snprintf(hint, sizeof hint, "merge both into one &%s group (the first is at line %d)", name,
                   doc->groups[k].line);
          err_add(errs, file, line, col, hint, "group &%s appears twice", name);
          break;
        }
      }
      nml_group *g = group_push(doc, name, file, line, col);
      parse_group_body(&lx, g);
    } else {
      int line = lx.line, col = lx.col;
      char rest[64];
      lx_rest(&lx, rest, sizeof rest);
      if (!rest[0]) {
        rest[0] = (char)c;
        rest[1] = '\0';
        lx_next(&lx);
      }
      err_add(errs, file, line, col, "entries belong inside a group: &name ... /",
                    "text outside a group: '%s'", rest);
      while (*lx.p && *lx.p != '\n' && *lx.p != '&') lx_next(&lx);
    }
  }
  return (int)(err_count(errs) - lx.count0);
}

void nml_doc_free(nml_doc *doc) {
  for (int i = 0; i < doc->n; i++) {
    nml_group *g = &doc->groups[i];
    for (int j = 0; j < g->n; j++) entry_free(&g->entries[j]);
    free(g->entries);
    free(g->name);
  }
  free(doc->groups);
  doc->groups = NULL;
  doc->n = 0;
}

void nml_write_string(const char *s, FILE *fp) {
  fputc('\'', fp);
  for (; *s; s++) {
    if (*s == '\'') fputc('\'', fp);
    fputc(*s, fp);
  }
  fputc('\'', fp);
}

void nml_format_real(double x, char *out, int len) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(out, (size_t)len, "%.*g", prec, x);
    if (strtod(out, NULL) == x) break;
  }
  if (!strpbrk(out, ".eEn")) { /* make it read back as a real */
    size_t n = strlen(out);
    if ((int)n + 2 < len) memcpy(out + n, ".0", 3);
  }
}
