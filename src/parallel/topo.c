/* topo: hwloc discovery of the node. */
#include "parallel/topo.h"

#include <hwloc.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

int topo_discover(topo_machine *t) {
  memset(t, 0, sizeof *t);
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return -1;
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return -1;
  }
  t->packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  t->cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  t->pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  t->memory_gib = (double)root->total_memory / (1024.0 * 1024.0 * 1024.0);
  hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
  const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
  util_strlcpy(t->cpu_model, model ? model : "unknown CPU", sizeof t->cpu_model);
  hwloc_topology_destroy(topo);
  return 0;
}

const char *topo_describe(const topo_machine *t, char *buf, size_t len) {
  util_snprintf(buf, len, "%d package%s (%s), %d cores, %d hardware threads, %.1f GiB", t->packages,
                t->packages == 1 ? "" : "s", t->cpu_model, t->cores, t->pus, t->memory_gib);
  return buf;
}

/* The cpuset this rank has (a launcher's binding), or will get from topo_bind (the node's ranks
 * spread over the cores with hwloc_distrib), into set; *why says which. Returns 1 when greenlm
 * should bind to it, 0 when the rank keeps what it has. */
static int plan_cpuset(hwloc_topology_t topo, int lrank, int nlocal, int enable, hwloc_bitmap_t set, const char **why) {
  hwloc_const_bitmap_t all = hwloc_topology_get_allowed_cpuset(topo);
  int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  if (hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) != 0) hwloc_bitmap_copy(set, all);
  if (!hwloc_bitmap_isequal(set, all)) {
    *why = "bound by the launcher";
    return 0;
  }
  if (!enable) {
    *why = "not bound: &parallel bind = 'none'";
    return 0;
  }
  if (nlocal > ncores) {
    *why = "not bound: more ranks than cores on this node";
    return 0;
  }
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  hwloc_bitmap_t *sets = util_calloc((size_t)nlocal, sizeof *sets, "cpusets"); /* hwloc_distrib allocates them */
  hwloc_distrib(topo, &root, 1, sets, (unsigned)nlocal, INT_MAX, 0);
  if (sets[lrank]) hwloc_bitmap_copy(set, sets[lrank]);
  for (int i = 0; i < nlocal; i++) hwloc_bitmap_free(sets[i]);
  free(sets);
  *why = "bound by greenlm";
  return 1;
}

int topo_bind(MPI_Comm node, int enable, char *desc, size_t len) {
  int lrank, nlocal;
  MPI_Comm_rank(node, &lrank);
  MPI_Comm_size(node, &nlocal);
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
    util_snprintf(desc, len, "not bound (hwloc cannot read the topology)");
    return 1;
  }
  hwloc_bitmap_t cur = hwloc_bitmap_alloc();
  const char *why;
  if (plan_cpuset(topo, lrank, nlocal, enable, cur, &why) && hwloc_set_cpubind(topo, cur, HWLOC_CPUBIND_PROCESS) != 0) {
    hwloc_get_cpubind(topo, cur, HWLOC_CPUBIND_PROCESS);
    why = "not bound: hwloc_set_cpubind failed";
  }
  int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, cur, HWLOC_OBJ_CORE);
  char list[256];
  hwloc_bitmap_list_snprintf(list, sizeof list, cur);
  util_snprintf(desc, len, "cpus %s (%d core%s, %s)", list, cores, cores == 1 ? "" : "s", why);
  hwloc_bitmap_free(cur);
  hwloc_topology_destroy(topo);
  return cores > 0 ? cores : 1;
}

/* ---- devices by locality ---------------------------------------------------------------------- */

void topo_assign_devices(int nranks, int ndev, const signed char *near, int *dev) {
  int *count = util_calloc((size_t)(ndev > 0 ? ndev : 1), sizeof(int), "device counts");
  int cap = (nranks + ndev - 1) / ndev; /* ranks per device when shared evenly */
  for (int r = 0; r < nranks; r++) {
    int least = 0, best = -1;
    for (int d = 1; d < ndev; d++)
      if (count[d] < count[least]) least = d;
    /* the least-loaded near device with room, else the least-loaded device */
    for (int d = 0; d < ndev; d++)
      if (near[(size_t)r * ndev + d] == 1 && count[d] < cap && (best < 0 || count[d] < count[best])) best = d;
    dev[r] = best >= 0 ? best : least;
    count[dev[r]]++;
  }
  free(count);
}

int topo_choose_device(MPI_Comm node, int enable_bind, int ndev, char *const *bus_ids, char *how, size_t len) {
  int lrank, nlocal;
  MPI_Comm_rank(node, &lrank);
  MPI_Comm_size(node, &nlocal);
  signed char *mine = util_malloc((size_t)ndev, "locality"), *near = util_malloc((size_t)nlocal * ndev, "locality");
  memset(mine, -1, (size_t)ndev);
  hwloc_topology_t topo;
  int loaded = hwloc_topology_init(&topo) == 0;
  if (loaded) hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  loaded = loaded && hwloc_topology_load(topo) == 0;
  int known = 0;
  if (loaded) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    const char *why;
    plan_cpuset(topo, lrank, nlocal, enable_bind, set, &why);
    for (int d = 0; d < ndev; d++) {
      hwloc_obj_t pci = bus_ids[d] ? hwloc_get_pcidev_by_busidstring(topo, bus_ids[d]) : NULL;
      hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : NULL;
      if (anc && anc->cpuset && !hwloc_bitmap_isequal(anc->cpuset, hwloc_topology_get_topology_cpuset(topo)))
        mine[d] = (signed char)hwloc_bitmap_intersects(anc->cpuset, set), known++;
    }
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(topo);
  }
  MPI_Allgather(mine, ndev, MPI_SIGNED_CHAR, near, ndev, MPI_SIGNED_CHAR, node);
  int *dev = util_malloc((size_t)nlocal * sizeof(int), "devices"), all_known;
  MPI_Allreduce(&known, &all_known, 1, MPI_INT, MPI_MIN, node);
  topo_assign_devices(nlocal, ndev, near, dev);
  int d = dev[lrank];
  if (all_known > 0)
    util_snprintf(how, len, "GPU by locality: PCI %s is %s this rank's cores%s", bus_ids[d] ? bus_ids[d] : "?",
                  mine[d] == 1 ? "attached near" : "not near (the near ones are taken)", nlocal > ndev ? "; ranks share GPUs" : "");
  else
    util_snprintf(how, len, "GPU = node rank mod %d (hwloc knows no PCI locality here)%s", ndev,
                  nlocal > ndev ? "; ranks share GPUs" : "");
  free(mine), free(near), free(dev);
  return d;
}
