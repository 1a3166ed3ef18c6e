/* energy: RAPL powercap reader and labelled estimate. */
#include "energy.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

const char *energy_status_name(energy_status s) {
  return s == ENERGY_MEASURED ? "measured" : s == ENERGY_ESTIMATED ? "estimated" : "not measured";
}

static int read_text(const char *path, char *buf, size_t len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, len - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
  return 0;
}

static int read_u64_fd(int fd, uint64_t *v) {
  char buf[64];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  *v = strtoull(buf, NULL, 10);
  return 0;
}

/* Add zone dir (package-* or dram) when readable. Returns 1 when added, 0 when not a zone we read,
 * -1 when present but unreadable (errno kept). */
static int add_zone(energy_meter *e, const char *dir) {
  char path[1024], name[64], range[64];
  snprintf(path, sizeof path, "%s/name", dir);
  if (read_text(path, name, sizeof name) != 0) return 0;
  if (strncmp(name, "package-", 8) != 0 && strcmp(name, "dram") != 0) return 0;
  if (e->nzones == ENERGY_MAX_ZONES) return 0;
  snprintf(path, sizeof path, "%s/max_energy_range_uj", dir);
  if (read_text(path, range, sizeof range) != 0) return -1;
  snprintf(path, sizeof path, "%s/energy_uj", dir);
  int fd = open(path, O_RDONLY);
  uint64_t v;
  if (fd < 0) return -1;
  if (read_u64_fd(fd, &v) != 0) {
    close(fd);
    return -1;
  }
  int z = e->nzones++;
  e->fd[z] = fd;
  e->last_uj[z] = v;
  e->range_uj[z] = strtoull(range, NULL, 10);
  const char *base = strrchr(dir, '/');
  util_snprintf(e->zone[z], sizeof e->zone[z], "%s(%s)", name, base ? base + 1 : dir);
  return 1;
}

static void open_rapl(energy_meter *e) {
  const char *root = getenv("GREENLM_POWERCAP_ROOT");
  if (!root || !*root) root = "/sys/class/powercap";
  DIR *d = opendir(root);
  if (!d) {
    snprintf(e->note, sizeof e->note, "no RAPL: %s absent", root);
    return;
  }
  int denied = 0;
  struct dirent *de;
  /* top-level zones intel-rapl:N and their sub-zones intel-rapl:N:M */
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "intel-rapl:", 11) != 0 || strchr(de->d_name + 11, ':')) continue;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
    if (add_zone(e, dir) < 0) denied = 1;
    DIR *sd = opendir(dir);
    if (!sd) continue;
    struct dirent *se;
    while ((se = readdir(sd))) {
      if (strncmp(se->d_name, "intel-rapl:", 11) != 0) continue;
      char sub[1100];
      util_snprintf(sub, sizeof sub, "%s/%s", dir, se->d_name);
      if (add_zone(e, sub) < 0) denied = 1;
    }
    closedir(sd);
  }
  closedir(d);
  if (e->nzones == 0)
    snprintf(e->note, sizeof e->note, denied ? "RAPL present in %s but not readable (root only since CVE-2020-8694)"
                                             : "no RAPL package zones in %s", root);
}

void energy_open(energy_meter *e, const cfg_energy *c, int cores) {
  memset(e, 0, sizeof *e);
  e->t0 = e->t_last = util_now();
  e->cores = cores > 0 ? cores : 1;
  open_rapl(e);
  if (e->nzones > 0) {
    e->status = ENERGY_MEASURED;
    snprintf(e->method, sizeof e->method, "rapl_sysfs");
    int o = snprintf(e->note, sizeof e->note, "RAPL counters:");
    for (int z = 0; z < e->nzones && o < (int)sizeof e->note; z++)
      o += snprintf(e->note + o, sizeof e->note - (size_t)o, " %s", e->zone[z]);
  } else if (c->cpu_tdp_w > 0) {
    char why[256];
    util_strlcpy(why, e->note, sizeof why);
    e->status = ENERGY_ESTIMATED;
    e->tdp_w = c->cpu_tdp_w;
    e->cpu_last = util_cpu_seconds();
    snprintf(e->method, sizeof e->method, "tdp_estimate");
    util_snprintf(e->note, sizeof e->note, "TDP %.0f W x CPU utilisation over %d cores (%s)", e->tdp_w, e->cores, why);
  } else {
    e->status = ENERGY_NOT_MEASURED;
    snprintf(e->method, sizeof e->method, "none");
    size_t n = strlen(e->note);
    snprintf(e->note + n, sizeof e->note - n, "; no &energy cpu_tdp_w for an estimate");
  }
}

void energy_sample(energy_meter *e) {
  double now = util_now(), dt = now - e->t_last;
  double dj = 0.0;
  if (e->status == ENERGY_MEASURED) {
    for (int z = 0; z < e->nzones; z++) {
      uint64_t v;
      if (read_u64_fd(e->fd[z], &v) != 0) continue;
      uint64_t d = v >= e->last_uj[z] ? v - e->last_uj[z] : v + (e->range_uj[z] - e->last_uj[z]);
      if (v < e->last_uj[z]) e->wraps++;
      e->last_uj[z] = v;
      dj += 1e-6 * (double)d;
    }
  } else if (e->status == ENERGY_ESTIMATED) {
    double cpu = util_cpu_seconds();
    double util = dt > 0 ? (cpu - e->cpu_last) / (dt * e->cores) : 0.0;
    if (util > 1.0) util = 1.0;
    dj = e->tdp_w * util * dt;
    e->cpu_last = cpu;
  }
  e->joules += dj;
  if (dt > 0) e->watts = dj / dt;
  e->t_last = now;
}

void energy_close(energy_meter *e) {
  for (int z = 0; z < e->nzones; z++) close(e->fd[z]);
  e->nzones = 0;
}
