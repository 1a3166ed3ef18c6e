/* fuzz_hf: the Hugging Face importer (config.json, the safetensors header and data) on arbitrary
 * files: the input up to its first NUL byte is config.json, the rest model.safetensors. The config
 * is read (hf_config_to_model); where it describes a model a deck takes (its &model loads) and that
 * is small, the weights are read into that model (hf_read_params). Properties: no crash, no loop
 * without end; an accepted config agrees with the deck made from it (hf_check_config); accepted
 * weights are all finite; every error names its file and has a message, and the first a hint. */
#include <math.h>

#include "deck/cfg.h"
#include "io/hf.h"
#include "model/backend.h"
#include "model/gpt.h"
#include "fuzz.h"

/* Models of at most this many parameters are read (a header may claim any shape). */
enum { MOST_PARAMS = 1 << 20 };

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 1);
  return 0;
}

static void check_errors(const err_list *e, const char *what) {
  for (int i = 0; i < e->n; i++) FUZZ_ASSERT(e->v[i].file[0] && e->v[i].msg[0], "errors name their file and say what");
  FUZZ_ASSERT(e->n > 0 && e->v[0].hint[0], what);
}

/* The &model the config describes, through the deck's own checks: 0 and *cfg, or -1. */
static int model_deck(const cfg_model *m, cfg_config *cfg) {
  char deck[4096], types[CFG_LIST_MAX * 12] = "";
  for (int i = 0; i < m->attention_types.n; i++)
    snprintf(types + strlen(types), sizeof types - strlen(types), "%s'%s'", i ? ", " : "", m->attention_types.v[i]);
  snprintf(deck, sizeof deck,
           "&model arch = '%s', vocab_size = %ld, block_size = %ld, n_layer = %ld, n_embd = %ld, n_head = %ld, n_inner = %ld,\n"
           "  attention_types = %s, window_size = %ld, layer_norm_epsilon = %.17g /\n",
           m->arch, m->vocab_size, m->block_size, m->n_layer, m->n_embd, m->n_head, m->n_inner, types, m->window_size,
           m->layer_norm_epsilon);
  err_list e = {0};
  int rc = cfg_load(cfg, deck, strlen(deck), "fuzz.nml", NULL, 0, &e) == 0 ? 0 : -1;
  err_free(&e);
  return rc;
}

/* The weights of dir read into a model of cfg's shape, when it is small. */
static void read_weights(const char *dir, const cfg_config *cfg) {
  gpt_shape s;
  gpt_shape_from_cfg(&s, &cfg->model);
  if (gpt_count_params(&s) <= MOST_PARAMS) {
    int nt;
    gpt_tensor *t = gpt_list_tensors(&s, gpt_whole(&s), &nt);
    size_t n = gpt_count_params(&s);
    float *params = malloc(n * sizeof(float) + 1);
    err_list e = {0};
    if (hf_read_params(dir, &s, t, nt, params, &e) == 0) {
      for (size_t i = 0; i < n; i++) FUZZ_ASSERT(isfinite(params[i]), "accepted weights are finite");
    } else {
      check_errors(&e, "the first error about the weights has a hint");
    }
    if (getenv("FUZZ_VERBOSE")) err_print(&e, 10);
    err_free(&e);
    free(params), free(t);
  }
  gpt_shape_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_write_pair("config.json", "model.safetensors", data, size);
  static cfg_config cfg;
  cfg_model m;
  memset(&m, 0, sizeof m);
  err_list e = {0};
  if (hf_config_to_model(fuzz_dir, &m, &e) != 0) {
    check_errors(&e, "the first error about a config has a hint");
  } else if (model_deck(&m, &cfg) == 0) {
    FUZZ_ASSERT(hf_check_config(fuzz_dir, &cfg.model, &e) == 0, "an accepted config agrees with the deck made from it");
    read_weights(fuzz_dir, &cfg);
  }
  if (getenv("FUZZ_VERBOSE")) err_print(&e, 10), printf("%s: %d errors\n", __FILE__, e.n);
  err_free(&e);
  return 0;
}
