/* backend: a compute backend is an object: the table of memory functions and tensor ops below plus
 * the backend's own context (device, stream, library handles, workspaces), and every function
 * receives the object. Nothing of a backend is process-wide: two instances (the parity test opens
 * a CPU and a CUDA one side by side, at different precisions) share no state.
 *
 * Model code never touches tensor elements: it calls these ops on backend memory (host memory
 * for the CPU backend, device memory for GPU backends). cpu/ is always built; it is the reference
 * every other backend is tested against.
 *
 * Element types. Activations, their gradients and the compute copy of the parameters are stored in
 * the instance's storage type (be->storage: fp32, bf16 or fp16; arguments typed `void *` below,
 * marked S). Everything else is fp32 (marked F): the master parameters, gradients of parameters,
 * AdamW moments, LayerNorm and softmax statistics, losses. Arithmetic is fp32 in every op; a
 * 16-bit output is rounded to nearest even when stored.
 *
 * Shapes in comments: B batch, T sequence, C channels, H heads, V vocabulary, N rows (= B*T).
 * Token ids are int32. Accumulating outputs are marked "+=": they are added to, never overwritten. */
#ifndef GREENLM_BACKEND_H
#define GREENLM_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* gpu/ is CUDA C++ */
#endif

#include "base/quant.h" /* quant_scheme, quant_seg: the compressed exchange's ops */

/* The MLP's activation (matmul_gelu_fwd, matmul_dgelu_bwd): gelu_new's tanh form (GPT-2, GPT-Neo; Hugging Face's
 * gelu_new and gelu_fast) or the exact erf form (GPT-NeoX's gelu). */
typedef enum { BACKEND_GELU_TANH = 0, BACKEND_GELU_ERF = 1 } backend_act;

/* Storage types of activations; the values index bit masks (backend_caps.storage). */
typedef enum { BACKEND_FP32 = 0, BACKEND_BF16 = 1, BACKEND_FP16 = 2 } backend_dtype;
enum { BACKEND_NDTYPES = 3 };

/* Bytes of one element; the name as decks write it ("fp32", "bf16", "fp16"). */
size_t backend_dtype_size(backend_dtype t);
const char *backend_dtype_name(backend_dtype t);
/* The storage type of &system precision: bf16 and fp16 store in that type, fp32 and tf32 in fp32. */
backend_dtype backend_precision_storage(const char *precision);

/* Precisions (&system precision) as bits of backend_caps.precisions. */
enum { BACKEND_PREC_FP32 = 1, BACKEND_PREC_TF32 = 2, BACKEND_PREC_BF16 = 4, BACKEND_PREC_FP16 = 8 };
/* The bit of a precision name; 0 for an unknown name. */
unsigned backend_precision_bit(const char *precision);

/* What a kind of backend can do, asked before (and without) opening one. */
typedef struct {
  unsigned precisions; /* BACKEND_PREC_* bits the backend runs */
  unsigned storage;    /* (1u << backend_dtype) for each storage type it stores activations in */
  int host_memory;     /* backend memory is ordinary host memory (MPI and I/O read it directly) */
  int devices;         /* computes on devices that are counted and chosen per rank (GPUs) */
  const char *attention; /* the attention paths it has, for the documentation and the header */
  /* the attention kernels' limits, 0 for none: head size (n_embd / n_head), heads on one rank
   * (n_head / tensor_parallel), sequences of one call (micro_batch_size) */
  int max_head_size, max_heads, max_batch;
} backend_caps;

typedef struct {
  float lr;           /* learning rate of this step */
  float beta1, beta2; /* moment decays */
  float eps;
  float weight_decay; /* decoupled: p -= lr * weight_decay * p */
  double loss_scale;  /* the gradients carry it (fp16's loss scaling; 1 otherwise): they are divided by it first */
  double grad_clip;   /* with sums, > 0: the gradients' global norm is clipped to it (<= 0: no clipping) */
  const double *sums; /* NULL, or backend memory: the step's {loss sum, gradients' sum of squares} (model.sums) */
  int step;           /* 1-based step, for bias correction */
} backend_adamw_args;

