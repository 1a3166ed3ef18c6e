/* test_nml: namelist syntax accepted by the deck reader, typed binding, overrides, derived values,
 * and the resolved-deck echo reading back to the same configuration. Malformed decks are tested
 * end to end by test_decks.sh. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "deck/cfg.h"
#include "deck/nml.h"
#include "testing.h"
#include "base/util.h"

static int load(cfg_config *c, const char *text, char *const *sets, int nsets) {
  err_list e = {0};
  int n = cfg_load(c, text, strlen(text), "test.nml", sets, nsets, &e);
  if (n) err_print(&e, 10);
  err_free(&e);
  return n;
}

static const char *base = "&data train = 'x.nc', val = 'y.nc' /\n";

static char *with_base(const char *text) {
  size_t n = strlen(text) + strlen(base) + 1;
  char *s = malloc(n);
  snprintf(s, n, "%s%s", base, text);
  return s;
}

static void test_syntax(void) {
  cfg_config *c = calloc(1, sizeof *c);
  char *t = with_base("! a comment line\n"
                      "&MODEL  N_LAYER = 3, n_embd=48 ! trailing comment\n"
                      "   n_head = 4\n"
                      "   attention_types = 2*'global', \"LOCAL\"  window_size = 7\n"
                      "   layer_norm_epsilon = 1.0d-6, init_std = .5e-1\n"
                      "/\n"
                      "&job name = 'it''s a \"test\"', overwrite = T, seed = 1e3 &end\n"
                      "&training lr = 3E-4 global_batch_size = 8, micro_batch_size = 2, warmup_steps = 0 /\n"
                      "&sample temperature = 1, prompt = \"say \"\"hi\"\"\" /\n");
  T_CHECK(load(c, t, NULL, 0) == 0, "valid deck rejected");
  T_CHECK(c->model.n_layer == 3 && c->model.n_embd == 48 && c->model.n_head == 4, "integers");
  T_CHECK(c->model.attention_types.n == 3 && !strcmp(c->model.attention_types.v[0], "global") &&
              !strcmp(c->model.attention_types.v[1], "global") && !strcmp(c->model.attention_types.v[2], "local"),
          "repeat count and case-folded choice in a string list");
  T_CHECK(c->model.window_size == 7, "entries separated by blanks only");
  T_CHECK(c->model.layer_norm_epsilon == 1e-6 && c->model.init_std == 0.05, "d exponent and leading-dot real");
  T_CHECK(!strcmp(c->job.name, "it's a \"test\""), "doubled quote in a string: got [%s]", c->job.name);
  T_CHECK(!strcmp(c->sample.prompt, "say \"hi\""), "doubled double quote: got [%s]", c->sample.prompt);
  T_CHECK(c->job.overwrite == 1 && c->job.seed == 1000, "logical T, integral real 1e3 for an integer");
  T_CHECK(c->training.lr == 3e-4 && c->sample.temperature == 1.0, "reals, integer literal for a real");
  T_CHECK(c->model.n_inner == 4 * 48, "derived n_inner = 4 n_embd, got %ld", c->model.n_inner);
  T_CHECK(c->training.decay_steps == c->training.max_steps, "derived decay_steps");
  T_CHECK(c->training.global_batch_size == 8, "explicit global batch kept");
  T_CHECK(!strcmp(c->model.arch, "gpt-neo") && c->model.vocab_size == 50257, "defaults kept");
  free(t);
  free(c);
}

static void test_logicals(void) {
  const char *forms[] = {".true.", ".TRUE.", ".t.", "T", "t", "true", ".false.", ".f.", "F", "false"};
  for (int i = 0; i < 10; i++) {
    cfg_config *c = calloc(1, sizeof *c);
    char deck[200];
    snprintf(deck, sizeof deck, "%s&job overwrite = %s /\n", base, forms[i]);
    T_CHECK(load(c, deck, NULL, 0) == 0, "logical %s rejected", forms[i]);
    T_CHECK(c->job.overwrite == (i < 6), "logical %s read as %d", forms[i], c->job.overwrite);
    free(c);
  }
}

static void test_overrides(void) {
  cfg_config *c = calloc(1, sizeof *c);
  char *sets[] = {"training.lr=1e-3", "model.attention_types='local','global'", "job.overwrite=.true."};
  T_CHECK(load(c, "&training lr = 5e-4 / &data train='a', val='b' /", sets, 3) == 0, "overrides rejected");
  T_CHECK(c->training.lr == 1e-3, "--set replaces a deck value");
  T_CHECK(c->model.attention_types.n == 2 && !strcmp(c->model.attention_types.v[0], "local"), "--set of a list");
  T_CHECK(c->job.overwrite == 1, "--set of a logical");
  int k = cfg_find("training", "lr");
  T_CHECK(k >= 0 && strstr(c->origin[k].file, "--set") != NULL, "origin of an override: %s", c->origin[k].file);
  free(c);
}

/* A renamed key's old name still sets the new key (with a warning on stderr), in decks and --set. */
static void test_renamed(void) {
  cfg_config *c = calloc(1, sizeof *c);
  char *sets[] = {"comm.bucket=128"};
  T_CHECK(load(c, "&comm bucket = 64 / &data train='a', val='b' /", NULL, 0) == 0 && c->comm.quant_bucket == 64,
          "&comm bucket did not set quant_bucket: %ld", c->comm.quant_bucket);
  T_CHECK(load(c, "&data train='a', val='b' /", sets, 1) == 0 && c->comm.quant_bucket == 128,
          "--set comm.bucket did not set quant_bucket: %ld", c->comm.quant_bucket);
  free(c);
}

