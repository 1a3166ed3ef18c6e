/* fuzz_deck: the deck reader (nml_parse, cfg_load, cfg_resolve_layout) on arbitrary bytes.
 * Properties: no crash, no undefined behaviour; and a deck that loads has a resolved echo that is
 * itself a deck, loading to the same values (the echo is what deck.resolved.nml holds). */
#include "deck/cfg.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return 0;
}

static char *echo(const cfg_config *c, size_t *len) {
  char *buf = NULL;
  FILE *fp = open_memstream(&buf, len);
  cfg_write_deck(c, fp, NULL);
  fclose(fp);
  return buf;
}

/* Whether every key has the same value in a and b (their origins aside). */
static int same_values(const cfg_config *a, const cfg_config *b) {
  for (int k = 0; k < CFG_NKEYS; k++) {
    const cfg_key *key = &cfg_keys()[k];
    size_t n = key->type == CFG_T_STR ? CFG_STR_LEN : key->type == CFG_T_STRLIST ? sizeof(cfg_strlist)
             : key->type == CFG_T_REAL ? sizeof(double) : key->type == CFG_T_INT ? sizeof(long) : sizeof(int);
    if (memcmp((const char *)a + key->offset, (const char *)b + key->offset, n) != 0) return 0;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > NML_MAX_BYTES) return 0; /* the program refuses such a file before parsing */
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = '\0';
  static cfg_config a, b;
  err_list errs = {0};
  if (cfg_load(&a, text, size, "fuzz.nml", NULL, 0, &errs) == 0) {
    cfg_resolve_layout(&a, 1 + (int)(size % 4), &errs);
    size_t n1;
    char *e1 = echo(&a, &n1);
    err_list again = {0};
    int loads = cfg_load(&b, e1, n1, "resolved.nml", NULL, 0, &again) == 0;
    if (!loads) err_print(&again, 5); /* what the echo got wrong, for the finding's report */
    FUZZ_ASSERT(loads, "the resolved deck of a valid deck loads");
    FUZZ_ASSERT(same_values(&a, &b), "the resolved deck loads to the same values");
    free(e1);
    err_free(&again);
  }
  FUZZ_ASSERT(err_count(&errs) >= errs.n && errs.n <= ERR_KEEP, "the error list stays bounded");
  err_free(&errs);
  free(text);
  return 0;
}
