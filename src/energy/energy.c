/* energy: RAPL (node leader), NVML through dlopen (GPU owner), labelled estimates, attribution of
 * node energy to ranks, totals, energy.csv and the end-of-run report. */
#include "energy/energy.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "base/env.h"
#include "base/util.h"
#include "energy/hwpower.h"

/* ---- tables ------------------------------------------------------------------------------------ */

/* Grid carbon intensities, gCO2e/kWh. Sources in doc/energy.md (research notes: tool tables). */
static const energy_region REGIONS[] = {
    {"world", "world average", 475.0, "location-based annual average, 2019",
     "IEA 2019, the default of CodeCarbon (carbon_intensity_per_source.json) and Green Algorithms"},
    {"usa", "United States", 369.5, "location-based annual average, 2023",
     "Our World in Data / Ember 2023 (CodeCarbon global_energy_mix.json)"},
    {"iso-ne", "US New England grid (ISO-NE; serves Massachusetts centres such as MGHPCC)", 240.0,
     "location-based annual average (electricityMap zone US-NEISO)",
     "electricityMap US-NEISO as shipped by experiment-impact-tracker; other tools give Massachusetts 354-420"},
    {"new-york", "New York State grid (NYISO)", 212.5, "location-based annual average (electricityMap zone US-NY)",
     "electricityMap US-NY as shipped by experiment-impact-tracker; CodeCarbon 210.5, Green Algorithms 199.0"},
    {"france", "France", 56.0, "location-based annual average, 2023",
     "Our World in Data / Ember 2023 (CodeCarbon global_energy_mix.json)"},
    {"germany", "Germany", 381.0, "location-based annual average, 2023",
     "Our World in Data / Ember 2023 (CodeCarbon global_energy_mix.json)"},
    {"quebec", "Quebec (Hydro-Quebec main grid)", 0.36, "direct emissions of generation and purchases, 2016",
     "Hydro-Quebec 2016: 360 t CO2/TWh (not life-cycle)"},
    {"sweden", "Sweden", 40.7, "location-based annual average, 2023",
     "Our World in Data / Ember 2023 (CodeCarbon global_energy_mix.json)"},
    {NULL, NULL, 0, NULL, NULL}};

const energy_region *energy_regions(void) { return REGIONS; }

const energy_region *energy_find_region(const char *name) {
  for (const energy_region *r = REGIONS; r->name; r++)
    if (strcmp(r->name, name) == 0) return r;
  return NULL;
}

/* Published training footprints; tokens and FLOPs as in the research notes (6 N D except GPT-3). */
static const energy_reference REFERENCES[] = {
    {"GPT-3 175B", 1287.0, 300e9, 3.14e23, "Patterson et al. 2021, arXiv:2104.10350"},
    {"BLOOM 176B (GPU, dynamic)", 433.196, 366e9, 6.0 * 176e9 * 366e9, "Luccioni et al. 2023, JMLR 24(253)"},
    {"Llama 2 7B", 73.7, 2.0e12, 6.0 * 7e9 * 2.0e12, "Meta Llama 2 model card (GPU-h x TDP)"},
    {"Llama 2 70B", 688.0, 2.0e12, 6.0 * 70e9 * 2.0e12, "Meta Llama 2 model card (GPU-h x TDP)"},
};

const energy_reference *energy_references(int *n) {
  *n = (int)(sizeof REFERENCES / sizeof REFERENCES[0]);
  return REFERENCES;
}

const char *energy_status_name(energy_status s) {
  return s == ENERGY_MEASURED ? "measured" : s == ENERGY_ESTIMATED ? "estimated" : "not measured";
}

const char *energy_component_name(int c) { return c == ENERGY_CPU ? "cpu" : c == ENERGY_DRAM ? "dram" : "gpu"; }

/* ---- RAPL (node leader) ------------------------------------------------------------------------ */

static int read_u64_fd(int fd, uint64_t *v) {
  char buf[64];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  *v = strtoull(buf, NULL, 10);
  return 0;
}

/* Add zone dir when it is a package-* or dram zone (psys overlaps the packages and is skipped).
 * Returns 1 when added, 0 when not a zone we read, -1 when present but unreadable. */
static int add_zone(energy_meter *e, const char *dir) {
  char path[1100], name[64], range[64];
  snprintf(path, sizeof path, "%s/name", dir);
  if (util_read_line(path, name, sizeof name) != 0) return 0;
  int comp = strncmp(name, "package-", 8) == 0 ? ENERGY_CPU : strcmp(name, "dram") == 0 ? ENERGY_DRAM : -1;
  if (comp < 0 || e->nzones == ENERGY_MAX_ZONES) return 0;
  snprintf(path, sizeof path, "%s/max_energy_range_uj", dir);
  if (util_read_line(path, range, sizeof range) != 0) return -1;
  snprintf(path, sizeof path, "%s/energy_uj", dir);
  int fd = open(path, O_RDONLY);
  uint64_t v;
  if (fd < 0) return -1;
  if (read_u64_fd(fd, &v) != 0) {
    close(fd);
    return -1;
  }
  int z = e->nzones++;
  e->fd[z] = fd;
  e->comp[z] = comp;
  e->last_uj[z] = v;
  e->range_uj[z] = strtoull(range, NULL, 10);
  const char *base = strrchr(dir, '/');
  util_snprintf(e->zone[z], sizeof e->zone[z], "%s(%s)", name, base ? base + 1 : dir);
  return 1;
}

