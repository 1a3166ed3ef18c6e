/* bpe: training a byte-level BPE vocabulary, written in GPT-2's format (encoder.json + vocab.bpe).
 *
 * The corpus is cut into pieces by GPT-2's pre-tokenization pattern (tok_pieces); each rank counts
 * the pieces of its own share of the text. Pieces are then owned by rank hash(piece) mod P and
 * adjacent-pair counts by rank hash(pair) mod P: every merge step each rank proposes the most
 * frequent pair it owns, all ranks agree on the global best (highest count; ties to the smaller
 * left id, then the smaller right id), apply it to the pieces they own, and send the count changes
 * to the pairs' owners. The vocabulary therefore depends only on the corpus and the size, never on
 * the rank count.
 *
 * Token ids: 0..255 are the bytes in GPT-2's order (so byte tokens coincide with GPT-2's), then
 * each new merged token in merge order, then <|endoftext|> last. A merge whose result already
 * exists reuses that token (its merge is still listed). */
#ifndef GREENLM_BPE_H
#define GREENLM_BPE_H

#include <mpi.h>
#include <stddef.h>

#include "deck/cfg.h"
#include "base/hmap.h"

typedef struct {
  long merges;        /* merges learned */
  int tokens;         /* tokens of the vocabulary learned, <|endoftext|> included */
  long words, unique; /* pieces counted (all ranks) and distinct pieces */
  double seconds;
} bpe_stats;

/* words: this rank's piece counts (piece bytes -> count). Learns merges until the vocabulary has
 * vocab_size tokens including <|endoftext|> (never a token longer than TOK_MAX_BYTES: such a pair
 * is passed over), then rank 0 writes dir/encoder.json and dir/vocab.bpe crash-safely, as a pair with
 * the manifest that lists them (TOK_MANIFEST, tok.h): a crash while they are replaced leaves a pair
 * that is refused, never one that loads mixed. Collective over comm. Returns 0; 1 when the text supports fewer tokens (st->tokens,
 * nothing written); -1 when the files cannot be written (an error added on rank 0). The same on
 * every rank. */
int bpe_train(const hmap_str *words, int vocab_size, MPI_Comm comm, const char *dir, bpe_stats *st, err_list *errs);

/* The 'tokenizer' task: count the pieces of &tokenizer corpus (or &prepare input) on every rank
 * and train &tokenizer vocab_size into &tokenizer dir. Returns the exit status (0, or 1 after adding
 * errors). Collective. */
int bpe_run_task(const cfg_config *cfg, MPI_Comm comm, err_list *errs);
/* Before any task runs: the files the 'tokenizer' task writes in &tokenizer dir (and their .tmp) are
 * none of its inputs and would not be read as one (corpus_clash). Returns 0, or 1 on every rank after
 * rank 0 added errors. Collective. */
int bpe_preflight(const cfg_config *cfg, MPI_Comm comm, err_list *errs);

/* GPT-2's id of the single-byte token of byte b (0..255). */
int bpe_byte_rank(int b);

#endif
