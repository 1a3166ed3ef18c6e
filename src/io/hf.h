/* hf: Hugging Face model directories (GPTNeoForCausalLM, GPT2LMHeadModel, GPTNeoXForCausalLM) in and out of
 * greenlm.
 *
 * A directory holds config.json, the weights (model.safetensors, or model-0000i-of-0000k
 * .safetensors shards with model.safetensors.index.json), generation_config.json and the GPT-2
 * tokenizer files (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json).
 * greenlm's tensors carry the Hugging Face names (gpt.h); the weights of GPT-2's Conv1D layers
 * (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are stored (in, out) by Hugging Face and
 * (out, in) by greenlm, so they are transposed on the way in and out; GPT-NeoX's query_key_value rows
 * are (head, q|k|v, head size) in the files and (q|k|v, head, head size) in greenlm, regrouped the same
 * way. Only safetensors weights are read (never pickled pytorch_model.bin files).
 *
 * Every function adds its errors (the file, the tensor, what is wrong, a hint) to errs and
 * returns how many it added: 0 means success. */
#ifndef GREENLM_HF_H
#define GREENLM_HF_H

#include "base/err.h"
#include "deck/cfg.h"
#include "model/gpt.h"

/* Compare dir/config.json with the deck's &model: every shape key that differs is an error (the
 * config's value, the deck's, and the deck key to set). Architectures other than gpt_neo, gpt2 and
 * gpt_neox, settings greenlm does not compute (an activation other than gelu and gelu_new, unscaled GPT-2
 * attention, scaled rotary embeddings, dropout) and GPT-NeoX fields it does not implement are errors too. */
int hf_check_config(const char *dir, const cfg_model *m, err_list *errs);

/* Fill the shape keys of *out (arch, vocab_size, block_size, n_layer, n_embd, n_head, n_inner,
 * attention_types, window_size, layer_norm_epsilon) from dir/config.json; other fields are left
 * as they are. */
int hf_config_to_model(const char *dir, cfg_model *out, err_list *errs);

/* Read the nt tensors t[] (a part of the model as gpt_list_tensors gives it; t[i].offset is the
 * tensor's place in params, host fp32) from dir's safetensors weights, converting BF16/F16 and
 * transposing GPT-2's Conv1D weights. Names are accepted with or without the "transformer."
 * prefix; the attention-mask and rotary buffers are ignored, and a tied model's head, when present
 * (lm_head.weight; embed_out.weight for GPT-NeoX, which reads lm_head.weight as its untied head too),
 * must equal the token embedding. Every
 * other tensor must be one of the whole model's (s): an extra tensor, a missing one, a wrong
 * shape or an unsupported dtype is an error. Nothing is read into params before all of that checks out;
 * a tensor holding a NaN or an infinity is an error too, found as it is read (params are then partly
 * read: the caller fails). */
int hf_read_params(const char *dir, const gpt_shape *s, const gpt_tensor *t, int nt, float *params, err_list *errs);

/* Start a model from dir: config.json checked against m, then the tensors the model holds read into
 * its master parameters (backend memory, through a host copy where the backend's memory is not the
 * host's) and its compute copy updated. Not collective. Returns the errors added; on errors the model
 * is not to be used (its parameters may be partly read: a NaN is found as its tensor is read). */
int hf_load_model(const char *dir, const cfg_model *mc, gpt_model *m, err_list *errs);

/* Write a Hugging Face model directory: config.json, generation_config.json (from &sample),
 * the weights of the whole model (params: gpt_list_tensors(s, gpt_whole(s)) order) in dtype
 * "fp32" | "bf16" | "fp16", in one model.safetensors or in shards of at most shard_mb MB (10^6
 * bytes) with an index, and the tokenizer of &tokenizer as GPT2Tokenizer files (kind 'bytes':
 * 256 byte tokens with ids equal to the byte values and no merges). Everything is written into
 * dir.tmp-XXXXXX and renamed to dir when complete; an existing non-empty dir is an error unless
 * overwrite (then it is replaced only after the new directory is complete). */
int hf_export(const char *dir, const gpt_shape *s, const float *params, const cfg_model *m, const cfg_tokenizer *tk,
              const cfg_sample *smp, const char *dtype, double shard_mb, int overwrite, err_list *errs);

#endif
