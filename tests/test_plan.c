/* test_plan: the planner's predictions against the formulas of doc/planning.md computed here
 * independently, its choice, what it says when nothing fits, and its errors. */
#include <mpi.h>

#include "testing.h"
#include "base/util.h"
#include "parallel/backends.h"
#include "model/gpt.h"
#include "parallel/par.h"
#include "plan/plan.h"
#include "trainer.h"

/* A model of 4 layers on one node of 2 "cores" whose every figure is given. */
static const char DECK[] =
    "&job task = 'plan' /\n"
    "&model vocab_size = 256, block_size = 32, n_layer = 4, n_embd = 64, n_head = 4 /\n"
    "&training seq_len = 32, micro_batch_size = 2, global_batch_size = 8 /\n"
    "&machine device = 'cpu', nodes = 1, devices_per_node = 2, memory_gb = 1, peak_tflops = 0.1, efficiency = 0.5,\n"
    "  memory_gbs = 10, intra_gbs = 1, intra_latency_us = 1, overhead_gb = 0.1, device_watts = 10, host_watts = 5,\n"
    "  tokens = 1e9 /\n"
    "&energy pue = 1.5, grid_intensity = 100 /\n";

static cfg_config *load(const char *text, const char *const *sets, int nsets) {
  cfg_config *c = calloc(1, sizeof *c);
  err_list e = {0};
  int bad = cfg_load(c, text, strlen(text), "test_plan", (char *const *)sets, nsets, &e);
  if (bad) err_print(&e, 10);
  T_CHECK(bad == 0, "deck rejected");
  err_free(&e);
  return c;
}

static const plan_layout *find_tp(const plan_result *r, int P, int T, int D, int B, int zero, int rc, int order) {
  for (int i = 0; i < r->n; i++) {
    const plan_layout *l = &r->v[i];
    if (l->P == P && l->tp == T && l->D == D && l->B == B && l->zero == zero && l->recompute == rc &&
        l->stages_adjacent == order)
      return l;
  }
  return NULL;
}

/* A layout without tensor parallelism. */
static const plan_layout *find(const plan_result *r, int P, int D, int B, int zero, int rc, int order) {
  return find_tp(r, P, 1, D, B, zero, rc, order);
}

/* The plan of cfg, which must succeed. */
static void plan_of(plan_result *r, const cfg_config *cfg, const backend *be) {
  err_list e = {0};
  T_CHECK(plan_make(r, cfg, be, NULL, &e) == 0, "plan_make failed");
  err_print(&e, 10);
  err_free(&e);
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) + 1e-15; }

/* FLOPs per token of the whole model, fwd + bwd: 6 x the blocks' and the head's weights plus the
 * attention over T (GPT-Neo's 256-token windows exceed T = 32 here). */
static double model_cost(double L, double C, double V, double T) {
  return L * (6.0 * (4 * C * C + 2 * C * 4 * C) + 12.0 * C * T) + 6.0 * V * C;
}

