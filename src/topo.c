/* topo: hwloc discovery of the node. */
#include "topo.h"

#include <hwloc.h>
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
