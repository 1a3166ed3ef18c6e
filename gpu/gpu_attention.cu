/* gpu_attention: causal (global or local-window) multi-head attention as fused, tiled kernels in
 * the manner of FlashAttention-2, in fp32.
 *
 * Forward: a block takes ATT_ROWS query rows of one (sequence b, head h); its warps own
 * ATT_RPW rows each. Keys and values stream through shared memory in tiles of 32 (one key per
 * lane): each lane scores its key, the warp keeps the running maximum and sum of each row
 * (online softmax) and rescales its output accumulator (lane d owns dimensions d, d+32, ...).
 * Scores exist only as one value per lane: nothing of size T x T is ever stored. The log-sum-exp
 * of each row (lse, (B,H,T)) is saved for the backward pass.
 *
 * Backward: two kernels recompute the probabilities P = exp(scale q.k - lse) from q, k and lse.
 *   dq:     per block of query rows, streaming key tiles:  dq = scale * sum_j dS_ij k_j,
 *           with dS = P (dP - D), dP_ij = dO_i . v_j and D_i = dO_i . o_i (saved for the next kernel)
 *   dk, dv: per block of key rows, streaming query tiles: dv = sum_i P_ij dO_i,
 *           dk = scale * sum_i dS_ij q_i
 * Each output element is written by exactly one thread, without atomics (deterministic).
 *
 * Head size hs = C/H up to 256: the kernels are compiled for 32, 64, 128 and 256 (NV = 1, 2, 4, 8
 * values per lane), the smallest that holds hs; shared-memory rows are padded to 32*NV (+1 where
 * lanes read different rows, against bank conflicts). The softmax scale is the model's (GPT-Neo
 * passes 1: its scores are not scaled). */
#include "gpu.h"

#include <math.h>

enum { ATT_RPW = 4, ATT_WARPS = 4, ATT_ROWS = ATT_RPW * ATT_WARPS, ATT_TILE = 32 };

/* The first key query i sees: i - window + 1 for a local layer, 0 for a global one. */
__device__ __forceinline__ int key_lo(int i, int window) {
  int lo = window > 0 ? i - window + 1 : 0;
  return lo > 0 ? lo : 0;
}

/* Whether query i sees key j. */
__device__ __forceinline__ bool visible(int i, int j, int window) { return j <= i && j >= key_lo(i, window); }

/* Copy rows [r0, r0 + nrows) of one head (columns col..col+hs of a (T, stride) matrix) into shared
 * memory rows of `pitch` floats, zero beyond hs and beyond T. All threads of the block take part. */
__device__ __forceinline__ void load_rows(float *dst, int pitch, int hp, const float *src, size_t stride, int r0,
                                          int nrows, int T, int hs) {
  for (int x = threadIdx.x; x < nrows * hp; x += blockDim.x) {
    int r = x / hp, d = x % hp, i = r0 + r;
    dst[r * pitch + d] = (i < T && d < hs) ? src[(size_t)i * stride + d] : 0.0f;
  }
}

/* ---- forward --------------------------------------------------------------------------------- */

