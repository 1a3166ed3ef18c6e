/* nml: a Fortran-namelist reader that keeps the place of everything it reads.
 *
 * Syntax accepted (case-insensitive names):
 *   &group  key = value, key2 = 'text', flags = .true.   ! comment
 *           list = 'global', 'local'    reps = 4*0.5
 *   /                                   (or &end)
 * Values: integers, reals (1e-4, 1.0d-4), logicals (.true. .false. .t. .f. T F), strings in
 * '...' or "..." (a doubled quote stands for itself), repeat counts n*value. Entries are
 * separated by commas, blanks or newlines.
 *
 * nml_parse() only checks syntax; types, ranges and names are checked against the tables in
 * cfg.c. Every error carries file:line:column and a hint. */
#ifndef GREENLM_NML_H
#define GREENLM_NML_H

typedef enum { NML_INT, NML_REAL, NML_BOOL, NML_STR } nml_kind;

typedef struct {
  nml_kind kind;
  char *text;  /* as written (strings: the unquoted contents) */
  long long i; /* NML_INT, NML_BOOL (0/1) */
  double r;    /* NML_INT and NML_REAL */
  int line, col;
} nml_value;

typedef struct {
  char *key; /* lower-cased */
  const char *file;
  int line, col;
  nml_value *vals;
  int nvals;
} nml_entry;

typedef struct {
  char *name; /* lower-cased, without '&' */
  const char *file;
  int line, col;
  nml_entry *entries;
  int n;
} nml_group;

typedef struct {
  nml_group *groups;
  int n;
} nml_doc;

typedef struct {
  char file[256];
  int line, col; /* 0 when the error has no place in a file */
  char msg[640];
  char hint[384];
} nml_error;

typedef struct {
  nml_error *v;
  int n, cap;
} nml_errors;

/* Parse text (NUL-terminated) read from `file` (a name for messages; kept by pointer) and append
 * its groups to doc. Returns the number of errors appended to errs. */
int nml_parse(const char *text, const char *file, nml_doc *doc, nml_errors *errs);
void nml_doc_free(nml_doc *doc);

/* Append an error; file may be NULL, hint may be NULL. */
void nml_error_add(nml_errors *errs, const char *file, int line, int col, const char *hint,
                   const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
void nml_errors_free(nml_errors *errs);
/* Print errors as "file:line:col: error: msg" + "  hint: ..." (at most `max`, then a count). */
void nml_errors_print(const nml_errors *errs, int max);

/* Format a value as deck text: strings quoted (quotes doubled), reals with a '.' or exponent. */
void nml_format_string(const char *s, char *out, int len);
void nml_format_real(double x, char *out, int len);

#endif
