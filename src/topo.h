/* topo: the machine as hwloc sees it (packages, cores, hardware threads, memory). */
#ifndef GREENLM_TOPO_H
#define GREENLM_TOPO_H

#include <mpi.h>
#include <stddef.h>

typedef struct {
  int packages, cores, pus;
  double memory_gib;
  char cpu_model[128];
} topo_machine;

/* Discover this node with hwloc. Returns 0, or -1 with a zeroed result when hwloc fails. */
int topo_discover(topo_machine *t);
/* Bind this rank to its share of the node's cores: the node's ranks (node communicator) are spread
 * over the cores with hwloc_distrib. A binding made by the launcher is kept; with more ranks than
 * cores nothing is bound. Returns the number of cores this rank may use; desc says which and why. */
int topo_bind(MPI_Comm node, int enable, char *desc, size_t len);

/* "1 package (Intel(R) Xeon(R) Processor), 2 cores, 2 hardware threads, 23.4 GiB" */
const char *topo_describe(const topo_machine *t, char *buf, size_t len);

#endif