/* One replica: 2 x ... on a 1 x 2 node by hand: the passes, the exchange, the optimizer, energy. */
static void check_data_parallel(const cfg_config *cfg, const backend *be) {
  plan_result r;
  plan_of(&r, cfg, be);
  const plan_layout *l = find(&r, 1, 2, 2, 0, 0, 0);
  T_CHECK(l != NULL, "layout 1 x 2, B 2 missing among %d", r.n);
  if (!l) return plan_free(&r);
  const double N = (double)r.nparams, peak = 0.1e12 * 0.5, T = 32, m = 2, B = 2;
  const double t_s = B * T * model_cost(4, 64, 256, T) / peak;
  T_CHECK(l->m == 2 && near(l->t_compute, m * t_s) && l->t_bubble == 0, "compute %.9g s, want %.9g", l->t_compute, m * t_s);
  const double bytes = N * 4, ring = 2.0 * (2 - 1) / 2 * bytes / 1e9 + 2.0 * 1 * 1e-6; /* one bucket: all of it exposed */
  T_CHECK(near(l->t_dp, ring), "replica exchange %.9g s, want %.9g", l->t_dp, ring);
  T_CHECK(near(l->t_opt, N * 28 / 10e9), "optimizer %.9g s, want %.9g", l->t_opt, N * 28 / 10e9);
  const double step = m * t_s + ring + N * 28 / 10e9;
  T_CHECK(near(l->t_step, step), "step %.9g s, want %.9g", l->t_step, step);
  T_CHECK(near(l->tokens_per_s, 8 * T / step), "tokens/s %.9g", l->tokens_per_s);
  const double secs = 1e9 / (8 * T / step), kwh = (2 * 10 * 0.8 + 5) * secs * 1.5 / 3.6e6;
  T_CHECK(near(l->seconds, secs) && near(l->kwh[1], kwh) && near(l->co2_kg[1], kwh * 0.1), "energy %.9g kWh, want %.9g",
          l->kwh[1], kwh);
  T_CHECK(l->kwh[0] < l->kwh[1] && l->kwh[1] < l->kwh[2], "energy range %.4g-%.4g-%.4g", l->kwh[0], l->kwh[1], l->kwh[2]);
  /* memory: the dry run's plan of the fullest rank plus, on a CPU rank, MPI's temporaries of the largest
   * bucket (the tied embedding's 256 x 64 are a bucket alone, the other N - 16384 parameters the largest;
   * an Iallreduce: half of it with MPICH, all of it with Open MPI), plus the overhead */
  cfg_config *c = malloc(sizeof *c);
  *c = *cfg;
  c->parallel.pipeline_stages = 1, c->parallel.data_parallel = 2, c->parallel.micro_batches = 2;
  par_layout lay;
  par_plan(&lay, c, 2, 0);
  trainer_memory tm = trainer_plan_memory(c, be, &lay, 0, 0);
  double mem = (double)tm.total;
#if defined(MPICH_VERSION)
  const double mpi = (N - 256 * 64) * 4 / 2;
#else
  const double mpi = (N - 256 * 64) * 4;
#endif
  T_CHECK(near((double)tm.mpi, mpi), "MPI's temporaries %zu bytes, want %.0f", tm.mpi, mpi);
  T_CHECK(near(l->mem_planned, mem) && near(l->mem, mem + mpi + 0.1e9), "memory %.0f (%.0f in all), want %.0f + %.0f + overhead",
          l->mem_planned, l->mem, mem, mpi);
  par_free(&lay);
  free(c);
  plan_free(&r);
}

/* Two stages: the busiest stage's m passes and one pass of the other (1F1B); the transfers of the warm-up and
 * cool-down; the tied embedding's exchange. The best layout is the fastest that fits. */
static void check_pipeline(const cfg_config *cfg, const backend *be) {
  plan_result r;
  err_list e = {0};
  plan_make(&r, cfg, be, NULL, &e);
  err_free(&e);
  const plan_layout *l = find(&r, 2, 1, 2, 0, 0, 0);
  T_CHECK(l != NULL, "layout 2 x 1 missing");
  if (l) {
    /* the split {2 blocks}, {2 blocks + head}: m passes of the second, one of the first */
    const double C = 64, T = 32, block = 6.0 * (4 * C * C + 2 * C * 4 * C) + 12.0 * C * T, head = 6.0 * 256 * C;
    const double pass = 2 * T / (0.1e12 * 0.5);
    T_CHECK(l->m == 4 && near(l->t_compute, 4 * pass * (2 * block + head)) && near(l->t_bubble, pass * 2 * block),
            "compute %.9g s (want %.9g), bubble %.9g s (want %.9g)", l->t_compute, 4 * pass * (2 * block + head), l->t_bubble,
            pass * 2 * block);
    const double p2p = 2 * (1e-6 + 2 * 32 * 64 * 4 / 1e9), emb = 1e-6 + 256 * 64 * 4 / 1e9;
    T_CHECK(near(l->t_p2p, p2p) && near(l->t_embed, emb), "transfers %.9g s (want %.9g), embedding %.9g s (want %.9g)",
            l->t_p2p, p2p, l->t_embed, emb);
  }
  T_CHECK(r.best >= 0, "nothing recommended");
  for (int i = 0; r.best >= 0 && i < r.n; i++)
    T_CHECK(!r.v[i].fits || r.v[i].t_step >= r.v[r.best].t_step * (1 - 1e-12), "layout %d is faster than the best", i);
  plan_free(&r);
}

