/* machine: the machine a training run is planned for (&machine, the 'plan' task): its devices from
 * a built-in table with sources (doc/planning.md), its links, its power and its grid.
 *
 * Units inside: bytes, seconds, FLOP/s, bytes/s, watts. Every figure remembers whether the deck
 * gave it or where its default came from, for the plan's echo. */
#ifndef GREENLM_MACHINE_H
#define GREENLM_MACHINE_H

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"

/* One row of the device table. Peaks are dense (no sparsity), per device. */
typedef struct {
  const char *name;  /* &machine device */
  const char *label; /* e.g. "NVIDIA V100 SXM2 32 GB" */
  double tflops[4];  /* peak at fp32, tf32, bf16, fp16 (tensor cores where the device has them); 0: none */
  double memory_gb;  /* per device, 10^9 bytes (0 for 'cpu': the node's) */
  double memory_gbs; /* memory bandwidth per device (per core for 'cpu') */
  const char *power; /* the GPU's row of the hardware power table (energy/hwpower.h); NULL for 'cpu' */
  double intra_gbs, intra_latency_us; /* between two ranks of a node, each way */
  int per_node;      /* usual devices per node (0 for 'cpu': this machine's cores) */
  double efficiency; /* share of the peak greenlm's step reaches there, as measured */
  double overhead_gb; /* memory of a rank outside the planned buffers ('cpu': beyond this process's) */
  const char *source;
} machine_device;

typedef struct {
  const machine_device *dev;
  int nodes, per_node, ranks;
  int cpu;               /* 'cpu': one rank per core */
  double peak;           /* FLOP/s of one rank at the deck's precision */
  double efficiency;     /* share of the peak reached by the forward and backward passes */
  double memory;         /* bytes one rank may use */
  double memory_bw;      /* bytes/s of one rank's memory */
  double intra_bw, intra_lat, inter_bw, inter_lat; /* bytes/s each way, seconds */
  double device_w, host_w; /* W per rank's device (per core for 'cpu'); W per node besides them */
  char power_from[160];  /* where device_w comes from */
  double overhead;       /* bytes of a rank outside the planned buffers */
  double library;        /* of which the math library's own buffers, measured ('cpu') */
  double tokens;         /* tokens the run trains on */
  double pue, intensity; /* site PUE; grid gCO2e/kWh */
  char grid[160];        /* where the intensity comes from */
  char peak_from[160], eff_from[160]; /* where the peak and the efficiency come from */
  char source[CFG_STR_LEN];
} machine_plan;

/* The built-in table, NULL-terminated by name. */
const machine_device *machine_devices(void);
const machine_device *machine_find(const char *name);

/* Resolve &machine (and &energy pue, region) for the deck's precision and model of nparams
 * parameters whose ops run on shapes up to ops: table defaults where the deck gives 0; for 'cpu',
 * the math library's buffers measured on be for those shapes and, without peak_tflops, a GEMM's
 * rate. Returns the number of errors added (a precision the device does not have; nodes x devices
 * per node beyond PAR_MAX_RANKS, which each key's range allows). */
int machine_resolve(machine_plan *m, const cfg_config *cfg, const backend *be, double nparams, const backend_shape *ops,
                    err_list *errs);

/* Lines describing the machine as resolved, into buf. */
const char *machine_describe(const machine_plan *m, char *buf, size_t len);

#endif