/* The resolved deck is itself a deck that resolves to the same configuration. */
static void test_echo_roundtrip(void) {
  cfg_config *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  char *t = with_base("&model n_layer = 5, n_embd = 40, n_head = 5, attention_types = 'local' /\n"
                      "&training lr = 1.2345678901234e-4, max_minutes = 0.1 /\n"
                      "&sample prompt = 'O''Brien said \"hi\"' /\n");
  T_CHECK(load(a, t, NULL, 0) == 0, "deck rejected");
  char *buf = NULL, *buf2 = NULL;
  size_t len = 0, len2 = 0;
  FILE *fp = open_memstream(&buf, &len);
  cfg_write_deck(a, fp, "header line 1\nheader line 2");
  fclose(fp);
  T_CHECK(load(b, buf, NULL, 0) == 0, "resolved deck does not parse:\n%s", buf);
  fp = open_memstream(&buf2, &len2);
  cfg_write_deck(b, fp, "header line 1\nheader line 2");
  fclose(fp);
  /* the values agree; only the "! default" marks may differ (every key is now set) */
  T_CHECK(b->training.lr == a->training.lr, "real round trip: %.17g vs %.17g", b->training.lr, a->training.lr);
  T_CHECK(!strcmp(b->sample.prompt, a->sample.prompt), "string round trip: [%s]", b->sample.prompt);
  T_CHECK(b->model.n_inner == 160 && b->model.attention_types.n == 1, "derived and list round trip");
#define CFG_CMP(g, type, n, def, range, doc)                                                       \
  T_CHECK(!memcmp(&a->g.n, &b->g.n, sizeof a->g.n), "round trip of %s.%s", #g, #n);
#define CFG_CMP_GROUP(gname, GMACRO, gdoc) GMACRO(CFG_CMP, gname)
  CFG_GROUPS(CFG_CMP_GROUP)
  free(buf);
  free(buf2);
  free(t);
  free(a);
  free(b);
}

/* Errors come back with file, line and column (a few here; test_decks.sh has the full set). */
static void test_error_places(void) {
  cfg_config *c = calloc(1, sizeof *c);
  err_list e = {0};
  cfg_load(c, "&model\n  n_layers = 2\n/\n&data train='x', val='y' /", 50, "deck.nml", NULL, 0, &e);
  T_CHECK(e.n == 1 && e.v[0].line == 2 && e.v[0].col == 3 && strstr(e.v[0].msg, "did you mean 'n_layer'"),
          "unknown key place/message: %d errors, %d:%d %s", e.n, e.n ? e.v[0].line : 0, e.n ? e.v[0].col : 0,
          e.n ? e.v[0].msg : "");
  err_free(&e);
  char *sets[] = {"training.lr=abc"};
  cfg_load(c, "&data train='x', val='y' /", 26, "deck.nml", sets, 1, &e);
  T_CHECK(e.n == 1 && strstr(e.v[0].file, "--set training.lr=abc"), "override error names the option: %s",
          e.n ? e.v[0].file : "");
  err_free(&e);
  free(c);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  test_syntax();
  test_logicals();
  test_overrides();
  test_renamed();
  test_echo_roundtrip();
  test_error_places();
  int rc = t_done("test_nml");
  MPI_Finalize();
  return rc;
}