/* Two tensor ranks on the node's two cores, by hand: the passes' FLOPs halved, the 4 sums per
 * block (5 with recomputation) and the embedding's and the head's, each a ring all-reduce of B T C
 * fp32 between the two ranks (2 (T - 1) / T of the bytes, 2 (T - 1) latencies), not overlapped; the
 * optimizer over tensor rank 0's shard. */
static void check_tensor_parallel(const cfg_config *cfg, const backend *be) {
  plan_result r;
  plan_of(&r, cfg, be);
  const double C = 64, T = 32, B = 2, m = 4, peak = 0.1e12 * 0.5;
  const double allreduce = 2.0 * (2 - 1) / 2 * B * T * C * 4 / 1e9 + 2.0 * (2 - 1) * 1e-6;
  for (int rc = 0; rc <= 1; rc++) {
    const plan_layout *l = find_tp(&r, 1, 2, 1, 2, 0, rc, 0);
    T_CHECK(l != NULL, "layout 1 x 2 x 1, B 2, recompute %d missing among %d", rc, r.n);
    if (!l) continue;
    const double block = 6.0 * (4 * C * C + 2 * C * 4 * C) + 12.0 * C * T;
    const double pass = B * T * (model_cost(4, C, 256, T) + (rc ? 4 * block / 3 : 0)) / (2 * peak);
    const double tp = m * ((rc ? 5 : 4) * 4 + 2) * allreduce;
    T_CHECK(l->m == 4 && near(l->t_compute, m * pass) && l->t_bubble == 0, "T = 2: compute %.9g s, want %.9g", l->t_compute,
            m * pass);
    T_CHECK(near(l->t_tp, tp), "T = 2, recompute %d: tensor all-reduces %.9g s, want %.9g", rc, l->t_tp, tp);
    gpt_shape s;
    gpt_shape_from_cfg(&s, &cfg->model);
    gpt_part part = gpt_whole(&s);
    part.tp = 2;
    const double own = (double)gpt_part_params(&s, part), opt = own * 28 / 10e9;
    gpt_shape_free(&s);
    T_CHECK(own < r.nparams * 0.6 && near(l->t_opt, opt), "T = 2: optimizer %.9g s, want %.9g", l->t_opt, opt);
    const double step = m * pass + tp + opt;
    T_CHECK(l->t_dp == 0 && l->t_p2p == 0 && l->t_embed == 0 && near(l->t_step, step), "T = 2: step %.9g s, want %.9g",
            l->t_step, step);
    /* memory: the dry run's plan of tensor rank 0 (the two hold 128 vocabulary rows each) */
    cfg_config *c = malloc(sizeof *c);
    *c = *cfg;
    c->parallel.tensor_parallel = 2, c->parallel.data_parallel = 1, c->parallel.micro_batches = 4;
    c->training.recompute = rc;
    par_layout lay;
    par_plan(&lay, c, 2, 0);
    double mem = (double)trainer_plan_memory(c, be, &lay, 0, 0).total;
    T_CHECK(near(l->mem_planned, mem), "T = 2: memory %.0f, want %.0f", l->mem_planned, mem);
    par_free(&lay);
    free(c);
  }
  /* the fastest for each T is the fastest among that T's layouts, the best the fastest of them */
  int tps[8], n = plan_tp_values(&r, tps, 8);
  T_CHECK(n == 2 && tps[0] == 1 && tps[1] == 2, "T values: %d", n);
  const int b1 = plan_fastest(&r, 1), b2 = plan_fastest(&r, 2);
  T_CHECK(b1 >= 0 && b2 >= 0 && r.v[b1].tp == 1 && r.v[b2].tp == 2 && (r.best == b1 || r.best == b2), "fastest per T: %d, %d",
          b1, b2);
  for (int i = 0; b1 >= 0 && b2 >= 0 && i < r.n; i++)
    T_CHECK(!r.v[i].fits || r.v[i].t_step >= r.v[r.v[i].tp == 1 ? b1 : b2].t_step * (1 - 1e-12), "layout %d beats its T's best",
            i);
  plan_free(&r);
}