/* The zones intel-rapl:N and their sub-zones intel-rapl:N:M. */
static void open_rapl(energy_meter *e, char *why, size_t wl) {
  const char *root = env_path("GREENLM_POWERCAP_ROOT");
  if (!root || !*root) root = "/sys/class/powercap";
  DIR *d = opendir(root);
  if (!d) {
    snprintf(why, wl, "no RAPL: %s absent", root);
    return;
  }
  int denied = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "intel-rapl:", 11) != 0 || strchr(de->d_name + 11, ':')) continue;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
    if (add_zone(e, dir) < 0) denied = 1;
    DIR *sd = opendir(dir);
    if (!sd) continue;
    struct dirent *se;
    while ((se = readdir(sd))) {
      if (strncmp(se->d_name, "intel-rapl:", 11) != 0) continue;
      char sub[1100];
      util_snprintf(sub, sizeof sub, "%s/%s", dir, se->d_name);
      if (add_zone(e, sub) < 0) denied = 1;
    }
    closedir(sd);
  }
  closedir(d);
  if (e->nzones == 0)
    snprintf(why, wl,
             denied ? "RAPL present in %s but not readable (root only since CVE-2020-8694; make energy_uj group-readable)"
                    : "no RAPL package zones in %s",
             root);
}

/* Read every zone; the advance since the last read goes into read_uj (caller holds mu). A counter
 * below its last value has wrapped once at max_energy_range_uj. */
static void read_rapl(energy_meter *e) {
  for (int z = 0; z < e->nzones; z++) {
    uint64_t v;
    if (read_u64_fd(e->fd[z], &v) != 0) continue;
    uint64_t d = v >= e->last_uj[z] ? v - e->last_uj[z] : v + (e->range_uj[z] - e->last_uj[z]);
    if (v < e->last_uj[z]) e->wraps++;
    e->last_uj[z] = v;
    e->read_uj[e->comp[z]] += d;
  }
}

/* The node's sensors at time now (caller holds mu): RAPL's counters, or hwmon's power integrated to now. */
static void read_node(energy_meter *e, double now) {
  read_rapl(e);
  if (e->hw.n) {
    uint64_t uj[2] = {0, 0};
    hwmon_read(&e->hw, now, uj);
    e->read_uj[ENERGY_CPU] += uj[HWMON_CPU], e->read_uj[ENERGY_DRAM] += uj[HWMON_DRAM];
  }
}

/* ---- NVML through dlopen (GPU owner) ----------------------------------------------------------- */

#define NVML_SUCCESS 0
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_bus_fn)(const char *bus, void **dev);
typedef int (*nvml_name_fn)(void *dev, char *name, unsigned int len);

/* Open NVML and this rank's GPU by bus id; the counter if it works, else power samples. */
static void open_nvml(energy_meter *e, const char *bus, energy_source *s) {
  const char *lib = env_path("GREENLM_NVML_LIBRARY");
  if (!lib || !*lib) lib = "libnvidia-ml.so.1";
  e->nvml_lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!e->nvml_lib) {
    snprintf(s->note, sizeof s->note, "NVML not loaded (%s)", dlerror());
    return;
  }
  nvml_init_fn init = (nvml_init_fn)dlsym(e->nvml_lib, "nvmlInit_v2");
  nvml_by_bus_fn by_bus = (nvml_by_bus_fn)dlsym(e->nvml_lib, "nvmlDeviceGetHandleByPciBusId_v2");
  nvml_name_fn name = (nvml_name_fn)dlsym(e->nvml_lib, "nvmlDeviceGetName");
  e->nvml_shutdown = (int (*)(void))dlsym(e->nvml_lib, "nvmlShutdown");
  e->nvml_energy = (int (*)(void *, unsigned long long *))dlsym(e->nvml_lib, "nvmlDeviceGetTotalEnergyConsumption");
  e->nvml_power = (int (*)(void *, unsigned int *))dlsym(e->nvml_lib, "nvmlDeviceGetPowerUsage");
  int rc = -1;
  if (!init || !by_bus || !e->nvml_shutdown || (rc = init()) != NVML_SUCCESS) {
    snprintf(s->note, sizeof s->note, "NVML in %s unusable (%s)", lib, init ? "nvmlInit failed" : "symbols missing");
  } else if ((rc = by_bus(bus, &e->nvml_dev)) != NVML_SUCCESS) {
    snprintf(s->note, sizeof s->note, "NVML has no GPU with PCI bus id %s (error %d)", bus, rc);
  } else {
    if (!name || name(e->nvml_dev, e->gpu_name, sizeof e->gpu_name) != NVML_SUCCESS) util_strlcpy(e->gpu_name, "GPU", sizeof e->gpu_name);
    unsigned int mw;
    if (e->nvml_energy && e->nvml_energy(e->nvml_dev, &e->gpu_last_mj) == NVML_SUCCESS) {
      s->status = ENERGY_MEASURED;
      snprintf(s->method, sizeof s->method, "nvml_energy_counter");
      snprintf(s->note, sizeof s->note, "%s at %s: NVML total energy counter", e->gpu_name, bus);
      return;
    }
    if (e->nvml_power && e->nvml_power(e->nvml_dev, &mw) == NVML_SUCCESS) {
      s->status = ENERGY_MEASURED;
      snprintf(s->method, sizeof s->method, "nvml_power_sampled");
      snprintf(s->note, sizeof s->note, "%s at %s: no energy counter; power sampled every 0.1 s, trapezoid rule", e->gpu_name, bus);
      e->power_every = 0.1;
      e->power_last_w = 1e-3 * mw;
      e->power_last_t = util_now();
      return;
    }
    snprintf(s->note, sizeof s->note, "%s at %s: NVML reports neither energy nor power", e->gpu_name, bus);
  }
  if (rc == NVML_SUCCESS || (init && e->nvml_shutdown)) e->nvml_shutdown();
  dlclose(e->nvml_lib);
  e->nvml_lib = NULL;
}

