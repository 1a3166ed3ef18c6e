/* plan_task: the 'plan' task: the table of layouts, the recommendation, plan.json. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "energy/energy.h"
#include "energy/metrics.h"
#include "parallel/backends.h"
#include "plan/plan.h"

enum { TABLE_ROWS = 12 };

/* A duration: days past two of them, else hours and minutes. */
static const char *fmt_duration(double s, char *buf, size_t len) {
  if (s >= 2 * 86400.0) util_snprintf(buf, len, "%.1f days", s / 86400.0);
  else util_fmt_duration(s, buf, len);
  return buf;
}

static void print_row(const plan_layout *l, int mark) {
  char mem[32], dur[32];
  printf("%c %4d %3d %4d %3d %5d %4d %9s %-9s %10s %5s %9.4g %10.4g %5.1f%% %10s %9.4g %9.4g\n", mark ? '*' : ' ', l->P, l->tp,
         l->D, l->B,
         l->m, l->zero, l->recompute ? "yes" : "no", l->P > 1 && l->D > 1 ? (l->stages_adjacent ? "stages" : "replicas") : "-",
         util_fmt_bytes(l->mem, mem, sizeof mem), l->fits ? "yes" : "no", l->t_step, l->tokens_per_s, 100 * l->mfu,
         fmt_duration(l->seconds, dur, sizeof dur), l->kwh[1] / 1e3, l->co2_kg[1] / 1e3);
}

static int by_time(const void *a, const void *b) {
  const plan_layout *x = a, *y = b;
  if (x->fits != y->fits) return y->fits - x->fits;
  return x->fits ? (x->t_step > y->t_step) - (x->t_step < y->t_step) : (x->mem > y->mem) - (x->mem < y->mem);
}

/* The layouts that fit, fastest first (else the smallest), at most TABLE_ROWS of them. */
static void print_table(const plan_result *r) {
  int fit = 0;
  for (int i = 0; i < r->n; i++) fit += r->v[i].fits;
  char mem[32];
  printf("layouts: %d planned, %d fit in %s per rank; %s:\n", r->n, fit, util_fmt_bytes(r->mach.memory, mem, sizeof mem),
         fit ? "the fastest" : "none fits, the smallest");
  printf("  %4s %3s %4s %3s %5s %4s %9s %-9s %10s %5s %9s %10s %6s %10s %9s %9s\n", "P", "tp", "D", "B", "m", "ZeRO", "recompute",
         "adjacent", "mem/rank", "fits", "step s", "tokens/s", "MFU", "duration", "MWh", "tCO2e");
  plan_layout *v = util_malloc((size_t)r->n * sizeof *v, "layouts");
  memcpy(v, r->v, (size_t)r->n * sizeof *v);
  qsort(v, (size_t)r->n, sizeof *v, by_time);
  for (int i = 0; i < r->n && i < TABLE_ROWS; i++) print_row(&v[i], r->best >= 0 && !memcmp(&v[i], &r->v[r->best], sizeof *v));
  free(v);
}

/* The fastest layout that fits for each tensor-rank count tp (tp = 1: pipeline stages and replicas only). */
static void print_by_tp(const plan_result *r) {
  int tps[64];
  const int n = plan_tp_values(r, tps, 64);
  printf("the fastest that fits for each tp (tensor ranks per stage):\n");
  for (int i = 0; i < n; i++) {
    int b = plan_fastest(r, tps[i]);
    if (b >= 0) print_row(&r->v[b], b == r->best);
    else printf("  %4s %3d   none fits\n", "-", tps[i]);
  }
}

/* The deck's own layout: its row, and a line of key=value pairs for scripts (run/calibrate). */
static void print_deck(const plan_result *r) {
  if (!r->has_deck) {
    printf("the deck's layout: not one of %d ranks (&parallel pipeline_stages, &training micro_batch_size, "
           "global_batch_size)\n", r->mach.ranks);
    return;
  }
  const plan_layout *l = &r->deck;
  printf("the deck's layout:\n");
  print_row(l, 0);
  printf("result: P=%d tp=%d D=%d B=%d m=%d zero=%d recompute=%d stages_adjacent=%d memory_bytes=%.0f planned_bytes=%.0f "
         "fits=%d step_s=%.6g compute_s=%.6g bubble_s=%.6g tensor_allreduce_s=%.6g pipeline_transfer_s=%.6g "
         "replica_exchange_s=%.6g embedding_exchange_s=%.6g optimizer_s=%.6g tokens_per_s=%.6g peak_flops=%.6g\n", l->P,
         l->tp, l->D, l->B, l->m, l->zero, l->recompute, l->stages_adjacent, l->mem, l->mem_planned, l->fits, l->t_step,
         l->t_compute, l->t_bubble, l->t_tp, l->t_p2p, l->t_dp, l->t_embed, l->t_opt, l->tokens_per_s, r->mach.peak);
}