/* T divides the ranks per node, n_head and the MLP width: 12 cores, 4 heads, n_inner 250 leave T = 1, 2. */
static void check_tp_divisibility(const backend *be) {
  const char *sets[] = {"machine.devices_per_node=12", "model.n_inner=250", "training.global_batch_size=24"};
  cfg_config *cfg = load(DECK, sets, 3);
  plan_result r;
  plan_of(&r, cfg, be);
  int seen[13] = {0};
  for (int i = 0; i < r.n; i++) {
    const plan_layout *l = &r.v[i];
    T_CHECK(l->tp >= 1 && 12 % l->tp == 0 && 4 % l->tp == 0 && 250 % l->tp == 0 && l->P * l->tp * l->D == 12,
            "layout %d: P %d x T %d x D %d", i, l->P, l->tp, l->D);
    if (l->tp >= 1 && l->tp <= 12) seen[l->tp] = 1;
  }
  T_CHECK(seen[1] && seen[2] && !seen[3] && !seen[4] && !seen[6] && !seen[12], "T values planned: 1 %d, 2 %d, 4 %d", seen[1],
          seen[2], seen[4]);
  plan_free(&r);
  free(cfg);
}

/* Nothing fits on the node in a byte less than the smallest layout needs: the plan finds the node
 * count at which something would (more stages). */
static void check_nothing_fits(const cfg_config *cfg0, const backend *be) {
  plan_result r;
  err_list e = {0};
  plan_make(&r, cfg0, be, NULL, &e);
  double least = r.v[0].mem;
  for (int i = 1; i < r.n; i++) least = fmin(least, r.v[i].mem);
  plan_free(&r);
  char mem[64];
  snprintf(mem, sizeof mem, "machine.memory_gb=%.9f", (least - 1) / 1e9);
  const char *sets[] = {mem};
  cfg_config *cfg = load(DECK, sets, 1);
  plan_make(&r, cfg, be, NULL, &e);
  err_free(&e);
  T_CHECK(r.best < 0, "a layout fits in %.0f bytes", least - 1);
  T_CHECK(r.nodes_needed == 2 && r.alt.fits && r.alt.P * r.alt.tp * r.alt.D == 4 && r.alt.mem < least,
          "what would fit: %d nodes, layout %d x %d x %d", r.nodes_needed, r.alt.P, r.alt.tp, r.alt.D);
  plan_free(&r);
  free(cfg);
}

/* A V100 has no bf16: an error at &system precision with the fp16 hint. */
static void check_errors(const backend *be) {
  const char *sets[] = {"machine.device='v100-32gb'", "system.precision='bf16'", "machine.devices_per_node=6"};
  cfg_config *cfg = load(DECK, sets, 3);
  plan_result r;
  err_list e = {0};
  T_CHECK(plan_make(&r, cfg, be, NULL, &e) != 0 && e.n == 1 && strstr(e.v[0].msg, "no bf16") && strstr(e.v[0].hint, "fp16"),
          "bf16 on a V100: %s", e.n ? e.v[0].msg : "no error");
  err_free(&e);
  plan_free(&r);
  free(cfg);
}