#ifdef __CUDACC__
#define BACKEND_HOST_DEVICE __host__ __device__
#else
#define BACKEND_HOST_DEVICE
#endif

/* The factor AdamW multiplies the gradients by: 1 / loss_scale, and with sums also min(1, grad_clip / (norm +
 * 1e-6)), norm = sqrt(sums[1]) / loss_scale the gradients' unscaled global norm; -1 when either sum is not finite:
 * the update is skipped (an fp16 overflow, or a diverged run that the host ends). Evaluated by the backend where the
 * sums are (device memory on a GPU), so a step's update is queued before the host reads them. */
static inline BACKEND_HOST_DEVICE float backend_adamw_factor(const backend_adamw_args *a) {
  if (!a->sums) return (float)(1.0 / a->loss_scale);
  const double loss = a->sums[0], ss = a->sums[1];
  if (!isfinite(loss) || !isfinite(ss)) return -1.0f;
  double c = 1.0;
  if (a->grad_clip > 0.0) {
    c = a->grad_clip / (sqrt(ss) / a->loss_scale + 1e-6);
    c = c < 1.0 ? c : 1.0;
  }
  return (float)(c / a->loss_scale);
}

/* The qkv row of the attention ops: [q (C) | k (Ckv) | v (Ckv)], Ckv = Hkv C/H, query head h reading key/value head
 * h / (H/Hkv). Its width, and the column where query head h's key head starts (its value head's is Ckv further). */
static inline BACKEND_HOST_DEVICE int backend_qkv_width(int C, int H, int Hkv) { return C + 2 * (C / H) * Hkv; }
static inline BACKEND_HOST_DEVICE int backend_key_col(int C, int H, int Hkv, int h) {
  return C + h / (H / Hkv) * (C / H);
}

/* The rotary embedding's frequencies: pair i of rot dims turns at inv_freq(i) = theta^(-2i/rot), in fp32 as
 * transformers forms it; with factor > 0 Llama 3's scaling (transformers' _compute_llama3_parameters, its fp32 steps
 * in its order): a pair whose wavelength 2 pi / inv_freq is above orig / low_freq turns factor times slower, one
 * below orig / high_freq as it is, and one between at a blend of the two, smooth = (orig / wavelength - low_freq) /
 * (high_freq - low_freq), inv_freq ((1 - smooth) / factor + smooth). */
typedef struct {
  float theta;
  float factor, low_freq, high_freq, orig; /* factor 0: no scaling */
} backend_rope;

static inline BACKEND_HOST_DEVICE float backend_rope_inv_freq(const backend_rope *r, int i, int rot) {
  const float inv = 1.0f / powf(r->theta, (float)(2 * i) / (float)rot);
  if (r->factor <= 0.0f) return inv;
  const float wavelen = (1.0f / inv) * 6.2831855f, lo_wave = r->orig / r->low_freq, hi_wave = r->orig / r->high_freq;
  const float scaled = wavelen > lo_wave ? inv / r->factor : inv;
  if (wavelen < hi_wave || wavelen > lo_wave) return scaled;
  const float smooth = ((1.0f / wavelen) * r->orig - r->low_freq) / (r->high_freq - r->low_freq);
  return (1.0f - smooth) * scaled / r->factor + smooth * scaled;
}

/* The largest shapes a backend instance will be asked to compute on: its workspaces are planned
 * (and allocated by prepare) from these, so the dry run's memory plan is exact. */
typedef struct {
  int B, T, C, H, F, V;
  int Hkv; /* key/value heads (H: multi-head attention) */
  int kv_rows; /* rows (all sequences' rings) of the largest KV cache attention_cached reads; 0 without */
} backend_shape;

typedef struct backend backend;

