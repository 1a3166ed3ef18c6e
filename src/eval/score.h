/* score: a model's log-likelihoods, the primitives of evaluation: every window of a token dataset
 * (loss, perplexity, bits per byte), and continuations of contexts (benchmark requests). Work is
 * spread across the ranks of the inference job; results do not depend on the rank count. */
#ifndef GREENLM_SCORE_H
#define GREENLM_SCORE_H

#include <stdint.h>

#include "infer.h"
#include "text/data.h"

typedef struct {
  double nats;        /* summed -log p of every target token */
  double tokens;      /* target tokens scored */
  double bytes;       /* their text in bytes (<|endoftext|> counts none) */
  uint64_t windows;   /* windows of T + 1 tokens scored */
  double loss, ppl, bpb; /* nats / tokens, exp(loss), nats / ln 2 / bytes */
  double seconds;
} score_dataset;

/* Every window of T + 1 tokens of the dataset at path (windows at stride T; the last tokens that do
 * not fill a window are not scored), B windows per forward pass (B, T within the model's plan).
 * Windows are split into contiguous ranges across the ranks; the per-window sums are added on rank 0
 * in window order. Collective. Returns the errors added (the dataset cannot be opened or does not
 * fit the model or tokenizer); the result is on every rank. */
int score_dataset_run(infer_model *im, const char *path, int B, int T, score_dataset *out, err_list *errs);

typedef struct {
  const char *context, *continuation;
  int greedy; /* also check whether greedy decoding gives every continuation token */
} score_request;

typedef struct {
  double loglik;  /* sum of log p(continuation token | everything before it) */
  int ntokens;    /* continuation tokens */
  int greedy_ok;  /* every continuation token is the most likely one (when asked) */
  int truncated;  /* cut on the left to fit the block size: the context, and the continuation where
                     it is longer than the block (then only the predicted tokens are scored) */
  int inputs;     /* tokens of its forward pass */
} score_result;

/* A request's tokens into all (emptied first), encoded as lm-evaluation-harness encodes a
 * (context, continuation) pair for a causal model (lm_eval/api/model.py: _encode_pair, loglikelihood),
 * the literal <|endoftext|> being the special token as in transformers' tokenizers:
 *   - the white space ending the context (Python's str.isspace) moves to the continuation's start;
 *   - context tokens: the context so stripped, encoded alone; continuation tokens: those of the
 *     whole text (context + continuation) after as many tokens as the context has. Where the
 *     tokenizer merges across the boundary the continuation's tokens are not its text's encoding.
 *   - an empty context: the continuation encoded, after the prefix token (<|endoftext|>; token 0 of
 *     the byte tokenizer), unless its first token is that token, which then is the context;
 *   - a context of white space only (lm-eval's rule leaves no context token there): the prefix
 *     token, then the whole text.
 * Returns the number of context tokens, all->v[0 .. n-1]; the continuation's are the rest. */
size_t score_encode(tok_tokenizer *tok, const char *context, const char *continuation, tok_ids *all);

/* One request on a whole model m (micro-batches up to (1, T) planned; longer pairs keep their last
 * T + 1 tokens, the context cut on the left), as lm-evaluation-harness scores it: encoded by
 * score_encode, the continuation's tokens scored (none: log-likelihood 0, greedy). */
void score_one(gpt_model *m, tok_tokenizer *tok, const score_request *q, score_result *r);

/* Score n requests with score_one on the whole model m held by every rank of comm. Request i
 * is computed on rank i mod size, alone in its forward pass, so its result is the same for any
 * rank count; every rank receives all results. Collective. */
void score_requests(gpt_model *m, tok_tokenizer *tok, MPI_Comm comm, const score_request *req, long n, score_result *res);

#endif
