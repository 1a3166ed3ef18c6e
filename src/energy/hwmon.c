/* hwmon: power sensors of the hwmon class, integrated over time. */
#include "energy/hwmon.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/util.h"

/* Which component a label names: HWMON_CPU, HWMON_DRAM, or -1 (skipped). */
static int classify(const char *label) {
  char low[96];
  size_t i = 0;
  for (; label[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)label[i]);
  low[i] = '\0';
  static const char *const skip[] = {"vdd", "vdn", "vcs", "vio", "gpu", "system", "total", "psu", "supply", "input"};
  for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++)
    if (strstr(low, skip[k])) return -1;
  if (strstr(low, "mem") || strstr(low, "dram") || strstr(low, "dimm")) return HWMON_DRAM;
  static const char *const cpu[] = {"proc", "chip", "cpu", "package", "socket"};
  for (size_t k = 0; k < sizeof cpu / sizeof cpu[0]; k++)
    if (strstr(low, cpu[k])) return HWMON_CPU;
  return -1;
}

/* Watts from an open power<N>_input (microwatts); -1 when it cannot be read. */
static double watts(int fd) {
  char buf[64];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char *end;
  double uw = strtod(buf, &end);
  return end == buf || uw < 0 ? -1 : uw * 1e-6;
}

/* The counted sensors of one device directory. */
static void open_device(hwmon_set *h, const char *dir, const char *dev, int *denied) {
  char path[1200], label[96], driver[64] = "hwmon";
  util_snprintf(path, sizeof path, "%s/name", dir);
  util_read_line(path, driver, sizeof driver);
  for (int i = 1; i <= 64 && h->n < HWMON_MAX; i++) {
    util_snprintf(path, sizeof path, "%s/power%d_label", dir, i);
    if (util_read_line(path, label, sizeof label) != 0) continue;
    int comp = classify(label);
    if (comp < 0) continue;
    util_snprintf(path, sizeof path, "%s/power%d_input", dir, i);
    int fd = open(path, O_RDONLY);
    double w = fd >= 0 ? watts(fd) : -1;
    if (w < 0) {
      if (fd >= 0) close(fd);
      *denied = 1;
      continue;
    }
    int k = h->n++;
    h->fd[k] = fd, h->comp[k] = comp, h->last_w[k] = w;
    util_snprintf(h->name[k], sizeof h->name[k], "%s (%s %s power%d)", label, driver, dev, i);
  }
}

int hwmon_open(hwmon_set *h, char *why, size_t wl) {
  memset(h, 0, sizeof *h);
  const char *root = env_path("GREENLM_HWMON_ROOT");
  if (!root || !*root) root = "/sys/class/hwmon";
  DIR *d = opendir(root);
  if (!d) {
    if (why) util_snprintf(why, wl, "no hwmon: %s absent", root);
    return 0;
  }
  int denied = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strncmp(de->d_name, "hwmon", 5) == 0) {
      char dir[1100];
      util_snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
      open_device(h, dir, de->d_name, &denied);
    }
  closedir(d);
  h->last_t = util_now();
  if (h->n == 0 && why)
    util_snprintf(why, wl, denied ? "hwmon power sensors in %s not readable" : "no processor or memory power sensors in %s", root);
  return h->n;
}

void hwmon_read(hwmon_set *h, double now, uint64_t uj[2]) {
  if (now < h->last_t) now = h->last_t; /* a reading taken since by the other thread */
  const double dt = now - h->last_t;
  for (int k = 0; k < h->n; k++) {
    double w = watts(h->fd[k]);
    if (w < 0) w = h->last_w[k]; /* a missed reading: the last one holds */
    if (dt > 0) uj[h->comp[k]] += (uint64_t)(0.5 * (h->last_w[k] + w) * dt * 1e6 + 0.5);
    h->last_w[k] = w;
  }
  h->last_t = now;
}

void hwmon_close(hwmon_set *h) {
  for (int k = 0; k < h->n; k++) close(h->fd[k]);
  h->n = 0;
}
