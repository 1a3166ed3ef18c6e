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

/* Devices to ranks: near (nranks x ndev) is 1 where device d is attached to the package or NUMA
 * node of rank r's cores, 0 where it is not, -1 where unknown. Each rank in turn takes the
 * least-loaded near device that has fewer than ceil(nranks / ndev) ranks, else the least-loaded
 * device (lowest index first); with no locality known this is rank mod ndev. dev (nranks)
 * receives the choice. */
void topo_assign_devices(int nranks, int ndev, const signed char *near, int *dev);
/* The device this rank of the node computes on, by PCI locality (hwloc) of the cores it has or
 * topo_bind will give it (enable_bind: &parallel bind is 'auto'); bus_ids (ndev) as CUDA gives
 * them. Collective over node. how says what decided. */
int topo_choose_device(MPI_Comm node, int enable_bind, int ndev, char *const *bus_ids, char *how, size_t len);

/* "1 package (Intel(R) Xeon(R) Processor), 2 cores, 2 hardware threads, 23.4 GiB" */
const char *topo_describe(const topo_machine *t, char *buf, size_t len);

#endif