/* A run's device without bf16 (an instance's caps are its device's, as the CUDA backend's on a
 * V100): an error at the deck line of &system precision naming the device, with the fp16 hint where
 * the device has fp16 and the fp32 one where it has fp32 alone; fp16 passes. */
static void check_device_precision(const backend *plan_be) {
  static const char deck[] = "&job task = 'plan' /\n&system\n  precision = 'bf16' /\n";
  const struct { unsigned can; const char *names, *hint; } dev_cases[] = {
      {BACKEND_PREC_FP32 | BACKEND_PREC_FP16, "fp32, fp16", "set precision = 'fp16' (tensor cores"},
      {BACKEND_PREC_FP32, "fp32:", "set precision = 'fp32'"}};
  backend dev = *plan_be;
  dev.name = "cuda";
  cfg_config *cfg = load(deck, NULL, 0);
  for (int i = 0; i < 2; i++) {
    dev.caps.precisions = dev_cases[i].can;
    err_list e = {0};
    T_CHECK(backends_check_device(cfg, &dev, "GPU 0, Tesla V100-SXM2-32GB", &e) == -1 && e.n == 1 &&
                strstr(e.v[0].msg, "precision = 'bf16'") && strstr(e.v[0].msg, "V100") &&
                strstr(e.v[0].hint, dev_cases[i].hint) && strstr(e.v[0].hint, dev_cases[i].names) && e.v[0].line == 3,
            "bf16 on a device of %s: line %d: %s (hint: %s)", dev_cases[i].names, e.n ? e.v[0].line : 0,
            e.n ? e.v[0].msg : "no error", e.n ? e.v[0].hint : "");
    err_free(&e);
  }
  free(cfg);
  const char *fp16[] = {"system.precision='fp16'"};
  cfg = load(DECK, fp16, 1);
  dev.caps.precisions = dev_cases[0].can;
  err_list e = {0};
  T_CHECK(backends_check_device(cfg, &dev, "GPU 0", &e) == 0 && e.n == 0, "fp16 on a V100 refused");
  err_free(&e);
  free(cfg);
}

/* Counts each within its range whose product is not: nodes x devices per node beyond the ranks a
 * plan lays out is an error at &machine nodes (it overflowed an int: SIGFPE); on 2^21 ranks the
 * layouts keep to the deck's ranges (no layout of more than data_parallel's 2^20 replicas). */
static void check_bounds(const backend *be) {
  const char *huge[] = {"machine.device='h100-80gb'", "machine.nodes=1048576", "machine.devices_per_node=4096"};
  cfg_config *cfg = load(DECK, huge, 3);
  plan_result r;
  err_list e = {0};
  T_CHECK(plan_make(&r, cfg, be, NULL, &e) != 0 && e.n == 1 && !strcmp(e.v[0].file, "--set machine.nodes=1048576") &&
              strstr(e.v[0].msg, "1048576 x 4096 = 4294967296 ranks, more than the 16777216 a plan lays out") &&
              e.v[0].hint[0], "nodes x devices_per_node beyond PAR_MAX_RANKS: %s: %s", e.n ? e.v[0].file : "",
          e.n ? e.v[0].msg : "no error");
  plan_free(&r);
  err_free(&e);
  free(cfg);
  const char *big[] = {"machine.device='h100-80gb'", "machine.nodes=4096", "machine.devices_per_node=512",
                       "training.micro_batch_size=1", "training.global_batch_size=1073741824"};
  cfg = load(DECK, big, 5);
  T_CHECK(plan_make(&r, cfg, be, NULL, &e) == 0 && r.n > 0, "a plan on 2^21 ranks");
  int in_range = 1;
  for (int i = 0; i < r.n; i++)
    in_range &= r.v[i].D <= (1 << 20) && (long)r.v[i].P * r.v[i].tp * r.v[i].D == (1 << 21) && r.v[i].m <= (1 << 20);
  T_CHECK(in_range, "every layout's replicas and micro-batches within their ranges, of 2^21 ranks");
  plan_free(&r);
  err_free(&e);
  free(cfg);
}

