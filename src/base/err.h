/* err: the one way greenlm reports errors. An error has a place (a file with its line and column,
 * a deck key's place, a command-line option, or none), what is wrong, and a hint. Modules add
 * errors to a list they are given and return; the program reports the list once, collectively:
 * every rank's errors are gathered to rank 0, repeats merged (naming the ranks when only some of
 * them saw an error), and printed there in the form editors read:
 *
 *   input/mine.nml:4:3: error: &model: unknown key 'n_layers'; did you mean 'n_layer'?
 *     hint: keys of &model: arch vocab_size block_size n_layer n_embd n_head ...
 *
 * Internal errors (a broken invariant, memory exhausted) cannot wait for the other ranks: they go
 * through util_fatal (util.h), which prints the same form and ends the job with one MPI_Abort.
 *
 * The one convention for "failed, errors added": a function given an err_list returns 0 when it
 * added none and non-zero when it failed (it added errors, or for a collective function some rank
 * did: then the same non-zero value on every rank). Callers test the result against 0 only, never
 * its value, which a function may make an error count. A task returns an exit status instead
 * (ERR_EXIT_*, the one table of them). */
#ifndef GREENLM_ERR_H
#define GREENLM_ERR_H

/* CUDA translation units (gpu/) are compiled without MPI's headers (GREENLM_NO_MPI): they use
 * the error list but never report it collectively. */
#ifndef GREENLM_NO_MPI
#include <mpi.h>
#endif
#include <stddef.h>

#if defined(__GNUC__)
#define ERR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ERR_PRINTF(a, b)
#endif

/* greenlm's exit statuses (doc/reference.md, "Exit statuses"). */
enum {
  ERR_EXIT_OK = 0,        /* the tasks ran (training completed, or stopped in time with a checkpoint) */
  ERR_EXIT_BAD_INPUT = 1, /* the deck, the environment or the data: the errors say what; nothing was trained */
  ERR_EXIT_USAGE = 2,     /* a bad command line */
  ERR_EXIT_DIVERGED = 3,  /* training diverged: the loss or the gradient norm stopped being finite */
  ERR_EXIT_IO_FAILED = 4, /* a checkpoint or a run file could not be written (the older checkpoints stay) */
  ERR_EXIT_WATCHDOG = 5   /* no rank made progress for &job step_timeout seconds */
};

/* A list keeps the first ERR_KEEP errors whole and counts the rest, so a deck of a million bad
 * lines costs no more memory than one of a hundred. */
enum { ERR_KEEP = 100 };

typedef struct {
  char file[1024]; /* the place: a path, "--set group.key=value", ...; "" for none */
  int line, col;  /* 0 when the error has no line (col 0: no column) */
  char msg[640];
  char hint[384];
} err_item;

typedef struct {
  err_item *v;
  int n, cap;
  long dropped; /* errors counted beyond ERR_KEEP */
} err_list;

/* Append an error; file and hint may be NULL. Long texts are cut at a word with "...", never in
 * the middle of the reason: keep the reason before the quoted material. */
void err_add(err_list *e, const char *file, int line, int col, const char *hint, const char *fmt, ...)
    ERR_PRINTF(6, 7);
/* Errors in the list: kept and counted. */
long err_count(const err_list *e);
void err_free(err_list *e);

/* Print up to max errors to stderr, then "... and N more errors". Not collective. */
void err_print(const err_list *e, int max);

/* Collective over comm: gather every rank's errors to comm rank 0, merge repeats (an error not
 * seen by every rank names the ranks that saw it), print up to max there, then the line
 * "greenlm: N error(s); <outcome>" when outcome is not NULL. Returns the number of distinct errors,
 * the same on every rank (0: nothing printed). */
#ifndef GREENLM_NO_MPI
long err_report(const err_list *e, MPI_Comm comm, int max, const char *outcome);
#endif

/* Cut text to fit len bytes at a word boundary with "..." (for quoting user material in
 * messages). Returns out. */
char *err_quote(char *out, size_t len, const char *text, size_t textlen);

#endif
