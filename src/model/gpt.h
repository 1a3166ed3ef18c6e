/* gpt: the decoders of the GPT-Neo line as Hugging Face's GPTNeoForCausalLM, GPT2LMHeadModel and
 * GPTNeoXForCausalLM compute them, and Llama's blocks as LlamaForCausalLM does.
 *
 *   x0 = wte[tok] + wpe[pos]                                           (B,T,C)  (no wpe with rotary embeddings)
 *   per block l:  h = x + out_proj(attn_l(ln_1(x)))                   (B,T,C)
 *                 x = h + c_proj(gelu(c_fc(ln_2(h))))                  (B,T,C)
 *     or, with the parallel residual (GPT-NeoX):
 *                 x = x + out_proj(attn_l(ln_1(x))) + c_proj(gelu(c_fc(ln_2(x))))
 *   logits = ln_f(x) @ head^T                                          (B,T,V)  (head = wte when tied)
 *
 * GPT-Neo: q, k, v without bias, scores not scaled by 1/sqrt(head size), layers global or local
 * (window). GPT-2: one biased qkv projection, scores scaled by 1/sqrt(head size), all global.
 * GPT-NeoX: one qkv projection (greenlm keeps q, k and v stacked; Hugging Face interleaves them per head),
 * biased or not, rotary embeddings on the first `rot` dims of each head's q and k, scores scaled by
 * 1/sqrt(head size), all global, gelu in its erf form by default, an untied head (embed_out).
 * Llama: RMSNorm (no biases) where the others have LayerNorms, q, k and v (stacked as GPT-Neo's) rotated on every dim
 * of each head, scores scaled by 1/sqrt(head size), biases on q, k, v and o only with attention_bias, the SwiGLU MLP
 * down(silu(gate x) * up x) with gate and up stacked (2F, C) so that one GEMM makes [gate | up], biases on it only
 * with mlp_bias, an untied head by default.
 *
 * A gpt_model holds a contiguous range of blocks [layer_lo, layer_hi) plus, optionally, the
 * embedding (first pipeline stage) and the final LayerNorm + tied head (last stage); on one rank
 * it holds them all. Parameters live in one contiguous buffer, gradients in another of the same
 * layout, activations in one planned arena with `nslots` slots: a pipeline stage keeps the
 * activations of several micro-batches in flight, one slot each. The AdamW moments belong to the
 * optimizer (optim.c), which may hold only a shard of them. */
#ifndef GREENLM_GPT_H
#define GREENLM_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "deck/cfg.h"

typedef enum { GPT_ARCH_NEO, GPT_ARCH_GPT2, GPT_ARCH_NEOX, GPT_ARCH_LLAMA } gpt_arch;

typedef struct {
  gpt_arch arch;
  int V;        /* vocabulary */
  int maxT;     /* block_size: rows of wpe */
  int L, C, H;  /* layers, channels, heads */
  int Hkv;      /* key/value heads (H: multi-head attention; fewer: grouped-query, Llama's num_key_value_heads) */
  int F;        /* MLP hidden size (n_inner) */
  int *window;  /* (L): 0 for a global layer, the window size for a local one */
  float eps;    /* LayerNorm epsilon */
  float init_std;
  float attn_scale; /* 1 for GPT-Neo, 1/sqrt(C/H) for GPT-2 and GPT-NeoX */
  int qkv_bias;     /* the qkv projection has a bias (GPT-2; GPT-NeoX's attention_bias) */
  int out_bias;     /* the attention's output projection has one (all but GPT-NeoX without attention_bias) */
  int wpe;          /* learned position embeddings (GPT-Neo, GPT-2); else rotary ones */
  int rot;          /* rotary dims of each head (even; 0: none) */
  backend_rope rope; /* the rotary frequencies: base, Llama 3's scaling */
  int parallel;     /* the parallel residual (GPT-NeoX's use_parallel_residual) */
  int act;          /* the MLP's activation (backend_act) */
  int tied;         /* the head is the token embedding's matrix (else a tensor of its own) */
  int rms;          /* RMSNorm without biases instead of every LayerNorm (Llama) */
  int swiglu;       /* the MLP is SwiGLU: fc holds gate and up, (2F, C) (Llama) */
  int mlp_unbiased; /* fc and proj have no biases (Llama without mlp_bias); 0: biased, as the others */
} gpt_shape;

