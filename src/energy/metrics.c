/* metrics: progress lines, log.txt, metrics.csv and JSON reports. */
#include "energy/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char RUN_DIR_HINT[] = "check that &job run_dir is writable and the disk is not full";
static const char CSV_HEADER[] = "step,loss,lr,grad_norm,ms_per_step,tokens_per_s,mfu,val_loss,watts,energy_j,energy_status,"
                                 "compute,bubble,exchange,bytes_per_step,grad_bytes_per_step,grad_ratio,encode_ms,decode_ms,"
                                 "q_error,q_error_expected,grad_inter_bytes_per_step\n";

int metrics_open(metrics_out *mo, const char *run_dir, int append, err_list *errs) {
  memset(mo, 0, sizeof *mo);
  char path[UTIL_PATH_MAX];
  if (util_mkdir_p(run_dir) != 0) {
    err_add(errs, run_dir, 0, 0, RUN_DIR_HINT, "cannot create the run directory: %s", strerror(errno));
    return -1;
  }
  snprintf(path, sizeof path, "%s/log.txt", run_dir);
  mo->log = fopen(path, append ? "a" : "w");
  snprintf(path, sizeof path, "%s/metrics.csv", run_dir);
  FILE *old = append ? fopen(path, "r") : NULL; /* a header only when the file starts */
  if (old) fclose(old);
  mo->csv = mo->log ? fopen(path, append ? "a" : "w") : NULL;
  if (!mo->log || !mo->csv) {
    err_add(errs, path, 0, 0, RUN_DIR_HINT, "cannot write: %s", strerror(errno));
    metrics_close(mo);
    return -1;
  }
  if (!old) fputs(CSV_HEADER, mo->csv);
  fflush(mo->csv);
  return 0;
}

/* After writing to f: a failed write (a full disk) is remembered for metrics_close. */
static void check_written(metrics_out *mo, FILE *f) {
  if (fflush(f) != 0 || ferror(f)) mo->failed = 1;
}

int metrics_close(metrics_out *mo) {
  if (mo->log && fclose(mo->log) != 0) mo->failed = 1;
  if (mo->csv && fclose(mo->csv) != 0) mo->failed = 1;
  mo->log = mo->csv = NULL;
  return mo->failed ? -1 : 0;
}

void metrics_printf(metrics_out *mo, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (mo && mo->log) {
    va_start(ap, fmt);
    vfprintf(mo->log, fmt, ap);
    va_end(ap);
    check_written(mo, mo->log);
  }
}

void metrics_log(metrics_out *mo, const char *fmt, ...) {
  if (!mo || !mo->log) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(mo->log, fmt, ap);
  va_end(ap);
  check_written(mo, mo->log);
}

void metrics_csv_row(metrics_out *mo, const metrics_row *r) {
  if (!mo->csv) return;
  /* empty fields for values that are not finite (no evaluation this step, no energy sensor) */
  const struct {
    double v;
    const char *fmt;
  } col[] = {{r->loss, "%.6f"},      {r->lr, "%.6e"},  {r->grad_norm, "%.6f"}, {r->ms_per_step, "%.3f"},
             {r->tokens_per_s, "%.1f"}, {r->mfu, "%.5f"}, {r->val_loss, "%.6f"},  {r->watts, "%.2f"},
             {r->energy_j, "%.3f"}};
  fprintf(mo->csv, "%ld", r->step);
  for (size_t i = 0; i < sizeof col / sizeof col[0]; i++) {
    fputc(',', mo->csv);
    if (isfinite(col[i].v)) fprintf(mo->csv, col[i].fmt, col[i].v);
  }
  fprintf(mo->csv, ",%s,%.4f,%.4f,%.4f,%.0f,%.0f,", r->energy_status, r->compute, r->bubble, r->exchange,
          r->bytes_per_step, r->grad_bytes_per_step);
  if (isfinite(r->grad_ratio)) fprintf(mo->csv, "%.5f", r->grad_ratio);
  fprintf(mo->csv, ",%.3f,%.3f,", r->encode_ms, r->decode_ms);
  if (isfinite(r->q_error)) fprintf(mo->csv, "%.6g,%.6g", r->q_error, r->q_error_expected);
  else fputc(',', mo->csv);
  fprintf(mo->csv, ",%.0f\n", r->grad_inter_bytes_per_step);
  check_written(mo, mo->csv);
}

