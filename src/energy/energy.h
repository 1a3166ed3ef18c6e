/* energy: the energy of a run, per rank and in total, measured where a sensor exists and labelled
 * where not; facility energy (PUE) and CO2e (grid intensity). See doc/energy.md.
 *
 * Sensors, each read by exactly one rank:
 *   - CPU packages and DRAM: the RAPL powercap tree (/sys/class/powercap, or the directory in
 *     GREENLM_POWERCAP_ROOT), read by the node leader (local rank 0) only, with wrap-around
 *     handling and a sampling thread that reads often enough that no counter wraps twice; where
 *     there is no RAPL (POWER9, Arm), the hwmon power sensors of processors and memory
 *     (hwmon.h), integrated by the same thread;
 *   - the GPU a rank computes on: NVML, loaded at run time with dlopen (libnvidia-ml.so.1, or the
 *     library in GREENLM_NVML_LIBRARY), found by PCI bus id; its cumulative energy counter, or
 *     power samples integrated by the sampling thread where the counter is missing. A GPU shared
 *     by several ranks of a node is read by the lowest of them.
 * Without a sensor a component is "estimated" (and labelled so, with the method that gave it): from
 * the deck's TDP where given, else (&energy estimate, the default) from the hardware power table
 * (hwpower.h): CPU TDP by model or a per-core default x CPU time, DRAM per GB x wall time, GPU
 * board power x wall time; or "not measured"; never a silent zero. Measured always wins. Node
 * energy is attributed to the node's ranks by a documented rule (&energy attribution) in integer
 * microjoules, so the ranks' shares sum to the node's reading exactly, and totals are MPI sums of
 * the shares: nothing is counted twice. */
#ifndef GREENLM_ENERGY_H
#define GREENLM_ENERGY_H

#include <jansson.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "energy/hwmon.h"

typedef enum { ENERGY_MEASURED, ENERGY_ESTIMATED, ENERGY_NOT_MEASURED } energy_status;
enum { ENERGY_CPU, ENERGY_DRAM, ENERGY_GPU, ENERGY_NCOMP };

#define ENERGY_MAX_ZONES 16
#define ENERGY_REC 8 /* per-rank record: node, 3 measured J, 3 estimated J, wall s */

/* How one component is obtained on this rank's node (CPU, DRAM) or for its GPU. */
typedef struct {
  energy_status status;
  char method[32]; /* rapl_sysfs, hwmon_power_integrated, nvml_energy_counter, nvml_power_sampled (measured);
                      deck_tdp_estimate, tdp_table_estimate, per_core_default_estimate,
                      dram_per_gb_estimate (estimated); none */
  char note[384];  /* what was read, or why nothing was, or how the estimate is made */
  char model[96];  /* estimated from the table: the part it matched; else "" */
  double watts;    /* estimated: CPU W per core-second of CPU time, DRAM W per node, GPU W per GPU */
} energy_source;

/* One grid region of the built-in table. */
typedef struct {
  const char *name;   /* deck value of &energy region */
  const char *label;  /* what it covers */
  double g_per_kwh;   /* gCO2e/kWh */
  const char *basis;  /* e.g. "location-based annual average, 2019" */
  const char *source; /* where the figure comes from */
} energy_region;

/* A published training footprint to compare against. */
typedef struct {
  const char *model;
  double mwh, tokens, flops; /* energy, training tokens, training FLOPs */
  const char *source;
} energy_reference;

