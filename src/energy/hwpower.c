/* hwpower: CPU TDP and GPU board power by model name, DRAM per GB, and what the node says about
 * its CPU, memory and GPUs (/proc/cpuinfo, /proc/meminfo and the cgroup, the NVIDIA driver). */
#include "energy/hwpower.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/util.h"

/* ---- the tables (sources in doc/energy.md) ------------------------------------------------------ */

#define ARK "Intel ARK (ark.intel.com): TDP, Total Cores"
#define AMD "AMD product specifications (amd.com): Default TDP, # of CPU Cores"

/* TDP per socket (W) and cores per socket; specific patterns before general ones. */
static const hwpower_part CPUS[] = {
    /* Intel Xeon E5 v4 (Broadwell) */
    {"E5-2630 v4", "Intel Xeon E5-2630 v4", 85, 10, ARK},
    {"E5-2680 v4", "Intel Xeon E5-2680 v4", 120, 14, ARK},
    {"E5-2690 v4", "Intel Xeon E5-2690 v4", 135, 14, ARK},
    {"E5-2698 v4", "Intel Xeon E5-2698 v4", 135, 20, ARK},
    /* Intel Xeon Scalable: Skylake, Cascade Lake, Ice Lake, Sapphire Rapids, Emerald Rapids */
    {"Gold 6130", "Intel Xeon Gold 6130", 125, 16, ARK},
    {"Gold 6140", "Intel Xeon Gold 6140", 140, 18, ARK},
    {"Gold 6148", "Intel Xeon Gold 6148", 150, 20, ARK},
    {"Platinum 8160", "Intel Xeon Platinum 8160", 150, 24, ARK},
    {"Platinum 8168", "Intel Xeon Platinum 8168", 205, 24, ARK},
    {"Gold 6230", "Intel Xeon Gold 6230", 125, 20, ARK},
    {"Gold 6240", "Intel Xeon Gold 6240", 150, 18, ARK},
    {"Gold 6248", "Intel Xeon Gold 6248", 150, 20, ARK},
    {"Gold 6248R", "Intel Xeon Gold 6248R", 205, 24, ARK},
    {"Gold 6252", "Intel Xeon Gold 6252", 150, 24, ARK},
    {"Platinum 8260", "Intel Xeon Platinum 8260", 165, 24, ARK},
    {"Platinum 8268", "Intel Xeon Platinum 8268", 205, 24, ARK},
    {"Platinum 8280", "Intel Xeon Platinum 8280", 205, 28, ARK},
    {"Gold 6330", "Intel Xeon Gold 6330", 205, 28, ARK},
    {"Gold 6338", "Intel Xeon Gold 6338", 205, 32, ARK},
    {"Platinum 8358", "Intel Xeon Platinum 8358", 250, 32, ARK},
    {"Platinum 8380", "Intel Xeon Platinum 8380", 270, 40, ARK},
    {"Gold 6448Y", "Intel Xeon Gold 6448Y", 225, 32, ARK},
    {"Platinum 8462Y+", "Intel Xeon Platinum 8462Y+", 300, 32, ARK},
    {"Platinum 8468", "Intel Xeon Platinum 8468", 350, 48, ARK},
    {"Platinum 8480+", "Intel Xeon Platinum 8480+", 350, 56, ARK},
    {"Platinum 8592+", "Intel Xeon Platinum 8592+", 350, 64, ARK},
    /* AMD EPYC 7002 (Rome), 7003 (Milan), 9004 (Genoa, Bergamo) */
    {"EPYC 7452", "AMD EPYC 7452", 155, 32, AMD},
    {"EPYC 7502", "AMD EPYC 7502", 180, 32, AMD},
    {"EPYC 7742", "AMD EPYC 7742", 225, 64, AMD},
    {"EPYC 7H12", "AMD EPYC 7H12", 280, 64, AMD},
    {"EPYC 7543", "AMD EPYC 7543", 225, 32, AMD},
    {"EPYC 7713", "AMD EPYC 7713", 225, 64, AMD},
    {"EPYC 7763", "AMD EPYC 7763", 280, 64, AMD},
    {"EPYC 9334", "AMD EPYC 9334", 210, 32, AMD},
    {"EPYC 9454", "AMD EPYC 9454", 290, 48, AMD},
    {"EPYC 9554", "AMD EPYC 9554", 360, 64, AMD},
    {"EPYC 9654", "AMD EPYC 9654", 360, 96, AMD},
    {"EPYC 9754", "AMD EPYC 9754", 360, 128, AMD},
    /* laptops and desktops (Processor Base Power where ARK gives no TDP) */
    {"i5-8250U", "Intel Core i5-8250U", 15, 4, ARK},
    {"i7-8650U", "Intel Core i7-8650U", 15, 4, ARK},
    {"i7-10510U", "Intel Core i7-10510U", 15, 4, ARK},
    {"i7-12700K", "Intel Core i7-12700K", 125, 12, ARK},
    {"i9-13900K", "Intel Core i9-13900K", 125, 24, ARK},
    {"Ryzen 5800X", "AMD Ryzen 7 5800X", 105, 8, AMD},
    {"Ryzen 5950X", "AMD Ryzen 9 5950X", 105, 16, AMD},
    {"Ryzen 7950X", "AMD Ryzen 9 7950X", 170, 16, AMD},
};

