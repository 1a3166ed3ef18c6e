/* tokjson: Hugging Face's tokenizer.json (the file of transformers' fast tokenizers) read into a
 * tok_tokenizer that encodes exactly as the file does, for the byte-level BPE tokenizers greenlm
 * reproduces: GPT-2's and GPT-NeoX's (pre_tokenizer ByteLevel with GPT-2's pattern; normalizer NFC
 * or none; non-special added tokens such as GPT-NeoX's runs of spaces) and Llama 3's (a Sequence of
 * Split with its own pattern and ByteLevel without one; model.ignore_merges). Merges are read as
 * "left right" strings or [left, right] arrays.
 *
 * Refused, with the file, the field, its value and a hint: another model type (Unigram, WordPiece,
 * WordLevel), BPE with byte_fallback, dropout, continuing_subword_prefix or end_of_word_suffix
 * (SentencePiece-style BPE as in Llama 2), a normalizer other than NFC, a pre-tokenizer other than
 * those above (Metaspace, Whitespace, a Split on a literal string or with another behavior,
 * add_prefix_space), a decoder other than ByteLevel, a non-special added token with lstrip, rstrip or
 * single_word, a vocabulary token that is not a byte-level string, ids that are not 0..n-1, two added
 * tokens with one id, an added token on a vocabulary id with other text.
 *
 * Special added tokens are never cut out of text (text is text, as greenlm reads corpora); their ids
 * are in the vocabulary. The end-of-text token (tok_tokenizer.eot), which 'prepare' puts between
 * documents: the special added token "<|endoftext|>" (GPT-2, GPT-NeoX), else "<|end_of_text|>"
 * (Llama 3), else none. The post_processor (Llama 3's TemplateProcessing adding <|begin_of_text|>) is
 * not applied: datasets are token streams with the end-of-text token between documents. */
#ifndef GREENLM_TOKJSON_H
#define GREENLM_TOKJSON_H

#include "base/err.h"
#include "text/tok.h"

/* Load the tokenizer.json at path (at most TOK_MAX_FILE bytes) into t. Returns 0, or -1 after adding
 * an error at path naming the field that greenlm cannot reproduce or that is malformed. */
int tokjson_load(tok_tokenizer *t, const char *path, err_list *errs);

#endif
