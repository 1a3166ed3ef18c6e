/* report: evaluation results as a terminal table, eval.json and eval.csv. */
#include "eval/report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "energy/metrics.h"

static const char RUN_DIR_HINT[] = "check that &job run_dir is writable and the disk is not full";

void evalrep_add(evalrep *rep, const char *task, const char *metric, double value, double stderr_, long n) {
  if (rep->nrows == rep->cap) {
    rep->cap = rep->cap ? 2 * rep->cap : 16;
    rep->rows = util_realloc(rep->rows, (size_t)rep->cap * sizeof *rep->rows, "evaluation rows");
  }
  rep->rows[rep->nrows++] =
      (evalrep_row){.task = util_strdup(task), .metric = util_strdup(metric), .value = value, .stderr_ = stderr_, .n = n};
}

void evalrep_add_scores(evalrep *rep, const char *task, const bench_scores *s) {
  if (!isnan(s->acc)) evalrep_add(rep, task, "acc", s->acc, s->acc_stderr, s->n);
  if (!isnan(s->acc_norm)) evalrep_add(rep, task, "acc_norm", s->acc_norm, s->acc_norm_stderr, s->n);
  if (!isnan(s->ppl)) evalrep_add(rep, task, "ppl", s->ppl, NAN, s->n);
}

void evalrep_free(evalrep *rep) {
  for (int i = 0; i < rep->nrows; i++) free(rep->rows[i].task), free(rep->rows[i].metric);
  free(rep->rows);
  memset(rep, 0, sizeof *rep);
}

/* A value for the table: whole numbers without decimals, others with 4; "-" for NaN. */
static const char *fmt_value(double v, char *buf, size_t len) {
  if (isnan(v)) util_snprintf(buf, len, "-");
  else if (v == floor(v) && fabs(v) < 1e15) util_snprintf(buf, len, "%.0f", v);
  else util_snprintf(buf, len, "%.4f", v);
  return buf;
}

void evalrep_print(const evalrep *rep, FILE *out) {
  int wt = (int)strlen("task"), wm = (int)strlen("metric"), wv = (int)strlen("value");
  char buf[64];
  for (int i = 0; i < rep->nrows; i++) {
    const evalrep_row *r = &rep->rows[i];
    int lt = (int)strlen(r->task), lm = (int)strlen(r->metric), lv = (int)strlen(fmt_value(r->value, buf, sizeof buf));
    wt = lt > wt ? lt : wt, wm = lm > wm ? lm : wm, wv = lv > wv ? lv : wv;
  }
  fprintf(out, "%-*s  %-*s  %*s  %-11s  %10s\n", wt, "task", wm, "metric", wv, "value", "± stderr", "n");
  for (int i = 0; i < rep->nrows; i++) {
    const evalrep_row *r = &rep->rows[i];
    char err[32] = "";
    if (!isnan(r->stderr_)) util_snprintf(err, sizeof err, "± %.4f", r->stderr_);
    /* "±" is two bytes for one column: pad by bytes plus one */
    fprintf(out, "%-*s  %-*s  %*s  %-*s  %10ld\n", wt, r->task, wm, r->metric, wv, fmt_value(r->value, buf, sizeof buf),
            err[0] ? 11 : 10, err, r->n);
  }
}

/* A number for JSON: null for NaN or infinity. */
static json_t *json_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *to_json(const evalrep *rep, const evalrep_info *info) {
  json_t *tasks = json_object();
  for (int i = 0; i < rep->nrows; i++) {
    const evalrep_row *r = &rep->rows[i];
    json_t *task = json_object_get(tasks, r->task);
    if (!task) json_object_set_new(tasks, r->task, task = json_object());
    json_object_set_new(task, r->metric,
                        json_pack("{s:o, s:o, s:I}", "value", json_num(r->value), "stderr", json_num(r->stderr_), "n",
                                  (json_int_t)r->n));
  }
  json_t *settings = json_pack("{s:i, s:I, s:I}", "num_fewshot", info->num_fewshot, "limit", (json_int_t)info->limit,
                               "seed", (json_int_t)info->seed);
  return json_pack("{s:s, s:s, s:o, s:o}", "run", info->run_name ? info->run_name : "", "model",
                   info->model ? info->model : "", "settings", settings, "tasks", tasks);
}

/* A CSV field: quoted (quotes doubled) when it holds a comma, a quote or a line break. */
static void csv_field(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\r\n")) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static int write_csv(const evalrep *rep, const char *path) {
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) return -1;
  fputs("task,metric,value,stderr,n\n", af.fp);
  for (int i = 0; i < rep->nrows; i++) {
    const evalrep_row *r = &rep->rows[i];
    csv_field(af.fp, r->task), fputc(',', af.fp), csv_field(af.fp, r->metric), fputc(',', af.fp);
    if (isfinite(r->value)) fprintf(af.fp, "%.10g", r->value);
    fputc(',', af.fp);
    if (isfinite(r->stderr_)) fprintf(af.fp, "%.10g", r->stderr_);
    fprintf(af.fp, ",%ld\n", r->n);
  }
  if (ferror(af.fp)) {
    util_atomic_abort(&af);
    return -1;
  }
  return util_atomic_close(&af);
}

int evalrep_write(const evalrep *rep, const evalrep_info *info, const char *run_dir, err_list *errs) {
  char path[UTIL_PATH_MAX];
  json_t *obj = to_json(rep, info);
  int rc = metrics_write_json(run_dir, "eval.json", obj);
  json_decref(obj);
  util_snprintf(path, sizeof path, "%s/%s", run_dir, rc == 0 ? "eval.csv" : "eval.json");
  if (rc == 0) rc = write_csv(rep, path);
  if (rc != 0) err_add(errs, path, 0, 0, RUN_DIR_HINT, "cannot write: %s", strerror(errno));
  return rc;
}
