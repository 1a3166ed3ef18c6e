/* testdeck: a deck from text, resolved for a rank count, for the C tests that train (include
 * after testing.h). A rejected deck is a failed check, with the errors printed. */
#ifndef GREENLM_TESTDECK_H
#define GREENLM_TESTDECK_H

#include <stdlib.h>

#include "deck/cfg.h"
#include "deck/nml.h"

static inline cfg_config *t_load_deck(const char *text, const char *name, int nranks) {
  cfg_config *c = calloc(1, sizeof *c);
  err_list e = {0};
  int bad = cfg_load(c, text, strlen(text), name, NULL, 0, &e) + cfg_resolve_layout(c, nranks, &e);
  if (bad) err_print(&e, 10);
  T_CHECK(bad == 0, "deck %s rejected", name);
  err_free(&e);
  return c;
}

#endif