typedef enum { GPT_INIT_NORMAL, GPT_INIT_ONES, GPT_INIT_ZEROS } gpt_init_kind;

/* How a tensor is cut across the T ranks of a tensor-parallel group (Megatron's scheme):
 *   GPT_SPLIT_NONE  every tensor rank holds all of it (LayerNorms, wpe, the biases of row-parallel layers)
 *   GPT_SPLIT_ROWS  each holds a block of rows (column-parallel layers: q, k, v, c_fc and their biases by
 *                   heads or hidden units; the tied embedding by vocabulary rows)
 *   GPT_SPLIT_COLS  each holds a block of columns (row-parallel layers: out_proj, mlp.c_proj) */
typedef enum { GPT_SPLIT_NONE, GPT_SPLIT_ROWS, GPT_SPLIT_COLS } gpt_split;

typedef struct {
  char name[96];   /* Hugging Face name, e.g. transformer.h.3.attn.attention.q_proj.weight */
  size_t offset;   /* in floats, within the parameter buffer */
  size_t numel;
  int rows, cols;  /* cols = 1 for vectors */
  int decay;       /* weight decay applies (matrices and embeddings) */
  int layer;       /* block index, or GPT_HOOK_EMBED (-1) for the embeddings, GPT_HOOK_HEAD (-2) for the final
                      LayerNorm and an untied head */
  int tied;        /* the tied embedding: the token embedding's and the head's (with pipeline stages the first
                      and the last each hold a copy; their gradients are summed) */
  int index;       /* position in the whole model's tensor list (stable across layouts) */
  gpt_init_kind init;
  float init_std;
  /* This rank's part (rows, cols, numel) of the whole tensor (grows, gcols): with GPT_SPLIT_ROWS rows
   * [r0, r0 + rows / groups) of each of `groups` equal row groups (GPT-2's c_attn stacks q, k and v: 3
   * groups), with GPT_SPLIT_COLS columns [c0, c0 + cols); the whole tensor without tensor parallelism. */
  gpt_split split;
  int grows, gcols, r0, c0, groups;
} gpt_tensor;

/* Element e of a tensor's part is element gpt_tensor_global(t, e, &run) of the whole tensor (row-major),
 * and so are the run - 1 elements after both. */
size_t gpt_tensor_global(const gpt_tensor *t, size_t e, size_t *run);

/* Pointers into a parameter-layout buffer for one block: the parameters' compute copy (the storage
 * type), or the master parameters and the gradients (fp32). */
typedef struct {
  void *ln1_w, *ln1_b;   /* (C); the b's NULL with RMSNorm */
  void *qkv_w;           /* (3C, C): q, k, v stacked */
  void *qkv_b;           /* (3C) or NULL */
  void *out_w, *out_b;   /* (C, C), (C) */
  void *ln2_w, *ln2_b;   /* (C) */
  void *fc_w, *fc_b;     /* (F, C), (F); SwiGLU: (2F, C), (2F), gate's rows then up's; biases NULL without mlp_bias */
  void *proj_w, *proj_b; /* (C, F), (C) */
} gpt_block_ptrs;

/* The same for the tensors outside the blocks; NULL where the part holds none. */
typedef struct {
  void *wte;           /* (V, C): the token embedding's (and the tied head's) */
  void *wpe;           /* (maxT, C): the embedding's; NULL with rotary embeddings */
  void *lnf_w, *lnf_b; /* (C): the head's (lnf_b NULL with RMSNorm) */
  void *head;          /* (V, C): the head's matrix: wte when tied */
} gpt_ends_ptrs;