/* grid (ceil(T/ATT_ROWS), H, B); out (B,T,C), lse (B,H,T), qkv (B,T,3C) */
template <int NV>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    att_fwd_kernel(float *out, float *lse, const float *qkv, int T, int C, int H, int window, float scale) {
  constexpr int HP = 32 * NV;
  extern __shared__ float sm[];
  float *Qs = sm;                         /* (ATT_ROWS, HP) */
  float *Ks = Qs + ATT_ROWS * HP;         /* (ATT_TILE, HP + 1) */
  float *Vs = Ks + ATT_TILE * (HP + 1);   /* (ATT_TILE, HP) */
  const int hs = C / H, C3 = 3 * C, b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;

  load_rows(Qs, HP, HP, q, C3, i0, ATT_ROWS, T, hs);
  float m[ATT_RPW], l[ATT_RPW], acc[ATT_RPW][NV];
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < NV; e++) acc[rr][e] = 0.0f;
  }
  const int i1 = min(i0 + ATT_ROWS, T); /* the block's rows see keys [key_lo(i0), i1) */
  for (int j0 = key_lo(i0, window); j0 < i1; j0 += ATT_TILE) {
    __syncthreads(); /* the previous tile is consumed */
    load_rows(Ks, HP + 1, HP, k, C3, j0, ATT_TILE, i1, hs);
    load_rows(Vs, HP, HP, v, C3, j0, ATT_TILE, i1, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
      const int r = warp * ATT_RPW + rr, i = i0 + r, j = j0 + lane;
      if (i >= T) continue; /* the same for the whole warp */
      const bool vis = visible(i, j, window);
      float s = -INFINITY;
      if (vis) {
        const float *qr = Qs + r * HP, *kj = Ks + lane * (HP + 1);
        float dot = 0.0f;
        for (int d = 0; d < hs; d++) dot += qr[d] * kj[d];
        s = scale * dot;
      }
      const float mt = gpu_warp_max(s);
      if (mt == -INFINITY) continue; /* no key of this tile is visible to row i */
      const float mn = fmaxf(m[rr], mt), alpha = expf(m[rr] - mn);
      const float p = vis ? expf(s - mn) : 0.0f;
      l[rr] = l[rr] * alpha + gpu_warp_sum(p);
#pragma unroll
      for (int e = 0; e < NV; e++) acc[rr][e] *= alpha;
      for (int jj = 0; jj < ATT_TILE; jj++) {
        const float pj = __shfl_sync(GPU_FULL_MASK, p, jj);
        const float *vj = Vs + jj * HP + lane;
#pragma unroll
        for (int e = 0; e < NV; e++) acc[rr][e] += pj * vj[32 * e];
      }
      m[rr] = mn;
    }
  }
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + warp * ATT_RPW + rr;
    if (i >= T) continue;
    float *o = out + ((size_t)b * T + i) * C + (size_t)h * hs;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int e = 0; e < NV; e++)
      if (lane + 32 * e < hs) o[lane + 32 * e] = acc[rr][e] * inv;
    if (lane == 0) lse[((size_t)b * H + h) * T + i] = m[rr] + logf(l[rr]);
  }
}

/* ---- backward: dq (and D) -------------------------------------------------------------------- */

/* grid (ceil(T/ATT_ROWS), H, B); writes the q part of dqkv (B,T,3C) and D (B,H,T) */
template <int NV>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    att_bwd_dq_kernel(float *dqkv, float *Dg, const float *dout, const float *out, const float *lse, const float *qkv,
                      int T, int C, int H, int window, float scale) {
  constexpr int HP = 32 * NV;
  extern __shared__ float sm[];
  float *Qs = sm;                         /* (ATT_ROWS, HP) */
  float *dOs = Qs + ATT_ROWS * HP;        /* (ATT_ROWS, HP) */
  float *Ks = dOs + ATT_ROWS * HP;        /* (ATT_TILE, HP + 1) */
  float *Vs = Ks + ATT_TILE * (HP + 1);   /* (ATT_TILE, HP + 1) */
  const int hs = C / H, C3 = 3 * C, b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
  const float *dO = dout + (size_t)b * T * C + (size_t)h * hs, *o = out + (size_t)b * T * C + (size_t)h * hs;
  const float *L = lse + ((size_t)b * H + h) * T;

  load_rows(Qs, HP, HP, q, C3, i0, ATT_ROWS, T, hs);
  load_rows(dOs, HP, HP, dO, C, i0, ATT_ROWS, T, hs);
  float Di[ATT_RPW], Li[ATT_RPW], acc[ATT_RPW][NV];
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + warp * ATT_RPW + rr;
    float s = 0.0f;
    if (i < T)
      for (int d = lane; d < hs; d += 32) s += dO[(size_t)i * C + d] * o[(size_t)i * C + d];
    Di[rr] = gpu_warp_sum(s);
    Li[rr] = i < T ? L[i] : 0.0f;
    if (i < T && lane == 0) Dg[((size_t)b * H + h) * T + i] = Di[rr];
#pragma unroll
    for (int e = 0; e < NV; e++) acc[rr][e] = 0.0f;
  }
  const int i1 = min(i0 + ATT_ROWS, T);
  for (int j0 = key_lo(i0, window); j0 < i1; j0 += ATT_TILE) {
    __syncthreads();
    load_rows(Ks, HP + 1, HP, k, C3, j0, ATT_TILE, i1, hs);
    load_rows(Vs, HP + 1, HP, v, C3, j0, ATT_TILE, i1, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
      const int r = warp * ATT_RPW + rr, i = i0 + r, j = j0 + lane;
      if (i >= T) continue;
      float ds = 0.0f;
      if (visible(i, j, window)) {
        const float *qr = Qs + r * HP, *dr = dOs + r * HP, *kj = Ks + lane * (HP + 1), *vj = Vs + lane * (HP + 1);
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < hs; d++) {
          s += qr[d] * kj[d];
          dp += dr[d] * vj[d];
        }
        ds = expf(scale * s - Li[rr]) * (dp - Di[rr]);
      }
      for (int jj = 0; jj < ATT_TILE; jj++) {
        const float dsj = __shfl_sync(GPU_FULL_MASK, ds, jj);
        const float *kj = Ks + jj * (HP + 1) + lane;
#pragma unroll
        for (int e = 0; e < NV; e++) acc[rr][e] += dsj * kj[32 * e];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + warp * ATT_RPW + rr;
    if (i >= T) continue;
    float *dq = dqkv + ((size_t)b * T + i) * C3 + (size_t)h * hs;
#pragma unroll
    for (int e = 0; e < NV; e++)
      if (lane + 32 * e < hs) dq[lane + 32 * e] = scale * acc[rr][e];
  }
}

