/* test_energy: the energy module on 4 ranks (mpiexec -n 4), with a fake powercap tree
 * (GREENLM_POWERCAP_ROOT) and the stub NVML library built by the tests (GREENLM_NVML_LIBRARY).
 *
 *   - RAPL: two packages and a dram zone (psys skipped), one counter wrapping, read by one rank per
 *     node: 4 ranks on one node count the node's energy once, 2 "nodes" of 2 ranks twice; the
 *     ranks' shares sum to the node's reading exactly, with equal and CPU-time attribution;
 *   - NVML: a GPU with an energy counter shared by two ranks (read once, split), a GPU without one
 *     (power samples integrated), a rank without a GPU, and NVML missing (not measured, or a
 *     labelled estimate from a TDP);
 *   - no RAPL: "estimated" from the hardware power table by default (the method named: TDP by
 *     model or the per-core default, DRAM per GB), from a deck TDP when given, "not measured" with
 *     &energy estimate = .false.; never a silent zero; measured always wins over an estimate;
 *   - the hardware power table: model names to TDP and cores, board power by GPU name, unknown
 *     parts, the node's memory (MemTotal, cgroup v1/v2 limits) and the driver's GPU names;
 *   - the report: each component's method in the lines and report.json, estimated CO2e labelled
 *     and kept apart from the measured totals. */
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <time.h>
#include <mpi.h>
#include <unistd.h>

#include "energy/energy.h"
#include "energy/hwpower.h"
#include "testing.h"
#include "base/util.h"

static char root[4096], stub_file[4200];

/* Write v into the counter file at path in place (the meter keeps it open), zero-padded. */
static void set_counter(const char *path, unsigned long long v) {
  char buf[32];
  int n = snprintf(buf, sizeof buf, "%020llu\n", v);
  int fd = open(path, O_WRONLY | O_CREAT, 0644);
  T_CHECK(fd >= 0 && pwrite(fd, buf, (size_t)n, 0) == n, "cannot write %s", path);
  if (fd >= 0) close(fd);
}

static void put_file(const char *path, const char *text) {
  FILE *fp = fopen(path, "w");
  T_CHECK(fp != NULL, "cannot write %s", path);
  if (fp) fputs(text, fp), fclose(fp);
}

static void zone(const char *sub, const char *name, unsigned long long range, unsigned long long v) {
  char dir[4400], path[4500], text[64];
  snprintf(dir, sizeof dir, "%s/%s", root, sub);
  util_mkdir_p(dir);
  snprintf(path, sizeof path, "%s/name", dir);
  snprintf(text, sizeof text, "%s\n", name);
  put_file(path, text);
  snprintf(path, sizeof path, "%s/max_energy_range_uj", dir);
  snprintf(text, sizeof text, "%llu\n", range);
  put_file(path, text);
  snprintf(path, sizeof path, "%s/energy_uj", dir);
  set_counter(path, v);
}

static void counter(const char *sub, unsigned long long v) {
  char path[4500];
  snprintf(path, sizeof path, "%s/%s/energy_uj", root, sub);
  set_counter(path, v);
}

static cfg_energy deck(double cpu_tdp, double gpu_tdp, const char *attribution) {
  cfg_energy c;
  memset(&c, 0, sizeof c);
  c.pue = 1.5;
  util_strlcpy(c.region, "france", sizeof c.region);
  c.cpu_tdp_w = cpu_tdp, c.gpu_tdp_w = gpu_tdp;
  util_strlcpy(c.attribution, attribution, sizeof c.attribution);
  c.sample_seconds = 0.02;
  c.estimate = 1; /* the default */
  return c;
}

static void pause_s(double s, MPI_Comm comm) {
  MPI_Barrier(comm);
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
  MPI_Barrier(comm);
}

