/* fileid: the same file under any spelling (device and inode, or canonical paths). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "text/fileid.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Components of rest ("a/./b/../c") appended to out (a canonical path), ".." removing the last. */
static void append_lexically(char *out, size_t len, const char *rest) {
  char buf[UTIL_PATH_MAX];
  util_strlcpy(buf, rest, sizeof buf);
  for (char *save = NULL, *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    size_t n = strlen(out);
    if (!strcmp(c, ".")) continue;
    if (!strcmp(c, "..")) {
      char *slash = strrchr(out, '/');
      if (slash) slash[slash == out] = '\0'; /* "/a" -> "/", "/" stays */
      continue;
    }
    util_snprintf(out + n, len - n, "%s%s", n && out[n - 1] == '/' ? "" : "/", c);
  }
}

void fileid_canonical(const char *path, char *out, size_t len) {
  char abs[2 * UTIL_PATH_MAX], cwd[UTIL_PATH_MAX];
  if (path[0] == '/' || !getcwd(cwd, sizeof cwd)) util_strlcpy(abs, path, sizeof abs);
  else util_snprintf(abs, sizeof abs, "%s/%s", cwd, path);
  /* the longest existing ancestor: cut the last component off until realpath takes it */
  char head[sizeof abs], real[PATH_MAX];
  util_strlcpy(head, abs, sizeof head);
  size_t cut = strlen(head);
  for (;;) {
    if (realpath(head[0] ? head : "/", real)) break;
    char *slash = strrchr(head, '/');
    if (!slash) { /* nothing of it exists (a relative path without a working directory) */
      util_strlcpy(real, "", sizeof real);
      cut = 0;
      break;
    }
    *slash = '\0';
    cut = (size_t)(slash - head);
  }
  util_strlcpy(out, real, len);
  append_lexically(out, len, abs + cut);
}

void fileid_of(const char *path, fileid *id) {
  struct stat st;
  memset(id, 0, sizeof *id);
  if (stat(path, &st) == 0) {
    id->exists = 1;
    id->dev = st.st_dev;
    id->ino = st.st_ino;
  }
  fileid_canonical(path, id->canonical, sizeof id->canonical);
}

int fileid_same(const fileid *a, const fileid *b) {
  if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
  return strcmp(a->canonical, b->canonical) == 0;
}

int fileid_same_path(const char *a, const char *b) {
  fileid x, y;
  fileid_of(a, &x);
  fileid_of(b, &y);
  return fileid_same(&x, &y);
}

void fileid_dirname(const char *path, char *out, size_t len) {
  util_strlcpy(out, path, len);
  char *slash = strrchr(out, '/');
  while (slash && slash > out && slash[1] == '\0') { /* "dir/" names dir */
    *slash = '\0';
    slash = strrchr(out, '/');
  }
  if (!slash) util_strlcpy(out, ".", len);
  else slash[slash == out] = '\0';
}
