/* hwpower: the hardware power table behind greenlm's labelled energy estimates where no sensor can
 * be read (doc/energy.md, "Estimates", has the table with its sources):
 *   - CPUs by model name (the "model name" of /proc/cpuinfo): TDP per socket in W and cores per
 *     socket, so that one core's share (W per core-second of CPU time) is known; an unknown CPU
 *     gets HWPOWER_CORE_DEFAULT_W per core;
 *   - DRAM: HWPOWER_DRAM_W_PER_GB watts per GB (1e9 bytes) of the memory the node gives the job
 *     (MemTotal, or the cgroup limit where smaller);
 *   - GPUs by device name (as the NVIDIA driver and NVML name them): board power in W.
 * A name matches an entry when every word of the entry's pattern is a word of the name (case
 * ignored; words split at blanks, parentheses, commas and '@'); the first match in table order
 * wins, so the tables list specific parts before general ones. */
#ifndef GREENLM_HWPOWER_H
#define GREENLM_HWPOWER_H

#include <stddef.h>

/* W per physical core for a CPU the table lacks: about the median share of the table's parts
 * (tests/test_energy.c keeps it so). */
#define HWPOWER_CORE_DEFAULT_W 7.0
/* W per GB of DRAM: Green Algorithms (Lannelongue et al. 2021), 0.3725 W/GB; CodeCarbon's 3 W per
 * 8 GB agrees within 1%. */
#define HWPOWER_DRAM_W_PER_GB 0.3725

typedef struct {
  const char *pattern; /* words that must all occur in the device name */
  const char *model;   /* the part, as the vendor names it */
  double watts;        /* CPU: TDP per socket; GPU: board power */
  int cores;           /* CPU: cores per socket; GPU: 0 */
  const char *source;  /* the vendor's specification it comes from */
} hwpower_part;

/* The tables: n entries each. */
const hwpower_part *hwpower_cpus(int *n);
const hwpower_part *hwpower_gpus(int *n);
/* The first entry of t (n entries) whose pattern matches name, or NULL. */
const hwpower_part *hwpower_match(const hwpower_part *t, int n, const char *name);
/* The entry of the CPU table, or of the GPU table, that matches name, or NULL. */
const hwpower_part *hwpower_cpu(const char *name);
const hwpower_part *hwpower_gpu(const char *name);

/* The first "model name" of a /proc/cpuinfo-format file into buf: 0, or -1 when there is none. */
int hwpower_cpu_model(const char *cpuinfo, char *buf, size_t len);
/* Bytes of memory the node gives this process: MemTotal of a /proc/meminfo-format file, or the
 * smallest memory limit of the process's cgroup and its ancestors (cgroup v2 memory.max, v1
 * memory.limit_in_bytes) where smaller. self_cgroup: a /proc/self/cgroup-format file; cgroup_root:
 * where the hierarchy is mounted (/sys/fs/cgroup). basis receives where the figure comes from.
 * Returns 0 when nothing could be read. */
double hwpower_memory_bytes(const char *meminfo, const char *self_cgroup, const char *cgroup_root, char *basis,
                            size_t len);
/* The name the NVIDIA driver gives the GPU at PCI bus id bus (any domain width and case:
 * "00000000:3B:00.0", "0000:3b:00.0"): the "Model:" line of <gpus_dir>/<bus>/information
 * (/proc/driver/nvidia/gpus). 0, or -1 when not found. */
int hwpower_gpu_name(const char *gpus_dir, const char *bus, char *buf, size_t len);

#endif
