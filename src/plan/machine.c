/* machine: the device table and &machine resolved for a plan. */
#include "plan/machine.h"

#include <math.h>
#include <string.h>

#include "base/util.h"
#include "energy/energy.h"
#include "energy/hwpower.h"
#include "parallel/par.h"
#include "parallel/topo.h"

/* The share of the peak greenlm's step reaches on a GPU, at fp32 and at the tensor-core precisions
 * (tf32, bf16, fp16): measured on an H200 (doc/performance.md, GPT-Neo 125M fp32 and 1.3B bf16)
 * and applied to every GPU until a calibration there says otherwise. */
#define GPU_EFF_FP32 0.518
#define GPU_EFF_TC 0.117
#define NV_SRC "NVIDIA datasheet"

static const machine_device table[] = {
    {"cpu", "CPU cores, one rank each", {0, 0, 0, 0}, 0, 5, NULL, 5, 1, 0, 0.75, 0.03,
     "peak: an SGEMM measured here on one core; efficiency: greenlm's CPU step at 70-80% of that peak (doc/performance.md); "
     "5 GB/s of memory bandwidth per core; power from the hardware power table (energy/hwpower.h); overhead per rank: "
     "the planning process's resident memory (this build's libraries and MPI) + OpenBLAS's packing buffers for the deck's "
     "shapes, measured with the kernels it chose here + 0.03 GB (a run's data, tokenizer, staging); "
     "shared-memory MPI at 5 GB/s, 1 us"},
    {"v100-16gb", "NVIDIA V100 SXM2 16 GB", {15.7, 0, 0, 125}, 16, 900, "V100-SXM2-16GB", 50, 3, 6, GPU_EFF_TC, 1.0,
     NV_SRC " (Tesla V100, 2020): 15.7 TFLOP/s fp32, 125 fp16 tensor, 900 GB/s HBM2, 300 W; NVLink 2.0 between the GPUs "
     "of an IBM AC922 node (6 GPUs), 50 GB/s each way"},
    {"v100-32gb", "NVIDIA V100 SXM2 32 GB", {15.7, 0, 0, 125}, 32, 900, "V100-SXM2-32GB", 50, 3, 6, GPU_EFF_TC, 1.0,
     NV_SRC " (Tesla V100, 2020): 15.7 TFLOP/s fp32, 125 fp16 tensor, 900 GB/s HBM2, 300 W; NVLink 2.0 between the GPUs "
     "of an IBM AC922 node (6 GPUs), 50 GB/s each way"},
    {"a100-40gb", "NVIDIA A100 SXM4 40 GB", {19.5, 156, 312, 312}, 40, 1555, "A100-SXM4-40GB", 250, 3, 8, GPU_EFF_TC, 1.0,
     NV_SRC " (A100, 2021): 19.5 TFLOP/s fp32, 156 tf32, 312 bf16/fp16 dense, 1555 GB/s HBM2, 400 W; NVLink 3 through "
     "NVSwitch, 300 GB/s each way (250 reached)"},
    {"a100-80gb", "NVIDIA A100 SXM4 80 GB", {19.5, 156, 312, 312}, 80, 2039, "A100-SXM4-80GB", 250, 3, 8, GPU_EFF_TC, 1.0,
     NV_SRC " (A100, 2021): 19.5 TFLOP/s fp32, 156 tf32, 312 bf16/fp16 dense, 2039 GB/s HBM2e, 400 W; NVLink 3 through "
     "NVSwitch, 300 GB/s each way (250 reached)"},
    {"h100-80gb", "NVIDIA H100 SXM5 80 GB", {67, 494.7, 989.4, 989.4}, 80, 3350, "H100", 400, 3, 8, GPU_EFF_TC, 1.0,
     NV_SRC " (H100, 2023): 67 TFLOP/s fp32, 494.7 tf32, 989.4 bf16/fp16 dense, 3.35 TB/s HBM3, 700 W; NVLink 4 through "
     "NVSwitch, 450 GB/s each way (400 reached)"},
    {"h200", "NVIDIA H200 SXM 141 GB", {67, 494.7, 989.4, 989.4}, 141, 4800, "H200", 400, 3, 8, GPU_EFF_TC, 1.0,
     NV_SRC " (H200, 2024): 67 TFLOP/s fp32, 494.7 tf32, 989.4 bf16/fp16 dense, 141 GB HBM3e at 4.8 TB/s, 700 W; NVLink 4 "
     "through NVSwitch, 450 GB/s each way (400 reached)"},
    {NULL, NULL, {0, 0, 0, 0}, 0, 0, NULL, 0, 0, 0, 0, 0, NULL}};