/* Read the GPU (caller holds mu): counter differences, or one more power sample integrated. */
static void read_gpu(energy_meter *e) {
  if (!e->nvml_lib) return;
  if (strcmp(e->src[ENERGY_GPU].method, "nvml_energy_counter") == 0) {
    unsigned long long mj;
    if (e->nvml_energy(e->nvml_dev, &mj) == NVML_SUCCESS && mj >= e->gpu_last_mj) {
      e->read_uj[ENERGY_GPU] += 1000ull * (mj - e->gpu_last_mj);
      e->gpu_last_mj = mj;
    }
  } else {
    unsigned int mw;
    double now = util_now();
    if (e->nvml_power(e->nvml_dev, &mw) == NVML_SUCCESS) {
      double w = 1e-3 * mw;
      e->read_uj[ENERGY_GPU] += (uint64_t)llround(1e6 * 0.5 * (w + e->power_last_w) * (now - e->power_last_t));
      e->power_last_w = w, e->power_last_t = now;
      e->samples++;
    }
  }
}

/* ---- the sampling thread ----------------------------------------------------------------------- */

static void *sampler(void *arg) {
  energy_meter *e = arg;
  double next_rapl = util_now() + e->rapl_every, next_power = util_now() + e->power_every;
  pthread_mutex_lock(&e->mu);
  while (!e->stop) {
    double now = util_now(), next = 1e300;
    if (e->rapl_every > 0) {
      if (now >= next_rapl) read_node(e, now), e->samples++, next_rapl = now + e->rapl_every;
      next = next_rapl;
    }
    if (e->power_every > 0) {
      if (now >= next_power) read_gpu(e), next_power = now + e->power_every;
      if (next_power < next) next = next_power;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wait = next - util_now();
    if (wait < 0) wait = 0;
    ts.tv_sec += (time_t)wait;
    ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

/* ---- open -------------------------------------------------------------------------------------- */

static void set_source(energy_source *s, energy_status st, const char *method, const char *note) {
  s->status = st;
  util_strlcpy(s->method, method, sizeof s->method);
  if (note) util_strlcpy(s->note, note, sizeof s->note);
}

/* The world and node communicators' ranks; nodes numbered 0.. in the order of their leaders. */
static void number_nodes(energy_meter *e, MPI_Comm world, MPI_Comm node) {
  e->world = world, e->node = node;
  MPI_Comm_rank(world, &e->rank);
  MPI_Comm_size(world, &e->size);
  MPI_Comm_rank(node, &e->node_rank);
  MPI_Comm_size(node, &e->node_size);
  e->leader = e->node_rank == 0;
  /* nodes numbered 0.. in the order of their leaders */
  MPI_Comm leaders;
  MPI_Comm_split(world, e->leader ? 0 : MPI_UNDEFINED, e->rank, &leaders);
  if (e->leader) {
    MPI_Comm_rank(leaders, &e->node_id);
    MPI_Comm_size(leaders, &e->nodes);
    MPI_Comm_free(&leaders);
  }
  MPI_Bcast(&e->node_id, 1, MPI_INT, 0, node);
  MPI_Bcast(&e->nodes, 1, MPI_INT, 0, node);
}

/* Where no sensor can be read. The note says how the estimate is made, or why there is none. */

/* CPU: W per core-second of CPU time from the deck's TDP per node, else (estimate) the table's TDP
 * per socket by model name, else the per-core default. */
static void estimate_cpu(energy_source *s, const cfg_energy *c, double node_cores, const char *why) {
  char name[128] = "", note[384];
  if (c->cpu_tdp_w > 0) {
    s->watts = c->cpu_tdp_w / node_cores;
    util_snprintf(note, sizeof note, "estimate: &energy cpu_tdp_w %.0f W / %.0f cores = %.3g W per core x greenlm's CPU time (%s)",
                  c->cpu_tdp_w, node_cores, s->watts, why);
    set_source(s, ENERGY_ESTIMATED, "deck_tdp_estimate", note);
    return;
  }
  if (!c->estimate) {
    util_snprintf(note, sizeof note, "%s; no &energy cpu_tdp_w, and &energy estimate = .false.", why);
    set_source(s, ENERGY_NOT_MEASURED, "none", note);
    return;
  }
  if (hwpower_cpu_model("/proc/cpuinfo", name, sizeof name) != 0) util_strlcpy(name, "unknown CPU", sizeof name);
  const hwpower_part *p = hwpower_cpu(name);
  if (p) {
    s->watts = p->watts / p->cores;
    util_strlcpy(s->model, p->model, sizeof s->model);
    util_snprintf(note, sizeof note, "estimate: %s, TDP %.0f W / %d cores = %.3g W per core x greenlm's CPU time (%s)",
                  p->model, p->watts, p->cores, s->watts, why);
    set_source(s, ENERGY_ESTIMATED, "tdp_table_estimate", note);
  } else {
    s->watts = HWPOWER_CORE_DEFAULT_W;
    util_snprintf(note, sizeof note,
                  "estimate: '%s' is not in the TDP table: %.3g W per core (the default) x greenlm's CPU time; "
                  "give &energy cpu_tdp_w for a better one (%s)", name, s->watts, why);
    set_source(s, ENERGY_ESTIMATED, "per_core_default_estimate", note);
  }
}

/* DRAM: W per GB of the memory the node gives the job, for the whole node. */
static void estimate_dram(energy_source *s, const cfg_energy *c, const char *why) {
  char basis[96], note[384];
  double bytes = c->estimate ? hwpower_memory_bytes("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup", basis, sizeof basis) : 0;
  if (bytes <= 0) {
    util_snprintf(note, sizeof note, "%s; %s", why, c->estimate ? "memory size unknown" : "&energy estimate = .false.");
    set_source(s, ENERGY_NOT_MEASURED, "none", note);
    return;
  }
  s->watts = HWPOWER_DRAM_W_PER_GB * bytes / 1e9;
  util_snprintf(note, sizeof note, "estimate: %.4g W per GB x %s = %.3g W per node x wall time (%s)", HWPOWER_DRAM_W_PER_GB,
                basis, s->watts, why);
  set_source(s, ENERGY_ESTIMATED, "dram_per_gb_estimate", note);
}

/* GPU (its owner): W per GPU from the deck's TDP, else (estimate) the table's board power by the
 * device name NVML or the NVIDIA driver gives; the note so far (why NVML gave nothing) is kept. */
static void estimate_gpu(energy_meter *e, energy_source *g, const cfg_energy *c, const char *bus) {
  char why[384], note[384];
  util_strlcpy(why, g->note, sizeof why);
  if (c->gpu_tdp_w > 0) {
    g->watts = c->gpu_tdp_w;
    util_snprintf(note, sizeof note, "estimate: &energy gpu_tdp_w %.0f W x wall time (an upper bound; %s)", g->watts, why);
    set_source(g, ENERGY_ESTIMATED, "deck_tdp_estimate", note);
    return;
  }
  if (!c->estimate) {
    util_snprintf(note, sizeof note, "%s; no &energy gpu_tdp_w, and &energy estimate = .false.", why);
    set_source(g, ENERGY_NOT_MEASURED, "none", note);
    return;
  }
  if (!e->gpu_name[0] && hwpower_gpu_name("/proc/driver/nvidia/gpus", bus, e->gpu_name, sizeof e->gpu_name) != 0) {
    util_snprintf(note, sizeof note, "%s; the GPU's name is unknown (no /proc/driver/nvidia/gpus entry): give &energy gpu_tdp_w", why);
    set_source(g, ENERGY_NOT_MEASURED, "none", note);
    return;
  }
  const hwpower_part *p = hwpower_gpu(e->gpu_name);
  if (!p) {
    util_snprintf(note, sizeof note, "%s; '%s' is not in the board-power table: give &energy gpu_tdp_w", why, e->gpu_name);
    set_source(g, ENERGY_NOT_MEASURED, "none", note);
    return;
  }
  g->watts = p->watts;
  util_strlcpy(g->model, p->model, sizeof g->model);
  util_snprintf(note, sizeof note, "estimate: '%s' is the %s, board power %.0f W x wall time (an upper bound; %s)", e->gpu_name,
                p->model, p->watts, why);
  set_source(g, ENERGY_ESTIMATED, "tdp_table_estimate", note);
}

/* CPU and DRAM: the leader reads RAPL, or estimates; the node's other ranks take its finding. */
static void open_cpu_sources(energy_meter *e, const cfg_energy *c) {
  char why[600] = "";
  if (e->leader) {
    open_rapl(e, why, sizeof why);
    int have[2] = {0, 0};
    for (int z = 0; z < e->nzones; z++) have[e->comp[z]] = 1;
    char hwhy[320] = "";
    if (e->nzones == 0 && hwmon_open(&e->hw, hwhy, sizeof hwhy) == 0) /* no RAPL: POWER9's OCC, Arm servers */
      util_snprintf(why + strlen(why), sizeof why - strlen(why), "; %s", hwhy);
    for (int i = 0; i < e->hw.n; i++) have[e->hw.comp[i] == HWMON_CPU ? ENERGY_CPU : ENERGY_DRAM] = 1;
    for (int k = ENERGY_CPU; k <= ENERGY_DRAM; k++) {
      energy_source *s = &e->src[k];
      if (have[k] && e->hw.n) {
        int o = snprintf(s->note, sizeof s->note, "hwmon power, read by local rank 0 every %g s and integrated:", c->sample_seconds);
        for (int i = 0; i < e->hw.n && o < (int)sizeof s->note; i++)
          if ((e->hw.comp[i] == HWMON_CPU) == (k == ENERGY_CPU))
            o += snprintf(s->note + o, sizeof s->note - (size_t)o, " %s", e->hw.name[i]);
        set_source(s, ENERGY_MEASURED, "hwmon_power_integrated", NULL);
      } else if (have[k]) {
        int o = snprintf(s->note, sizeof s->note, "RAPL, read by local rank 0:");
        for (int z = 0; z < e->nzones && o < (int)sizeof s->note; z++)
          if (e->comp[z] == k) o += snprintf(s->note + o, sizeof s->note - (size_t)o, " %s", e->zone[z]);
        set_source(s, ENERGY_MEASURED, "rapl_sysfs", NULL);
      } else if (k == ENERGY_CPU) {
        estimate_cpu(s, c, e->node_cores, why);
      } else {
        estimate_dram(s, c, have[ENERGY_CPU] ? e->hw.n ? "no hwmon memory power sensor" : "no RAPL dram zone (AMD packages have none)" : why);
      }
    }
  }
  MPI_Bcast(&e->src[ENERGY_CPU], 2 * sizeof e->src[0], MPI_BYTE, 0, e->node);
  e->cpu_last = util_cpu_seconds();
}

/* GPU: the lowest rank of the node on each bus id reads it, or estimates; the others take its
 * finding. */
static void open_gpu_source(energy_meter *e, const cfg_energy *c, const char *gpu_bus_id) {
  char bus[32] = "";
  if (gpu_bus_id) util_strlcpy(bus, gpu_bus_id, sizeof bus);
  char *all = util_malloc((size_t)e->node_size * sizeof bus, "bus ids");
  MPI_Allgather(bus, sizeof bus, MPI_CHAR, all, sizeof bus, MPI_CHAR, e->node);
  int first = -1;
  for (int r = 0; r < e->node_size && bus[0]; r++)
    if (strcmp(all + (size_t)r * sizeof bus, bus) == 0) {
      if (first < 0) first = r;
      e->gpu_sharers++;
    }
  free(all);
  e->gpu_owner = bus[0] && first == e->node_rank;
  /* the ranks of the node on the same GPU, the owner first */
  MPI_Comm_split(e->node, bus[0] ? first : MPI_UNDEFINED, e->node_rank, &e->gpu_comm);
  energy_source *g = &e->src[ENERGY_GPU];
  if (!bus[0]) {
    set_source(g, ENERGY_NOT_MEASURED, "none", "no GPU in use");
    return;
  }
  set_source(g, ENERGY_NOT_MEASURED, "none", NULL);
  if (e->gpu_owner) {
    open_nvml(e, bus, g);
    if (g->status == ENERGY_NOT_MEASURED) estimate_gpu(e, g, c, bus);
  }
  MPI_Bcast(g, sizeof *g, MPI_BYTE, 0, e->gpu_comm);
}

/* The sampling thread (RAPL well inside the shortest wrap time, GPU power at 10 Hz) and rank 0's
 * energy.csv. Returns 0, or an errno after adding an error. */
static int start_sampling(energy_meter *e, const cfg_energy *c, const char *csv_path, int append, err_list *errs) {
  if (e->leader && (e->nzones > 0 || e->hw.n > 0)) e->rapl_every = c->sample_seconds;
  int rc = 0;
  if (e->rapl_every > 0 || e->power_every > 0) {
    rc = pthread_create(&e->thread, NULL, sampler, e);
    e->running = rc == 0;
  }
  if (e->rank == 0 && csv_path) { /* a restarted run appends: the earlier jobs' series stay */
    FILE *old = append ? fopen(csv_path, "r") : NULL;
    if (old) fclose(old);
    e->csv = fopen(csv_path, append ? "a" : "w");
    if (!e->csv) rc = errno;
    else if (!old) fprintf(e->csv, "time_s,node,component,measured_j,estimated_j\n");
  }
  if (rc)
    err_add(errs, e->csv || !csv_path ? NULL : csv_path, 0, 0, "check that &job run_dir is writable",
            "energy: cannot %s: %s", e->csv || !csv_path ? "start the sampling thread" : "write", strerror(rc));
  return rc;
}

int energy_open(energy_meter *e, const cfg_energy *c, MPI_Comm world, MPI_Comm node, int node_cores,
                const char *gpu_bus_id, const char *csv_path, int append, err_list *errs) {
  memset(e, 0, sizeof *e);
  e->gpu_comm = MPI_COMM_NULL;
  number_nodes(e, world, node);
  e->node_cores = node_cores > 0 ? node_cores : 1;
  e->by_cpu_time = cfg_energy_attribution_of(c) == CFG_ATTRIB_CPU_TIME;
  e->pue = c->pue;
  e->region = c->grid_intensity > 0 ? NULL : energy_find_region(c->region);
  e->intensity = e->region ? e->region->g_per_kwh : c->grid_intensity;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  open_cpu_sources(e, c);
  open_gpu_source(e, c, gpu_bus_id);
  e->t0 = e->t_last = e->hw.last_t = util_now(); /* the integrated sensors count from here too */
  int rc = start_sampling(e, c, csv_path, append, errs), any;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, world);
  if (any) return -1;
  if (e->rank == 0) e->rec = util_calloc((size_t)e->size * ENERGY_REC, sizeof(double), "energy records");
  return 0;
}

/* ---- sample ------------------------------------------------------------------------------------ */

/* Split delta (uJ) among n ranks with weights w (NULL: equal), in integers; share 0 takes the
 * remainder, so the shares sum to delta exactly. Returns share i. */
static uint64_t share_of(uint64_t delta, int n, const double *w, int i) {
  double sum = 0;
  for (int r = 0; r < n && w; r++) sum += w[r];
  uint64_t given = 0, mine = 0;
  for (int r = 1; r < n; r++) {
    uint64_t s = (w && sum > 0) ? (uint64_t)floor((double)delta * (w[r] / sum)) : delta / (uint64_t)n;
    if (s > delta - given) s = delta - given;
    given += s;
    if (r == i) mine = s;
  }
  return i == 0 ? delta - given : mine;
}

/* rank 0: one energy.csv row per node and component (cumulative joules), from the ranks' records */
static void write_csv(energy_meter *e, double t) {
  if (!e->csv) return;
  for (int n = 0; n < e->nodes; n++)
    for (int k = 0; k < ENERGY_NCOMP; k++) {
      double j = 0, est = 0;
      for (int r = 0; r < e->size; r++) {
        const double *x = e->rec + (size_t)r * ENERGY_REC;
        if ((int)x[0] == n) j += x[1 + k], est += x[4 + k];
      }
      fprintf(e->csv, "%.3f,%d,%s,%.6f,%.6f\n", t - e->t0, n, energy_component_name(k), j, est);
    }
  fflush(e->csv);
}

void energy_sample(energy_meter *e) {
  /* the sample's time taken under the lock, so no reading of the thread's falls after it */
  pthread_mutex_lock(&e->mu);
  double now = util_now(), dt = now - e->t_last, cpu = util_cpu_seconds(), dcpu = cpu - e->cpu_last;
  e->cpu_last = cpu;
  /* this rank's sensors: their advance since the last sample */
  uint64_t mine[ENERGY_NCOMP] = {0, 0, 0};
  if (e->nzones || e->hw.n) read_node(e, now);
  if (e->gpu_owner) read_gpu(e);
  for (int k = 0; k < ENERGY_NCOMP; k++) mine[k] = e->read_uj[k] - e->taken_uj[k], e->taken_uj[k] = e->read_uj[k];
  pthread_mutex_unlock(&e->mu);
  /* the leader's CPU and DRAM readings, shared among the node's ranks by the rule */
  uint64_t lead[2] = {mine[ENERGY_CPU], mine[ENERGY_DRAM]};
  MPI_Bcast(lead, 2, MPI_UINT64_T, 0, e->node);
  double *w = NULL;
  if (e->by_cpu_time) {
    w = util_malloc((size_t)e->node_size * sizeof(double), "energy weights");
    MPI_Allgather(&dcpu, 1, MPI_DOUBLE, w, 1, MPI_DOUBLE, e->node);
  }
  e->own_uj[ENERGY_CPU] += share_of(lead[0], e->node_size, w, e->node_rank);
  e->own_uj[ENERGY_DRAM] += share_of(lead[1], e->node_size, w, e->node_rank);
  free(w);
  /* the owner's GPU reading, shared equally among the ranks on that GPU */
  if (e->gpu_comm != MPI_COMM_NULL) {
    uint64_t d = mine[ENERGY_GPU];
    int i;
    MPI_Bcast(&d, 1, MPI_UINT64_T, 0, e->gpu_comm);
    MPI_Comm_rank(e->gpu_comm, &i);
    e->own_uj[ENERGY_GPU] += share_of(d, e->gpu_sharers, NULL, i);
  }
  /* estimates, each rank its own */
  double est[ENERGY_NCOMP] = {0, 0, 0};
  if (e->src[ENERGY_CPU].status == ENERGY_ESTIMATED) est[ENERGY_CPU] = e->src[ENERGY_CPU].watts * dcpu;
  if (e->src[ENERGY_DRAM].status == ENERGY_ESTIMATED) est[ENERGY_DRAM] = e->src[ENERGY_DRAM].watts * dt / e->node_size;
  if (e->src[ENERGY_GPU].status == ENERGY_ESTIMATED) est[ENERGY_GPU] = e->src[ENERGY_GPU].watts * dt / e->gpu_sharers;
  for (int k = 0; k < ENERGY_NCOMP; k++) e->own_est_j[k] += est[k];
  /* totals: sums of the shares over the job */
  double rec[ENERGY_REC] = {e->node_id}, tot[2 * ENERGY_NCOMP];
  for (int k = 0; k < ENERGY_NCOMP; k++) rec[1 + k] = 1e-6 * (double)e->own_uj[k], rec[4 + k] = e->own_est_j[k];
  rec[7] = now - e->t0;
  uint64_t uj[ENERGY_NCOMP];
  MPI_Allreduce(e->own_uj, uj, ENERGY_NCOMP, MPI_UINT64_T, MPI_SUM, e->world);
  MPI_Allreduce(e->own_est_j, tot + ENERGY_NCOMP, ENERGY_NCOMP, MPI_DOUBLE, MPI_SUM, e->world);
  /* coverage: ranks by status for the GPU, nodes (leaders) for CPU and DRAM */
  int cov[ENERGY_NCOMP * 3 + 1] = {0}, all[ENERGY_NCOMP * 3 + 1];
  for (int k = 0; k < ENERGY_NCOMP; k++)
    if (k == ENERGY_GPU ? e->gpu_owner : e->leader) cov[3 * k + e->src[k].status] = 1;
  cov[ENERGY_NCOMP * 3] = e->wraps;
  MPI_Allreduce(cov, all, ENERGY_NCOMP * 3 + 1, MPI_INT, MPI_SUM, e->world);
  e->wraps_total = all[ENERGY_NCOMP * 3];
  double before = e->joules, before_est = e->est_joules;
  e->joules = e->est_joules = 0;
  for (int k = 0; k < ENERGY_NCOMP; k++) {
    e->measured_j[k] = 1e-6 * (double)uj[k];
    e->estimated_j[k] = tot[ENERGY_NCOMP + k];
    e->joules += e->measured_j[k], e->est_joules += e->estimated_j[k];
    for (int s = 0; s < 3; s++) e->coverage[k][s] = all[3 * k + s];
  }
  if (dt > 0) e->watts = (e->joules - before) / dt, e->est_watts = (e->est_joules - before_est) / dt;
  MPI_Gather(rec, ENERGY_REC, MPI_DOUBLE, e->rec, ENERGY_REC, MPI_DOUBLE, 0, e->world);
  if (e->rank == 0) write_csv(e, now);
  e->t_last = now;
}

void energy_close(energy_meter *e) {
  if (e->running) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->running = 0;
  }
  for (int z = 0; z < e->nzones; z++) close(e->fd[z]);
  e->nzones = 0;
  hwmon_close(&e->hw);
  if (e->nvml_lib) {
    e->nvml_shutdown();
    dlclose(e->nvml_lib);
    e->nvml_lib = NULL;
  }
  if (e->gpu_comm != MPI_COMM_NULL) MPI_Comm_free(&e->gpu_comm);
  if (e->csv) fclose(e->csv), e->csv = NULL;
  free(e->rec), e->rec = NULL;
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
}

/* ---- reports ----------------------------------------------------------------------------------- */

const char *energy_coverage(const energy_meter *e, int c, char *buf, size_t len) {
  const int *n = e->coverage[c];
  int total = n[0] + n[1] + n[2];
  const char *unit = c == ENERGY_GPU ? "GPU" : "node";
  if (total == 0) util_snprintf(buf, len, "not measured (no %s)", c == ENERGY_GPU ? "GPU in use" : "node");
  else if (n[ENERGY_MEASURED] == total) util_snprintf(buf, len, "measured on %d/%d %s%s", total, total, unit, total == 1 ? "" : "s");
  else if (n[ENERGY_ESTIMATED] == total) util_snprintf(buf, len, "estimated on %d/%d %s%s", total, total, unit, total == 1 ? "" : "s");
  else if (n[ENERGY_NOT_MEASURED] == total) util_snprintf(buf, len, "not measured on %d/%d %s%s", total, total, unit, total == 1 ? "" : "s");
  else
    util_snprintf(buf, len, "partly measured: %d measured, %d estimated, %d not measured of %d %ss", n[0], n[1], n[2], total, unit);
  return buf;
}

static double kwh(double j) { return j / 3.6e6; }

const char *energy_basis(const energy_meter *e) {
  int measured = energy_any_measured(e);
  return measured ? (e->est_joules > 0 ? "measured and estimated" : "measured") : e->est_joules > 0 ? "estimated" : "none";
}

int energy_any_measured(const energy_meter *e) {
  int n = 0;
  for (int k = 0; k < ENERGY_NCOMP; k++) n += e->coverage[k][ENERGY_MEASURED];
  return n > 0;
}

/* One component's line: measured, estimated (with the method and how), or why nothing. */
static void print_component(const energy_meter *e, int k, energy_print_fn print, void *ctx) {
  char cov[160];
  energy_coverage(e, k, cov, sizeof cov);
  const char *name = energy_component_name(k);
  if (e->measured_j[k] > 0 || e->coverage[k][ENERGY_MEASURED]) {
    if (e->estimated_j[k] > 0)
      print(ctx, "energy: %-4s %10.4g kJ  %s (%s), plus %.4g kJ estimated elsewhere\n", name, 1e-3 * e->measured_j[k], cov,
            e->src[k].method, 1e-3 * e->estimated_j[k]);
    else
      print(ctx, "energy: %-4s %10.4g kJ  %s (%s)\n", name, 1e-3 * e->measured_j[k], cov, e->src[k].method);
  } else if (e->estimated_j[k] > 0 || e->coverage[k][ENERGY_ESTIMATED]) {
    print(ctx, "energy: %-4s %10.4g kJ  %s, an estimate (%s: %s)\n", name, 1e-3 * e->estimated_j[k], cov, e->src[k].method,
          e->src[k].note);
  } else if (e->coverage[k][ENERGY_NOT_MEASURED] == 0) {
    print(ctx, "energy: %-4s         --     %s\n", name, cov);
  } else {
    print(ctx, "energy: %-4s         --     %s (%s)\n", name, cov, e->src[k].note);
  }
}

/* "CO2e<what>: G g at I gCO2e/kWh (region; source)" */
static void print_co2e(const energy_meter *e, const char *what, double grams, energy_print_fn print, void *ctx) {
  if (e->region)
    print(ctx, "CO2e%s: %.4g g at %.4g gCO2e/kWh (%s; %s)\n", what, grams, e->intensity, e->region->label, e->region->source);
  else
    print(ctx, "CO2e%s: %.4g g at %.4g gCO2e/kWh (given in the deck: &energy grid_intensity)\n", what, grams, e->intensity);
}

void energy_report_print(const energy_meter *e, double tokens, double flops, energy_print_fn print, void *ctx) {
  for (int k = 0; k < ENERGY_NCOMP; k++) print_component(e, k, print, ctx);
  const char *pue_note = e->pue == 1.0 ? " (the default: give the site's &energy pue)" : "";
  int m = energy_any_measured(e);
  double est_fac = kwh(e->est_joules) * e->pue;
  if (m) {
    double fac = kwh(e->joules) * e->pue;
    print(ctx, "IT energy (measured components): %.4g kWh; facility %.4g kWh with PUE %.2f%s\n", kwh(e->joules), fac, e->pue, pue_note);
    print_co2e(e, "", fac * e->intensity, print, ctx);
    if (tokens > 0 && flops > 0)
      print(ctx, "efficiency: %.4g J/token (IT), %.4g J/token with PUE, %.4g kWh per 1e18 FLOP\n", e->joules / tokens,
            e->joules * e->pue / tokens, kwh(e->joules) / (flops / 1e18));
    if (e->est_joules > 0)
      print(ctx, "with the estimates for the components without a sensor: IT %.4g kWh, facility %.4g kWh, CO2e %.4g g "
                 "(%.4g g measured + %.4g g estimated)\n",
            kwh(e->joules + e->est_joules), fac + est_fac, (fac + est_fac) * e->intensity, fac * e->intensity,
            est_fac * e->intensity);
  } else if (e->est_joules > 0) {
    print(ctx, "IT energy: not measured; estimated %.4g kWh, facility %.4g kWh with PUE %.2f%s\n", kwh(e->est_joules), est_fac,
          e->pue, pue_note);
    print_co2e(e, " (estimated, not measured)", est_fac * e->intensity, print, ctx);
  } else {
    print(ctx, "IT energy: not measured; CO2e not computed\n");
  }
  double j = m ? e->joules : e->est_joules;
  if (j > 0 && tokens > 0) {
    int n;
    const energy_reference *r = energy_references(&n);
    char line[512];
    int o = util_snprintf(line, sizeof line, "per token: this run %.3g J%s;", j / tokens, m ? "" : " (estimated)");
    for (int i = 0; i < n && o < (int)sizeof line; i++)
      o += snprintf(line + o, sizeof line - (size_t)o, " %s %.3g J%s", r[i].model, r[i].mwh * 3.6e9 / r[i].tokens,
                    i + 1 < n ? "," : "");
    print(ctx, "%s (published totals / tokens; doc/energy.md)\n", line);
  }
}

json_t *energy_report_json(const energy_meter *e, const cfg_config *cfg, double duration, double tokens, double flops,
                           double mfu, const char *cpu_model, int cpu_count, double ram_gib) {
  json_t *j = json_object();
  char ts[64];
  time_t now = time(NULL);
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  double it = kwh(e->joules), fac = it * e->pue, kg = fac * e->intensity / 1000.0;
  int measured = energy_any_measured(e);
  /* the fields CodeCarbon's emissions.csv has, with its names and units (kWh, kg, W, s) */
  json_object_set_new(j, "timestamp", json_string(ts));
  json_object_set_new(j, "project_name", json_string(cfg->job.name));
  json_object_set_new(j, "run_dir", json_string(cfg->job.run_dir));
  json_object_set_new(j, "duration", json_real(duration));
  json_object_set_new(j, "emissions", measured ? json_real(kg) : json_null());
  json_object_set_new(j, "emissions_rate", measured && duration > 0 ? json_real(kg / duration) : json_null());
  static const char *power[] = {"cpu_power", "ram_power", "gpu_power"}, *energy[] = {"cpu_energy", "ram_energy", "gpu_energy"};
  for (int k = 0; k < ENERGY_NCOMP; k++) {
    int m = e->coverage[k][ENERGY_MEASURED] > 0;
    json_object_set_new(j, power[k], m && duration > 0 ? json_real(e->measured_j[k] / duration) : json_null());
    json_object_set_new(j, energy[k], m ? json_real(kwh(e->measured_j[k])) : json_null());
  }
  json_object_set_new(j, "energy_consumed", measured ? json_real(it) : json_null());
  json_object_set_new(j, "region", json_string(e->region ? e->region->name : "deck"));
  json_object_set_new(j, "pue", json_real(e->pue));
  json_object_set_new(j, "cpu_count", json_integer(cpu_count));
  json_object_set_new(j, "cpu_model", json_string(cpu_model ? cpu_model : ""));
  json_object_set_new(j, "gpu_count", json_integer(e->coverage[ENERGY_GPU][0] + e->coverage[ENERGY_GPU][1] + e->coverage[ENERGY_GPU][2]));
  json_object_set_new(j, "gpu_model", json_string(e->gpu_name));
  json_object_set_new(j, "ram_total_size", json_real(ram_gib));
  json_object_set_new(j, "tracking_mode", json_string("machine"));
  /* greenlm's own fields */
  json_object_set_new(j, "greenlm_version", json_string(PACKAGE_VERSION));
  json_object_set_new(j, "ranks", json_integer(e->size));
  json_object_set_new(j, "nodes", json_integer(e->nodes));
  json_object_set_new(j, "attribution_rule", json_string(e->by_cpu_time ? "cpu_time" : "equal"));
  json_object_set_new(j, "facility_energy", measured ? json_real(fac) : json_null());
  json_object_set_new(j, "estimated_energy", json_real(kwh(e->est_joules)));
  json_object_set_new(j, "estimated_emissions", json_real(kwh(e->est_joules) * e->pue * e->intensity / 1000.0));
  json_object_set_new(j, "energy_with_estimates", json_real(kwh(e->joules + e->est_joules)));
  json_object_set_new(j, "emissions_with_estimates", json_real(kwh(e->joules + e->est_joules) * e->pue * e->intensity / 1000.0));
  json_object_set_new(j, "energy_basis", json_string(energy_basis(e)));
  json_object_set_new(j, "carbon_intensity_g_per_kwh", json_real(e->intensity));
  json_object_set_new(j, "ci_basis", json_string(e->region ? e->region->basis : "given in the deck"));
  json_object_set_new(j, "ci_source", json_string(e->region ? e->region->source : "&energy grid_intensity"));
  json_object_set_new(j, "tokens", json_real(tokens));
  json_object_set_new(j, "flops_total", json_real(flops));
  json_object_set_new(j, "mfu", isfinite(mfu) ? json_real(mfu) : json_null());
  json_object_set_new(j, "j_per_token", measured && tokens > 0 ? json_real(e->joules / tokens) : json_null());
  json_object_set_new(j, "j_per_flop", measured && flops > 0 ? json_real(e->joules / flops) : json_null());
  json_object_set_new(j, "kwh_per_1e18_flop", measured && flops > 0 ? json_real(it / (flops / 1e18)) : json_null());
  json_t *comp = json_object();
  for (int k = 0; k < ENERGY_NCOMP; k++) {
    json_t *c = json_object();
    char cov[160];
    int m = e->coverage[k][ENERGY_MEASURED] > 0;
    json_object_set_new(c, "status", json_string(energy_status_name(e->src[k].status)));
    json_object_set_new(c, "coverage", json_string(energy_coverage(e, k, cov, sizeof cov)));
    json_object_set_new(c, "method", json_string(e->src[k].method));
    json_object_set_new(c, "note", json_string(e->src[k].note));
    json_object_set_new(c, "model", e->src[k].model[0] ? json_string(e->src[k].model) : json_null());
    json_object_set_new(c, "estimate_basis_w", e->src[k].status == ENERGY_ESTIMATED ? json_real(e->src[k].watts) : json_null());
    json_object_set_new(c, "energy_j", m ? json_real(e->measured_j[k]) : json_null());
    json_object_set_new(c, "estimated_j", json_real(e->estimated_j[k]));
    json_object_set_new(comp, energy_component_name(k), c);
  }
  json_object_set_new(j, "components", comp);
  json_object_set_new(j, "rapl_wraps", json_integer(e->wraps_total));
  json_t *refs = json_array();
  int n;
  const energy_reference *r = energy_references(&n);
  for (int i = 0; i < n; i++) {
    json_t *x = json_object();
    json_object_set_new(x, "model", json_string(r[i].model));
    json_object_set_new(x, "energy_mwh", json_real(r[i].mwh));
    json_object_set_new(x, "j_per_token", json_real(r[i].mwh * 3.6e9 / r[i].tokens));
    json_object_set_new(x, "kwh_per_1e18_flop", json_real(r[i].mwh * 1e3 / (r[i].flops / 1e18)));
    json_object_set_new(x, "source", json_string(r[i].source));
    json_array_append_new(refs, x);
  }
  json_object_set_new(j, "published_footprints", refs);
  json_t *pr = json_array();
  for (int i = 0; e->rec && i < e->size; i++) {
    const double *x = e->rec + (size_t)i * ENERGY_REC;
    json_t *o = json_object();
    json_object_set_new(o, "rank", json_integer(i));
    json_object_set_new(o, "node", json_integer((json_int_t)x[0]));
    json_object_set_new(o, "cpu_j", json_real(x[1]));
    json_object_set_new(o, "dram_j", json_real(x[2]));
    json_object_set_new(o, "gpu_j", json_real(x[3]));
    json_object_set_new(o, "estimated_j", json_real(x[4] + x[5] + x[6]));
    json_array_append_new(pr, o);
  }
  json_object_set_new(j, "per_rank", pr);
  return j;
}
