/* gpt: the GPT-Neo / GPT-2 decoder as Hugging Face's GPTNeoForCausalLM computes it.
 *
 *   x0 = wte[tok] + wpe[pos]                                           (B,T,C)
 *   per block l:  h = x + out_proj(attn_l(ln_1(x)))                   (B,T,C)
 *                 x = h + c_proj(gelu_new(c_fc(ln_2(h))))              (B,T,C)
 *   logits = ln_f(x) @ wte^T                                           (B,T,V)  (tied embedding)
 *
 * GPT-Neo: q, k, v without bias, scores not scaled by 1/sqrt(head size), layers global or local
 * (window). GPT-2: one biased qkv projection, scores scaled by 1/sqrt(head size), all global.
 *
 * A gpt_model holds a contiguous range of blocks [layer_lo, layer_hi) plus, optionally, the
 * embedding (first stage) and the final LayerNorm + tied head (last stage); on one rank it holds
 * them all. Parameters live in one contiguous buffer, gradients in another of the same layout,
 * AdamW moments in two more, activations in one planned arena. */
#ifndef GREENLM_MODEL_H
#define GREENLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cfg.h"

typedef enum { GPT_ARCH_NEO, GPT_ARCH_GPT2 } gpt_arch;

typedef struct {
  gpt_arch arch;
  int V;        /* vocabulary */
  int maxT;     /* block_size: rows of wpe */
  int L, C, H;  /* layers, channels, heads */
  int F;        /* MLP hidden size (n_inner) */
  int *window;  /* (L): 0 for a global layer, the window size for a local one */
  float eps;    /* LayerNorm epsilon */
  float init_std;
  float attn_scale; /* 1 for GPT-Neo, 1/sqrt(C/H) for GPT-2 */
  int qkv_bias;     /* GPT-2 only */
} gpt_shape;

typedef enum { GPT_INIT_NORMAL, GPT_INIT_ONES, GPT_INIT_ZEROS } gpt_init_kind;

typedef struct {
  char name[96];   /* Hugging Face name, e.g. transformer.h.3.attn.attention.q_proj.weight */
  size_t offset;   /* in floats, within the parameter buffer */
  size_t numel;
  int rows, cols;  /* cols = 1 for vectors */
  int decay;       /* weight decay applies (matrices and embeddings) */
  int layer;       /* block index, or -1 for embeddings and the final LayerNorm */
  int index;       /* position in the whole model's tensor list (stable across layouts) */
  gpt_init_kind init;
  float init_std;
} gpt_tensor;

/* Pointers into a parameter-layout buffer (parameters or gradients) for one block. */
typedef struct {
  float *ln1_w, *ln1_b; /* (C) */
  float *qkv_w;         /* (3C, C): q, k, v stacked */
  float *qkv_b;         /* (3C) or NULL */
  float *out_w, *out_b; /* (C, C), (C) */
  float *ln2_w, *ln2_b; /* (C) */
  float *fc_w, *fc_b;   /* (F, C), (F) */
  float *proj_w, *proj_b; /* (C, F), (C) */
} gpt_block_ptrs;

/* Byte counts the model allocates; the dry run prints them and gpt_init must allocate exactly these. */
typedef struct {
  size_t params, grads, adam, acts, io;
  size_t total;
} gpt_memory;

typedef struct {
  gpt_shape s;
  const backend *be;
  int B, T; /* the largest micro-batch the arena is planned for */
  int layer_lo, layer_hi, has_embed, has_head;

  gpt_tensor *tensors;
  int ntensors;
  size_t nparams;
  float *params, *grads, *adam_m, *adam_v; /* backend memory, (nparams) each */

  float *acts;       /* backend memory: the activation arena */
  int32_t *tokens;   /* backend memory (B,T) */
  int32_t *targets;  /* backend memory (B,T) */
  float *losses;     /* backend memory (B,T) */
  float *losses_host;
  gpt_memory mem;
} gpt_model;

/* Build the shape from the deck (window list expanded from attention_types). */
void gpt_shape_from_cfg(gpt_shape *s, const cfg_model *m);
void gpt_shape_free(gpt_shape *s);

/* Parameter count of the whole model (all blocks, embeddings, final LayerNorm). */
size_t gpt_count_params(const gpt_shape *s);
/* Model FLOPs per trained token, 6N + 12 L C T (PaLM), N excluding the position embedding. */
double gpt_flops_per_token(const gpt_shape *s, int T);

/* Memory the model will allocate for micro-batches up to (B,T), without allocating. */
gpt_memory gpt_plan_memory(const gpt_shape *s, const backend *be, int B, int T, int layer_lo, int layer_hi,
                           int has_embed, int has_head);

/* Allocate and initialise (seeded: tensor i from rng stream (seed, RNG_INIT, i)). */
void gpt_init(gpt_model *m, const gpt_shape *s, const backend *be, int B, int T, int layer_lo, int layer_hi,
              int has_embed, int has_head, uint64_t seed);
void gpt_free(gpt_model *m);

/* Block l's pointers within buf (m->params or m->grads). */
void gpt_block(const gpt_model *m, float *buf, int l, gpt_block_ptrs *p);
/* The tensor of that name, or NULL. */
const gpt_tensor *gpt_find_tensor(const gpt_model *m, const char *name);

/* Copy B*T token ids (and targets, may be NULL) from host memory into the model's buffers. */
void gpt_set_batch(gpt_model *m, const int32_t *tokens, const int32_t *targets, int B, int T);
/* Forward pass up to the logits (B,T,V) for the tokens set by gpt_set_batch. */
void gpt_forward(gpt_model *m, int B, int T);
/* The logits of the last forward pass (backend memory, (B,T,V)). */
float *gpt_logits(const gpt_model *m);
/* Cross-entropy against the targets: returns the sum of the B*T token losses. When dscale != 0
 * the logits are replaced by the gradient of dscale * (sum of losses), ready for gpt_backward. */
double gpt_loss(gpt_model *m, int B, int T, float dscale);
/* Backward pass: adds the gradients of this micro-batch into m->grads. */
void gpt_backward(gpt_model *m, int B, int T);
void gpt_zero_grad(gpt_model *m);

#endif