const machine_device *machine_devices(void) { return table; }

const machine_device *machine_find(const char *name) {
  for (const machine_device *d = table; d->name; d++)
    if (!strcmp(d->name, name)) return d;
  return NULL;
}

/* x when the deck gives it (> 0), else the default; `from` notes which. */
static double pick(double deck, double def) { return deck > 0 ? deck : def; }

/* The peak and efficiency of one rank: the deck's, the table's, or a GEMM measured here. */
static int resolve_compute(machine_plan *m, const cfg_config *cfg, const backend *be, err_list *errs) {
  const cfg_machine *c = &cfg->machine;
  const cfg_system_precision pi = cfg_system_precision_of(&cfg->system); /* indexes tflops[] */
  if (!m->cpu && m->dev->tflops[pi] <= 0) {
    cfg_error_at(cfg, errs, "system", "precision",
                 m->dev->tflops[CFG_PREC_FP16] > 0 ? "the V100 computes at fp16 (tensor cores, loss scaling) or fp32: set precision = 'fp16'" : "",
                 "&machine device = '%s' has no %s arithmetic", m->dev->name, cfg->system.precision);
    return 1;
  }
  if (c->peak_tflops > 0) {
    m->peak = c->peak_tflops * 1e12;
    util_snprintf(m->peak_from, sizeof m->peak_from, "&machine peak_tflops");
  } else if (m->cpu) {
    be->set_threads(be, 1);
    m->peak = be->measure_gflops(be, 1024, 1.0) * 1e9;
    util_snprintf(m->peak_from, sizeof m->peak_from, "an SGEMM measured here on one core");
  } else {
    m->peak = m->dev->tflops[pi] * 1e12;
    util_snprintf(m->peak_from, sizeof m->peak_from, "the %s peak at %s (%s)", m->dev->label, cfg->system.precision, NV_SRC);
  }
  const double eff_table = m->cpu ? m->dev->efficiency : pi == 0 ? GPU_EFF_FP32 : GPU_EFF_TC;
  m->efficiency = pick(c->efficiency, eff_table);
  util_snprintf(m->eff_from, sizeof m->eff_from, "%s",
                c->efficiency > 0 ? "&machine efficiency"
                : m->cpu          ? "greenlm's CPU step against the SGEMM peak (doc/performance.md)"
                                  : "greenlm's GPU step measured on an H200 (doc/performance.md)");
  return 0;
}

/* The site's PUE and grid intensity from &energy. */
static void resolve_grid(machine_plan *m, const cfg_config *cfg) {
  m->pue = cfg->energy.pue;
  const energy_region *r = energy_find_region(cfg->energy.region);
  if (cfg->energy.grid_intensity > 0 || !r) {
    m->intensity = cfg->energy.grid_intensity;
    util_snprintf(m->grid, sizeof m->grid, "&energy grid_intensity");
  } else {
    m->intensity = r->g_per_kwh;
    util_snprintf(m->grid, sizeof m->grid, "%s (%s)", r->label, r->basis);
  }
}

/* W of one rank's device: the deck's, the GPU's board power, or one core's share of this
 * machine's CPU TDP (the hardware power table; a default per core for a CPU it lacks). */
static void resolve_power(machine_plan *m, const cfg_config *cfg, double node_mem) {
  if (cfg->machine.device_watts > 0) {
    m->device_w = cfg->machine.device_watts;
    util_snprintf(m->power_from, sizeof m->power_from, "&machine device_watts");
  } else if (!m->cpu) {
    const hwpower_part *g = hwpower_gpu(m->dev->power);
    UTIL_CHECK(g != NULL, NULL, "internal: no power table row '%s'", m->dev->power);
    m->device_w = g->watts;
    util_snprintf(m->power_from, sizeof m->power_from, "board power of the %s", g->model);
  } else {
    char model[256] = "";
    const hwpower_part *c = hwpower_cpu_model("/proc/cpuinfo", model, sizeof model) == 0 ? hwpower_cpu(model) : NULL;
    m->device_w = c ? c->watts / c->cores : HWPOWER_CORE_DEFAULT_W;
    util_snprintf(m->power_from, sizeof m->power_from, c ? "TDP per core of the %s" : "the default per core (%s%s)",
                  c ? c->model : model[0] ? model : "CPU", c ? "" : " not in the table");
  }
  /* besides the devices: the deck's, 150 W per GPU, or a CPU node's memory */
  m->host_w = cfg->machine.host_watts > 0 ? cfg->machine.host_watts
              : m->cpu                     ? HWPOWER_DRAM_W_PER_GB * node_mem / 1e9
                                           : 150.0 * m->per_node;
}