/* The tensor ops, written once: X(name, params, args). Each generates a member of the table
 * (void name params), the per-backend declarations, greenlm-bench's profiling wrappers, and the
 * names whose tests test_ops and test_gpu_parity must define (a missing one does not compile).
 * params start with the backend; args are the remaining parameters' names. */
#define BACKEND_OPS(X)                                                                                                 \
  /* out S (B,T,C) = wte[tok[b,t] - v0] + wpe[t];  tok (B,T), wpe S (>=T,C) (NULL: not added);                       \
   * wte S (nv,C) holds vocabulary rows [v0, v0 + nv) (a tensor rank's shard; 0, V for the whole): a token outside    \
   * them adds nothing */                                                                                              \
  X(embed_fwd,                                                                                                         \
    (const backend *be, void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T, int C, int v0,  \
     int nv),                                                                                                          \
    (out, tok, wte, wpe, B, T, C, v0, nv))                                                                             \
  /* dwte F (nv,C) [tok[b,t] - v0] += dout S [b,t] for the tokens in [v0, v0 + nv);                                    \
   * dwpe F [t] += sum_b dout[b,t] (skipped when NULL) */                                                              \
  X(embed_bwd,                                                                                                         \
    (const backend *be, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B, int T, int C, int v0,   \
     int nv),                                                                                                          \
    (dwte, dwpe, dout, tok, B, T, C, v0, nv))                                                                          \
  /* out S (N,C) = (inp - mean) * rstd * w + b;  inp S, w b S (C); mean, rstd F (N) saved for the backward */          \
  X(layernorm_fwd,                                                                                                     \
    (const backend *be, void *out, float *mean, float *rstd, const void *inp, const void *w, const void *b, int N,      \
     int C, float eps),                                                                                                \
    (out, mean, rstd, inp, w, b, N, C, eps))                                                                           \
  /* The residual connection and the LayerNorm after it, in one pass: res S (N,C) = a S + b S, then out S (N,C) =      \
   * LayerNorm(res as stored) with mean, rstd F (N), exactly residual_fwd then layernorm_fwd (whose backwards serve) */ \
  X(residual_layernorm_fwd,                                                                                            \
    (const backend *be, void *res, void *out, float *mean, float *rstd, const void *a, const void *b, const void *w,   \
     const void *bias, int N, int C, float eps),                                                                      \
    (res, out, mean, rstd, a, b, w, bias, N, C, eps))                                                                  \
  /* dinp S (N,C) +=, dw F (C) +=, db F (C) += (dw, db overwritten when acc = 0: a step's first backward pass writes \
   * the parameters' gradients instead of a pass zeroing them);  dout inp S (N,C), w S (C), mean rstd F (N) */         \
  X(layernorm_bwd,                                                                                                     \
    (const backend *be, void *dinp, float *dw, float *db, const void *dout, const void *inp, const void *w,            \
     const float *mean, const float *rstd, int N, int C, int acc),                                                     \
    (dinp, dw, db, dout, inp, w, mean, rstd, N, C, acc))                                                               \
  /* RMSNorm as Hugging Face's LlamaRMSNorm: rstd F (N) = 1 / sqrt(mean(inp^2) + eps) saved for the backward;      \
   * out S (N,C) = w S (C) * (inp * rstd rounded to the storage type): the normalized row is rounded before its      \
   * product with the weight, which is rounded again (one fp32 product at fp32 storage) */                            \
  X(rmsnorm_fwd, (const backend *be, void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps), \
    (out, rstd, inp, w, N, C, eps))                                                                                    \
  /* dinp S (N,C) +=, dw F (C) += (overwritten when acc = 0, as layernorm_bwd's);  dout inp S (N,C), w S (C),         \
   * rstd F (N) */                                                                                                     \
  X(rmsnorm_bwd,                                                                                                       \
    (const backend *be, void *dinp, float *dw, const void *dout, const void *inp, const void *w, const float *rstd,    \
     int N, int C, int acc),                                                                                           \
    (dinp, dw, dout, inp, w, rstd, N, C, acc))                                                                         \
  /* SwiGLU (Llama's MLP activation): h S (N,F) = silu(g) * u, silu(g) = g / (1 + exp(-g)), from gu S (N,2F) whose     \
   * rows hold [g | u] (a tensor rank's F units of each) */                                                           \
  X(swiglu_fwd, (const backend *be, void *h, const void *gu, int N, int F), (h, gu, N, F))                             \
  /* dgu S (N,2F) = [dh * u * silu'(g) | dh * silu(g)] (overwritten) from dh S (N,F) and gu S (N,2F) */               \
  X(swiglu_bwd, (const backend *be, void *dgu, const void *dh, const void *gu, int N, int F), (dgu, dh, gu, N, F))     \
  /* out S (N,M) = inp S (N,K) @ w S (M,K)^T + bias S (M); bias may be NULL. out's rows are ldo >= M elements apart \
   * (the LM head pads them to a multiple of 128: aligned rows for the tensor cores); columns M..ldo-1 are left     \
   * undefined and never read */                                                                                    \
  X(matmul_fwd,                                                                                                        \
    (const backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int K, int M, int ldo),    \
    (out, inp, w, bias, N, K, M, ldo))                                                                                 \
  /* dinp S (N,K) = dout S (N,M) @ w S (M,K) (overwritten; skipped when NULL);                                         \
   * dw F (M,K) += dout^T @ inp S (N,K);  dbias F (M) += column sums of dout (skipped when NULL); dout's rows are ldo  \
   * >= M elements apart. acc = 0: dw and dbias are overwritten instead (a GEMM with beta = 0) */                      \
  X(matmul_bwd,                                                                                                        \
    (const backend *be, void *dinp, float *dw, float *dbias, const void *dout, const void *inp, const void *w, int N,  \
     int K, int M, int ldo, int acc),                                                                                  \
    (dinp, dw, dbias, dout, inp, w, N, K, M, ldo, acc))                                                                \
  /* Causal self-attention on qkv S (B,T,W) = [q (C) | k (Ckv) | v (Ckv)], W = C + 2 Ckv, Ckv = Hkv C/H: query head h \
   * in columns h*C/H..(h+1)*C/H of q, its key and value head h / (H/Hkv) likewise in k and v (grouped-query         \
   * attention; Hkv = H is multi-head attention, W = 3C).                                                              \
   * window <= 0: global (query i sees keys j <= i); else local (i - window < j <= i).                                 \
   * out S (B,T,C) = softmax(scale * q k^T) v per head; lse F (B,H,T) the log-sum-exp of each row.                     \
   * scratch: attention_scratch bytes of backend memory. */                                                            \
  X(attention_fwd,                                                                                                     \
    (const backend *be, void *out, float *lse, const void *qkv, void *scratch, int B, int T, int C, int H, int Hkv,    \
     int window, float scale),                                                                                         \
    (out, lse, qkv, scratch, B, T, C, H, Hkv, window, scale))                                                          \
  /* dqkv S (B,T,W) = gradient w.r.t. qkv (overwritten), from dout S (B,T,C) and the forward's out, lse */             \
  X(attention_bwd,                                                                                                     \
    (const backend *be, void *dqkv, const void *dout, const void *out, const float *lse, const void *qkv,              \
     void *scratch, int B, int T, int C, int H, int Hkv, int window, float scale),                                     \
    (dqkv, dout, out, lse, qkv, scratch, B, T, C, H, Hkv, window, scale))                                              \
  /* The MLP's first linear layer with its activation: pre S (N,M) = inp S (N,K) @ w S (M,K)^T + bias S (M) (bias may  \
   * be NULL); out S (N,M) = gelu(pre) of pre as computed (before its rounding to the storage type): a GEMM           \
   * epilogue's form. act (backend_act): BACKEND_GELU_TANH gelu_new = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), \
   * BACKEND_GELU_ERF the exact 0.5 x (1 + erf(x / sqrt(2))) */                                                       \
  X(matmul_gelu_fwd,                                                                                                   \
    (const backend *be, void *out, void *pre, const void *inp, const void *w, const void *bias, int N, int K, int M,   \
     int act),                                                                                                         \
    (out, pre, inp, w, bias, N, K, M, act))                                                                            \
  /* The backward of the MLP's second linear layer, whose input is inp = gelu(pre), through the activation:            \
   * dpre S (N,K) = (dout S (N,M) @ w S (M,K)) * gelu'(pre S (N,K)), the product as computed (overwritten);            \
   * dw F (M,K) += dout^T @ inp S (N,K);  dbias F (M) += column sums of dout (skipped when NULL); both overwritten    \
   * when acc = 0 */                                                                                                   \
  X(matmul_dgelu_bwd,                                                                                                  \
    (const backend *be, void *dpre, float *dw, float *dbias, const void *dout, const void *inp, const void *pre,        \
     const void *w, int N, int K, int M, int acc, int act),                                                            \
    (dpre, dw, dbias, dout, inp, pre, w, N, K, M, acc, act))                                                           \
  /* Rotary position embedding (GPT-NeoX's rotate-half form), in place on the queries and keys of qkv S (N,W) (laid   \
   * out as attention_fwd's): in each of q's H heads and k's Hkv the first rot (even, <= C/H) dims turn as the         \
   * pairs (i, i + rot/2), i < rot/2: (a, b) -> (a cos - b sin, b cos + a sin), angle = p * backend_rope_inv_freq(i)  \
   * computed in fp32 as Hugging Face does, p the row's position: pos[r] (int32 (N) backend memory), or r % T when    \
   * pos is NULL. sign = -1 rotates back (the backward pass: dq, dk in dqkv); v and the other dims are left as they    \
   * are. rope (host memory): the frequencies */                                                                       \
  X(rope,                                                                                                              \
    (const backend *be, void *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot,                   \
     const backend_rope *rope, int sign),                                                                              \
    (qkv, pos, N, T, C, H, Hkv, rot, rope, sign))                                                                      \
  /* out S (n) = a S + b S (the residual connection; its backward is accumulate) */                                    \
  X(residual_fwd, (const backend *be, void *out, const void *a, const void *b, size_t n), (out, a, b, n))             \
  /* dst S (n) += src S */                                                                                             \
  X(accumulate, (const backend *be, void *dst, const void *src, size_t n), (dst, src, n))                             \
  /* Fused softmax + cross-entropy over logits S (N,V), rows ld >= V elements apart (columns V..ld-1 neither read    \
   * nor written), with targets (N): losses F (N) = logsumexp(logits[i]) - logits[i, targets[i]].                      \
   * The logits are overwritten: when dscale != 0 with dscale * (softmax - onehot(target)), the                        \
   * gradient of dscale * sum(losses); otherwise with scratch values. */                                               \
  X(xent_fwd_bwd,                                                                                                      \
    (const backend *be, float *losses, void *logits, const int32_t *targets, int N, int V, int ld, float dscale),      \
    (losses, logits, targets, N, V, ld, dscale))                                                                       \
  /* Vocabulary-parallel cross-entropy over logits S (N,nv) (rows ld >= nv apart), the columns [v0, v0 + nv) of the  \
   * vocabulary a tensor rank                                                                                          \
   * holds. xent_part: part F (N,2) = {logsumexp of row i, the logit of targets[i] when v0 <= targets[i] < v0 + nv     \
   * else 0}; the ranks' parts combine into each row's loss = logsumexp over ranks of the first - sum of the second. */ \
  X(xent_part,                                                                                                         \
    (const backend *be, float *part, const void *logits, const int32_t *targets, int N, int nv, int v0, int ld),       \
    (part, logits, targets, N, nv, v0, ld))                                                                            \
  /* logits S (N,nv) = dscale * (exp(logits - lse[i]) - onehot(targets[i] - v0)) (overwritten): the gradient of        \
   * dscale * sum(losses), given each row's log-sum-exp over the whole vocabulary lse F (N) */                         \
  X(xent_grad,                                                                                                         \
    (const backend *be, void *logits, const float *lse, const int32_t *targets, int N, int nv, int v0, int ld,         \
     float dscale),                                                                                                    \
    (logits, lse, targets, N, nv, v0, ld, dscale))                                                                     \
  /* AdamW (PyTorch's formulation) on n master parameters p F with gradients g F times backend_adamw_factor(a) and    \
   * moments m, v F (nothing changes when that is -1); the compute copy pc S (n) is written from the updated p        \
   * (skipped when NULL: fp32 storage). */                                                                            \
  X(adamw, (const backend *be, float *p, void *pc, const float *g, float *m, float *v, size_t n,                        \
            const backend_adamw_args *a),                                                                              \
    (p, pc, g, m, v, n, a))                                                                                            \
  /* *acc D (one double in backend memory) += the sum of x F (n), of its squares when square, accumulated in double   \
   * in an order fixed by n: a step's loss and gradient norm stay in backend memory until the host reads them once */ \
  X(reduce_sum, (const backend *be, double *acc, const float *x, size_t n, int square), (acc, x, n, square))          \
  /* dst S (n) = src F (n) rounded to the storage type (compute copies of parameters) */                               \
  X(to_storage, (const backend *be, void *dst, const float *src, size_t n), (dst, src, n))                            \
  /* dst F (n) = src S (n) (logits for sampling, tensors for tests) */                                                 \
  X(to_fp32, (const backend *be, float *dst, const void *src, size_t n), (dst, src, n))                               \
  /* KV cache (generation). kc, vc S (nseq, ring, Ckv): the keys and values of sequence s at position p in row        \
   * p % ring of its slab. seq, pos int32 (N) in backend memory: each row's sequence and position.                     \
   * kv_store: the k and v of row r of qkv S (N,C+2Ckv) into row pos[r] % ring of sequence seq[r]. */                  \
  X(kv_store, (const backend *be, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos, int N,  \
               int C, int Ckv, int ring),                                                                              \
    (kc, vc, qkv, seq, pos, N, C, Ckv, ring))                                                                          \
  /* Attention of N new query rows (q: the first C columns of qkv S (N,C+2Ckv), H heads, Hkv key/value heads as       \
   * attention_fwd's) against the cache: row r sees the                                                               \
   * positions j <= pos[r] of sequence seq[r] (window > 0: pos[r] - j < window), which must be stored (kv_store)       \
   * and still held (ring >= the visible span). out S (N,C) = softmax(scale * q k^T) v per head. */                    \
  X(attention_cached,                                                                                                  \
    (const backend *be, void *out, const void *qkv, const void *kc, const void *vc, const int32_t *seq,                \
     const int32_t *pos, int N, int C, int H, int Hkv, int ring, int window, float scale),                             \
    (out, qkv, kc, vc, seq, pos, N, C, H, Hkv, ring, window, scale))                                                  \
  /* The compressed gradient exchange (src/base/quant.h), on backend memory: seg (nseg) a table of segments in     \
   * backend memory, q the scheme (host). quant_encode: the segments of v F encoded into msg (bytes, each segment at    \
   * its off) with the random bits of rng_hash(key, seg.id); with ef F (indexed as v; NULL: none) v += ef first on the  \
   * quantized segments, the messages contracted, and ef = v - Q(v) after (quant_encode_segs, bit for bit) */          \
  X(quant_encode, (const backend *be, uint8_t *msg, float *v, float *ef, const quant_seg *seg, int nseg,              \
                   const quant_scheme *q, uint64_t key),                                                              \
    (msg, v, ef, seg, nseg, q, key))                                                                                   \
  /* out F (indexed as v) = the segments decoded from msg, whose byte 0 is the message's byte base (+= when add) */     \
  X(quant_decode, (const backend *be, float *out, const uint8_t *msg, size_t base, const quant_seg *seg, int nseg,     \
                   const quant_scheme *q, int add),                                                                   \
    (out, msg, base, seg, nseg, q, add))                                                                               \
  /* PowerSGD's low-rank factors (src/parallel/psgd.h), fp32 in backend memory, row-major: M F (n,m), P F (n,r), Q F  \
   * (m,r); every sum in lowrank_core.h's order. lowrank_left: P = M Q, after M += ef (ef F (n,m); NULL: none).       \
   * lowrank_right: Q = M^T P. lowrank_orth: P's columns orthonormal, in place (Gram-Schmidt in column order; a zero  \
   * column stays zero). lowrank_expand: M = P Q^T, or M -= P Q^T when sub */                                          \
  X(lowrank_left, (const backend *be, float *P, float *M, float *ef, const float *Q, size_t n, size_t m, int r),       \
    (P, M, ef, Q, n, m, r))                                                                                            \
  X(lowrank_right, (const backend *be, float *Q, const float *M, const float *P, size_t n, size_t m, int r),           \
    (Q, M, P, n, m, r))                                                                                                \
  X(lowrank_orth, (const backend *be, float *P, size_t n, int r), (P, n, r))                                          \
  X(lowrank_expand, (const backend *be, float *M, const float *P, const float *Q, size_t n, size_t m, int r, int sub), \
    (M, P, Q, n, m, r, sub))