#define NV "NVIDIA datasheet"

/* Board power (W, the maximum the board is specified for) by the driver's device name. */
static const hwpower_part GPUS[] = {
    {"V100-SXM2-16GB", "NVIDIA V100 SXM2 16 GB", 300, 0, NV " V100 (2020): Max Power Consumption"},
    {"V100-SXM2-32GB", "NVIDIA V100 SXM2 32 GB", 300, 0, NV " V100 (2020): Max Power Consumption"},
    {"V100-PCIE-16GB", "NVIDIA V100 PCIe 16 GB", 250, 0, NV " V100 (2020): Max Power Consumption"},
    {"V100-PCIE-32GB", "NVIDIA V100 PCIe 32 GB", 250, 0, NV " V100 (2020): Max Power Consumption"},
    {"V100S-PCIE-32GB", "NVIDIA V100S PCIe 32 GB", 250, 0, NV " V100 (2020): Max Power Consumption"},
    {"A100-SXM4-40GB", "NVIDIA A100 SXM4 40 GB", 400, 0, NV " A100 (2021): Max TDP Power"},
    {"A100-SXM4-80GB", "NVIDIA A100 SXM4 80 GB", 400, 0, NV " A100 (2021): Max TDP Power"},
    {"A100-PCIE-40GB", "NVIDIA A100 PCIe 40 GB", 250, 0, NV " A100 (2021): Max TDP Power"},
    {"A100 80GB PCIe", "NVIDIA A100 PCIe 80 GB", 300, 0, NV " A100 (2021): Max TDP Power"},
    {"H100 PCIe", "NVIDIA H100 PCIe", 350, 0, NV " H100: Max TDP (PCIe 300-350 W)"},
    {"H100 NVL", "NVIDIA H100 NVL", 400, 0, NV " H100: Max TDP (NVL 350-400 W)"},
    {"H100", "NVIDIA H100 SXM5", 700, 0, NV " H100: Max TDP (SXM up to 700 W)"},
    {"H200 NVL", "NVIDIA H200 NVL", 600, 0, NV " H200: Max TDP (NVL up to 600 W)"},
    {"H200", "NVIDIA H200 SXM", 700, 0, NV " H200: Max TDP (SXM up to 700 W)"},
    {"L40S", "NVIDIA L40S", 350, 0, NV " L40S: Max Power Consumption"},
    {"A10", "NVIDIA A10", 150, 0, NV " A10: Max TDP Power"},
};

const hwpower_part *hwpower_cpus(int *n) {
  *n = (int)(sizeof CPUS / sizeof CPUS[0]);
  return CPUS;
}

const hwpower_part *hwpower_gpus(int *n) {
  *n = (int)(sizeof GPUS / sizeof GPUS[0]);
  return GPUS;
}

/* ---- matching ----------------------------------------------------------------------------------- */

static int is_sep(char c) { return c == '\0' || isspace((unsigned char)c) || strchr("(),@", c) != NULL; }

/* Whether word (len n) is one of the words of name, case ignored. */
static int has_word(const char *name, const char *word, size_t n) {
  for (const char *p = name; *p; p++)
    if ((p == name || is_sep(p[-1])) && strncasecmp(p, word, n) == 0 && is_sep(p[n])) return 1;
  return 0;
}

const hwpower_part *hwpower_match(const hwpower_part *t, int n, const char *name) {
  for (int i = 0; i < n; i++) {
    int all = 1;
    for (const char *w = t[i].pattern; *w && all;) {
      size_t len = strcspn(w, " ");
      all = has_word(name, w, len);
      w += len + (w[len] == ' ');
    }
    if (all) return &t[i];
  }
  return NULL;
}

/* ---- what the node says ------------------------------------------------------------------------- */

/* The value after "key<blanks>:" on the first line of path that starts with key, into buf. */
static int field(const char *path, const char *key, char *buf, size_t len) {
  FILE *fp = fopen(path, "r");
  if (!fp) return -1;
  char line[512];
  size_t k = strlen(key);
  int rc = -1;
  while (rc != 0 && fgets(line, sizeof line, fp)) {
    const char *p = line + strspn(line, " \t");
    if (strncmp(p, key, k) != 0 || p[k + strspn(p + k, " \t")] != ':') continue;
    p += k + strspn(p + k, " \t") + 1;
    p += strspn(p, " \t");
    util_strlcpy(buf, p, len);
    buf[strcspn(buf, "\n")] = '\0';
    rc = 0;
  }
  fclose(fp);
  return rc;
}

