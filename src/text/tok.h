/* tok: tokenizers. 'bytes' (one token per byte, vocabulary 256) and byte-level BPE that encodes
 * exactly as GPT-2 does, from a GPT-2-format encoder.json + vocab.bpe (GPT-2's own files, or a
 * vocabulary trained by bpe.c).
 *
 * BPE encoding: the text is cut into pieces by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2 with UTF and Unicode properties); each piece's bytes start as single-byte tokens and the
 * adjacent pair of lowest merge rank is merged until none is left. Bytes that are not valid UTF-8
 * match no part of the pattern and form pieces of their own, so any byte string encodes, and
 * decoding returns exactly the original bytes. */
#ifndef GREENLM_TOK_H
#define GREENLM_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hmap.h"
#include "deck/cfg.h"

typedef enum { TOK_BYTES, TOK_BPE } tok_kind;

/* Limits of a vocabulary read from files: tokens, and bytes per token (BPE training learns no longer
 * token). */
enum { TOK_MAX_VOCAB = 16777216, TOK_MAX_BYTES = 1024 };
/* The largest encoder.json or vocab.bpe read. */
#define TOK_MAX_FILE ((size_t)1 << 30)

/* A growable list of token ids. */
typedef struct {
  int32_t *v;
  size_t n, cap;
} tok_ids;

void tok_ids_push(tok_ids *l, int32_t id);
void tok_ids_free(tok_ids *l);

typedef struct {
  tok_kind kind;
  int vocab_size;
  int eot;         /* id of <|endoftext|>, or -1 */
  int nmerges;
  int max_len;     /* longest token in bytes */
  char *bytes;     /* token bytes, concatenated */
  size_t *off;     /* (vocab_size + 1) offsets into bytes */
  int byte_id[256];
  hmap_u64 merges; /* (left << 32 | right) -> (rank << 32 | merged id) */
  uint64_t hash;   /* identity of the vocabulary and merges (see tok_hash_of) */
  char hash_hex[17];
  char desc[128];
  void *re, *md;   /* PCRE2 pattern and match data */
  hmap_str cache;  /* piece bytes -> offset of its ids in cache_ids */
  tok_ids cache_ids;
} tok_tokenizer;

/* The 256-token byte tokenizer. */
void tok_init_bytes(tok_tokenizer *t);
/* Load dir/encoder.json and dir/vocab.bpe (or, when neither is there, Hugging Face's names for
 * the same files: dir/vocab.json and dir/merges.txt). When dir holds a manifest (TOK_MANIFEST, which
 * the 'tokenizer' task writes), encoder.json and vocab.bpe must be the pair it lists: a pair of which
 * one file is older than the other is refused. Returns 0, or -1 after adding an error at the file (and
 * line) that names what is wrong (a path that is a directory, a FIFO, a device is named as such). */
int tok_load_bpe(tok_tokenizer *t, const char *dir, err_list *errs);

/* The manifest of a learned pair: its name in the directory, and its text for the bytes of encoder.json
 * (enc) and vocab.bpe (voc): a version line, then "NAME HASH BYTES" for each file (HASH: util_hash64
 * of its bytes, 16 hex digits). */
#define TOK_MANIFEST "tokenizer.manifest"
void tok_manifest_text(const char *enc, size_t enc_len, const char *voc, size_t voc_len, char *out, size_t len);
void tok_free(tok_tokenizer *t);
/* &tokenizer kind: bytes, or BPE from dir. Returns 0, or -1 after adding errors. */
int tok_open(tok_tokenizer *t, cfg_tokenizer_kind kind, const char *dir, err_list *errs);
/* Only GPT-2's pre-tokenization pattern (for tok_pieces), no vocabulary. */
int tok_init_pretokenizer(tok_tokenizer *t, err_list *errs);

/* Encode len bytes of text, appending ids to out. With special != 0 the literal text
 * "<|endoftext|>" becomes the end-of-text token; otherwise it is ordinary text. */
void tok_encode(tok_tokenizer *t, const char *text, size_t len, int special, tok_ids *out);
/* Bytes of the decoded ids, written to out (room for n * max_len bytes). Returns the length. */
size_t tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, char *out);

/* Cut text into GPT-2 pre-tokenization pieces: calls fn(piece, len, ctx) for each, in order. */
void tok_pieces(tok_tokenizer *t, const char *text, size_t len, void (*fn)(const char *, size_t, void *), void *ctx);

/* GPT-2's byte <-> character map: the Unicode code point that stands for byte b in token strings. */
int tok_byte_to_char(int b);
/* UTF-8 text (a token string of encoder.json) -> bytes; returns the byte count or -1. */
int tok_chars_to_bytes(const char *s, char *out, int outlen);
/* bytes -> the token string (UTF-8) that stands for them; returns its length. */
int tok_bytes_to_chars(const char *b, int n, char *out, int outlen);

/* The identity hash of a vocabulary: FNV-1a over each token's bytes (in id order, each followed
 * by a 0xff separator) and then each merge's (left, right) ids. */
uint64_t tok_hash_of(const tok_tokenizer *t);
/* The merges in rank order: (nmerges, 2) (left id, right id) pairs; free() the list. */
uint32_t *tok_merge_list(const tok_tokenizer *t);

#endif