/* One enumerator per op: BACKEND_OP_embed_fwd, ...; BACKEND_NOPS of them. */
#define BACKEND_OP_ENUM(name, params, args) BACKEND_OP_##name,
enum { BACKEND_OPS(BACKEND_OP_ENUM) BACKEND_NOPS };
/* The ops' names in enumerator order ("embed_fwd", ...). */
extern const char *const backend_op_names[BACKEND_NOPS];

/* Splices a parenthesised argument list into a call: BACKEND_CALL(f, be, (a, b)) is f(be, a, b). */
#define BACKEND_ARGS_(...) __VA_ARGS__
#define BACKEND_CALL(f, be, args) f(be, BACKEND_ARGS_ args)

#define BACKEND_OP_MEMBER(name, params, args) void(*name) params;

struct backend {
  const char *name;     /* the kind: "cpu", "cuda" */
  backend_caps caps;
  backend_dtype storage; /* of activations and the compute copy of parameters */
  char precision[8];     /* &system precision it computes at */
  void *ctx;             /* the backend's own state */

  /* ---- memory ---- */
  void *(*alloc)(const backend *be, size_t bytes); /* zero-filled */
  void (*free)(const backend *be, void *p);
  void (*to_device)(const backend *be, void *dst, const void *src, size_t bytes);
  void (*to_host)(const backend *be, void *dst, const void *src, size_t bytes);
  /* to_device queued in order with the ops (a GPU copies on its stream while the host goes on): src must stay
   * unchanged until the next sync or synchronous copy when it is host_alloc memory (other host memory may change as
   * soon as this returns) */
  void (*to_device_async)(const backend *be, void *dst, const void *src, size_t bytes);
  void (*zero)(const backend *be, void *p, size_t bytes);
  void (*copy)(const backend *be, void *dst, const void *src, size_t bytes); /* within backend memory */
  void (*sync)(const backend *be);
  /* Host memory that copies to and from backend memory fast (pinned for a GPU): MPI staging. */
  void *(*host_alloc)(const backend *be, size_t bytes);
  void (*host_free)(const backend *be, void *p);

