/* fuzz_bench: the benchmark file readers (bench_load: LAMBADA, HellaSwag, PIQA, ARC, WinoGrande and
 * the generic multiple-choice form) on arbitrary files: the input's first byte picks the kind and the
 * few-shot count, the rest is the file. Properties: no crash; an accepted file gives items with a gold
 * choice among their choices, requests laid out item after item with a context and a continuation
 * each, and scores within [0, 1]; a refused one has errors that name the file, each with a message
 * and a hint. */
#include <math.h>

#include "eval/bench.h"
#include "fuzz.h"

static const char *const KINDS[] = {"lambada", "hellaswag", "piqa", "arc", "winogrande", "mc"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 0);
  return 0;
}

static void check_set(const bench_set *set) {
  FUZZ_ASSERT(set->nitems >= 1 && set->nitems <= set->nfile && set->first[0] == 0, "an accepted file has items");
  for (long i = 0; i < set->nitems; i++) {
    const int n = (int)(set->first[i + 1] - set->first[i]), gold = bench_gold(set, i);
    FUZZ_ASSERT(n >= 1 && gold >= 0 && gold < n, "each item's gold choice is one of its choices");
    for (int c = 0; c < n; c++) {
      const bench_request *r = bench_request_at(set, set->first[i] + c);
      FUZZ_ASSERT(r->item == i && r->choice == c && r->context && r->continuation, "requests come item after item");
    }
  }
  FUZZ_ASSERT(set->first[set->nitems] == bench_nrequests(set), "the requests are the items' choices");
  bench_result *res = calloc((size_t)bench_nrequests(set) + 1, sizeof *res);
  for (long r = 0; r < bench_nrequests(set); r++) res[r] = (bench_result){-(double)(r % 7), 1 + r % 3, (int)(r & 1)};
  bench_scores sc;
  bench_score(set, res, &sc);
  FUZZ_ASSERT(sc.n == set->nitems && sc.acc >= 0 && sc.acc <= 1 && (isnan(sc.acc_norm) || (sc.acc_norm >= 0 && sc.acc_norm <= 1)),
              "scores are shares within [0, 1]");
  free(res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  char path[400], spec[512];
  fuzz_write("bench.jsonl", data + 1, size - 1, path, sizeof path);
  snprintf(spec, sizeof spec, "%s:%s", KINDS[data[0] % 6], path);
  bench_set set;
  err_list errs = {0};
  if (bench_load(&set, spec, data[0] & 0x40 ? 3 : 0, (data[0] >> 3) & 3, 7, &errs) == 0) {
    check_set(&set);
    bench_free(&set);
  } else {
    for (int i = 0; i < errs.n; i++)
      FUZZ_ASSERT(strstr(errs.v[i].file, "bench.jsonl") && errs.v[i].msg[0] && errs.v[i].hint[0],
                  "errors name the file, with a message and a hint");
    FUZZ_ASSERT(errs.n > 0, "a refused file has errors");
  }
  if (getenv("FUZZ_VERBOSE")) err_print(&errs, 10), printf("%s: %d errors\n", __FILE__, errs.n);
  err_free(&errs);
  return 0;
}