/* Where a parameter-layout buffer's tensors are: gpt_init fills it once, the passes read it. With tensor
 * parallelism the shapes are the shard's (gpt_dims: Cl for 3C's and C's attention channels, Fl for F,
 * nv of V's rows). */
typedef struct {
  gpt_block_ptrs *blk; /* (layer_hi - layer_lo): held block l at blk[l - layer_lo] */
  gpt_ends_ptrs ends;
} gpt_ptrs;

/* Byte counts the model allocates; the dry run prints them and gpt_init allocates exactly these. */
typedef struct {
  size_t params, grads; /* fp32 master parameters, their gradients */
  size_t compute;       /* the parameters' compute copy in the storage type (0 at fp32: the master is used) */
  size_t acts, io;      /* the activation arena; tokens, targets and losses */
  size_t work;          /* the backend instance's workspace for these shapes */
  size_t total;
} gpt_memory;

/* What a rank holds: blocks [lo, hi), the embedding, the head; activation slots; whether the
 * blocks' inner activations are recomputed in the backward pass (then one block's worth is kept,
 * shared by all blocks and slots, instead of one per block and slot). */
typedef struct {
  int lo, hi, has_embed, has_head;
  int nslots;
  int recompute;
  int inference; /* weights only: no gradients, activation arena, batch buffers or workspace (generation,
                    generate.h, plans its own); gpt_forward and gpt_backward may not run */
  int tp, tp_rank; /* tensor parallelism: the part is tensor rank tp_rank's of tp (0 or 1: none) */
} gpt_part;

/* Sizes of a tensor rank's shards: attention channels Cl = C/T of Hl = H/T heads, Hkvl = Hkv/T key/value heads
 * (a row of the rank's qkv holds Wl = Cl + 2 Hkvl C/H: [q | k | v]), MLP width Fl = F/T,
 * vocabulary rows [v0, v0 + nv) (in T nearly equal pieces); the whole model's without tensor parallelism.
 * The logits' rows are ldv apart: nv padded to a multiple of GPT_LOGITS_ALIGN, so that every row
 * starts aligned for the tensor cores (the pad columns are never computed, read, counted or sampled). */
enum { GPT_LOGITS_ALIGN = 128 };
typedef struct {
  int Cl, Hl, Fl, v0, nv, ldv;
  int Hkvl, Wl;
} gpt_dims;
gpt_dims gpt_part_dims(const gpt_shape *s, gpt_part part);

/* The tensor-parallel group's collectives, supplied by the caller (parallel/tp.h): the model itself has
 * no MPI. Buffers are backend memory unless marked host. */
typedef struct {
  /* x F (n) := its sum over the T ranks; every rank gets the same bits */
  void (*sum)(void *ctx, float *x, size_t n);
  /* all F (T, n) host := every rank's mine F (n), in rank order */
  void (*gather)(void *ctx, float *all, const float *mine, size_t n);
  void *ctx;
} gpt_tp_comm;

typedef struct {
  gpt_shape s;
  const backend *be;
  int B, T; /* the largest micro-batch the arena is planned for */
  int layer_lo, layer_hi, has_embed, has_head, nslots, recompute, inference;
  int tp, tp_rank;  /* tensor parallelism (gpt_part): T ranks (1: none) and this one */
  gpt_dims d;       /* this rank's shard sizes */
  gpt_tp_comm tpc;  /* the group's collectives (gpt_set_tp_comm); needed when tp > 1 */
  float *tp_host;   /* host (tp, 2 max(N, Vmax)) floats: gathered loss parts and logits rows */

  gpt_tensor *tensors;
  int ntensors;
  size_t nparams;
  float *params, *grads; /* backend memory, (nparams) each */
  int grads_unset;       /* gpt_zero_grad was called: the next backward pass writes the gradients, not adds */
  void *cparams;         /* backend memory: the compute copy (nparams in the storage type); = params at fp32 */
  gpt_ptrs w, g;         /* the tensors in cparams (what the ops read) and in grads (g.blk NULL without gradients) */

  void *acts;        /* backend memory: nslots activation slots, then the shared gradient buffers */
  int32_t *tokens;   /* backend memory (nslots, B, T) */
  int32_t *targets;  /* backend memory (nslots, B, T) */
  float *losses;     /* backend memory (B,T): the last gpt_loss's token losses */
  double *sums;      /* backend memory: the step's {sum of token losses (gpt_loss adds), gradients' sum of squares} */
  float *losses_host;
  gpt_memory mem;
} gpt_model;

