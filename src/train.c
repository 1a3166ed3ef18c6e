/* train: the optimizer loop with gradient accumulation, evaluation, progress and the verdict. */
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "data.h"
#include "energy.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "sample.h"
#include "tok.h"
#include "topo.h"
#include "util.h"

typedef struct {
  const cfg_config *cfg;
  const backend *be;
  gpt_shape shape;
  gpt_model model;
  tok_tokenizer tok;
  data_loader data;
  energy_meter energy;
  metrics_out out;
  int B, T, accum;
  double flops_per_token, peak_gflops;
  char engine[256];
  topo_machine machine;
  int32_t *tokens, *targets; /* host (B,T) */
  uint64_t *win;              /* window ids of one step (B * accum) */
} train_state;

/* Mean validation loss over the deck's eval_batches micro-batches. */
static double evaluate(train_state *st) {
  double sum = 0.0;
  long n = st->cfg->training.eval_batches;
  for (long k = 0; k < n; k++) {
    data_val_batch(&st->data, (int)k, st->B, st->tokens, st->targets);
    gpt_set_batch(&st->model, st->tokens, st->targets, st->B, st->T);
    gpt_forward(&st->model, st->B, st->T);
    sum += gpt_loss(&st->model, st->B, st->T, 0.0f);
  }
  return sum / ((double)n * st->B * st->T);
}

/* Refuse to clobber a finished run unless &job overwrite is set. */
static int check_run_dir(const cfg_config *cfg, nml_errors *errs) {
  char path[4096];
  struct stat sb;
  snprintf(path, sizeof path, "%s/metrics.csv", cfg->job.run_dir);
  if (!cfg->job.overwrite && stat(path, &sb) == 0) {
    cfg_error_at(cfg, errs, "job", "run_dir",
                 "choose a new run_dir, or set &job overwrite = .true. (or --set job.overwrite=T) to replace it",
                 "'%s' already holds a run (metrics.csv exists)", cfg->job.run_dir);
    return 1;
  }
  return 0;
}

static int write_resolved_deck(const cfg_config *cfg, const char *header) {
  char path[4096];
  snprintf(path, sizeof path, "%s/deck.resolved.nml", cfg->job.run_dir);
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) return -1;
  cfg_write_deck(cfg, af.fp, header);
  return util_atomic_close(&af);
}

static void print_header(train_state *st) {
  const cfg_config *cfg = st->cfg;
  const gpt_shape *s = &st->shape;
  metrics_out *o = &st->out;
  char b1[32], b2[32], b3[32], b4[32], b5[32];
  size_t n = gpt_count_params(s);
  const gpt_memory *mem = &st->model.mem;
  metrics_printf(o, "== model ==\n");
  metrics_printf(o, "%s: %d layers, n_embd %d, %d heads, vocab %d, block %d, MLP %d; %zu parameters (%.2f M)\n",
                 cfg->model.arch, s->L, s->C, s->H, s->V, s->maxT, s->F, n, (double)n / 1e6);
  metrics_printf(o, "memory: parameters %s, gradients %s, AdamW %s, activations %s; total %s\n",
                 util_fmt_bytes((double)mem->params, b1, sizeof b1), util_fmt_bytes((double)mem->grads, b2, sizeof b2),
                 util_fmt_bytes((double)mem->adam, b3, sizeof b3), util_fmt_bytes((double)mem->acts, b4, sizeof b4),
                 util_fmt_bytes((double)mem->total, b5, sizeof b5));
  metrics_printf(o, "batch: %d sequences x %d tokens per micro-batch, %d micro-batches per step = %ld tokens per step\n",
                 st->B, st->T, st->accum, (long)st->B * st->T * st->accum);
  char mdesc[300];
  metrics_printf(o, "machine: %s\n", topo_describe(&st->machine, mdesc, sizeof mdesc));
  metrics_printf(o, "compute: %s backend, %s\n", st->be->name, st->engine);
  metrics_printf(o, "MFU basis: %.4g GFLOP per token (6N + 12LCT), peak %.1f GFLOP/s per rank (%s)\n",
                 st->flops_per_token / 1e9, st->peak_gflops,
                 cfg->system.peak_gflops > 0 ? "from the deck" : "measured SGEMM");
  metrics_printf(o, "data: %s: %lld tokens (%llu windows of %d+1); %s: %lld tokens; tokenizer %s\n", cfg->data.train,
                 (long long)st->data.train.ntokens, (unsigned long long)st->data.nwin, st->T, cfg->data.val,
                 (long long)st->data.val.ntokens, st->tok.desc);
  metrics_printf(o, "energy: CPU %s (%s)\n", energy_status_name(st->energy.status), st->energy.note);
}