/* The GPT-Neo 13B shape on 4 x 6 V100-32GB: a layout fits, memory and counts in 64 bits. */
static void check_13b(const backend *be) {
  const char *sets[] = {"model.n_layer=40", "model.n_embd=5120", "model.n_head=40", "model.vocab_size=50257",
                        "model.block_size=2048", "training.seq_len=2048", "training.micro_batch_size=4",
                        "training.global_batch_size=1024", "machine.device='v100-32gb'", "machine.nodes=4",
                        "machine.devices_per_node=6", "system.precision='fp16'", "machine.memory_gb=0",
                        "machine.overhead_gb=0", "machine.peak_tflops=0", "machine.efficiency=0"};
  cfg_config *cfg = load(DECK, sets, 16);
  plan_result r;
  err_list e = {0};
  T_CHECK(plan_make(&r, cfg, be, NULL, &e) == 0, "13B plan failed");
  err_free(&e);
  T_CHECK(r.nparams > 12.8e9 && r.nparams < 12.9e9, "13B parameters %.4g", r.nparams);
  T_CHECK(r.best >= 0 && r.v[r.best].P * r.v[r.best].tp * r.v[r.best].D == 24 && r.v[r.best].mem < 32e9 && r.v[r.best].mem > 4e9,
          "13B on 24 V100: best %d, memory %.4g", r.best, r.best >= 0 ? r.v[r.best].mem : 0);
  plan_free(&r);
  free(cfg);
}

/* The two-level exchange (&comm hierarchy = 'node') on 2 nodes x 2 ranks, fp32: the sums and
 * gathers inside the node at its bandwidth, the halves between the nodes at the node's network
 * shared by its 2 owners; the one-level ring spans the nodes at the network's rate. */
static void check_hierarchy(const backend *be) {
  static const char *const sets[] = {"machine.nodes=2", "machine.inter_gbs=0.1", "machine.inter_latency_us=2",
                                     "comm.hierarchy='node'"};
  for (int two = 0; two < 2; two++) {
    cfg_config *cfg = load(DECK, sets, two ? 4 : 3);
    plan_result r;
    plan_of(&r, cfg, be);
    const plan_layout *l = find(&r, 1, 4, 2, 0, 0, 0);
    T_CHECK(l != NULL, "layout 1 x 4, B 2 missing among %d", r.n);
    if (l) {
      const double fp32 = (double)r.nparams * 4, inter = 0.1e9, intra = 1e9, li = 2e-6, la = 1e-6;
      const double want = two ? 2.0 * 1 / 2 * fp32 / intra + 2.0 * la + 2.0 * 1 / 2 * (fp32 / 2) / (inter / 2) + 2.0 * li
                              : 2.0 * 3 / 4 * fp32 / inter + 2.0 * 3 * li; /* one bucket, all of it exposed */
      T_CHECK(near(l->t_dp, want), "%s exchange %.9g s, want %.9g", two ? "two-level" : "one-level", l->t_dp, want);
      printf("  replica exchange on 2 nodes x 2, fp32: %s %.6g s\n", two ? "two levels" : "one ring", l->t_dp);
    }
    plan_free(&r);
    free(cfg);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  cfg_config *cfg = load(DECK, NULL, 0);
  const backend *be = backends_plan(cfg);
  check_data_parallel(cfg, be);
  check_pipeline(cfg, be);
  check_tensor_parallel(cfg, be);
  check_tp_divisibility(be);
  check_nothing_fits(cfg, be);
  check_errors(be);
  check_device_precision(be);
  check_13b(be);
  check_bounds(be);
  check_hierarchy(be);
  backend_close(be);
  free(cfg);
  int rc = t_done("test_plan");
  MPI_Finalize();
  return rc;
}
