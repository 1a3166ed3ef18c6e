/* fuzz_machine: machine files (greenlm --plan --machine FILE: a namelist read after the deck, its
 * &machine and &energy keys replacing the deck's) on arbitrary bytes, planned for a small deck.
 * Properties: no crash, no undefined behaviour (an int product of nodes and devices), no loop without
 * end; a machine that plans gives layouts of exactly its ranks whose counts the deck's ranges take,
 * positive finite step times, and a recommendation that fits; a refused one has errors with messages
 * and hints. The deck fixes the peak (no GEMM measured per input). */
#include <math.h>

#include "deck/cfg.h"
#include "model/backend.h"
#include "parallel/par.h"
#include "plan/plan.h"
#include "fuzz.h"

static const char DECK[] =
    "&job task = 'plan' /\n"
    "&model vocab_size = 256, block_size = 32, n_layer = 4, n_embd = 64, n_head = 4 /\n"
    "&training seq_len = 32, micro_batch_size = 4, global_batch_size = 64 /\n";
static char *const SETS[] = {"machine.peak_tflops=1", "machine.overhead_gb=0.1"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 1);
  return 0;
}

static void check_plan(const plan_result *r) {
  for (int i = 0; i < r->n; i++) {
    const plan_layout *l = &r->v[i];
    FUZZ_ASSERT((long)l->P * l->tp * l->D == r->mach.ranks && r->mach.ranks <= PAR_MAX_RANKS, "layouts of the machine's ranks");
    FUZZ_ASSERT(l->D <= cfg_key_max("parallel", "data_parallel") && l->m <= cfg_key_max("parallel", "micro_batches") &&
                (long)l->B * l->m * l->D == r->G, "a layout's counts are a deck's");
    FUZZ_ASSERT(l->t_step > 0 && isfinite(l->t_step), "a step takes a positive finite time");
  }
  FUZZ_ASSERT(r->best < 0 || r->v[r->best].fits, "the recommendation fits");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > NML_MAX_BYTES) return 0; /* the program refuses such a file before parsing */
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = '\0';
  static cfg_config cfg;
  const cfg_source src[2] = {{DECK, sizeof DECK - 1, "deck.nml"}, {text, size, "machine.nml"}};
  err_list errs = {0};
  if (cfg_load_sources(&cfg, src, 2, SETS, 2, &errs) == 0) {
    const backend *be = backend_cpu();
    plan_result r;
    if (plan_make(&r, &cfg, be, NULL, &errs) == 0) check_plan(&r);
    else FUZZ_ASSERT(errs.n > 0 && errs.v[0].msg[0] && errs.v[0].hint[0], "a machine refused by the planner says why");
    plan_free(&r);
  } else {
    FUZZ_ASSERT(errs.n > 0 && errs.v[0].msg[0], "a refused machine file has errors");
  }
  if (getenv("FUZZ_VERBOSE")) err_print(&errs, 10), printf("%s: %d errors\n", __FILE__, errs.n);
  err_free(&errs);
  free(text);
  return 0;
}