/* The whole model on one rank, one activation slot. */
gpt_part gpt_whole(const gpt_shape *s);

/* What a model holds, as gpt_init was given it. */
gpt_part gpt_model_part(const gpt_model *m);
/* The tensor-parallel group's collectives; before the first gpt_forward of a model with tp > 1. */
void gpt_set_tp_comm(gpt_model *m, const gpt_tp_comm *c);
/* Whether this rank speaks for the tensor in sums and files: every rank for its own shard, tensor rank 0
 * for a tensor all of them hold. */
int gpt_tensor_owned(const gpt_model *m, const gpt_tensor *t);

/* Build the shape from the deck (window list expanded from attention_types). */
void gpt_shape_from_cfg(gpt_shape *s, const cfg_model *m);
void gpt_shape_free(gpt_shape *s);

/* The model's norm on n rows of s->C: LayerNorm (mean, rstd), or RMSNorm (rstd only; b NULL) */
void gpt_norm_fwd(const gpt_shape *s, const backend *be, void *out, float *mean, float *rstd, const void *x,
                  const void *w, const void *b, int n);
/* res (n,C) = a + b, then out = the norm of res as stored */
void gpt_residual_norm_fwd(const gpt_shape *s, const backend *be, void *res, void *out, float *mean, float *rstd,
                           const void *a, const void *b, const void *w, const void *bias, int n);
/* The MLP's first layer and activation on ln (n,C): fc (n,F) the pre-activations and gel (n,F) = gelu(fc), or with
 * SwiGLU fc (n,2F) = [gate | up] and gel (n,F) = silu(gate) * up; F a tensor rank's units */
void gpt_mlp_in_fwd(const gpt_shape *s, const backend *be, void *gel, void *fc, const void *ln, const void *w,
                    const void *b, int n, int F);

/* Parameter count of the whole model (all blocks, embeddings, final LayerNorm). */
size_t gpt_count_params(const gpt_shape *s);
/* Model FLOPs per trained token, 6N + 12 L C T (PaLM), N excluding the position embedding and an untied
 * token embedding (lookups, no arithmetic). */
double gpt_flops_per_token(const gpt_shape *s, int T);

/* Memory the model will allocate for micro-batches up to (B,T), without allocating. */
gpt_memory gpt_plan_memory(const gpt_shape *s, const backend *be, int B, int T, gpt_part part);
/* The tensors a part holds, in buffer order (offsets within the part's buffer); free() the list. */
gpt_tensor *gpt_list_tensors(const gpt_shape *s, gpt_part part, int *n);
/* Parameters (floats) the part holds. */
size_t gpt_part_params(const gpt_shape *s, gpt_part part);

/* Allocate and initialise (seeded: tensor i from rng stream (seed, RNG_INIT, i), whichever rank
 * holds it). */
void gpt_init(gpt_model *m, const gpt_shape *s, const backend *be, int B, int T, gpt_part part, uint64_t seed);
void gpt_free(gpt_model *m);

/* Block l's pointers within an fp32 buffer in the parameters' layout (m->params, a copy of them). */
void gpt_block(const gpt_model *m, float *buf, int l, gpt_block_ptrs *p);
/* Block l's pointers within the parameters' compute copy (the storage type: what the ops read): m->w's. */
void gpt_block_compute(const gpt_model *m, int l, gpt_block_ptrs *p);
/* The tensor of that name in the parameters' compute copy (fatal when this rank does not hold it); the passes
 * use m->w and m->g instead. */
