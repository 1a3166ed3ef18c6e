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

#include <stddef.h>
#include <stdio.h>

#include "base/err.h"

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
  int nvals, cap;
} nml_entry;

typedef struct {
  char *name; /* lower-cased, without '&' */
  const char *file;
  int line, col;
  nml_entry *entries;
  int n, cap;
} nml_group;

typedef struct {
  nml_group *groups;
  int n, cap;
} nml_doc;

/* A deck is at most this long; a key takes at most this many values. */
enum { NML_MAX_BYTES = 1 << 20, NML_MAX_VALUES = 4096 };

/* Parse len bytes of text (NUL-terminated after them) read from `file` (a name for messages; kept
 * by pointer) and append its groups to doc. Text that is not text (a NUL byte, a control
 * character, invalid UTF-8) is an error at its line and column, and nothing is parsed. Returns
 * the number of errors appended to errs. */
int nml_parse(const char *text, size_t len, const char *file, nml_doc *doc, err_list *errs);
void nml_doc_free(nml_doc *doc);

/* Values as deck text: a string quoted with its quotes doubled, whole however long (written to fp); a real with a
 * '.' or an exponent, in the fewest digits that read back to the same double (at most 25 bytes with the NUL). */
void nml_write_string(const char *s, FILE *fp);
void nml_format_real(double x, char *out, int len);

#endif