int hwpower_cpu_model(const char *cpuinfo, char *buf, size_t len) {
  return field(cpuinfo, "model name", buf, len) == 0 && buf[0] ? 0 : -1;
}

/* A cgroup limit file: bytes, or 0 for none ("max", absent, or v1's "unlimited" near 2^63). */
static double cgroup_limit(const char *path) {
  FILE *fp = fopen(path, "r");
  if (!fp) return 0;
  char v[64] = "";
  if (!fgets(v, sizeof v, fp)) v[0] = '\0';
  fclose(fp);
  double b = strtod(v, NULL);
  return b > 0 && b < 0x1p62 ? b : 0;
}

/* The smallest limit of the cgroup at rel (a path under dir) and its ancestors; 0 for none. */
static double cgroup_min(const char *dir, const char *rel, const char *file) {
  char sub[1024], path[1200];
  util_strlcpy(sub, rel, sizeof sub);
  double best = 0;
  for (;;) {
    util_snprintf(path, sizeof path, "%s%s/%s", dir, sub, file);
    double b = cgroup_limit(path);
    if (b > 0 && (best == 0 || b < best)) best = b;
    char *slash = strrchr(sub, '/');
    if (!slash) break;
    *slash = '\0';
  }
  return best;
}

/* The memory limit of this process's cgroup (v2 "0::/path", or v1's "N:memory:/path"); 0 for none. */
static double cgroup_memory(const char *self_cgroup, const char *root) {
  FILE *fp = fopen(self_cgroup, "r");
  if (!fp) return 0;
  char line[1024], dir[1100];
  double best = 0;
  while (best == 0 && fgets(line, sizeof line, fp)) {
    line[strcspn(line, "\n")] = '\0';
    char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
    if (!b) continue;
    *a = *b = '\0'; /* line: hierarchy id, a + 1: controllers, b + 1: the path */
    if (strcmp(line, "0") == 0 && a + 1 == b) { /* v2 */
      best = cgroup_min(root, b + 1, "memory.max");
    } else if (strcmp(a + 1, "memory") == 0) { /* v1 */
      util_snprintf(dir, sizeof dir, "%s/memory", root);
      best = cgroup_min(dir, b + 1, "memory.limit_in_bytes");
    }
  }
  fclose(fp);
  return best;
}

double hwpower_memory_bytes(const char *meminfo, const char *self_cgroup, const char *cgroup_root, char *basis,
                            size_t len) {
  char v[64];
  double total = field(meminfo, "MemTotal", v, sizeof v) == 0 ? 1024.0 * strtod(v, NULL) : 0; /* kB */
  double limit = cgroup_memory(self_cgroup, cgroup_root);
  if (limit > 0 && (total <= 0 || limit < total)) {
    util_snprintf(basis, len, "the cgroup's memory limit, %.1f GB", limit / 1e9);
    return limit;
  }
  util_snprintf(basis, len, total > 0 ? "MemTotal, %.1f GB" : "memory size unknown", total / 1e9);
  return total;
}

/* A PCI bus id as numbers (domain, bus, device, function), whatever the width and case. */
static int parse_bus(const char *s, unsigned v[4]) {
  return sscanf(s, "%x:%x:%x.%x", &v[0], &v[1], &v[2], &v[3]) == 4 ? 0 : -1;
}

int hwpower_gpu_name(const char *gpus_dir, const char *bus, char *buf, size_t len) {
  unsigned want[4], have[4];
  DIR *d = parse_bus(bus, want) == 0 ? opendir(gpus_dir) : NULL;
  if (!d) return -1;
  int rc = -1;
  struct dirent *de;
  while (rc != 0 && (de = readdir(d))) {
    if (parse_bus(de->d_name, have) != 0 || memcmp(have, want, sizeof have) != 0) continue;
    char path[1200];
    util_snprintf(path, sizeof path, "%s/%s/information", gpus_dir, de->d_name);
    rc = field(path, "Model", buf, len) == 0 && buf[0] ? 0 : -1;
  }
  closedir(d);
  return rc;
}

const hwpower_part *hwpower_cpu(const char *name) {
  int n;
  const hwpower_part *t = hwpower_cpus(&n);
  return hwpower_match(t, n, name);
}

const hwpower_part *hwpower_gpu(const char *name) {
  int n;
  const hwpower_part *t = hwpower_gpus(&n);
  return hwpower_match(t, n, name);
}