void *gpt_param(const gpt_model *m, const char *name);
/* The compute copy at parameter `at`, or NULL when there is none (fp32 storage). */
void *gpt_compute_params(const gpt_model *m, size_t at);
/* Master parameters [lo, hi) were written (initialisation, the optimizer, a checkpoint, an
 * exchange): round them into the compute copy. Nothing to do at fp32 storage. */
void gpt_params_changed(gpt_model *m, size_t lo, size_t hi);
/* The tensor of that name, or NULL: for names from outside (checkpoints, Hugging Face files). */
const gpt_tensor *gpt_find_tensor(const gpt_model *m, const char *name);

/* Copy B*T token ids and targets (either may be NULL) from host memory into a slot. */
void gpt_set_batch(gpt_model *m, int slot, const int32_t *tokens, const int32_t *targets, int B, int T);
/* The residual stream entering the first held block (B,T,C): a later pipeline stage receives its
 * input here before gpt_forward. */
void *gpt_input(const gpt_model *m, int slot, int B, int T);
/* The residual stream leaving the last held block (B,T,C), after gpt_forward. */
void *gpt_output(const gpt_model *m, int slot, int B, int T);
/* Forward pass of a slot's micro-batch: from its tokens (first stage) or its input, up to the
 * logits (last stage) or the output. */
void gpt_forward(gpt_model *m, int slot, int B, int T);
/* The logits of the slot's last forward pass (backend memory, (B,T,V) in the storage type); last
 * stage only. */
void *gpt_logits(const gpt_model *m, int slot);
/* Row `row` (of B*T) of those logits, in fp32, into host memory (V floats). */
void gpt_logits_row(const gpt_model *m, int slot, size_t row, float *host);
/* Cross-entropy of the slot's logits against its targets: the B*T token losses into m->losses, their sum added to
 * m->sums[0], both in backend memory (nothing waits for the device). When dscale != 0 the logits are replaced by the
 * gradient of dscale * (sum of losses), ready for gpt_backward. */
void gpt_loss(gpt_model *m, int slot, int B, int T, float dscale);
/* The last gpt_loss's N token losses, copied into host memory (waits for the device). */
const float *gpt_token_losses(gpt_model *m, int N);
/* m->sums := 0 (queued); and the sums read into host memory (waits for the device). */
void gpt_sums_clear(gpt_model *m);
void gpt_sums_read(const gpt_model *m, double out[2]);

/* The gradient flowing into the last held block's output (B,T,C): a stage without the head
 * receives it here before gpt_backward. */
void *gpt_grad_output(const gpt_model *m);
/* The gradient with respect to the input (B,T,C) after gpt_backward: a stage without the
 * embedding sends it to the previous stage. */
void *gpt_grad_input(const gpt_model *m);

/* Called during gpt_backward as soon as a part's gradients of this micro-batch have been added:
 * GPT_HOOK_HEAD (final LayerNorm and, on this stage, the head's use of wte), each block l (in
 * descending order), GPT_HOOK_EMBED (wte and wpe). */
enum { GPT_HOOK_EMBED = -1, GPT_HOOK_HEAD = -2 };
typedef void (*gpt_hook)(void *ctx, int what);

/* Backward pass of a slot's micro-batch: adds its gradients into m->grads (the first pass after gpt_zero_grad
 * writes them: the GEMMs' and column sums' outputs overwrite, so no pass over all gradients zeroes them). */
void gpt_backward(gpt_model *m, int slot, int B, int T, gpt_hook hook, void *ctx);
/* The gradients are zero from here on: the embedding's are zeroed now, every other one is written by the next
 * gpt_backward (read none before it). */
void gpt_zero_grad(gpt_model *m);

#endif
