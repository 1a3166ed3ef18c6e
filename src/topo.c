/* topo: hwloc discovery of the node. */
#include "topo.h"

#include <hwloc.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

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
  hwloc_const_bitmap_t all = hwloc_topology_get_allowed_cpuset(topo);
  int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  const char *why;
  if (hwloc_get_cpubind(topo, cur, HWLOC_CPUBIND_PROCESS) != 0) hwloc_bitmap_copy(cur, all);
  if (!hwloc_bitmap_isequal(cur, all)) {
    why = "bound by the launcher";
  } else if (!enable) {
    why = "not bound: &parallel bind = 'none'";
  } else if (nlocal > ncores) {
    why = "not bound: more ranks than cores on this node";
  } else {
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    hwloc_bitmap_t *sets = util_malloc((size_t)nlocal * sizeof *sets, "cpusets");
    for (int i = 0; i < nlocal; i++) sets[i] = hwloc_bitmap_alloc();
    hwloc_distrib(topo, &root, 1, sets, (unsigned)nlocal, INT_MAX, 0);
    if (hwloc_set_cpubind(topo, sets[lrank], HWLOC_CPUBIND_PROCESS) == 0) {
      hwloc_bitmap_copy(cur, sets[lrank]);
      why = "bound by greenlm";
    } else {
      why = "not bound: hwloc_set_cpubind failed";
    }
    for (int i = 0; i < nlocal; i++) hwloc_bitmap_free(sets[i]);
    free(sets);
  }
  int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, cur, HWLOC_OBJ_CORE);
  char list[256];
  hwloc_bitmap_list_snprintf(list, sizeof list, cur);
  util_snprintf(desc, len, "cpus %s (%d core%s, %s)", list, cores, cores == 1 ? "" : "s", why);
  hwloc_bitmap_free(cur);
  hwloc_topology_destroy(topo);
  return cores > 0 ? cores : 1;
}