  /* ---- the device and the engine ---- */
  /* PCI bus id ("00000000:3B:00.0") of the device this instance computes on, for the energy
   * sensors; NULL where there is none, as on the CPU backend. */
  const char *(*bus_id)(const backend *be);
  /* The device ("GPU 1 of 4: NVIDIA H200, PCI 00000000:3B:00.0") into buf; NULL on the CPU. */
  const char *(*placement)(const backend *be, char *buf, size_t len);
  /* One line naming what computes (library, kernel set, threads, attention path) into buf. */
  const char *(*describe)(const backend *be, char *buf, size_t len);
  /* Threads the backend's math library may use per rank (0 leaves the library's default). */
  void (*set_threads)(const backend *be, int n);
  /* Measured GEMM rate in GFLOP/s at the instance's precision: best of repeated n x n x n products
   * over `seconds` (a GPU uses n >= 8192 to approach its peak). */
  double (*measure_gflops)(const backend *be, int n, double seconds);
  /* Bytes in use on the device (all of it: this instance's, the runtime's and libraries'); NULL
   * on the CPU backend. For measuring memory against the plan. */
  size_t (*device_memory_used)(const backend *be);
  /* Whether MPI may be given backend memory directly (always for host memory); `how` says what
   * told (the MPI library's query, an environment switch). */
  int (*mpi_direct)(const backend *be, const char **how);

