/* textgen: text from a model: the 'sample' task (prompts from the deck or a file, spread across the
 * ranks, the KV-cache generator of generate.h on each, the completions in sample.txt and
 * samples.jsonl), and the sample after training. */
#ifndef GREENLM_TEXTGEN_H
#define GREENLM_TEXTGEN_H

#include <mpi.h>
#include <stdio.h>

#include "base/err.h"
#include "deck/cfg.h"
#include "model/backend.h"
#include "model/generate.h"
#include "text/tok.h"

typedef struct {
  char *text;  /* the prompt and its continuation, decoded (malloc'd) */
  int n_new;   /* tokens generated */
  gen_end end; /* why it ended */
} textgen_out;

/* Generate after each of n prompts (UTF-8 texts; "<|endoftext|>" in a prompt is the token) on the
 * whole model m held by this rank, with the deck's &sample settings; prompt p samples from rng
 * stream first + p, so a prompt gives the same text in any batch and on any rank. With stream, the
 * new text of prompt 0 is written there as it is drawn. out: (n); *tm the generator's timing. */
void textgen_generate(gpt_model *m, tok_tokenizer *tok, const cfg_sample *c, uint64_t seed, const char *const *prompts,
                      int n, int first, FILE *stream, textgen_out *out, gen_timing *tm);
void textgen_out_free(textgen_out *out, int n);

/* The 'sample' task. Collective over comm. Returns 0, or 1 (every rank) after adding errors. */
int textgen_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs);

#endif