static void fmt_energy(const energy_meter *e, char *w, size_t wl, char *j, size_t jl) {
  if (e->status == ENERGY_NOT_MEASURED) {
    snprintf(w, wl, "-- W");
    snprintf(j, jl, "-- Wh");
  } else {
    const char *tag = e->status == ENERGY_ESTIMATED ? " est" : "";
    snprintf(w, wl, "%.1f W%s", e->watts, tag);
    snprintf(j, jl, "%.3g Wh%s", e->joules / 3600.0, tag);
  }
}

static json_t *verdict_json(const train_state *st, const char *status, long steps, double wall, double train_time,
                            double train_loss, double val_loss, double tokens) {
  const cfg_config *cfg = st->cfg;
  const energy_meter *e = &st->energy;
  double tps = train_time > 0 ? tokens / train_time : 0.0;
  double mfu = st->peak_gflops > 0 ? tps * st->flops_per_token / (st->peak_gflops * 1e9) : 0.0;
  double kwh = e->joules / 3.6e6, fac = kwh * cfg->energy.pue;
  int measured = e->status != ENERGY_NOT_MEASURED;
  json_t *j = json_object();
  json_object_set_new(j, "run", json_string(cfg->job.name));
  json_object_set_new(j, "status", json_string(status));
  json_object_set_new(j, "steps", json_integer(steps));
  json_object_set_new(j, "tokens_trained", json_real(tokens));
  json_object_set_new(j, "duration_s", json_real(wall));
  json_object_set_new(j, "train_time_s", json_real(train_time));
  json_object_set_new(j, "train_loss", isfinite(train_loss) ? json_real(train_loss) : json_null());
  json_object_set_new(j, "val_loss", isfinite(val_loss) ? json_real(val_loss) : json_null());
  json_object_set_new(j, "tokens_per_s", json_real(tps));
  json_object_set_new(j, "mfu", json_real(mfu));
  json_object_set_new(j, "peak_gflops_per_rank", json_real(st->peak_gflops));
  json_object_set_new(j, "flops_per_token", json_real(st->flops_per_token));
  json_object_set_new(j, "flops_total", json_real(st->flops_per_token * tokens));
  json_object_set_new(j, "flops_formula", json_string("6N + 12*L*C*T per token (PaLM), N without wpe"));
  json_object_set_new(j, "n_params", json_integer((json_int_t)gpt_count_params(&st->shape)));
  json_object_set_new(j, "backend", json_string(st->be->name));
  json_object_set_new(j, "engine", json_string(st->engine));
  json_object_set_new(j, "ranks", json_integer(1));
  /* FNV-1a of the final parameter bytes: equal hashes mean bitwise-equal models */
  float *host = util_malloc(st->model.nparams * sizeof(float), "parameter copy");
  st->be->to_host(host, st->model.params, st->model.nparams * sizeof(float));
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx",
           (unsigned long long)util_hash64(host, st->model.nparams * sizeof(float), 0));
  free(host);
  json_object_set_new(j, "param_hash", json_string(hash));
  json_t *en = json_object();
  json_object_set_new(en, "cpu_status", json_string(energy_status_name(e->status)));
  json_object_set_new(en, "cpu_method", json_string(e->method));
  json_object_set_new(en, "note", json_string(e->note));
  json_object_set_new(en, "energy_consumed_kwh", measured ? json_real(kwh) : json_null());
  json_object_set_new(en, "pue", json_real(cfg->energy.pue));
  json_object_set_new(en, "facility_energy_kwh", measured ? json_real(fac) : json_null());
  json_object_set_new(en, "carbon_intensity_g_per_kwh", json_real(cfg->energy.grid_intensity));
  json_object_set_new(en, "emissions_kg", measured ? json_real(fac * cfg->energy.grid_intensity / 1000.0) : json_null());
  json_object_set_new(en, "j_per_token", measured && tokens > 0 ? json_real(e->joules / tokens) : json_null());
  json_object_set_new(j, "energy", en);
  return j;
}

