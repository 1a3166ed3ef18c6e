/* err: error lists with places and hints, reported once across ranks. */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* Copy src into dst[len]; when it does not fit, end at a word boundary with "...". */
static void fit(char *dst, size_t len, const char *src) {
  size_t n = strlen(src);
  if (n < len) {
    memcpy(dst, src, n + 1);
    return;
  }
  err_quote(dst, len, src, n);
}

char *err_quote(char *out, size_t len, const char *text, size_t textlen) {
  if (len == 0) return out;
  if (textlen < len) {
    memcpy(out, text, textlen);
    out[textlen] = '\0';
    return out;
  }
  if (len < 8) {
    util_strlcpy(out, "...", len);
    return out;
  }
  size_t keep = len - 4; /* room for "..." and the NUL */
  size_t cut = keep;
  while (cut > keep / 2 && text[cut] != ' ' && text[cut - 1] != ' ') cut--; /* a word boundary nearby */
  if (cut <= keep / 2) cut = keep;
  while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--; /* not inside a UTF-8 character */
  memcpy(out, text, cut);
  memcpy(out + cut, "...", 4);
  return out;
}

void err_add(err_list *e, const char *file, int line, int col, const char *hint, const char *fmt, ...) {
  if (e->n >= ERR_KEEP) {
    e->dropped++;
    return;
  }
  if (e->n == e->cap) {
    e->cap = e->cap ? 2 * e->cap : 16;
    e->v = util_realloc(e->v, (size_t)e->cap * sizeof *e->v, "error list");
  }
  err_item *it = &e->v[e->n++];
  memset(it, 0, sizeof *it);
  fit(it->file, sizeof it->file, file ? file : "");
  it->line = line;
  it->col = col;
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fit(it->msg, sizeof it->msg, msg);
  if (hint) fit(it->hint, sizeof it->hint, hint);
}

long err_count(const err_list *e) { return e->n + e->dropped; }

void err_free(err_list *e) {
  free(e->v);
  memset(e, 0, sizeof *e);
}

static void print_item(const err_item *it, const char *ranks) {
  if (it->line > 0 && it->col > 0)
    fprintf(stderr, "%s:%d:%d: error: %s%s\n", it->file, it->line, it->col, it->msg, ranks);
  else if (it->line > 0)
    fprintf(stderr, "%s:%d: error: %s%s\n", it->file, it->line, it->msg, ranks);
  else if (it->file[0])
    fprintf(stderr, "%s: error: %s%s\n", it->file, it->msg, ranks);
  else
    fprintf(stderr, "greenlm: error: %s%s\n", it->msg, ranks);
  if (it->hint[0]) fprintf(stderr, "  hint: %s\n", it->hint);
}

void err_print(const err_list *e, int max) {
  for (int i = 0; i < e->n && i < max; i++) print_item(&e->v[i], "");
  long more = err_count(e) - (e->n < max ? e->n : max);
  if (more > 0) fprintf(stderr, "greenlm: ... and %ld more error%s\n", more, more == 1 ? "" : "s");
  fflush(stderr);
}

static int same_item(const err_item *a, const err_item *b) {
  return a->line == b->line && a->col == b->col && strcmp(a->file, b->file) == 0 && strcmp(a->msg, b->msg) == 0;
}

/* " (on ranks 1, 3)" for an error seen by some of the ranks; "" when all saw it. */
static void ranks_text(const unsigned char *seen, int size, char *out, size_t len) {
  int count = 0;
  for (int r = 0; r < size; r++) count += seen[r];
  out[0] = '\0';
  if (count == size || size == 1 || (count == 1 && seen[0])) return; /* all, or rank 0 checking for all */
  int o = util_snprintf(out, len, " (on rank%s", count == 1 ? "" : "s");
  int shown = 0;
  for (int r = 0; r < size && o < (int)len - 16; r++)
    if (seen[r]) o += util_snprintf(out + o, len - (size_t)o, "%s %d", shown++ ? "," : "", r);
  if (shown < count) o += util_snprintf(out + o, len - (size_t)o, ", ... %d in all", count);
  util_snprintf(out + o, len - (size_t)o, ")");
}

long err_report(const err_list *e, MPI_Comm comm, int max, const char *outcome) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  /* each rank sends at most `max` kept errors and its whole count */
  int mine = e->n < max ? e->n : max;
  long dropped = err_count(e) - mine;
  int *counts = rank == 0 ? util_malloc((size_t)size * sizeof(int), "error counts") : NULL;
  MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, comm);
  long most_dropped = 0;
  MPI_Reduce(&dropped, &most_dropped, 1, MPI_LONG, MPI_MAX, 0, comm);
  int *bytes = NULL, *displs = NULL, total = 0;
  err_item *all = NULL;
  if (rank == 0) {
    bytes = util_malloc((size_t)size * sizeof(int), "error counts");
    displs = util_malloc((size_t)size * sizeof(int), "error counts");
    for (int r = 0; r < size; r++) {
      bytes[r] = counts[r] * (int)sizeof(err_item);
      displs[r] = total * (int)sizeof(err_item);
      total += counts[r];
    }
    all = util_malloc((size_t)(total ? total : 1) * sizeof(err_item), "errors");
  }
  MPI_Gatherv(e->v, mine * (int)sizeof(err_item), MPI_BYTE, all, bytes, displs, MPI_BYTE, 0, comm);
  long distinct = 0;
  if (rank == 0) {
    /* distinct errors in order of first appearance (rank 0's first), with the ranks that saw each */
    unsigned char *seen = util_calloc((size_t)(total ? total : 1) * (size_t)size, 1, "error ranks");
    int *first = util_malloc((size_t)(total ? total : 1) * sizeof(int), "errors");
    for (int r = 0, i = 0; r < size; r++)
      for (int k = 0; k < counts[r]; k++, i++) {
        long d = 0;
        while (d < distinct && !same_item(&all[first[d]], &all[i])) d++;
        if (d == distinct) first[distinct++] = i;
        seen[(size_t)d * (size_t)size + (size_t)r] = 1;
      }
    char ranks[160];
    for (long d = 0; d < distinct && d < max; d++) {
      ranks_text(seen + (size_t)d * (size_t)size, size, ranks, sizeof ranks);
      print_item(&all[first[d]], ranks);
    }
    long more = (distinct > max ? distinct - max : 0) + most_dropped;
    if (more > 0) fprintf(stderr, "greenlm: ... and %ld more error%s\n", more, more == 1 ? "" : "s");
    distinct += most_dropped;
    if (distinct && outcome) fprintf(stderr, "greenlm: %ld error%s; %s\n", distinct, distinct == 1 ? "" : "s", outcome);
    fflush(stderr);
    free(seen), free(first);
  }
  MPI_Bcast(&distinct, 1, MPI_LONG, 0, comm);
  free(counts), free(bytes), free(displs), free(all);
  return distinct;
}