/* The fake tree: package-0 (range 1e6, wraps), its dram, package-1, and psys (never read). */
static void rapl_case(MPI_Comm node, int nodes_expected, const char *attribution) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    zone("intel-rapl:0", "package-0", 1000000, 900000);
    zone("intel-rapl:0/intel-rapl:0:0", "dram", 1000000, 7);
    zone("intel-rapl:1", "package-1", 5000000, 5);
    zone("intel-rapl:2", "psys", 1000000, 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  setenv("GREENLM_POWERCAP_ROOT", root, 1);
  cfg_energy c = deck(0, 0, attribution);
  energy_meter e;
  err_list eerr = {0};
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, node, 2, NULL, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
  T_CHECK(e.src[ENERGY_CPU].status == ENERGY_MEASURED && strcmp(e.src[ENERGY_CPU].method, "rapl_sysfs") == 0,
          "cpu not measured by RAPL: %s", e.src[ENERGY_CPU].note);
  T_CHECK(e.src[ENERGY_DRAM].status == ENERGY_MEASURED, "dram not measured: %s", e.src[ENERGY_DRAM].note);
  T_CHECK(!strstr(e.src[ENERGY_CPU].note, "psys"), "psys was read: %s", e.src[ENERGY_CPU].note);
  /* package-0: +50000, then a wrap to 100000 (+150000), each seen by the sampling thread */
  if (rank == 0) counter("intel-rapl:0", 950000);
  pause_s(0.2, MPI_COMM_WORLD);
  if (rank == 0) counter("intel-rapl:0", 100000), counter("intel-rapl:1", 300005), counter("intel-rapl:0/intel-rapl:0:0", 70007);
  pause_s(0.2, MPI_COMM_WORLD);
  /* some CPU time for the CPU-time rule, more on some ranks */
  volatile double x = 0;
  for (long i = 0; i < 2000000L * (rank + 1); i++) x += 1e-9 * (double)i;
  energy_sample(&e);
  int nodes = e.nodes;
  T_CHECK(nodes == nodes_expected, "%d nodes, expected %d", nodes, nodes_expected);
  /* each node's leader read 0.2 J + 0.3 J of packages and 0.07 J of dram: counted once per node */
  T_CHECK(fabs(e.measured_j[ENERGY_CPU] - 0.5 * nodes) < 1e-12, "cpu %.9f J, expected %.1f (counted once per node)",
          e.measured_j[ENERGY_CPU], 0.5 * nodes);
  T_CHECK(fabs(e.measured_j[ENERGY_DRAM] - 0.07 * nodes) < 1e-12, "dram %.9f J, expected %.2f", e.measured_j[ENERGY_DRAM],
          0.07 * nodes);
  int wraps = e.wraps_total;
  T_CHECK(wraps == nodes, "%d wraps seen, expected one per node", wraps);
  /* the shares of each node sum to its reading exactly (integer microjoules) */
  uint64_t sums[2], node_sum[2];
  MPI_Allreduce(&e.own_uj[ENERGY_CPU], &node_sum[0], 1, MPI_UINT64_T, MPI_SUM, node);
  MPI_Allreduce(&e.own_uj[ENERGY_DRAM], &node_sum[1], 1, MPI_UINT64_T, MPI_SUM, node);
  T_CHECK(node_sum[0] == 500000 && node_sum[1] == 70000, "%s: a node's shares sum to %llu + %llu uJ, not 500000 + 70000",
          attribution, (unsigned long long)node_sum[0], (unsigned long long)node_sum[1]);
  MPI_Allreduce(e.own_uj, sums, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  T_CHECK(sums[0] == 500000ull * (uint64_t)nodes, "job shares sum to %llu", (unsigned long long)sums[0]);
  if (strcmp(attribution, "equal") == 0) {
    int n;
    MPI_Comm_size(node, &n);
    T_CHECK(e.own_uj[ENERGY_CPU] == 500000ull / (uint64_t)n, "equal share %llu", (unsigned long long)e.own_uj[ENERGY_CPU]);
  }
  if (rank == 0) {
    T_CHECK(e.coverage[ENERGY_CPU][ENERGY_MEASURED] == nodes, "coverage %d", e.coverage[ENERGY_CPU][ENERGY_MEASURED]);
    double per_rank = 0;
    for (int r = 0; r < e.size; r++) per_rank += e.rec[(size_t)r * ENERGY_REC + 1];
    T_CHECK(fabs(per_rank - e.measured_j[ENERGY_CPU]) < 1e-9, "per-rank records sum to %.9f", per_rank);
  }
  energy_close(&e);
  (void)x;
}

/* dir/rel holding text, its directory made first. */
static void put_in(const char *dir, const char *rel, const char *text) {
  char path[4600];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  char *slash = strrchr(path, '/');
  *slash = '\0';
  util_mkdir_p(path);
  *slash = '/';
  put_file(path, text);
}

/* Sensor i of the simulated device dir/hwmon0: its label and its reading. */
static void hwmon_sensor(const char *dir, int i, const char *label, double watts) {
  char rel[64], text[128];
  snprintf(rel, sizeof rel, "hwmon0/power%d_label", i);
  snprintf(text, sizeof text, "%s\n", label);
  put_in(dir, rel, text);
  snprintf(rel, sizeof rel, "hwmon0/power%d_input", i);
  snprintf(text, sizeof text, "%.0f\n", watts * 1e6);
  put_in(dir, rel, text);
}

/* A simulated POWER9 node's hwmon tree (the OCC's sensors through ibmpowernv): the system total,
 * the two processors with one's rails and GPU, memory; a second device without power sensors. */
static void hwmon_case(void) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char dir[4400];
  snprintf(dir, sizeof dir, "%s/hwmon", root);
  if (rank == 0) {
    hwmon_sensor(dir, 1, "System", 1050);
    hwmon_sensor(dir, 2, "Proc 0", 100);
    hwmon_sensor(dir, 3, "Proc 0 Vdd", 60);
    hwmon_sensor(dir, 4, "Proc 1", 120);
    hwmon_sensor(dir, 5, "Proc 0 GPU", 300);
    hwmon_sensor(dir, 6, "Proc 0 Memory", 30);
    put_in(dir, "hwmon0/name", "ibmpowernv\n");
    put_in(dir, "hwmon1/name", "nvme\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  setenv("GREENLM_POWERCAP_ROOT", "/nonexistent", 1);
  setenv("GREENLM_HWMON_ROOT", dir, 1);
  setenv("GREENLM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  cfg_energy c = deck(0, 0, "equal");
  energy_meter e;
  err_list eerr = {0};
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, NULL, NULL, 0, &eerr) == 0, "hwmon open failed");
  T_CHECK(e.src[ENERGY_CPU].status == ENERGY_MEASURED && !strcmp(e.src[ENERGY_CPU].method, "hwmon_power_integrated"),
          "cpu not measured by hwmon: %s %s", e.src[ENERGY_CPU].method, e.src[ENERGY_CPU].note);
  T_CHECK(e.src[ENERGY_DRAM].status == ENERGY_MEASURED, "memory not measured by hwmon: %s", e.src[ENERGY_DRAM].note);
  const char *note = e.src[ENERGY_CPU].note;
  T_CHECK(strstr(note, "Proc 0 (ibmpowernv hwmon0 power2)") && strstr(note, "Proc 1") && !strstr(note, "System") &&
              !strstr(note, "Vdd") && !strstr(note, "GPU"),
          "hwmon sensors read for the CPU: %s", note);
  pause_s(0.5, MPI_COMM_WORLD);
  energy_sample(&e);
  double t = e.t_last - e.t0; /* the leader's: from the meter's start to the sample */
  MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const double cpu = 220 * t, dram = 30 * t;
  T_CHECK(t > 0.45, "the sensors integrated over %.3f s of a 0.5 s pause", t);
  T_CHECK(fabs(e.measured_j[ENERGY_CPU] - cpu) < 0.01 * cpu, "hwmon cpu %.4f J in %.3f s, the sensors imply %.4f J",
          e.measured_j[ENERGY_CPU], t, cpu);
  T_CHECK(fabs(e.measured_j[ENERGY_DRAM] - dram) < 0.01 * dram, "hwmon memory %.4f J in %.3f s, the sensors imply %.4f J",
          e.measured_j[ENERGY_DRAM], t, dram);
  energy_close(&e);
  /* only totals and rails: labelled estimates, saying why */
  if (rank == 0) {
    put_in(dir, "hwmon0/power2_label", "Proc 0 Vdn\n");
    put_in(dir, "hwmon0/power4_label", "Total\n");
    put_in(dir, "hwmon0/power6_label", "Vio\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, NULL, NULL, 0, &eerr) == 0, "hwmon open failed");
  T_CHECK(e.src[ENERGY_CPU].status == ENERGY_ESTIMATED && strstr(e.src[ENERGY_CPU].note, "no processor or memory power sensors"),
          "no usable hwmon sensor: cpu %s", e.src[ENERGY_CPU].note);
  energy_close(&e);
  err_free(&eerr);
  unsetenv("GREENLM_HWMON_ROOT");
}

/* GPUs by the stub: rank 0 and 1 on GPU A (counter), rank 2 on GPU B (power only), rank 3 none. */
static void nvml_case(const char *lib) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) put_file(stub_file, "00000000:3B:00.0 1000 250000 1\n00000000:5E:00.0 0 100000 0\n");
  MPI_Barrier(MPI_COMM_WORLD);
  setenv("GREENLM_NVML_LIBRARY", lib, 1);
  setenv("GREENLM_NVML_STUB", stub_file, 1);
  setenv("GREENLM_POWERCAP_ROOT", "/nonexistent", 1);
  const char *bus = rank < 2 ? "00000000:3B:00.0" : rank == 2 ? "00000000:5E:00.0" : NULL;
  cfg_energy c = deck(0, 0, "equal");
  energy_meter e;
  err_list eerr = {0};
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, bus, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
  const char *want = rank < 2 ? "nvml_energy_counter" : rank == 2 ? "nvml_power_sampled" : "none";
  T_CHECK(strcmp(e.src[ENERGY_GPU].method, want) == 0, "rank %d: GPU method %s, expected %s (%s)", rank,
          e.src[ENERGY_GPU].method, want, e.src[ENERGY_GPU].note);
  T_CHECK(e.gpu_owner == (rank == 0 || rank == 2), "rank %d: owner %d", rank, e.gpu_owner);
  double t0 = util_now();
  pause_s(0.05, MPI_COMM_WORLD);
  if (rank == 0) put_file(stub_file, "00000000:3B:00.0 6000 250000 1\n00000000:5E:00.0 0 100000 0\n");
  pause_s(0.5, MPI_COMM_WORLD);
  energy_sample(&e);
  double dt = util_now() - t0;
  /* A: 5000 mJ read once, split 2.5 J + 2.5 J; B: 100 W x about dt */
  double mine = 1e-6 * (double)e.own_uj[ENERGY_GPU];
  if (rank < 2) T_CHECK(fabs(mine - 2.5) < 1e-12, "rank %d: GPU share %.6f J, expected 2.5", rank, mine);
  if (rank == 2) T_CHECK(mine > 100.0 * (dt - 0.3) && mine < 100.0 * (dt + 0.1), "power samples gave %.3f J over %.2f s at 100 W", mine, dt);
  if (rank == 3) T_CHECK(mine == 0, "a rank without a GPU got %.3f J", mine);
  T_CHECK(e.coverage[ENERGY_GPU][ENERGY_MEASURED] == 2, "GPU coverage %d, expected 2 GPUs", e.coverage[ENERGY_GPU][ENERGY_MEASURED]);
  T_CHECK(e.src[ENERGY_CPU].status == ENERGY_ESTIMATED, "cpu without RAPL, estimates on, is %s", energy_status_name(e.src[ENERGY_CPU].status));
  energy_close(&e);

  /* measured wins: with a deck TDP and estimates on, the GPU with a counter is still measured */
  c = deck(50, 300, "equal");
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, bus, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
  T_CHECK(strcmp(e.src[ENERGY_GPU].method, want) == 0, "rank %d: with a TDP the GPU method is %s, expected %s", rank,
          e.src[ENERGY_GPU].method, want);
  energy_close(&e);

  /* NVML missing, &energy estimate = .false.: not measured; with a TDP, estimated and labelled,
   * outside the measured totals */
  setenv("GREENLM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  for (int tdp = 0; tdp <= 1; tdp++) {
    c = deck(tdp ? 50 : 0, tdp ? 300 : 0, "equal");
    c.estimate = 0;
    T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, bus, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
    energy_status st = bus ? e.src[ENERGY_GPU].status : ENERGY_NOT_MEASURED;
    T_CHECK(st == (tdp && bus ? ENERGY_ESTIMATED : ENERGY_NOT_MEASURED), "rank %d, tdp %d: GPU %s (%s)", rank, tdp,
            energy_status_name(st), e.src[ENERGY_GPU].note);
    T_CHECK(e.src[ENERGY_CPU].status == (tdp ? ENERGY_ESTIMATED : ENERGY_NOT_MEASURED), "tdp %d: cpu %s", tdp,
            energy_status_name(e.src[ENERGY_CPU].status));
    T_CHECK(strstr(e.src[ENERGY_CPU].note, tdp ? "estimate: &energy cpu_tdp_w 50 W" : "&energy estimate = .false.") != NULL,
            "cpu note: %s", e.src[ENERGY_CPU].note);
    T_CHECK(strcmp(e.src[ENERGY_CPU].method, tdp ? "deck_tdp_estimate" : "none") == 0, "tdp %d: cpu method %s", tdp,
            e.src[ENERGY_CPU].method);
    T_CHECK(e.src[ENERGY_DRAM].status == ENERGY_NOT_MEASURED, "estimate off: dram %s", energy_status_name(e.src[ENERGY_DRAM].status));
    volatile double x = 0;
    for (long i = 0; i < 3000000L; i++) x += 1e-9 * (double)i;
    (void)x;
    pause_s(0.1, MPI_COMM_WORLD);
    energy_sample(&e);
    T_CHECK(!energy_any_measured(&e) && e.joules == 0, "tdp %d: something measured: %.3f J", tdp, e.joules);
    if (tdp) {
      T_CHECK(e.estimated_j[ENERGY_CPU] > 0, "no CPU estimate");
      T_CHECK(e.estimated_j[ENERGY_GPU] > 300 * 0.1 * 2, "GPU estimate %.2f J for 2 GPUs at 300 W", e.estimated_j[ENERGY_GPU]);
    } else {
      T_CHECK(e.est_joules == 0, "an estimate without a TDP: %.3f J", e.est_joules);
    }
    char cov[160];
    energy_coverage(&e, ENERGY_CPU, cov, sizeof cov);
    T_CHECK(strstr(cov, tdp ? "estimated" : "not measured") != NULL, "coverage: %s", cov);
    energy_close(&e);
  }
}

/* ---- the hardware power table ------------------------------------------------------------------ */

static void expect_part(const hwpower_part *t, int n, const char *name, double watts, int cores) {
  const hwpower_part *p = hwpower_match(t, n, name);
  if (watts == 0) {
    T_CHECK(p == NULL, "'%s' matched %s", name, p ? p->model : "");
    return;
  }
  T_CHECK(p != NULL && p->watts == watts && p->cores == cores, "'%s': %s %.0f W %d cores, expected %.0f W %d cores", name,
          p ? p->model : "no match", p ? p->watts : 0, p ? p->cores : 0, watts, cores);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Every entry sourced and reachable: its own pattern finds it, not an earlier, more general one. */
static void table_sound(const hwpower_part *t, int n, int cpu) {
  for (int i = 0; i < n; i++) {
    T_CHECK(t[i].watts > 0 && (!cpu || t[i].cores > 0) && t[i].source && *t[i].source, "%s lacks a figure or source", t[i].model);
    T_CHECK(hwpower_match(t, n, t[i].pattern) == &t[i], "'%s' is shadowed by an earlier entry", t[i].pattern);
  }
}

static void hwpower_case(void) {
  int nc, ng;
  const hwpower_part *cpus = hwpower_cpus(&nc), *gpus = hwpower_gpus(&ng);
  table_sound(cpus, nc, 1);
  table_sound(gpus, ng, 0);
  /* /proc/cpuinfo model names */
  expect_part(cpus, nc, "Intel(R) Xeon(R) Platinum 8480+", 350, 56);
  expect_part(cpus, nc, "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", 150, 20);
  expect_part(cpus, nc, "Intel(R) Xeon(R) Gold 6248R CPU @ 3.00GHz", 205, 24);
  expect_part(cpus, nc, "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz", 120, 14);
  expect_part(cpus, nc, "AMD EPYC 7763 64-Core Processor", 280, 64);
  expect_part(cpus, nc, "AMD EPYC 9654 96-Core Processor", 360, 96);
  expect_part(cpus, nc, "AMD Ryzen 9 5950X 16-Core Processor", 105, 16);
  expect_part(cpus, nc, "Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz", 15, 4);
  /* unknown: a virtual machine's generic name, a near miss */
  expect_part(cpus, nc, "Intel(R) Xeon(R) Processor", 0, 0);
  expect_part(cpus, nc, "AMD EPYC Processor", 0, 0);
  expect_part(cpus, nc, "Intel(R) Xeon(R) Gold 62480", 0, 0);
  /* GPU names as the driver gives them */
  expect_part(gpus, ng, "Tesla V100-SXM2-32GB", 300, 0);
  expect_part(gpus, ng, "Tesla V100-PCIE-16GB", 250, 0);
  expect_part(gpus, ng, "NVIDIA A100-SXM4-80GB", 400, 0);
  expect_part(gpus, ng, "NVIDIA A100-PCIE-40GB", 250, 0);
  expect_part(gpus, ng, "NVIDIA A100 80GB PCIe", 300, 0);
  expect_part(gpus, ng, "NVIDIA H100 80GB HBM3", 700, 0);
  expect_part(gpus, ng, "NVIDIA H100 PCIe", 350, 0);
  expect_part(gpus, ng, "NVIDIA H200", 700, 0);
  expect_part(gpus, ng, "NVIDIA H200 NVL", 600, 0);
  expect_part(gpus, ng, "NVIDIA L40S", 350, 0);
  expect_part(gpus, ng, "NVIDIA A10", 150, 0);
  expect_part(gpus, ng, "Stub GPU 1", 0, 0);
  /* the per-core default is the table's median share, within half a watt */
  double *w = util_malloc((size_t)nc * sizeof *w, "shares");
  for (int i = 0; i < nc; i++) w[i] = cpus[i].watts / cpus[i].cores;
  qsort(w, (size_t)nc, sizeof *w, cmp_double);
  double median = nc % 2 ? w[nc / 2] : 0.5 * (w[nc / 2 - 1] + w[nc / 2]);
  T_CHECK(fabs(HWPOWER_CORE_DEFAULT_W - median) <= 0.5, "per-core default %.2f W, the table's median %.2f W", HWPOWER_CORE_DEFAULT_W,
          median);
  free(w);
}

/* What the node says: fake /proc and cgroup files. */
static void node_files_case(void) {
  char dir[4400], path[4600], a[4700], b[4600], buf[128], basis[96];
  snprintf(dir, sizeof dir, "%s/../node", root);
  snprintf(path, sizeof path, "%s/cpuinfo", dir);
  util_mkdir_p(dir);
  put_file(path, "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7742 64-Core Processor\nflags\t: fpu\n");
  T_CHECK(hwpower_cpu_model(path, buf, sizeof buf) == 0 && strcmp(buf, "AMD EPYC 7742 64-Core Processor") == 0, "cpuinfo model '%s'", buf);
  put_file(path, "processor\t: 0\n");
  T_CHECK(hwpower_cpu_model(path, buf, sizeof buf) != 0, "a model name from a cpuinfo without one");
  /* MemTotal 16 GiB; a cgroup v2 job at /job/step limited to 4e9 bytes by its parent; v1 unlimited */
  snprintf(a, sizeof a, "%s/meminfo", dir);
  put_file(a, "MemTotal:       16777216 kB\nMemFree:         1000 kB\n");
  snprintf(b, sizeof b, "%s/self-cgroup", dir);
  put_file(b, "0::/job/step\n");
  snprintf(path, sizeof path, "%s/cg/job/step", dir);
  util_mkdir_p(path);
  snprintf(path, sizeof path, "%s/cg/job/step/memory.max", dir);
  put_file(path, "max\n");
  snprintf(path, sizeof path, "%s/cg/job/memory.max", dir);
  put_file(path, "4000000000\n");
  snprintf(path, sizeof path, "%s/cg", dir);
  double bytes = hwpower_memory_bytes(a, b, path, basis, sizeof basis);
  T_CHECK(bytes == 4e9 && strstr(basis, "cgroup"), "cgroup v2 limit: %.0f bytes (%s)", bytes, basis);
  put_file(b, "7:memory:/job/step\n");
  snprintf(path, sizeof path, "%s/cg/memory/job/step", dir);
  util_mkdir_p(path);
  snprintf(path, sizeof path, "%s/cg/memory/job/step/memory.limit_in_bytes", dir);
  put_file(path, "9223372036854771712\n");
  snprintf(path, sizeof path, "%s/cg", dir);
  bytes = hwpower_memory_bytes(a, b, path, basis, sizeof basis);
  T_CHECK(bytes == 16777216.0 * 1024 && strstr(basis, "MemTotal"), "no cgroup limit: %.0f bytes (%s)", bytes, basis);
  /* the driver's GPU entry, found whatever the bus id's domain width and case */
  snprintf(path, sizeof path, "%s/gpus/0000:3b:00.0", dir);
  util_mkdir_p(path);
  snprintf(a, sizeof a, "%s/information", path);
  put_file(a, "Model: \t\t NVIDIA H200\nIRQ:   \t\t 34\nBus Location: \t 0000:3b:00.0\n");
  snprintf(path, sizeof path, "%s/gpus", dir);
  T_CHECK(hwpower_gpu_name(path, "00000000:3B:00.0", buf, sizeof buf) == 0 && strcmp(buf, "NVIDIA H200") == 0, "GPU name '%s'", buf);
  T_CHECK(hwpower_gpu_name(path, "00000000:5E:00.0", buf, sizeof buf) != 0, "a name for an absent GPU");
}

/* Print callback into a buffer. */
static char report[8192];
static void to_report(void *ctx, const char *fmt, ...) {
  (void)ctx;
  size_t n = strlen(report);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(report + n, sizeof report - n, fmt, ap);
  va_end(ap);
}

static const char *comp_str(json_t *j, const char *comp, const char *key) {
  return json_string_value(json_object_get(json_object_get(json_object_get(j, "components"), comp), key));
}

/* No sensor, nothing in the deck: estimated from the table by default, every figure named by its
 * method; the report's CO2e is the estimate's, labelled; measured fields stay null. */
static void default_estimate_case(void) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  setenv("GREENLM_POWERCAP_ROOT", "/nonexistent", 1);
  setenv("GREENLM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  const char *bus = rank == 3 ? "00000000:3B:00.0" : NULL;
  cfg_energy c = deck(0, 0, "equal");
  energy_meter e;
  err_list eerr = {0};
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, bus, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
  /* the CPU: the table's entry for this machine's model, or the per-core default */
  char model[128] = "unknown CPU";
  hwpower_cpu_model("/proc/cpuinfo", model, sizeof model);
  const hwpower_part *p = hwpower_cpu(model);
  const energy_source *cpu = &e.src[ENERGY_CPU], *dram = &e.src[ENERGY_DRAM];
  T_CHECK(cpu->status == ENERGY_ESTIMATED && strcmp(cpu->method, p ? "tdp_table_estimate" : "per_core_default_estimate") == 0,
          "cpu '%s': %s, %s (%s)", model, energy_status_name(cpu->status), cpu->method, cpu->note);
  T_CHECK(fabs(cpu->watts - (p ? p->watts / p->cores : HWPOWER_CORE_DEFAULT_W)) < 1e-12, "cpu %.3f W per core", cpu->watts);
  T_CHECK(p ? strcmp(cpu->model, p->model) == 0 : cpu->model[0] == '\0', "cpu model '%s'", cpu->model);
  /* DRAM: per GB of this node's memory */
  char basis[96];
  double bytes = hwpower_memory_bytes("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup", basis, sizeof basis);
  T_CHECK(dram->status == ENERGY_ESTIMATED && strcmp(dram->method, "dram_per_gb_estimate") == 0, "dram %s (%s)", dram->method,
          dram->note);
  T_CHECK(fabs(dram->watts - HWPOWER_DRAM_W_PER_GB * bytes / 1e9) < 1e-9, "dram %.3f W for %.0f bytes", dram->watts, bytes);
  /* a GPU without NVML and (on this machine) without the driver's name: not measured, a hint */
  DIR *drv = opendir("/proc/driver/nvidia/gpus");
  if (drv) closedir(drv);
  if (rank == 3 && !drv)
    T_CHECK(e.src[ENERGY_GPU].status == ENERGY_NOT_MEASURED && strstr(e.src[ENERGY_GPU].note, "give &energy gpu_tdp_w"),
            "GPU without a name: %s (%s)", energy_status_name(e.src[ENERGY_GPU].status), e.src[ENERGY_GPU].note);
  volatile double x = 0;
  for (long i = 0; i < 3000000L; i++) x += 1e-9 * (double)i;
  (void)x;
  pause_s(0.1, MPI_COMM_WORLD);
  energy_sample(&e);
  T_CHECK(!energy_any_measured(&e) && e.joules == 0, "something measured: %.3f J", e.joules);
  T_CHECK(e.estimated_j[ENERGY_CPU] > 0 && e.estimated_j[ENERGY_DRAM] > 0, "estimates cpu %.3g J, dram %.3g J",
          e.estimated_j[ENERGY_CPU], e.estimated_j[ENERGY_DRAM]);
  /* DRAM: the node's watts x wall time, counted once for the node's 4 ranks (each adds a quarter
   * over its own interval) */
  double dt = e.t_last - e.t0, dt_sum;
  MPI_Allreduce(&dt, &dt_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  T_CHECK(fabs(e.estimated_j[ENERGY_DRAM] - dram->watts * dt_sum / 4) < 1e-9, "dram %.6f J, expected %.4f W x %.4f s",
          e.estimated_j[ENERGY_DRAM], dram->watts, dt_sum / 4);
  if (rank == 0) {
    static cfg_config cfg;
    report[0] = '\0';
    energy_report_print(&e, 1000, 1e12, to_report, NULL);
    T_CHECK(strstr(report, cpu->method) && strstr(report, "dram_per_gb_estimate") && strstr(report, "an estimate"),
            "the report does not name the methods:\n%s", report);
    T_CHECK(strstr(report, "IT energy: not measured; estimated") && strstr(report, "CO2e (estimated, not measured): "),
            "no labelled estimated CO2e:\n%s", report);
    json_t *j = energy_report_json(&e, &cfg, 1.0, 1000, 1e12, 0.1, "cpu", 2, 1.0);
    T_CHECK(json_is_null(json_object_get(j, "emissions")) && json_is_null(json_object_get(j, "energy_consumed")),
            "report.json: a measured figure without a measurement");
    T_CHECK(json_real_value(json_object_get(j, "estimated_emissions")) > 0, "report.json: no estimated_emissions");
    T_CHECK(strcmp(json_string_value(json_object_get(j, "energy_basis")), "estimated") == 0, "energy_basis %s",
            json_string_value(json_object_get(j, "energy_basis")));
    T_CHECK(strcmp(comp_str(j, "cpu", "method"), cpu->method) == 0 && strcmp(comp_str(j, "dram", "method"), "dram_per_gb_estimate") == 0,
            "report.json methods %s, %s", comp_str(j, "cpu", "method"), comp_str(j, "dram", "method"));
    json_decref(j);
  }
  energy_close(&e);
}

/* RAPL with a package but no dram zone: the CPU measured, the DRAM estimated; the totals stay
 * measured, the estimates beside them, and "with the estimates" sums both. */
static void mixed_case(void) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char pc[4400];
  snprintf(pc, sizeof pc, "%s-mixed", root);
  if (rank == 0) {
    char save[4096];
    util_strlcpy(save, root, sizeof save);
    util_strlcpy(root, pc, sizeof root);
    zone("intel-rapl:0", "package-0", 1000000, 0);
    util_strlcpy(root, save, sizeof root);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  setenv("GREENLM_POWERCAP_ROOT", pc, 1);
  cfg_energy c = deck(0, 0, "equal");
  energy_meter e;
  err_list eerr = {0};
  T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, NULL, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
  T_CHECK(strcmp(e.src[ENERGY_CPU].method, "rapl_sysfs") == 0 && strcmp(e.src[ENERGY_DRAM].method, "dram_per_gb_estimate") == 0,
          "mixed: cpu %s, dram %s", e.src[ENERGY_CPU].method, e.src[ENERGY_DRAM].method);
  T_CHECK(strstr(e.src[ENERGY_DRAM].note, "no RAPL dram zone") != NULL, "dram note: %s", e.src[ENERGY_DRAM].note);
  if (rank == 0) {
    char path[4500];
    snprintf(path, sizeof path, "%s/intel-rapl:0/energy_uj", pc);
    set_counter(path, 400000);
  }
  pause_s(0.1, MPI_COMM_WORLD);
  energy_sample(&e);
  T_CHECK(fabs(e.joules - 0.4) < 1e-12 && e.estimated_j[ENERGY_CPU] == 0, "measured %.6f J (expected 0.4), cpu estimate %.3f J",
          e.joules, e.estimated_j[ENERGY_CPU]);
  if (rank == 0) {
    static cfg_config cfg;
    report[0] = '\0';
    energy_report_print(&e, 1000, 1e12, to_report, NULL);
    T_CHECK(strstr(report, "IT energy (measured components)") && strstr(report, "with the estimates for the components without a sensor"),
            "mixed report:\n%s", report);
    json_t *j = energy_report_json(&e, &cfg, 1.0, 1000, 1e12, 0.1, "cpu", 2, 1.0);
    double it = json_real_value(json_object_get(j, "energy_consumed")), all = json_real_value(json_object_get(j, "energy_with_estimates"));
    double em = json_real_value(json_object_get(j, "emissions")), emall = json_real_value(json_object_get(j, "emissions_with_estimates"));
    T_CHECK(fabs(it - 0.4 / 3.6e6) < 1e-15 && fabs(all - (0.4 + e.est_joules) / 3.6e6) < 1e-15, "energy %.6g kWh, with estimates %.6g",
            it, all);
    T_CHECK(fabs(em - it * 1.5 * 56.0 / 1000) < 1e-15 && emall > em, "emissions %.6g kg, with estimates %.6g", em, emall);
    T_CHECK(strcmp(json_string_value(json_object_get(j, "energy_basis")), "measured and estimated") == 0, "energy_basis %s",
            json_string_value(json_object_get(j, "energy_basis")));
    json_decref(j);
  }
  energy_close(&e);
}

/* The deck's allowed regions and the built-in table are the same list, in the same order. */
static void regions_case(void) {
  int k = cfg_find("energy", "region");
  T_CHECK(k >= 0, "no &energy region key");
  if (k < 0) return;
  char list[1024] = "";
  for (const energy_region *r = energy_regions(); r->name; r++) {
    T_CHECK(r->g_per_kwh >= 0 && r->source && *r->source && r->basis && *r->basis, "region %s lacks a value or source", r->name);
    size_t n = strlen(list);
    snprintf(list + n, sizeof list - n, "%s%s", n ? "|" : "", r->name);
  }
  T_CHECK(strcmp(list, cfg_keys()[k].range) == 0, "deck regions '%s' differ from the table's '%s'", cfg_keys()[k].range, list);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  int rank;
  if (t_need_ranks(4, &rank)) return 77;
  const char *out = getenv("TEST_OUT");
  snprintf(root, sizeof root, "%s/energy/powercap", out ? out : "tests/out");
  snprintf(stub_file, sizeof stub_file, "%s/energy/nvml-stub.txt", out ? out : "tests/out");
  if (rank == 0) util_mkdir_p(root);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) regions_case(), hwpower_case(), node_files_case();
  /* one node of 4 ranks, then two "nodes" of 2 (a node communicator split by hand) */
  rapl_case(MPI_COMM_WORLD, 1, "equal");
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &half);
  rapl_case(half, 2, "equal");
  rapl_case(half, 2, "cpu_time");
  MPI_Comm_free(&half);
  /* the stub library sits beside the test program */
  char lib[4200];
  snprintf(lib, sizeof lib, "%s/../libnvml-stub.so", out ? out : "tests/out");
  nvml_case(lib);
  default_estimate_case();
  mixed_case();
  hwmon_case();
  int checks = t_checks, failed = t_failed, all_checks = 0, all_failed = 0;
  MPI_Reduce(&checks, &all_checks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&failed, &all_failed, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("test_energy: %d checks on 4 ranks, %d failed\n", all_checks, all_failed);
  MPI_Finalize();
  return all_failed ? 1 : 0;
}
