/* tok: tokenizers. 'bytes' (one token per byte, vocabulary 256) and byte-level BPE that encodes
 * exactly as GPT-2 does, from a GPT-2-format encoder.json + vocab.bpe (GPT-2's own files, or a
 * vocabulary trained by bpe.c), or exactly as Hugging Face's fast tokenizer does from its
 * tokenizer.json (tokjson.c reads it: another pattern, NFC, added tokens, ignore_merges).
 *
 * BPE encoding: the text is cut into pieces by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2 with UTF and Unicode properties); each piece's bytes start as single-byte tokens and the
 * adjacent pair of lowest merge rank is merged until none is left. Bytes that are not valid UTF-8
 * match no part of the pattern and form pieces of their own, so any byte string encodes, and
 * decoding returns exactly the original bytes.
 *
 * A tokenizer.json adds, in Hugging Face's order: its non-special added tokens are cut out of the text
 * first (leftmost-longest; those matched in normalized text after NFC), the rest is NFC-normalized when
 * the file says so, cut by its pattern, and a piece that is a whole vocabulary token is that token
 * when ignore_merges is set. */
#ifndef GREENLM_TOK_H
#define GREENLM_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hmap.h"
#include "base/util.h"
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

/* An added token of a tokenizer.json matched in text: its id (its bytes are the token's), and whether
 * it is matched in the NFC-normalized text (1) or in the text as given (0). */
typedef struct {
  int32_t id;
  int normalized;
} tok_added;

typedef struct {
  tok_kind kind;
  int vocab_size;
  int eot;         /* id of <|endoftext|> (a tokenizer.json's: see tokjson.h), or -1 */
  int nmerges;
  int max_len;     /* longest token in bytes */
  char *bytes;     /* token bytes, concatenated */
  size_t *off;     /* (vocab_size + 1) offsets into bytes */
  int byte_id[256];
  hmap_u64 merges; /* (left << 32 | right) -> (rank << 32 | merged id) */
  uint64_t hash;   /* identity of the vocabulary and merges (see tok_hash_of) */
  char hash_hex[17];
  char desc[UTIL_PATH_MAX + 96]; /* what it is and the path it came from, whole */
  void *re, *md;   /* PCRE2 pattern and match data */
  /* From a tokenizer.json only (tokjson.c); NULL or 0 for GPT-2's files and for 'bytes'. */
  char *json_path;   /* the tokenizer.json read (export writes it again) */
  char *pattern;     /* the pre-tokenization pattern when it is not GPT-2's */
  int ignore_merges; /* a piece that is a whole token of the vocabulary is that token (Llama 3) */
  int nfc;           /* text is NFC-normalized before it is cut into pieces */
  int nadded;        /* non-special added tokens, cut out of the text before anything else */
  tok_added *added;  /* (nadded) */
  unsigned char added_first[256]; /* 1 for a byte that starts an added token */
  hmap_str vocab;    /* with ignore_merges: the vocabulary's token bytes -> id */
  hmap_str cache;  /* piece bytes -> offset of its ids in cache_ids */
  tok_ids cache_ids;
} tok_tokenizer;

/* The 256-token byte tokenizer. */
void tok_init_bytes(tok_tokenizer *t);
/* Load dir/encoder.json and dir/vocab.bpe; when neither is there, dir/tokenizer.json (tokjson.h) or,
 * without it, Hugging Face's names for GPT-2's files: dir/vocab.json and dir/merges.txt. When dir holds a manifest (TOK_MANIFEST, which
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

/* Encode len bytes of text, appending ids to out. With special != 0 the literal text of the
 * end-of-text token ("<|endoftext|>") becomes that token; otherwise it is ordinary text. */
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

/* The identity hash of a vocabulary: FNV-1a over each token's length and bytes (in id order) and
 * then each merge's (left, right) ids; then, only where a tokenizer.json sets them (so that GPT-2's
 * vocabulary has one hash from either format), the pattern, ignore_merges, NFC and the added tokens. */
uint64_t tok_hash_of(const tok_tokenizer *t);
/* 1 when t encodes as GPT-2's files (encoder.json and vocab.bpe) can say: none of a tokenizer.json's
 * pattern, ignore_merges, NFC or added tokens matched in text. */
int tok_is_gpt2(const tok_tokenizer *t);
/* GPT-2's pre-tokenization pattern (above). */
const char *tok_gpt2_pattern(void);
/* For the loaders: compile t's pre-tokenization pattern (t->pattern, or GPT-2's when NULL); an
 * error names the file and the field it came from. Returns 0 or -1 after adding an error. */
int tok_compile_pattern(tok_tokenizer *t, const char *file, const char *field, err_list *errs);
/* For the loaders: t->bytes and t->off from the t->vocab_size tokens tok[i] of tlen[i] bytes. */
void tok_set_tokens(tok_tokenizer *t, char *const *tok, const int *tlen);
/* For the loaders: t->byte_id from by_bytes (token bytes -> id); 0, or -1 after adding an error at path
 * when a byte has no token. */
int tok_set_byte_ids(tok_tokenizer *t, const hmap_str *by_bytes, const char *path, const char *hint, err_list *errs);
/* For the loaders: the merge (left, right) -> merged of the next rank; -1 when the pair has one already. */
int tok_put_merge(tok_tokenizer *t, int32_t left, int32_t right, int32_t merged);
/* For the loaders: once the tokens and merges are in t, its hash, hash_hex, max_len and piece cache. */
void tok_finish(tok_tokenizer *t);
/* The merges in rank order: (nmerges, 2) (left id, right id) pairs; free() the list. */
uint32_t *tok_merge_list(const tok_tokenizer *t);

#endif
