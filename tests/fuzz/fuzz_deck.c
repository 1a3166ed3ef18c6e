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

/* Whether key k has the same value in a and b: strings and list items as text, reals bit for bit. */
static int same_value(const cfg_config *a, const cfg_config *b, const cfg_key *key) {
  const void *x = (const char *)a + key->offset, *y = (const char *)b + key->offset;
  switch (key->type) {
  case CFG_T_INT: return *(const long *)x == *(const long *)y;
  case CFG_T_REAL: return memcmp(x, y, sizeof(double)) == 0;
  case CFG_T_BOOL: return *(const int *)x == *(const int *)y;
  case CFG_T_STR: return strcmp(x, y) == 0;
  case CFG_T_STRLIST: {
    const cfg_strlist *l = x, *m = y;
    if (l->n != m->n) return 0;
    for (int i = 0; i < l->n; i++)
      if (strcmp(l->v[i], m->v[i]) != 0) return 0;
    return 1;
  }
  case CFG_T_REALLIST: {
    const cfg_reallist *l = x, *m = y;
    return l->n == m->n && memcmp(l->v, m->v, (size_t)l->n * sizeof(double)) == 0;
  }
  }
  return 0;
}

/* Whether every key has the same value in a and b (their origins aside); names the first that differs. */
static int same_values(const cfg_config *a, const cfg_config *b) {
  for (int k = 0; k < CFG_NKEYS; k++)
    if (!same_value(a, b, &cfg_keys()[k])) {
      fprintf(stderr, "fuzz: %s differs in the resolved deck\n", cfg_keys()[k].name);
      return 0;
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
