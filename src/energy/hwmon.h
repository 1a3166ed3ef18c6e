/* hwmon: the power sensors of the kernel's hwmon class (/sys/class/hwmon/hwmon*, or the directory
 * in GREENLM_HWMON_ROOT) integrated over time: a node's processors and memory where there is no
 * RAPL, as on POWER9 (the OCC's sensors through the ibmpowernv driver) and Arm servers.
 *
 * Each hwmon device's power<N>_input (microwatts) is read with its power<N>_label. A label naming
 * memory (mem, dram, dimm) counts as DRAM, one naming a processor (proc, chip, cpu, package,
 * socket) as CPU; the rest is skipped so nothing is counted twice: the rails inside a processor's
 * total (Vdd, Vdn, Vcs, Vio), GPUs (NVML reads them), whole-system and supply totals, unlabelled
 * sensors. Energy is the trapezoid rule over the readings. */
#ifndef GREENLM_HWMON_H
#define GREENLM_HWMON_H

#include <stddef.h>
#include <stdint.h>

#define HWMON_MAX 32
enum { HWMON_CPU, HWMON_DRAM };

typedef struct {
  int n;
  int fd[HWMON_MAX], comp[HWMON_MAX]; /* power<N>_input, open; HWMON_CPU or HWMON_DRAM */
  char name[HWMON_MAX][96];           /* "Proc 0 (ibmpowernv hwmon0 power2)" */
  double last_w[HWMON_MAX], last_t;   /* the last readings and when */
} hwmon_set;

/* Open the sensors that count; their number (0: why says why, when non-NULL). */
int hwmon_open(hwmon_set *h, char *why, size_t wl);
/* Read every sensor at time now (seconds); add each component's energy since the last reading,
 * in microjoules, to uj[HWMON_CPU] and uj[HWMON_DRAM]. */
void hwmon_read(hwmon_set *h, double now, uint64_t uj[2]);
void hwmon_close(hwmon_set *h);

#endif
