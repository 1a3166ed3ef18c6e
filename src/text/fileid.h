/* fileid: whether two paths name the same file, however they are spelt.
 *
 * Two paths that both exist are the same file when they have the same device and inode (./x, a
 * symbolic link to x, a hard link to x). A path that does not exist yet (an output about to be
 * written) is compared by its canonical form: the real path of its longest existing ancestor (links
 * resolved), then the rest with "." and ".." applied and repeated slashes removed. */
#ifndef GREENLM_FILEID_H
#define GREENLM_FILEID_H

#include <sys/types.h>

#include "base/util.h"

typedef struct {
  int exists;
  dev_t dev;
  ino_t ino;
  char canonical[UTIL_PATH_MAX];
} fileid;

void fileid_of(const char *path, fileid *id);
int fileid_same(const fileid *a, const fileid *b);
/* fileid_same of two paths. */
int fileid_same_path(const char *a, const char *b);
/* The canonical form of path (above) into out (len bytes). */
void fileid_canonical(const char *path, char *out, size_t len);
/* The directory path is in, into out ("." for a bare name). */
void fileid_dirname(const char *path, char *out, size_t len);

#endif
