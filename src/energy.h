/* energy: energy used by this run, measured where a sensor exists and labelled where not.
 *
 * CPU packages and DRAM are read from the RAPL powercap tree (/sys/class/powercap, or the
 * directory in GREENLM_POWERCAP_ROOT) with wrap-around handling. Without a readable sensor the
 * CPU energy is "estimated" from the deck's cpu_tdp_w and the measured CPU utilisation when a TDP
 * is given, else "not measured"; never a silent zero. See doc/energy.md. */
#ifndef GREENLM_ENERGY_H
#define GREENLM_ENERGY_H

#include <stdint.h>

#include "cfg.h"

typedef enum { ENERGY_MEASURED, ENERGY_ESTIMATED, ENERGY_NOT_MEASURED } energy_status;

#define ENERGY_MAX_ZONES 16

typedef struct {
  energy_status status;
  char method[32]; /* rapl_sysfs, tdp_estimate, none */
  char note[256];  /* how it was obtained, or why not */
  /* RAPL zones */
  int nzones;
  int fd[ENERGY_MAX_ZONES];
  char zone[ENERGY_MAX_ZONES][64];
  uint64_t last_uj[ENERGY_MAX_ZONES], range_uj[ENERGY_MAX_ZONES];
  int wraps;
  /* estimate */
  double tdp_w;
  int cores;
  double cpu_last;
  /* totals */
  double t0, t_last;
  double joules, watts;
} energy_meter;

void energy_open(energy_meter *e, const cfg_energy *c, int cores);
/* Read the sensors (or update the estimate); call at every log step and at the end. */
void energy_sample(energy_meter *e);
void energy_close(energy_meter *e);
/* "measured", "estimated" or "not measured". */
const char *energy_status_name(energy_status s);

#endif
