/* nvml_stub: a stand-in for libnvidia-ml.so.1 that the energy tests load with dlopen
 * (GREENLM_NVML_LIBRARY). Its GPUs and their readings come from the file named by
 * GREENLM_NVML_STUB, re-read at every call, one GPU per line:
 *   BUS_ID ENERGY_MJ POWER_MW COUNTER
 * COUNTER 1: nvmlDeviceGetTotalEnergyConsumption works; 0: it answers NOT_SUPPORTED (as on
 * GPUs before Volta), leaving power samples. Only the entry points greenlm uses exist. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STUB_SUCCESS 0
#define STUB_NOT_SUPPORTED 3
#define STUB_NOT_FOUND 6
#define STUB_UNKNOWN 999

typedef struct {
  char bus[64];
  unsigned long long mj;
  unsigned int mw;
  int counter;
} stub_gpu;

/* GPU number i (1-based) of the file, or 0 when absent. */
static int stub_read(int i, const char *bus, stub_gpu *g) {
  const char *path = getenv("GREENLM_NVML_STUB");
  FILE *fp = path ? fopen(path, "r") : NULL;
  if (!fp) return 0;
  int n = 0, found = 0;
  while (fscanf(fp, "%63s %llu %u %d", g->bus, &g->mj, &g->mw, &g->counter) == 4) {
    n++;
    if ((bus && strcmp(bus, g->bus) == 0) || (!bus && n == i)) {
      found = n;
      break;
    }
  }
  fclose(fp);
  return found;
}

int nvmlInit_v2(void) { return getenv("GREENLM_NVML_STUB") ? STUB_SUCCESS : STUB_UNKNOWN; }
int nvmlShutdown(void) { return STUB_SUCCESS; }

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev) {
  stub_gpu g;
  int i = stub_read(0, bus, &g);
  if (!i) return STUB_NOT_FOUND;
  *dev = (void *)(size_t)i;
  return STUB_SUCCESS;
}

int nvmlDeviceGetName(void *dev, char *name, unsigned int len) {
  snprintf(name, len, "Stub GPU %d", (int)(size_t)dev);
  return STUB_SUCCESS;
}

int nvmlDeviceGetTotalEnergyConsumption(void *dev, unsigned long long *mj) {
  stub_gpu g;
  if (!stub_read((int)(size_t)dev, NULL, &g)) return STUB_NOT_FOUND;
  if (!g.counter) return STUB_NOT_SUPPORTED;
  *mj = g.mj;
  return STUB_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *dev, unsigned int *mw) {
  stub_gpu g;
  if (!stub_read((int)(size_t)dev, NULL, &g)) return STUB_NOT_FOUND;
  *mw = g.mw;
  return STUB_SUCCESS;
}
