/* test_energy: the energy module on 4 ranks (mpiexec -n 4), with a fake powercap tree
 * (GREENLM_POWERCAP_ROOT) and the stub NVML library built by the tests (GREENLM_NVML_LIBRARY).
 *
 *   - RAPL: two packages and a dram zone (psys skipped), one counter wrapping, read by one rank per
 *     node: 4 ranks on one node count the node's energy once, 2 "nodes" of 2 ranks twice; the
 *     ranks' shares sum to the node's reading exactly, with equal and CPU-time attribution;
 *   - NVML: a GPU with an energy counter shared by two ranks (read once, split), a GPU without one
 *     (power samples integrated), a rank without a GPU, and NVML missing (not measured, or a
 *     labelled estimate from a TDP);
 *   - no RAPL: "not measured", or "estimated" from a TDP; never a silent zero. */
#include <fcntl.h>
#include <time.h>
#include <mpi.h>
#include <unistd.h>

#include "energy/energy.h"
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
  T_CHECK(e.src[ENERGY_CPU].status == ENERGY_NOT_MEASURED, "cpu without RAPL or TDP is %s", energy_status_name(e.src[ENERGY_CPU].status));
  energy_close(&e);

  /* NVML missing: not measured; with a TDP, estimated and labelled, outside the measured totals */
  setenv("GREENLM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  for (int tdp = 0; tdp <= 1; tdp++) {
    c = deck(tdp ? 50 : 0, tdp ? 300 : 0, "equal");
    T_CHECK(energy_open(&e, &c, MPI_COMM_WORLD, MPI_COMM_WORLD, 2, bus, NULL, 0, &eerr) == 0, "open: %s", eerr.n ? eerr.v[0].msg : "");
    energy_status st = bus ? e.src[ENERGY_GPU].status : ENERGY_NOT_MEASURED;
    T_CHECK(st == (tdp && bus ? ENERGY_ESTIMATED : ENERGY_NOT_MEASURED), "rank %d, tdp %d: GPU %s (%s)", rank, tdp,
            energy_status_name(st), e.src[ENERGY_GPU].note);
    T_CHECK(e.src[ENERGY_CPU].status == (tdp ? ENERGY_ESTIMATED : ENERGY_NOT_MEASURED), "tdp %d: cpu %s", tdp,
            energy_status_name(e.src[ENERGY_CPU].status));
    T_CHECK(strstr(e.src[ENERGY_CPU].note, tdp ? "estimate: TDP 50 W" : "no &energy cpu_tdp_w") != NULL, "cpu note: %s",
            e.src[ENERGY_CPU].note);
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
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) {
    if (rank == 0) printf("SKIP: needs 4 ranks (run under mpiexec -n 4)\n");
    MPI_Finalize();
    return 77;
  }
  const char *out = getenv("TEST_OUT");
  snprintf(root, sizeof root, "%s/energy/powercap", out ? out : "tests/out");
  snprintf(stub_file, sizeof stub_file, "%s/energy/nvml-stub.txt", out ? out : "tests/out");
  if (rank == 0) util_mkdir_p(root);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) regions_case();
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
  int checks = t_checks, failed = t_failed, all_checks = 0, all_failed = 0;
  MPI_Reduce(&checks, &all_checks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&failed, &all_failed, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("test_energy: %d checks on %d ranks, %d failed\n", all_checks, size, all_failed);
  MPI_Finalize();
  return all_failed ? 1 : 0;
}
