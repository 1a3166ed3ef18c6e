/* topo: the machine as hwloc sees it (packages, cores, hardware threads, memory). */
#ifndef GREENLM_TOPO_H
#define GREENLM_TOPO_H

#include <stddef.h>

typedef struct {
  int packages, cores, pus;
  double memory_gib;
  char cpu_model[128];
} topo_machine;

/* Discover this node with hwloc. Returns 0, or -1 with a zeroed result when hwloc fails. */
int topo_discover(topo_machine *t);
/* "1 package (Intel(R) Xeon(R) Processor), 2 cores, 2 hardware threads, 23.4 GiB" */
const char *topo_describe(const topo_machine *t, char *buf, size_t len);

#endif