int train_run(const cfg_config *cfg, const backend *be, const char *header) {
  train_state st;
  memset(&st, 0, sizeof st);
  st.cfg = cfg;
  st.be = be;
  int rank = util_rank();
  const cfg_training *tc = &cfg->training;
  st.B = (int)tc->micro_batch_size;
  st.T = (int)tc->seq_len;
  st.accum = (int)(tc->global_batch_size / tc->micro_batch_size);

  /* inputs first: nothing is written before they are known to be good */
  nml_errors errs = {0};
  if (rank == 0) check_run_dir(cfg, &errs);
  char err[2048] = "";
  if (tok_open(&st.tok, cfg->tokenizer.kind, cfg->tokenizer.dir, err, sizeof err) != 0)
    cfg_error_at(cfg, &errs, "tokenizer", "dir", "run the 'tokenizer' task first, or point dir at GPT-2's files", "%s",
                 err);
  else
    data_open(&st.data, cfg, &st.tok, st.T, &errs);
  if (errs.n) {
    if (rank == 0) nml_errors_print(&errs, 20);
    nml_errors_free(&errs);
    return 1;
  }
  if (rank == 0) {
    err[0] = '\0';
    if (metrics_open(&st.out, cfg->job.run_dir, err, sizeof err) != 0 || write_resolved_deck(cfg, header) != 0) {
      if (!err[0]) util_snprintf(err, sizeof err, "cannot write the resolved deck in '%s': %s", cfg->job.run_dir, strerror(errno));
      cfg_error_at(cfg, &errs, "job", "run_dir", "check that the directory is writable and the disk is not full", "%s",
                   err);
      nml_errors_print(&errs, 20);
      nml_errors_free(&errs);
      return 1;
    }
  }
  if (rank == 0) {
    char *echo = NULL;
    size_t elen = 0;
    FILE *fp = open_memstream(&echo, &elen);
    cfg_write_deck(cfg, fp, NULL);
    fclose(fp);
    metrics_log(&st.out, "greenlm %s: deck %s\n== resolved deck ==\n%s", PACKAGE_VERSION, cfg->deck_path, echo);
    free(echo);
  }
  be->set_threads((int)cfg->system.blas_threads);
  be->describe(st.engine, sizeof st.engine);

  gpt_shape_from_cfg(&st.shape, &cfg->model);
  gpt_init(&st.model, &st.shape, be, st.B, st.T, 0, st.shape.L, 1, 1, (uint64_t)cfg->job.seed);
  st.flops_per_token = gpt_flops_per_token(&st.shape, st.T);
  st.peak_gflops = cfg->system.peak_gflops > 0 ? cfg->system.peak_gflops : be->measure_gflops(1024, 0.3);
  topo_discover(&st.machine);
  energy_open(&st.energy, &cfg->energy, st.machine.cores);
  st.tokens = util_malloc((size_t)st.B * st.T * sizeof(int32_t), "batch tokens");
  st.targets = util_malloc((size_t)st.B * st.T * sizeof(int32_t), "batch targets");
  st.win = util_malloc((size_t)st.B * st.accum * sizeof(uint64_t), "step windows");
  if (rank == 0) {
    print_header(&st);
    metrics_printf(&st.out, "== training: %ld steps ==\n", tc->max_steps);
  }

  const double tokens_per_step = (double)st.B * st.T * st.accum;
  const float dscale = (float)(1.0 / tokens_per_step);
  double t_start = util_now(), train_time = 0.0, tokens = 0.0, last_loss = NAN, val_loss = NAN;
  double log_time = 0.0, log_tokens = 0.0; /* since the last progress line */
  long log_steps = 0;
  const char *status = "completed";
  long steps_done = 0;
  int rc = 0;
  for (long step = 0; step < tc->max_steps; step++) {
    double t0 = util_now();
    gpt_zero_grad(&st.model);
    double loss_sum = 0.0;
    data_next_windows(&st.data, (long)st.B * st.accum, st.win);
    for (int k = 0; k < st.accum; k++) {
      data_read_train(&st.data, st.win + (size_t)k * st.B, st.B, st.tokens, st.targets);
      gpt_set_batch(&st.model, st.tokens, st.targets, st.B, st.T);
      gpt_forward(&st.model, st.B, st.T);
      loss_sum += gpt_loss(&st.model, st.B, st.T, dscale);
      gpt_backward(&st.model, st.B, st.T);
    }
    double loss = loss_sum / tokens_per_step;
    double norm = sqrt(optim_grad_sumsq(&st.model));
    double lr = optim_lr(tc, step);
    last_loss = loss;
    if (!isfinite(loss) || !isfinite(norm)) {
      if (rank == 0)
        metrics_printf(&st.out, "greenlm: error: training diverged at step %ld (loss %g, gradient norm %g)\n"
                                "  hint: lower &training lr, raise warmup_steps, or keep grad_clip > 0\n",
                       step + 1, loss, norm);
      status = "diverged";
      rc = 3;
      break;
    }
    optim_adamw_step(&st.model, tc, step, lr, optim_clip_scale(tc, norm));
    be->sync();
    double dt = util_now() - t0;
    steps_done = step + 1;
    train_time += dt;
    tokens += tokens_per_step;
    log_time += dt;
    log_tokens += tokens_per_step;
    log_steps++;

    int last = steps_done == tc->max_steps;
    int out_of_time = !last && tc->max_minutes > 0 && util_now() - t_start >= 60.0 * tc->max_minutes;
    int do_eval = last || out_of_time || (tc->eval_every > 0 && steps_done % tc->eval_every == 0);
    double vl = NAN;
    if (do_eval) vl = val_loss = evaluate(&st);
    if (steps_done % cfg->job.log_every == 0 || do_eval) {
      energy_sample(&st.energy);
      double tps = log_tokens / log_time;
      double mfu = tps * st.flops_per_token / (st.peak_gflops * 1e9);
      double eta = (double)(tc->max_steps - steps_done) * (train_time / (double)steps_done);
      int measured = st.energy.status != ENERGY_NOT_MEASURED;
      if (rank == 0) {
        char w[32], e[32], es[32], vs[48] = "";
        fmt_energy(&st.energy, w, sizeof w, e, sizeof e);
        if (do_eval) snprintf(vs, sizeof vs, " | val %.4f", vl);
        metrics_printf(&st.out, "step %*ld/%ld | loss %.4f%s | lr %.2e | %.0f tok/s | MFU %.1f%% | %s | %s | ETA %s\n",
                       (int)snprintf(NULL, 0, "%ld", tc->max_steps), steps_done, tc->max_steps, loss, vs, lr, tps,
                       100.0 * mfu, w, e, util_fmt_duration(eta, es, sizeof es));
        metrics_row row = {steps_done, loss, lr, norm, 1e3 * log_time / (double)log_steps, tps, mfu, vl,
                           measured ? st.energy.watts : NAN, measured ? st.energy.joules : NAN,
                           energy_status_name(st.energy.status)};
        metrics_csv_row(&st.out, &row);
      }
      log_time = log_tokens = 0.0;
      log_steps = 0;
    }
    if (out_of_time) {
      status = "time_limit";
      if (rank == 0) metrics_printf(&st.out, "stopping: &training max_minutes = %g reached\n", tc->max_minutes);
      break;
    }
  }
  energy_sample(&st.energy);
  double wall = util_now() - t_start;

  if (rank == 0) {
    json_t *v = verdict_json(&st, status, steps_done, wall, train_time, last_loss, val_loss, tokens);
    double tps = json_real_value(json_object_get(v, "tokens_per_s"));
    double mfu = json_real_value(json_object_get(v, "mfu"));
    metrics_printf(&st.out, "== verdict: %s ==\n", status);
    metrics_printf(&st.out, "steps %ld, tokens %.0f, wall %.1f s (training %.1f s)\n", steps_done, tokens, wall,
                   train_time);
    metrics_printf(&st.out, "loss: train %.4f, validation %.4f\n", last_loss, val_loss);
    metrics_printf(&st.out, "figure of merit: %.1f tokens/s, MFU %.1f%% of %.1f GFLOP/s\n", tps, 100.0 * mfu,
                   st.peak_gflops);
    const energy_meter *e = &st.energy;
    if (e->status == ENERGY_NOT_MEASURED) {
      metrics_printf(&st.out, "energy: not measured (%s); CO2e not computed\n", e->note);
    } else {
      double kwh = e->joules / 3.6e6, fac = kwh * cfg->energy.pue;
      metrics_printf(&st.out,
                     "energy (%s, %s): IT %.4g kWh, facility %.4g kWh (PUE %.2f), %.3g J/token; "
                     "CO2e %.4g g at %.0f gCO2e/kWh\n",
                     energy_status_name(e->status), e->method, kwh, fac, cfg->energy.pue,
                     tokens > 0 ? e->joules / tokens : 0.0, fac * cfg->energy.grid_intensity,
                     cfg->energy.grid_intensity);
    }
    if (metrics_write_json(cfg->job.run_dir, "verdict.json", v) != 0)
      metrics_printf(&st.out, "greenlm: warning: could not write %s/verdict.json: %s\n", cfg->job.run_dir,
                     strerror(errno));
    json_decref(v);
  }

  /* sample */
  if (rc == 0 && cfg->sample.n_tokens > 0 && rank == 0) {
    const char *p = cfg->sample.prompt[0] ? cfg->sample.prompt : "\n";
    tok_ids prompt = {0};
    tok_encode(&st.tok, p, strlen(p), 1, &prompt);
    int np = (int)prompt.n, nn = (int)cfg->sample.n_tokens;
    int32_t *ids = util_malloc((size_t)(np + nn) * sizeof(int32_t), "sample");
    sample_generate(&st.model, &cfg->sample, (uint64_t)cfg->job.seed, prompt.v, np, nn, ids);
    char *text = util_malloc((size_t)(np + nn) * (size_t)st.tok.max_len + 1, "sample text");
    size_t len = tok_decode(&st.tok, ids, (size_t)(np + nn), text);
    text[len] = '\0';
    metrics_printf(&st.out, "== sample (%d tokens, temperature %g, top-k %ld) ==\n%s\n", nn, cfg->sample.temperature,
                   cfg->sample.top_k, text);
    char path[4096];
    snprintf(path, sizeof path, "%s/sample.txt", cfg->job.run_dir);
    util_atomic_file af;
    if (util_atomic_open(&af, path) == 0) {
      fwrite(text, 1, len, af.fp);
      util_atomic_close(&af);
    }
    free(text);
    free(ids);
    tok_ids_free(&prompt);
  }

  if (rank == 0) metrics_close(&st.out);
  energy_close(&st.energy);
  free(st.tokens);
  free(st.targets);
  free(st.win);
  gpt_free(&st.model);
  gpt_shape_free(&st.shape);
  data_close(&st.data);
  tok_free(&st.tok);
  return rc;
}