typedef struct {
  /* ---- set up by energy_open ---- */
  MPI_Comm world, node, gpu_comm; /* gpu_comm: the node's ranks on this rank's GPU, or MPI_COMM_NULL */
  int rank, size, node_rank, node_size, node_id, nodes;
  int leader;      /* this rank reads the node's RAPL zones */
  int gpu_owner;   /* this rank reads its GPU (the lowest rank of the node using it) */
  int gpu_sharers; /* ranks of the node on this rank's GPU (0: no GPU) */
  energy_source src[ENERGY_NCOMP];
  double node_cores;
  int by_cpu_time; /* attribution rule: 1 CPU-time shares, 0 equal shares */
  /* RAPL zones (leader) */
  int nzones;
  int fd[ENERGY_MAX_ZONES], comp[ENERGY_MAX_ZONES]; /* ENERGY_CPU or ENERGY_DRAM */
  char zone[ENERGY_MAX_ZONES][64];
  uint64_t last_uj[ENERGY_MAX_ZONES], range_uj[ENERGY_MAX_ZONES];
  hwmon_set hw; /* without RAPL: the leader's hwmon power sensors */
  /* NVML (GPU owner) */
  void *nvml_lib, *nvml_dev;
  int (*nvml_energy)(void *dev, unsigned long long *mj);
  int (*nvml_power)(void *dev, unsigned int *mw);
  int (*nvml_shutdown)(void);
  char gpu_name[96];
  unsigned long long gpu_last_mj;
  double power_last_w, power_last_t;
  /* sampling thread and what it accumulates (under mu): the node's or GPU's readings, uJ */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int running, stop;
  double rapl_every, power_every; /* seconds between reads (0: not read by the thread) */
  uint64_t read_uj[ENERGY_NCOMP]; /* cumulative readings of this rank's sensors */
  uint64_t taken_uj[ENERGY_NCOMP]; /* of which already attributed */
  int wraps, samples; /* this rank's sensors */
  int wraps_total;    /* the job's, after energy_sample */
  /* ---- this rank's share, cumulative ---- */
  uint64_t own_uj[ENERGY_NCOMP];  /* measured, attributed to this rank */
  double own_est_j[ENERGY_NCOMP]; /* estimated */
  double cpu_last;                /* process CPU seconds at the last sample */
  /* ---- job totals after each energy_sample, on every rank ---- */
  double t0, t_last;
  double measured_j[ENERGY_NCOMP], estimated_j[ENERGY_NCOMP];
  int coverage[ENERGY_NCOMP][3]; /* ranks (CPU, DRAM: nodes) by status */
  double joules, est_joules; /* all measured components; all estimated ones */
  double watts, est_watts;   /* over the last interval */
  /* ---- rank 0: energy.csv, and every rank's cumulative record ---- */
  FILE *csv;
  double *rec; /* rank 0: ENERGY_REC values per rank (see energy.c) */
  /* ---- emissions ---- */
  double pue, intensity;
  const energy_region *region; /* NULL when the deck gives the intensity */
} energy_meter;

/* Open the sensors: collective over world (node: its node communicator). gpu_bus_id is the PCI bus
 * id of the GPU this rank computes on, NULL or "" for none. csv_path (rank 0; NULL for none)
 * receives the time series, appended to an existing file when append is set (a restarted run).
 * Returns 0, or -1 (on every rank) after an error was added where it happened. */
int energy_open(energy_meter *e, const cfg_energy *c, MPI_Comm world, MPI_Comm node, int node_cores,
                const char *gpu_bus_id, const char *csv_path, int append, err_list *errs);
/* Read every sensor and update the job totals on every rank: collective; call at every log step
 * and at the end. */
void energy_sample(energy_meter *e);
/* Stop the sampling thread and close everything (collective). */
void energy_close(energy_meter *e);

/* Whether any component is measured anywhere in the job (after energy_sample). */
int energy_any_measured(const energy_meter *e);
/* What the totals rest on: "measured", "measured and estimated", "estimated" or "none". */
const char *energy_basis(const energy_meter *e);
/* "measured", "estimated" or "not measured". */
const char *energy_status_name(energy_status s);
/* "cpu", "dram", "gpu" */
const char *energy_component_name(int c);
/* The job-level status of component c: measured on every rank or node, estimated (fully or in
 * part), or not measured; "partly measured" otherwise. Written into buf. */
const char *energy_coverage(const energy_meter *e, int c, char *buf, size_t len);

/* The built-in grid regions (NULL-terminated by name) and the published footprints. */
const energy_region *energy_regions(void);
const energy_region *energy_find_region(const char *name);
const energy_reference *energy_references(int *n);

/* The end-of-run report (rank 0): printed lines via the callback, and report.json's object.
 * tokens and flops are this job's; duration in seconds; mfu NAN when it is not a valid figure. */
typedef void (*energy_print_fn)(void *ctx, const char *fmt, ...);
void energy_report_print(const energy_meter *e, double tokens, double flops, energy_print_fn print, void *ctx);
json_t *energy_report_json(const energy_meter *e, const cfg_config *cfg, double duration, double tokens,
                           double flops, double mfu, const char *cpu_model, int cpu_count, double ram_gib);

#endif