/* The length of the part of file fp to keep: its header line, then its complete rows up to the first
 * of a step after `step`. */
static long kept_length(FILE *fp, long step) {
  char *line = NULL;
  size_t cap = 0;
  long keep = 0;
  ssize_t n;
  for (int header = 1; (n = getline(&line, &cap, fp)) > 0; header = 0) {
    if (line[n - 1] != '\n') break;                      /* torn by a kill in the middle of a write */
    if (!header && strtol(line, NULL, 10) > step) break; /* a row of work done again after the restart */
    keep += (long)n;
  }
  free(line);
  return keep;
}

void metrics_rewind(metrics_out *mo, const char *run_dir, long step) {
  static const char *const files[] = {"metrics.csv", "val.csv", "bench.csv", "windows.csv"};
  char cut[256] = "";
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[UTIL_PATH_MAX];
    util_snprintf(path, sizeof path, "%s/%s", run_dir, files[i]);
    FILE *fp = fopen(path, "r");
    if (!fp) continue; /* not written yet */
    long keep = kept_length(fp, step), size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    fclose(fp);
    if (size <= keep) continue;
    if (truncate(path, (off_t)keep) != 0) {
      fprintf(stderr, "greenlm: warning: %s: cannot drop the rows of the steps after %ld, done again now: %s\n", path,
              step, strerror(errno));
      continue;
    }
    if (keep == 0 && i == 0 && mo->csv) fputs(CSV_HEADER, mo->csv), check_written(mo, mo->csv); /* its header was torn */
    size_t o = strlen(cut);
    util_snprintf(cut + o, sizeof cut - o, "%s%s", o ? ", " : "", files[i]);
  }
  if (cut[0])
    metrics_printf(mo, "restart: %s: the rows of steps after %ld dropped (a job stopped without a checkpoint of "
                   "them; they are done again)\n", cut, step);
}

int metrics_write_json(const char *run_dir, const char *name, json_t *obj) {
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/%s", run_dir, name);
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) return -1;
  if (json_dumpf(obj, af.fp, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) != 0 || fputc('\n', af.fp) == EOF) {
    util_atomic_abort(&af);
    return -1;
  }
  return util_atomic_close(&af);
}

/* The data rows of a CSV file with a header: its lines but the first (0 when it cannot be read). */
static int csv_rows(const char *path) {
  FILE *fp = fopen(path, "r");
  if (!fp) return 0;
  int lines = 0;
  for (int c, at_start = 1; (c = fgetc(fp)) != EOF; at_start = c == '\n') lines += at_start;
  fclose(fp);
  return lines > 1 ? lines - 1 : 0;
}

int metrics_job_begin(const char *run_dir, int resuming, long start, const char *from) {
  char path[UTIL_PATH_MAX], when[64];
  util_snprintf(path, sizeof path, "%s/jobs.csv", run_dir);
  int before = resuming ? csv_rows(path) : 0;
  FILE *fp = fopen(path, before ? "a" : "w");
  if (!fp) return -1;
  time_t now = time(NULL);
  struct tm utc;
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &utc));
  if (!before) fprintf(fp, "job,started_utc,first_step,restarted_from\n");
  fprintf(fp, "%d,%s,%ld,\"", before + 1, when, start + 1);
  for (const char *c = from; *c; c++) { /* a quoted CSV field: quotes doubled */
    if (*c == '"') fputc('"', fp);
    fputc(*c, fp);
  }
  fprintf(fp, "\"\n");
  return fclose(fp) == 0 ? before + 1 : -1;
}