  /* ---- planning ---- */
  /* Bytes of backend memory attention_fwd/bwd need as scratch for sequences of T. */
  size_t (*attention_scratch)(const backend *be, int T);
  /* Bytes of workspace the instance holds for shapes up to s (conversion buffers, GEMM workspace). */
  size_t (*workspace_bytes)(const backend *be, const backend_shape *s);
  /* Resident bytes the math library takes for itself outside the table's allocations when ops
   * run on shapes up to s (OpenBLAS's packing buffers, whose size depends on the kernels it picked
   * for this CPU), measured by running them; call it before other products have run, as the
   * library keeps what it took. NULL where there is none to measure (a GPU's device memory is
   * device_memory_used's). */
  size_t (*library_bytes)(const backend *be, const backend_shape *s);
  /* Allocate that workspace now (ops may not run on larger shapes afterwards). */
  void (*prepare)(const backend *be, const backend_shape *s);
  /* Free the context, its workspaces and the instance itself (backend_close). */
  void (*close)(backend *be);

  /* ---- ops ---- */
  BACKEND_OPS(BACKEND_OP_MEMBER)
};

/* Close an instance: its context, workspaces and table. */
void backend_close(const backend *be);

/* A kind of backend this build has: how to ask what it can do, count its devices and open it. */
typedef struct {
  const char *name; /* as &system backend names it */
  backend_caps (*caps)(void);
  /* Devices this process may use (0 with the reason in why); NULL for a kind without devices. */
  int (*devices)(char *why, size_t len);
  /* PCI bus id of device d ("0000:3B:00.0"): 0, or -1 with "". */
  int (*device_bus_id)(int d, char *buf, size_t len);
  /* An instance on device d (ignored without devices) at the precision; d = -1 opens one for
   * planning only (the dry run): no device is touched and its ops may not run. Errors are fatal. */
  backend *(*open)(int device, const char *precision);
} backend_kind;

/* The kinds built in, CPU first: n of them. */
const backend_kind *const *backend_kinds(int *n);
/* The kind of that name in this build, or NULL; when NULL and the name is a kind greenlm has,
 * *build says how to get a build with it. */
const backend_kind *backend_find_kind(const char *name, const char **build);
/* "fp32, bf16, fp16": the names of the BACKEND_PREC_* bits set in mask, into buf. */
const char *backend_precision_names(unsigned mask, char *buf, size_t len);

/* The kinds' descriptions (cpu/, gpu/). */
extern const backend_kind backend_kind_cpu;
#ifdef GREENLM_HAVE_CUDA /* config.h: built with ./configure --with-cuda */
extern const backend_kind backend_kind_cuda;
#endif

/* A CPU instance at fp32, opened once and never closed (tests and tools that need one). */
const backend *backend_cpu(void);

#ifdef __cplusplus
}
#endif

#endif
