/* generate: text generation from a whole model held on one rank, for a batch of prompts.
 *
 * GEN_CACHE keeps, per layer, the keys and values of every position seen so far (the KV cache, in
 * backend memory, in the storage type): a global layer holds up to max_len positions per sequence,
 * a local layer a ring of window + GEN_CHUNK - 1 rows (its window, plus the rows a prefill pass
 * adds at once). The prompts go through the model in passes of up to GEN_CHUNK rows of a sequence
 * (several sequences share a pass), filling the caches; then each new token costs one row per
 * sequence through every layer: embedding at its position, LayerNorms, matmuls of N = batch rows,
 * attention against the cache (attention_cached), logits of that row only. The cost of a token
 * does not grow with the prompt beyond the attention's reads of the cache.
 *
 * GEN_RECOMPUTE is the reference: no cache, the whole sequence so far goes through gpt_forward for
 * every new token (the model must have an activation arena planned for (batch, max_len)).
 *
 * Both draw the same tokens from the same logits (sample.h; prompt p of a gen_run call samples from
 * stream first + p). A sequence ends when it has n_tokens new tokens, when the caller's hook says
 * so, at <|endoftext|> (the deck's stop_eot), or when it reaches max_len tokens (at most
 * block_size: the model has no position beyond). */
#ifndef GREENLM_GENERATE_H
#define GREENLM_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "deck/cfg.h"
#include "model/gpt.h"
#include "model/sample.h"

enum { GEN_CHUNK = 64 /* rows of one sequence in a prefill pass */ };

typedef enum { GEN_CACHE, GEN_RECOMPUTE } gen_mode;

typedef enum { GEN_RUNNING, GEN_END_LENGTH, GEN_END_EOT, GEN_END_STOP, GEN_END_FULL } gen_end;
/* "n_tokens", "<|endoftext|>", "stopped", "block_size reached" (max_len, when it is smaller) */
const char *gen_end_name(gen_end e);

/* Backend memory a generator allocates (GEN_CACHE; GEN_RECOMPUTE uses the model's arena: zeros). */
typedef struct {
  size_t cache; /* per layer keys and values, (batch, ring, C) each, in the storage type */
  size_t acts;  /* a pass's activations (rows = max(batch, GEN_CHUNK)) and the head's (batch rows, V logits) */
  size_t io;    /* a pass's token ids, sequence indices and positions (int32) */
  size_t work;  /* the backend workspace these shapes need (an instance keeps the largest it was prepared for) */
  size_t total;
} gen_memory;

gen_memory gen_plan_memory(const gpt_shape *s, const backend *be, int batch, int max_len, gen_mode mode);

typedef struct {
  /* Each new token of prompt p (its index in the gen_run call), in the order drawn; return nonzero to
   * end that sequence (the token is kept). NULL: never. */
  int (*on_token)(void *ctx, int p, int32_t token);
  /* The fp32 logits (host, V) each token of prompt p is drawn from (tests, diagnostics); NULL: none. */
  void (*on_logits)(void *ctx, int p, const float *logits);
  void *ctx;
  int32_t eot; /* the <|endoftext|> id, ending a sequence when the deck's stop_eot is set; -1: none */
} gen_hooks;

typedef struct {
  int32_t *tokens; /* (len): the prompt (its last max_len - 1 tokens when longer), then the new tokens */
  int len, n_prompt, n_new;
  gen_end end;
} gen_seq;

typedef struct {
  double prefill_s;      /* from the start until every prompt's first new token is drawn */
  double decode_s;       /* the rest */
  long prefill_tokens;   /* prompt tokens fed */
  long decode_tokens;    /* tokens drawn after each prompt's first */
  double decode_tps;     /* decode_tokens / decode_s (0 without) */
} gen_timing;

typedef struct {
  gpt_model *m;
  gen_mode mode;
  int batch, max_len, rows; /* rows: of a pass */
  const cfg_sample *c;
  uint64_t seed;
  gen_memory mem;
  int *ring;       /* (L) rows of each layer's cache ring */
  size_t *kv_at;   /* (L) byte offset of each layer's keys in kv; its values follow */
  void *kv, *acts; /* backend memory */
  int32_t *io;     /* backend memory: tok, seq, pos (rows each) */
  int32_t *tok_h, *seq_h, *pos_h, *heads, *who; /* host: a pass's rows; the rows (and prompts) needing logits */
  float *logits_h; /* host (batch, V) */
  gen_seq *seqs;   /* (batch): the results of the last gen_run */
  sample_state *samplers;
  gen_timing timing;
} gen;

/* A generator for up to `batch` prompts and sequences of up to max_len tokens (2..block_size), on
 * the whole model m (all layers, embedding and head, on any backend), sampling with c and seed.
 * Allocates gen_plan_memory's bytes. Errors are internal (fatal): the caller checks its input. */
void gen_open(gen *g, gpt_model *m, int batch, int max_len, const cfg_sample *c, uint64_t seed, gen_mode mode);
/* Generate up to n_tokens after each of n <= batch prompts (prompts[p]: lens[p] >= 1 token ids);
 * prompt p samples from rng stream first + p. Results in g->seqs[0..n), times in g->timing. */
void gen_run(gen *g, const int32_t *const *prompts, const int *lens, int n, int first, int n_tokens,
             const gen_hooks *h);
void gen_close(gen *g);

#endif
