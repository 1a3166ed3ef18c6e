/* util: errors with place and hint, checked allocation, clocks, small string helpers.
 *
 * Fatal errors go through util_fatal(): it prints "greenlm: error: <where>: <what>" with the
 * source file and line, the MPI rank, an optional hint, and ends the job with one MPI_Abort.
 * Errors in user input (decks, data files) that every rank detects identically are reported by
 * the caller and end with util_exit_all() instead, so no rank is killed mid-write. */
#ifndef GREENLM_UTIL_H
#define GREENLM_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "base/err.h"

#if defined(__GNUC__)
#define UTIL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define UTIL_NORETURN __attribute__((noreturn))
#else
#define UTIL_PRINTF(a, b)
#define UTIL_NORETURN
#endif

/* Room for a path in greenlm's buffers (longer paths are refused where they are read). */
enum { UTIL_PATH_MAX = 4096 };

/* Fatal error with a hint (hint may be NULL). Never returns. */
void util_fatal_at(const char *file, int line, const char *hint, const char *fmt, ...)
    UTIL_PRINTF(4, 5) UTIL_NORETURN;
#define UTIL_FATAL(hint, ...) util_fatal_at(__FILE__, __LINE__, (hint), __VA_ARGS__)

/* CHECK(cond, hint, fmt, ...): fatal with place, rank and hint when cond is false. */
#define UTIL_CHECK(cond, hint, ...)                                                                \
  do {                                                                                             \
    if (!(cond)) util_fatal_at(__FILE__, __LINE__, (hint), __VA_ARGS__);                           \
  } while (0)

/* MPI_Init_thread asking for MPI_THREAD_MULTIPLE: the watchdog's thread exchanges heartbeats
 * while the main thread computes (watchdog.h); greenlm's other threads (the energy sampler, the
 * checkpoint readers) and OpenBLAS's make no MPI calls. */
void util_mpi_init(int *argc, char ***argv);

/* Rank of this process in MPI_COMM_WORLD (0 before MPI_Init). */
int util_rank(void);
void util_set_rank(int rank);

/* End the whole job at once with status (MPI_Abort), after flushing this rank's output. */
void util_abort(int status) UTIL_NORETURN;

/* Quiet all ranks' MPI and leave with the given status (for errors every rank saw). */
void util_exit_all(int status) UTIL_NORETURN;

/* Allocation that cannot fail silently; 64-byte aligned where it matters. */
void *util_malloc(size_t bytes, const char *what);
void *util_calloc(size_t n, size_t size, const char *what);
void *util_realloc(void *p, size_t bytes, const char *what);
void *util_aligned_alloc(size_t bytes, const char *what);
char *util_strdup(const char *s);

/* Wall clock in seconds (monotonic). */
double util_now(void);
/* Process CPU time (user + system) in seconds. */
double util_cpu_seconds(void);
/* Peak resident memory of this process so far, bytes (getrusage). */
double util_peak_rss(void);

/* Start of piece r of n things cut into k nearly equal pieces (the longest one element longer than the
 * shortest): piece r is [util_piece(n, k, r), util_piece(n, k, r + 1)). */
static inline size_t util_piece(size_t n, int k, int r) { return n * (size_t)r / (size_t)k; }

/* Case-insensitive string compare and bounded copy. */
int util_strieq(const char *a, const char *b);
void util_strlcpy(char *dst, const char *src, size_t size);
/* Levenshtein distance between two short strings, case-insensitive. */
int util_edit_distance(const char *a, const char *b);

/* What a path that is not a regular file is ("a directory", "a FIFO (named pipe)", "a character
 * device", "a block device", "a socket", "a symbolic link loop"...), or NULL for a regular file. */
const char *util_file_kind(mode_t mode);
/* Open a regular file for reading without blocking on what is not one (a FIFO's open would wait
 * for a writer): returns the descriptor (close-on-exec), or -1 after adding the error at path
 * ("cannot open the <what>: <reason>", or "<path> is a directory, not a <what> file"). */
int util_open_regular(const char *path, const char *what, const char *hint, err_list *errs);
/* The same check for a path a library opens itself (PnetCDF, jansson, zlib): 0 when path is a
 * regular file (or a symbolic link to one), else -1 after adding the error. */
int util_check_regular(const char *path, const char *what, const char *hint, err_list *errs);

/* Read a whole file of at most max bytes into a NUL-terminated buffer (*len: its length, NUL
 * bytes in it included). Returns NULL after adding an error at the file (`what` names its kind in
 * the message: "deck"). */
char *util_read_file(const char *path, size_t max, size_t *len, const char *what, const char *hint, err_list *errs);
/* The first line of a small file (a sysfs attribute) into buf, without its newline; 0, or -1 when
 * it cannot be read. */
int util_read_line(const char *path, char *buf, size_t len);

/* Crash-safe file writing: data go to "<path>.tmp", which util_atomic_close() fsyncs and renames
 * over <path>. util_atomic_abort() removes the temporary file and leaves <path> untouched. */
typedef struct {
  FILE *fp;
  char *path;
  char *tmp;
} util_atomic_file;
int util_atomic_open(util_atomic_file *af, const char *path);
int util_atomic_close(util_atomic_file *af);
void util_atomic_abort(util_atomic_file *af);

/* Rename tmp (written and synced) over path, and sync the directory so that the new name survives
 * a crash. 0, or -1 with errno. */
int util_commit(const char *tmp, const char *path);
/* mkdir -p of a directory, or of the directory a file path is in; 0, or -1 with errno set. */
int util_mkdir_p(const char *path);
int util_mkdir_parent(const char *path);

/* snprintf for text that may be cut to fit (names in messages): same behaviour, no truncation
 * warnings. */
int util_snprintf(char *buf, size_t len, const char *fmt, ...) UTIL_PRINTF(3, 4);

/* Human-readable byte count ("1.23 GiB") into buf. */
const char *util_fmt_bytes(double bytes, char *buf, size_t len);
/* Seconds as "1h02m" / "3m20s" / "12.3s" into buf. */
const char *util_fmt_duration(double s, char *buf, size_t len);

/* FNV-1a 64-bit hash, for config agreement checks and stream seeding. */
uint64_t util_hash64(const void *data, size_t len, uint64_t seed);
/* util_hash64(a || b, 0) from h = util_hash64(a, 0) and b: a hash over a stream, piece by piece
 * (h = UTIL_HASH64_EMPTY before the first piece). */
#define UTIL_HASH64_EMPTY 1469598103934665603ULL
uint64_t util_hash64_more(uint64_t h, const void *data, size_t len);

#endif