/* The recommendation, its run, and the published footprints beside it. */
static void print_verdict(const plan_result *r) {
  char lines[512], dur[32], mem[32];
  const plan_layout *b = r->best >= 0 ? &r->v[r->best] : NULL;
  if (!b) {
    const plan_layout *s = &r->v[0];
    for (int i = 1; i < r->n; i++)
      if (r->v[i].mem < s->mem) s = &r->v[i];
    printf("nothing fits: the smallest layout needs %s per rank against %s, with recomputation, ZeRO-1, the most "
           "stages and the smallest micro-batch tried\n", util_fmt_bytes(s->mem, mem, sizeof mem),
           util_fmt_bytes(r->mach.memory, lines, sizeof lines));
    if (!r->nodes_needed) {
      printf("what would: no layout fits even on %d nodes (%d ranks); a device with more memory (&machine device)\n",
             r->nodes_tried, r->nodes_tried * r->mach.per_node);
      return;
    }
    printf("what would: %d nodes (%d ranks), with\n%s\n", r->nodes_needed, r->nodes_needed * r->mach.per_node,
           plan_deck_lines(r, &r->alt, lines, sizeof lines));
    b = &r->alt;
  } else {
    printf("recommended (the fastest that fits, marked *):\n%s\n", plan_deck_lines(r, b, lines, sizeof lines));
  }
  printf("recommended: nodes=%d ranks=%d P=%d tp=%d D=%d B=%d m=%d zero=%d recompute=%d stages_adjacent=%d\n",
         r->best >= 0 ? r->mach.nodes : r->nodes_needed, b->P * b->tp * b->D, b->P, b->tp, b->D, b->B, b->m, b->zero,
         b->recompute, b->stages_adjacent);
  printf("predicted: %.4g tokens/s, MFU %.1f%%, %s for %.4g tokens (%.0f per parameter); peak memory %s per rank\n",
         b->tokens_per_s, 100 * b->mfu, fmt_duration(b->seconds, dur, sizeof dur), r->mach.tokens,
         r->mach.tokens / r->nparams, util_fmt_bytes(b->mem, mem, sizeof mem));
  printf("energy: %.4g MWh (%.4g-%.4g) with PUE %.2f; %.4g tCO2e (%.4g-%.4g) at %.0f gCO2e/kWh (estimates: time +-20%%, "
         "power 60-100%% of the boards')\n", b->kwh[1] / 1e3, b->kwh[0] / 1e3, b->kwh[2] / 1e3, r->mach.pue,
         b->co2_kg[1] / 1e3, b->co2_kg[0] / 1e3, b->co2_kg[2] / 1e3, r->mach.intensity);
  int nref;
  const energy_reference *ref = energy_references(&nref);
  printf("per training FLOP: this plan %.3g pJ;", b->kwh[1] * 3.6e6 / (r->flops_per_token * r->mach.tokens) * 1e12);
  for (int i = 0; i < nref; i++)
    printf("%s %s %.3g pJ (%.4g MWh)", i ? "," : "", ref[i].model, ref[i].mwh * 3.6e9 / ref[i].flops * 1e12, ref[i].mwh);
  printf("\n");
}

static json_t *layout_json(const plan_layout *l) {
  json_t *o = json_pack("{si si si si si si sb sb sf sf sb}", "pipeline_stages", l->P, "tensor_parallel", l->tp,
                        "data_parallel", l->D, "micro_batch_size", l->B, "micro_batches", l->m, "zero_stage", l->zero,
                        "recompute", l->recompute, "stages_adjacent", l->stages_adjacent, "memory_bytes", l->mem,
                        "planned_bytes", l->mem_planned, "fits", l->fits);
  json_object_update_new(o, json_pack("{sf sf sf sf sf sf sf sf sf sf sf}", "compute_s", l->t_compute, "bubble_s",
                                      l->t_bubble, "tensor_allreduce_s", l->t_tp, "pipeline_transfer_s", l->t_p2p,
                                      "replica_exchange_s", l->t_dp, "embedding_exchange_s", l->t_embed, "optimizer_s",
                                      l->t_opt, "step_s", l->t_step, "tokens_per_s", l->tokens_per_s, "mfu", l->mfu,
                                      "seconds", l->seconds));
  json_object_set_new(o, "facility_kwh", json_pack("[fff]", l->kwh[0], l->kwh[1], l->kwh[2]));
  json_object_set_new(o, "co2e_kg", json_pack("[fff]", l->co2_kg[0], l->co2_kg[1], l->co2_kg[2]));
  return o;
}