int machine_resolve(machine_plan *m, const cfg_config *cfg, const backend *be, double nparams, const backend_shape *ops,
                    err_list *errs) {
  const cfg_machine *c = &cfg->machine;
  memset(m, 0, sizeof *m);
  m->dev = machine_find(c->device);
  UTIL_CHECK(m->dev != NULL, NULL, "internal: device '%s' passed the range check", c->device);
  m->cpu = !strcmp(m->dev->name, "cpu");
  topo_machine here;
  if (m->cpu && topo_discover(&here) != 0) here.cores = 1, here.memory_gib = 1;
  m->nodes = (int)c->nodes;
  m->per_node = c->devices_per_node > 0 ? (int)c->devices_per_node : m->cpu ? here.cores : m->dev->per_node;
  if ((long)m->nodes * m->per_node > PAR_MAX_RANKS) { /* each in its range, their product need not be */
    cfg_error_at(cfg, errs, "machine", "nodes",
                 "plan for fewer nodes or devices per node: a plan lays out at most as many ranks as --ranks takes",
                 "nodes x devices_per_node = %d x %d = %ld ranks, more than the %d a plan lays out", m->nodes, m->per_node,
                 (long)m->nodes * m->per_node, PAR_MAX_RANKS);
    return 1;
  }
  m->ranks = m->nodes * m->per_node;
  const double libraries = util_peak_rss(); /* this process so far: the build's libraries and MPI */
  if (m->cpu && c->overhead_gb <= 0 && be->library_bytes) { /* before any other product: the library keeps what it takes */
    be->set_threads(be, 1);
    m->library = (double)be->library_bytes(be, ops);
  }
  if (resolve_compute(m, cfg, be, errs)) return 1;
  const double node_mem = m->cpu ? here.memory_gib * 1073741824.0 : 0;
  m->memory = c->memory_gb > 0 ? c->memory_gb * 1e9 : m->cpu ? node_mem / m->per_node : m->dev->memory_gb * 1e9;
  m->memory_bw = pick(c->memory_gbs, m->dev->memory_gbs) * 1e9;
  m->intra_bw = pick(c->intra_gbs, m->dev->intra_gbs) * 1e9;
  m->intra_lat = pick(c->intra_latency_us, m->dev->intra_latency_us) * 1e-6;
  m->inter_bw = pick(c->inter_gbs, 25) * 1e9;
  m->inter_lat = pick(c->inter_latency_us, 2) * 1e-6;
  resolve_power(m, cfg, node_mem);
  /* a CPU rank: this build's process as it stands, plus what a run holds outside its planned buffers */
  m->overhead = c->overhead_gb > 0 ? c->overhead_gb * 1e9 : m->dev->overhead_gb * 1e9 + (m->cpu ? libraries + m->library : 0);
  m->tokens = c->tokens > 0 ? c->tokens : 20.0 * nparams;
  util_strlcpy(m->source, c->source, sizeof m->source);
  resolve_grid(m, cfg);
  return 0;
}

const char *machine_describe(const machine_plan *m, char *buf, size_t len) {
  char mem[32], over[32], lib[32], with[64] = "";
  if (m->library > 0) util_snprintf(with, sizeof with, ", of which OpenBLAS's buffers %s", util_fmt_bytes(m->library, lib, sizeof lib));
  util_snprintf(buf, len,
                "machine: %d node%s x %d %s = %d ranks; %s per rank (%s of it outside the planned buffers%s)%s%s\n"
                "compute: %.4g TFLOP/s per rank (%s), at %.1f%% of it (%s)\n"
                "links: within a node %.4g GB/s, %.3g us; between nodes %.4g GB/s per node, %.3g us; memory %.4g GB/s per rank\n"
                "power: %.4g W per %s (%s), %.4g W per node besides; PUE %.2f; grid %.0f gCO2e/kWh, %s",
                m->nodes, m->nodes == 1 ? "" : "s", m->per_node, m->cpu ? "cores" : m->dev->label, m->ranks,
                util_fmt_bytes(m->memory, mem, sizeof mem), util_fmt_bytes(m->overhead, over, sizeof over), with, m->source[0] ? "; figures from " : "", m->source, m->peak / 1e12,
                m->peak_from, 100 * m->efficiency, m->eff_from, m->intra_bw / 1e9, m->intra_lat * 1e6, m->inter_bw / 1e9,
                m->inter_lat * 1e6, m->memory_bw / 1e9, m->device_w, m->cpu ? "core" : "GPU", m->power_from, m->host_w, m->pue,
                m->intensity, m->grid);
  return buf;
}