/* ---- backward: dk, dv ------------------------------------------------------------------------ */

/* grid (ceil(T/ATT_ROWS), H, B): a block owns ATT_ROWS keys; writes the k and v parts of dqkv */
template <int NV>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    att_bwd_dkdv_kernel(float *dqkv, const float *Dg, const float *dout, const float *lse, const float *qkv, int T,
                        int C, int H, int window, float scale) {
  constexpr int HP = 32 * NV;
  extern __shared__ float sm[];
  float *Ks = sm;                         /* (ATT_ROWS, HP) */
  float *Vs = Ks + ATT_ROWS * HP;         /* (ATT_ROWS, HP) */
  float *Qs = Vs + ATT_ROWS * HP;         /* (ATT_TILE, HP + 1) */
  float *dOs = Qs + ATT_TILE * (HP + 1);  /* (ATT_TILE, HP + 1) */
  float *Ls = dOs + ATT_TILE * (HP + 1);  /* (ATT_TILE) */
  float *Ds = Ls + ATT_TILE;              /* (ATT_TILE) */
  const int hs = C / H, C3 = 3 * C, b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
  const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
  const float *L = lse + ((size_t)b * H + h) * T, *D = Dg + ((size_t)b * H + h) * T;

  load_rows(Ks, HP, HP, k, C3, j0, ATT_ROWS, T, hs);
  load_rows(Vs, HP, HP, v, C3, j0, ATT_ROWS, T, hs);
  float dk[ATT_RPW][NV], dv[ATT_RPW][NV];
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++)
#pragma unroll
    for (int e = 0; e < NV; e++) dk[rr][e] = dv[rr][e] = 0.0f;
  /* queries that see keys [j0, j1): i in [j0, j1 - 1 + window) for a local layer, [j0, T) globally */
  const int j1 = min(j0 + ATT_ROWS, T);
  const int iend = window > 0 ? min(T, j1 - 1 + window) : T;
  for (int it = j0; it < iend; it += ATT_TILE) {
    __syncthreads();
    load_rows(Qs, HP + 1, HP, q, C3, it, ATT_TILE, iend, hs);
    load_rows(dOs, HP + 1, HP, dO, C, it, ATT_TILE, iend, hs);
    if (threadIdx.x < ATT_TILE) {
      const int i = it + threadIdx.x;
      Ls[threadIdx.x] = i < iend ? L[i] : 0.0f;
      Ds[threadIdx.x] = i < iend ? D[i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < ATT_RPW; rr++) {
      const int r = warp * ATT_RPW + rr, j = j0 + r, i = it + lane;
      if (j >= T) continue;
      float p = 0.0f, ds = 0.0f;
      if (i < iend && visible(i, j, window)) {
        const float *qi = Qs + lane * (HP + 1), *di = dOs + lane * (HP + 1), *kr = Ks + r * HP, *vr = Vs + r * HP;
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < hs; d++) {
          s += qi[d] * kr[d];
          dp += di[d] * vr[d];
        }
        p = expf(scale * s - Ls[lane]);
        ds = p * (dp - Ds[lane]);
      }
      for (int ii = 0; ii < ATT_TILE; ii++) {
        const float pi = __shfl_sync(GPU_FULL_MASK, p, ii), dsi = __shfl_sync(GPU_FULL_MASK, ds, ii);
        const float *qi = Qs + ii * (HP + 1) + lane, *di = dOs + ii * (HP + 1) + lane;
#pragma unroll
        for (int e = 0; e < NV; e++) {
          dv[rr][e] += pi * di[32 * e];
          dk[rr][e] += dsi * qi[32 * e];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int j = j0 + warp * ATT_RPW + rr;
    if (j >= T) continue;
    float *dkj = dqkv + ((size_t)b * T + j) * C3 + C + (size_t)h * hs, *dvj = dkj + C;
#pragma unroll
    for (int e = 0; e < NV; e++)
      if (lane + 32 * e < hs) {
        dkj[lane + 32 * e] = scale * dk[rr][e];
        dvj[lane + 32 * e] = dv[rr][e];
      }
  }
}

/* ---- launches -------------------------------------------------------------------------------- */

static size_t fwd_smem(int hp) { return (size_t)(ATT_ROWS * hp + ATT_TILE * (hp + 1) + ATT_TILE * hp) * sizeof(float); }
static size_t dq_smem(int hp) { return (size_t)(2 * ATT_ROWS * hp + 2 * ATT_TILE * (hp + 1)) * sizeof(float); }
static size_t dkdv_smem(int hp) {
  return (size_t)(2 * ATT_ROWS * hp + 2 * ATT_TILE * (hp + 1) + 2 * ATT_TILE) * sizeof(float);
}

/* Allow `kernel` the dynamic shared memory it needs (above 48 KiB needs the opt-in). */
template <typename K>
static void allow_smem(K kernel, size_t bytes) {
  if (bytes > (size_t)gpu.prop.sharedMemPerBlockOptin)
    UTIL_FATAL("use more heads (a smaller head size n_embd / n_head)",
               "CUDA attention: %zu bytes of shared memory per block exceed this GPU's %zu", bytes,
               (size_t)gpu.prop.sharedMemPerBlockOptin);
  GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

size_t gpu_attention_scratch(int T) {
  (void)T;
  return 0; /* the kernels keep their tiles in shared memory; D (B,H,T) goes to gpu_workspace */
}

template <int NV>
static void fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int H, int window, float scale) {
  dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, H, B);
  size_t smem = fwd_smem(32 * NV);
  static bool ready = false; /* the opt-in is set once per kernel */
  if (!ready) allow_smem(att_fwd_kernel<NV>, smem), ready = true;
  att_fwd_kernel<NV><<<grid, 32 * ATT_WARPS, smem>>>(out, lse, qkv, T, C, H, window, scale);
  GPU_LAUNCHED();
}

template <int NV>
static void bwd(float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv, int B, int T,
                int C, int H, int window, float scale) {
  dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, H, B);
  float *D = (float *)gpu_workspace((size_t)B * H * T * sizeof(float)); /* (B,H,T) */
  size_t s1 = dq_smem(32 * NV), s2 = dkdv_smem(32 * NV);
  static bool ready = false;
  if (!ready) allow_smem(att_bwd_dq_kernel<NV>, s1), allow_smem(att_bwd_dkdv_kernel<NV>, s2), ready = true;
  att_bwd_dq_kernel<NV><<<grid, 32 * ATT_WARPS, s1>>>(dqkv, D, dout, out, lse, qkv, T, C, H, window, scale);
  GPU_LAUNCHED();
  att_bwd_dkdv_kernel<NV><<<grid, 32 * ATT_WARPS, s2>>>(dqkv, D, dout, lse, qkv, T, C, H, window, scale);
  GPU_LAUNCHED();
}