static json_t *plan_json(const plan_result *r) {
  const machine_plan *m = &r->mach;
  char lines[512];
  json_t *j = json_pack("{sf sf si si}", "parameters", r->nparams, "flops_per_token", r->flops_per_token, "seq_len", r->T,
                        "global_batch_size", (int)r->G);
  json_object_set_new(j, "machine", json_pack("{ss si si si sf sf sf sf sf sf sf sf sf sf sf sf sf ss ss ss}", "device",
                                              m->dev->name, "nodes", m->nodes, "per_node", m->per_node, "ranks", m->ranks,
                                              "peak_flops", m->peak, "efficiency", m->efficiency, "memory_bytes", m->memory,
                                              "memory_bps", m->memory_bw, "intra_bps", m->intra_bw, "intra_latency_s",
                                              m->intra_lat, "inter_bps", m->inter_bw, "inter_latency_s", m->inter_lat,
                                              "device_w", m->device_w, "host_w", m->host_w, "pue", m->pue,
                                              "g_co2e_per_kwh", m->intensity, "tokens", m->tokens, "peak_from", m->peak_from,
                                              "efficiency_from", m->eff_from, "source", m->source));
  json_t *a = json_array();
  for (int i = 0; i < r->n; i++) json_array_append_new(a, layout_json(&r->v[i]));
  json_object_set_new(j, "layouts", a);
  json_t *by = json_array(); /* the fastest that fits for each tp, ascending */
  int tps[64];
  for (int i = 0, n = plan_tp_values(r, tps, 64); i < n; i++) {
    int k = plan_fastest(r, tps[i]);
    json_t *l = k >= 0 ? layout_json(&r->v[k]) : json_null();
    json_array_append_new(by, json_pack("{si so}", "tensor_parallel", tps[i], "layout", l));
  }
  json_object_set_new(j, "fastest_by_tensor_parallel", by);
  const plan_layout *b = r->best >= 0 ? &r->v[r->best] : r->nodes_needed ? &r->alt : NULL;
  json_object_set_new(j, "recommended", b ? layout_json(b) : json_null());
  json_object_set_new(j, "deck_layout", r->has_deck ? layout_json(&r->deck) : json_null());
  json_object_set_new(j, "recommended_nodes", json_integer(r->best >= 0 ? m->nodes : r->nodes_needed));
  json_object_set_new(j, "deck_lines", b ? json_string(plan_deck_lines(r, b, lines, sizeof lines)) : json_null());
  return j;
}

/* The backend whose memory plan (and, for CPU ranks, GEMM) the plan uses: the CPU's for
 * &machine device = 'cpu', else the deck's as the dry run opens it (no device is touched). */
static const backend *plan_backend(const cfg_config *cfg) {
  if (strcmp(cfg->machine.device, "cpu") != 0) return backends_plan(cfg);
  cfg_config *c = util_malloc(sizeof *c, "deck copy");
  *c = *cfg;
  util_strlcpy(c->system.backend, "cpu", sizeof c->system.backend);
  const backend *be = backends_plan(c);
  free(c);
  return be;
}

int plan_run(const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  int rank, rc = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    const backend *be = plan_backend(cfg);
    plan_result r;
    rc = plan_make(&r, cfg, be, stdout, errs) != 0;
    if (!rc) {
      char desc[2048];
      printf("plan: %.4g parameters, seq_len %d, %ld sequences per step (%.4g tokens), %.4g FLOPs per token\n%s\n", r.nparams,
             r.T, r.G, (double)r.G * r.T, r.flops_per_token, machine_describe(&r.mach, desc, sizeof desc));
      print_table(&r);
      print_by_tp(&r);
      print_deck(&r);
      print_verdict(&r);
      json_t *j = plan_json(&r);
      if (util_mkdir_p(cfg->job.run_dir) != 0 || metrics_write_json(cfg->job.run_dir, "plan.json", j) != 0) {
        err_add(errs, cfg->job.run_dir, 0, 0, "check that &job run_dir is writable", "cannot write plan.json");
        rc = 1;
      } else {
        printf("plan.json: %s/plan.json\n", cfg->job.run_dir);
      }
      json_decref(j);
    }
    plan_free(&r);
    backend_close(be);
    fflush(stdout);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  return rc;
}
