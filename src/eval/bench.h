/* bench: benchmark files in their published JSON Lines formats -> scoring requests (a context and
 * a continuation whose log-likelihood the model computes), and the benchmark's scores from the
 * results of those requests, as lm-evaluation-harness (lm-eval) defines them.
 *
 * Kinds ('kind:path' in &eval benchmarks; doc/evaluation.md has the fields and the sources):
 *   lambada     {"text"}: context = the text before its last space, continuation = " " + the last
 *               word (lm-eval's lambada_openai). One request per item, with greedy set.
 *   hellaswag   {"activity_label", "ctx_a", "ctx_b", "endings"[4], "label" (int or "0".."3")}:
 *               context = pre(activity_label + ": " + ctx_a + " " + capitalize(ctx_b)), choices
 *               " " + pre(ending); pre() strips, turns " [title]" into ". ", removes "[...]" and
 *               turns "  " into " "; capitalize() upper-cases the first letter and lower-cases the
 *               rest (Python's str.capitalize, ASCII letters only).
 *   piqa        {"goal", "sol1", "sol2", "label" (0|1)}: context "Question: {goal}\nAnswer:",
 *               choices " " + sol1, " " + sol2.
 *   arc         AI2's {"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"} or HF's
 *               {"question", "choices": {"text": [], "label": []}, "answerKey"}: context
 *               "Question: {question}\nAnswer:", choices " " + text; the gold choice is the one
 *               whose label equals answerKey ("A".."E" or "1".."5").
 *   winogrande  {"sentence" with "_", "option1", "option2", "answer" ("1"|"2")}: lm-eval's partial
 *               scoring: choice i's context = the sentence before the first "_" followed by option i,
 *               the continuation (the same for both) = " " + the text after "_", stripped.
 *   mc          {"context", "choices": [...], "label": int}: continuations " " + choice, or the
 *               choice itself when it starts with white space.
 *
 * Few-shot: k solved examples drawn with the seed from the whole file (never the item itself, k
 * distinct ones, in draw order), each written as its context followed by its gold continuation
 * (winogrande: the gold option's context), joined by "\n\n" and followed by "\n\n" and the item's
 * context. Item i's draw depends only on (seed, i): any rank draws the same examples.
 *
 * Requests are laid out item after item, an item's choices in order; request r belongs to item
 * bench_request_at(set, r)->item. The caller computes one bench_result per request, in the same order
 * (on any ranks it likes: the arrays are plain), and calls bench_score. */
#ifndef GREENLM_BENCH_H
#define GREENLM_BENCH_H

#include <stdint.h>

#include "base/err.h"

/* Most few-shot examples per item (&eval num_fewshot's range). */
enum { BENCH_MAX_FEWSHOT = 64 };

typedef enum { BENCH_LAMBADA, BENCH_HELLASWAG, BENCH_PIQA, BENCH_ARC, BENCH_WINOGRANDE, BENCH_MC } bench_kind;

typedef struct {
  const char *context;      /* the prompt: the few-shot examples, then the item's context */
  const char *continuation; /* the text whose tokens are scored after the context */
  int greedy;               /* 1: the caller also says whether greedy decoding gives every continuation token */
  long item;                /* the scored item it belongs to, 0 .. set->nitems - 1 */
  int choice;               /* its choice within the item (request first[item] + choice) */
} bench_request;

typedef struct {
  double loglik; /* sum over the continuation's tokens of ln p(token | all text before it) */
  long ntokens;  /* tokens of the continuation */
  int greedy_ok; /* requests with greedy: 1 when each continuation token is the most likely one */
} bench_result;

/* Scores of one benchmark; NAN where a metric does not apply to its kind or n < 2 (stderr).
 *   acc       share of items whose gold choice has the highest summed log-likelihood (the first
 *             choice wins a tie); lambada: share of items whose target greedy decoding reproduces
 *   acc_norm  the same with each log-likelihood divided by the length of its choice text in Unicode
 *             characters, the leading delimiter space excluded (lm-eval's completion_len); not for
 *             lambada and winogrande (lm-eval reports acc only there)
 *   *_stderr  sample standard deviation of the per-item 0/1 values / sqrt(n) (lm-eval's
 *             mean_stderr)
 *   ppl       lambada: exp(-mean over items of the target's summed log-likelihood) (lm-eval's
 *             perplexity aggregation: per item, not per token)
 *   tokens    continuation tokens of all requests */
typedef struct {
  long n;
  double acc, acc_stderr, acc_norm, acc_norm_stderr, ppl;
  long tokens;
} bench_scores;

typedef struct bench_item bench_item; /* a parsed line of the file (bench.c) */

typedef struct {
  bench_kind kind;
  char *name; /* "kind:stem", the stem being the file's name without directory and .jsonl/.json */
  long nitems;        /* items scored: the first `limit` of the file */
  long nfile;         /* items in the file: the few-shot pool */
  bench_request *req; /* nreq requests, item after item */
  long nreq;
  long *first;        /* [nitems + 1]: item i's requests are first[i] .. first[i + 1] - 1 */
  bench_item *items;  /* [nfile] */
  char **prompts;     /* [nprompts]: the few-shot prompts the requests point to */
  long nprompts;
} bench_set;

/* Kind by its name ("lambada", ...); -1 when unknown. */
int bench_kind_parse(const char *name);
const char *bench_kind_name(bench_kind kind);

/* Read spec = "kind:path", keep the first `limit` items (0: all) and build their requests with
 * num_fewshot solved examples each, drawn with seed. Returns 0, or -1 after adding errors (each
 * bad line at path:line, with the fields the kind expects as the hint) and leaving *set empty. */
int bench_load(bench_set *set, const char *spec, long limit, int num_fewshot, uint64_t seed, err_list *errs);
void bench_free(bench_set *set);

static inline long bench_nrequests(const bench_set *set) { return set->nreq; }
static inline const bench_request *bench_request_at(const bench_set *set, long r) { return &set->req[r]; }

/* Index of item i's gold choice (0 for lambada). */
int bench_gold(const bench_set *set, long i);

/* Scores from res[0 .. nrequests - 1], the results of the requests in their order. */
void bench_score(const bench_set *set, const bench_result *res, bench_scores *out);

#endif
