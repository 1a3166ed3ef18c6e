/* replay: the main of the fuzz targets outside fuzzing builds. Runs every file given, and every
 * file in every directory given, through LLVMFuzzerTestOneInput once: the committed corpora and
 * reproducers as regression tests (tests/test_fuzz.sh).
 *
 *   tests/fuzz/fuzz_deck tests/fuzz/corpus/deck tests/fuzz/crashes/deck */
#include <dirent.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  size_t cap = 1 << 16, n = 0, got;
  uint8_t *buf = malloc(cap);
  while ((got = fread(buf + n, 1, cap - n, fp)) > 0)
    if ((n += got) == cap) buf = realloc(buf, cap *= 2);
  fclose(fp);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int files = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) continue; /* an absent directory: nothing to replay */
    if (!S_ISDIR(st.st_mode)) {
      bad += run_file(argv[i]), files++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    struct dirent *de;
    while (d && (de = readdir(d))) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
      if (de->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) bad += run_file(path), files++;
    }
    if (d) closedir(d);
  }
  printf("%s: %d inputs replayed\n", argv[0], files);
  int inited, finalized;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
  return bad != 0;
}
