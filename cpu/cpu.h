/* cpu: the CPU backend's kernels (the reference implementation of every op in backend.h): fp32
 * kernels on fp32 arrays (cpu_ops.c, cpu_matmul.c, cpu_attention.c), and the table's ops at every
 * storage type around them (cpu_storage.c). */
#ifndef GREENLM_CPU_H
#define GREENLM_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"

/* An instance's context: the workspace the ops stage 16-bit operands in (cpu_storage.c). */
typedef struct {
  float *work;
  size_t work_floats;
} cpu_ctx;

/* Widen n elements of storage type t to fp32, and round fp32 to t (nearest even); t = fp32 copies. */
void cpu_load(backend_dtype t, float *dst, const void *src, size_t n);
void cpu_store(backend_dtype t, void *dst, const float *src, size_t n);
/* Workspace (floats) the ops need for shapes up to s at storage type t. */
size_t cpu_stage_floats(backend_dtype t, const backend_shape *s);

/* The table's ops (cpu_storage.c): cpu_op_embed_fwd, ... */
#define CPU_OP_DECLARE(name, params, args) void cpu_op_##name params;
BACKEND_OPS(CPU_OP_DECLARE)

/* The fp32 kernels */

void cpu_embed_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C, int v0,
                   int nv);
void cpu_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C, int v0, int nv);
void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                       int C, float eps);
/* mean and db NULL: RMSNorm's backward (rmsnorm_bwd) */
void cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                       const float *mean, const float *rstd, int N, int C);
/* out (N,C) = inp * rstd (* w where w is not NULL), rstd (N) written */
void cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
/* x (N,C) *= w (C) row by row */
void cpu_mul_rows(float *x, const float *w, int N, int C);
/* the swiglu ops (backend.h) in fp32 */
void cpu_swiglu_fwd(float *h, const float *gu, int N, int F);
void cpu_swiglu_bwd(float *dgu, const float *dh, const float *gu, int N, int F);
/* Resident bytes OpenBLAS's packing buffers take for the model's linear layers at shapes up to s,
 * measured now (0 where /proc cannot tell). */
size_t cpu_blas_bytes(const backend_shape *s);
/* out's and dout's rows ldo >= M floats apart, the logits' ld (backend.h) */
void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int K, int M, int ldo);
void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                    int N, int K, int M, int ldo);
size_t cpu_attention_scratch(int T);
/* qkv F (B,T,C+2Ckv) as the attention ops lay it out: H query heads, Hkv key/value heads */
void cpu_attention_fwd(float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H, int Hkv,
                       int window, float scale);
void cpu_attention_bwd(float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv,
                       float *scratch, int B, int T, int C, int H, int Hkv, int window, float scale);
/* kv_store copies elements of es bytes (any storage type); attention_cached computes in fp32 */
void cpu_kv_store(size_t es, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos, int N, int C,
                  int Ckv, int ring);
void cpu_attention_cached(float *out, const float *qkv, const float *kc, const float *vc, const int32_t *seq,
                          const int32_t *pos, int N, int C, int H, int Hkv, int ring, int window, float scale);
/* act: backend_act */
void cpu_gelu_fwd(float *out, const float *inp, size_t n, int act);
void cpu_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n, int act);
/* qkv F (N,C+2Ckv) rotated in place as the rope op says; the frequency of pair i as the op computes it */
void cpu_rope(float *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot, const backend_rope *rope,
              int sign);
void cpu_residual_fwd(float *out, const float *a, const float *b, size_t n);
void cpu_accumulate(float *dst, const float *src, size_t n);
void cpu_xent_fwd_bwd(float *losses, float *logits, const int32_t *targets, int N, int V, int ld, float dscale);
void cpu_xent_part(float *part, const float *logits, const int32_t *targets, int N, int nv, int v0, int ld);
void cpu_xent_grad(float *logits, const float *lse, const int32_t *targets, int N, int nv, int v0, int ld,
                   float dscale);
/* 0 when the step is skipped (backend_adamw_factor -1): nothing written */
int cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, const backend_adamw_args *a);
double cpu_dsum(const float *x, size_t n);  /* in double, in order */
double cpu_sumsq(const float *x, size_t n); /* float blocks of 4096, summed in double */

#endif