static void check_shape(int B, int T, int C, int H) {
  UTIL_CHECK(C / H <= 256, "use more heads: n_embd / n_head <= 256",
             "the CUDA attention kernels handle head sizes up to 256, not %d", C / H);
  UTIL_CHECK(H <= 65535 && B <= 65535, "use fewer heads or a smaller micro_batch_size",
             "CUDA attention: %d heads x %d sequences exceed the grid limits", H, B);
  (void)T;
}

void gpu_attention_fwd(float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H, int window,
                       float scale) {
  (void)scratch;
  check_shape(B, T, C, H);
  int hs = C / H;
  if (hs <= 32) fwd<1>(out, lse, qkv, B, T, C, H, window, scale);
  else if (hs <= 64) fwd<2>(out, lse, qkv, B, T, C, H, window, scale);
  else if (hs <= 128) fwd<4>(out, lse, qkv, B, T, C, H, window, scale);
  else fwd<8>(out, lse, qkv, B, T, C, H, window, scale);
}

void gpu_attention_bwd(float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv,
                       float *scratch, int B, int T, int C, int H, int window, float scale) {
  (void)scratch;
  check_shape(B, T, C, H);
  int hs = C / H;
  if (hs <= 32) bwd<1>(dqkv, dout, out, lse, qkv, B, T, C, H, window, scale);
  else if (hs <= 64) bwd<2>(dqkv, dout, out, lse, qkv, B, T, C, H, window, scale);
  else if (hs <= 128) bwd<4>(dqkv, dout, out, lse, qkv, B, T, C, H, window, scale);
  else bwd<8>(dqkv, dout, out, lse, qkv, B, T, C, H, window, scale);
}
