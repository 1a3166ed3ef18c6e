/* metrics: what a run tells its user: progress lines on stdout and in log.txt, one metrics.csv
 * row per logging step, and machine-readable JSON files written crash-safely (temporary name,
 * fsync, rename). Only rank 0 calls these. */
#ifndef GREENLM_METRICS_H
#define GREENLM_METRICS_H

#include <jansson.h>
#include <stdio.h>

#include "base/err.h"
#include "base/util.h"

typedef struct {
  FILE *log, *csv;
  int failed; /* a write to log.txt or metrics.csv failed (a full disk) */
} metrics_out;

typedef struct {
  long step;
  double loss, lr, grad_norm, ms_per_step, tokens_per_s, mfu;
  double val_loss; /* NAN when not evaluated at this step */
  double watts, energy_j;
  const char *energy_status;
  double compute, bubble, exchange; /* shares of the ranks' time: passes, waiting for neighbours, gradient exchange */
  double bytes_per_step;            /* payload sent by all ranks (activations, gradients) */
  double grad_bytes_per_step;       /* of which the gradient exchange's */
  double grad_ratio;                /* those bytes over an fp32 exchange's (1 uncompressed; NAN without one) */
  double encode_ms, decode_ms;      /* per rank and step: compressing and decompressing gradients */
  double q_error, q_error_expected; /* relative quantization error, measured and exact (NAN when not measured) */
  double grad_inter_bytes_per_step; /* of the gradient exchange's: to collectives among ranks of several nodes */
} metrics_row;

/* Open log.txt and metrics.csv in run_dir (created when missing); append to them when resuming
 * a run. Returns 0, or -1 after adding an error. */
int metrics_open(metrics_out *mo, const char *run_dir, int append, err_list *errs);
/* Close both; -1 when any write to them failed since they were opened. */
int metrics_close(metrics_out *mo);
/* Print to stdout and append to log.txt (when open). */
void metrics_printf(metrics_out *mo, const char *fmt, ...) UTIL_PRINTF(2, 3);
/* Append to log.txt only (what stdout already showed). */
void metrics_log(metrics_out *mo, const char *fmt, ...) UTIL_PRINTF(2, 3);
void metrics_csv_row(metrics_out *mo, const metrics_row *r);
/* A job of the run's restart chain begins after step `start` (from: the checkpoint it restarted
 * from, "" for none): its row goes to run_dir/jobs.csv (job, started_utc, first_step,
 * restarted_from; appended when resuming, else the file starts anew), and its number in the chain
 * (1 for the first job) is returned, or -1 when the file cannot be written (errno set). */
int metrics_job_begin(const char *run_dir, int resuming, long start, const char *from);
/* After a restart from the checkpoint of step `step` (0: from the start): the step-indexed CSV files of
 * run_dir (metrics.csv, val.csv, bench.csv, windows.csv: the step in the first column) are cut before
 * their first row of a later step, and before a row torn by a kill (no newline), so they hold each
 * step once, as an uninterrupted run's; the rows a killed job wrote after its last checkpoint (work
 * that was lost and is done again) go. One truncation per file, nothing rewritten. Says which files
 * lost rows (stdout and log.txt), and warns where one could not be cut. Rank 0, before the steps. */
void metrics_rewind(metrics_out *mo, const char *run_dir, long step);
/* Write obj as run_dir/name crash-safely. Returns 0 or -1. */
int metrics_write_json(const char *run_dir, const char *name, json_t *obj);

#endif
