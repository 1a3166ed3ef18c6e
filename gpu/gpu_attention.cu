/* gpu_attention: causal (global or local-window) multi-head attention as fused, tiled kernels in
 * the manner of FlashAttention-2: nothing of size T x T is ever stored. Two families:
 *   fp32 kernels on the CUDA cores: fp32 and tf32 precision, and head sizes the others do not take
 *     (up to 256);
 *   tensor-core kernels (WMMA): bf16 and fp16 precision, head sizes 33..128, compute capability
 *     8.0 or newer (gpu_attention_fwd / _bwd choose, see tc_choice).
 * The forward pass saves the log-sum-exp of each row (lse, (B,H,T)); the backward pass recomputes
 * the probabilities P = exp(scale q.k - lse) from q, k and lse in two kernels:
 *   dq:     per block of query rows, streaming key tiles:  dq = scale * sum_j dS_ij k_j,
 *           with dS = P (dP - D), dP_ij = dO_i . v_j and D_i = dO_i . o_i (saved for the next kernel)
 *   dk, dv: per block of key rows, streaming query tiles: dv = sum_i P_ij dO_i,
 *           dk = scale * sum_i dS_ij q_i
 * Each output element is written by exactly one thread, without atomics (deterministic). A block
 * streams only the tiles it can see: for a block of queries the keys from the first one its first
 * row sees (key_lo: 0, or the start of a local window) up to its last row; for a block of keys the
 * queries from its first key up to the last query that sees its last key. The softmax scale is
 * the model's (GPT-Neo passes 1: its scores are not scaled).
 * Generation's KV cache (at the end): kv_store copies new rows' k and v into the cache, and
 * attention_cached runs one warp per (new row, head) over its visible cached keys (online softmax).
 *
 * fp32 kernels. Forward: a block takes ATT_ROWS query rows of one (sequence b, head h); its warps
 * own ATT_RPW rows each. Keys and values stream through shared memory in tiles of 32 (one key per
 * lane): each lane scores its key, the warp keeps the running maximum and sum of each row (online
 * softmax) and rescales its output accumulator (lane d owns dimensions d, d+32, ...). The backward
 * kernels give each lane one key (dq) or one query (dk, dv) of the tile in the same way. Head size
 * hs = C/H up to 256: the kernels are compiled for 32, 64, 128 and 256 (NV = 1, 2, 4, 8 values per
 * lane), the smallest that holds hs; shared-memory rows are padded to 32*NV (+1 where lanes read
 * different rows, against bank conflicts).
 *
 * Tensor-core kernels: 16x16x16 WMMA products of E = bf16 or fp16 with fp32 accumulators. q, k, v
 * and dO stay fp32 in global memory and are rounded to E as tiles are loaded into shared memory:
 * rows of HP + 8 elements, HP = 64 or 128 the head size zero-padded (the 8 spare elements stagger
 * the rows over the banks). A block has TC_WARPS = 4 warps and owns TC_ROWS = 64 rows (queries;
 * keys for dk, dv), 16 per warp; the other side streams through in tiles of TC_TILE = 64. A warp
 * stores its 16 x 16 blocks of scores (fp32) to its own shared memory as (key, row), i.e.
 * column-major with ldm 16: element x = 32c + lane is (row lane % 16, key 2c + lane / 16), so each
 * lane owns one row, reads without bank conflicts, and does the softmax math of its elements in
 * fp32; it writes P or dS, rounded to E, in the same layout, which is the A operand (col_major) of
 * the next product:
 *   forward: S (16 rows x 64 keys) = q k^T; online softmax: each row's maximum m and sum l are kept
 *            by its two lanes (one shuffle combines their halves); o (16 x HP) = alpha o + P v
 *   dq:      per 16 keys, S and dP (16 x 16) = q k^T, dO v^T; dS = P (dP - D); dq (16 x HP) += dS k
 *   dk, dv:  per 16 queries, S^T and dP^T (16 keys x 16 queries) = k q^T, v dO^T; dv += P^T dO,
 *            dk += dS^T q (16 x HP each)
 * P and dS are rounded to E before their products, as in FlashAttention; the softmax, lse and D
 * are fp32 (D from dO as rounded for dP). The accumulators stay in registers; their element
 * layout is unspecified, so a 16 x 16 matrix Ms[x] = x / 16, loaded as an accumulator row-major
 * (column-major), gives each lane the row (column) of its elements: for the per-row rescaling of
 * o and the final guarded writes (rows < T, columns < hs). Shared memory per block (tc_smem),
 * HP = 128 (64): forward 78,080 (53,504) bytes, dq 80,896 (48,128), dk/dv 83,456 (50,688). */
#include "gpu.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>

enum { ATT_RPW = 4, ATT_WARPS = 4, ATT_ROWS = ATT_RPW * ATT_WARPS, ATT_TILE = 32 };

/* The first key query i sees: i - window + 1 for a local layer, 0 for a global one. */
__device__ __forceinline__ int key_lo(int i, int window) {
  int lo = window > 0 ? i - window + 1 : 0;
  return lo > 0 ? lo : 0;
}

/* Whether query i sees key j. */
__device__ __forceinline__ bool visible(int i, int j, int window) { return j <= i && j >= key_lo(i, window); }

/* fp32 to the element type of shared-memory tiles (round to nearest even). */
template <typename E>
__device__ __forceinline__ E to_elem(float x);
template <>
__device__ __forceinline__ float to_elem<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 to_elem<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half to_elem<__half>(float x) { return __float2half(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

/* Copy rows [r0, r0 + nrows) of one head (columns col..col+hs of a (T, stride) matrix) into shared
 * memory rows of `pitch` elements, converted to E, zero beyond hs (up to hp) and from row `lim`
 * on. All threads of the block take part. */
template <typename E>
__device__ __forceinline__ void load_rows(E *dst, int pitch, int hp, const float *src, size_t stride, int r0,
                                          int nrows, int lim, int hs) {
  for (int x = threadIdx.x; x < nrows * hp; x += blockDim.x) {
    int r = x / hp, d = x % hp, i = r0 + r;
    dst[r * pitch + d] = to_elem<E>((i < lim && d < hs) ? src[(size_t)i * stride + d] : 0.0f);
  }
}

/* a . b over hs elements in fp32, summed by the 32 lanes of a warp (every lane gets it). */
template <typename E>
__device__ __forceinline__ float warp_dot(const E *a, const float *b, int hs) {
  float s = 0.0f;
  for (int d = threadIdx.x % 32; d < hs; d += 32) s += to_float(a[d]) * b[d];
  return gpu_warp_sum(s);
}

/* ---- forward --------------------------------------------------------------------------------- */

/* grid (ceil(T/ATT_ROWS), H, B); out (B,T,C), lse (B,H,T), qkv (B,T,3C) */
template <int NV>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    att_fwd_kernel(float *out, float *lse, const float *qkv, int T, int C, int H, int Hkv, int window, float scale) {
  constexpr int HP = 32 * NV;
  extern __shared__ float sm[];
  float *Qs = sm;                         /* (ATT_ROWS, HP) */
  float *Ks = Qs + ATT_ROWS * HP;         /* (ATT_TILE, HP + 1) */
  float *Vs = Ks + ATT_TILE * (HP + 1);   /* (ATT_TILE, HP) */
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs,
              *k = qkv + (size_t)b * T * C3 + backend_key_col(C, H, Hkv, h), *v = k + hs * Hkv;

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
                      int T, int C, int H, int Hkv, int window, float scale) {
  constexpr int HP = 32 * NV;
  extern __shared__ float sm[];
  float *Qs = sm;                         /* (ATT_ROWS, HP) */
  float *dOs = Qs + ATT_ROWS * HP;        /* (ATT_ROWS, HP) */
  float *Ks = dOs + ATT_ROWS * HP;        /* (ATT_TILE, HP + 1) */
  float *Vs = Ks + ATT_TILE * (HP + 1);   /* (ATT_TILE, HP + 1) */
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * ATT_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs,
              *k = qkv + (size_t)b * T * C3 + backend_key_col(C, H, Hkv, h), *v = k + hs * Hkv;
  const float *dO = dout + (size_t)b * T * C + (size_t)h * hs, *o = out + (size_t)b * T * C + (size_t)h * hs;
  const float *L = lse + ((size_t)b * H + h) * T;

  load_rows(Qs, HP, HP, q, C3, i0, ATT_ROWS, T, hs);
  load_rows(dOs, HP, HP, dO, C, i0, ATT_ROWS, T, hs);
  float Di[ATT_RPW], Li[ATT_RPW], acc[ATT_RPW][NV];
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int i = i0 + warp * ATT_RPW + rr;
    Di[rr] = i < T ? warp_dot(dO + (size_t)i * C, o + (size_t)i * C, hs) : 0.0f;
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

/* grid (ceil(T/ATT_ROWS), Hkv, B): a block owns ATT_ROWS keys of key/value head g; writes the k and v parts of dqkv,
 * summed over the H/Hkv query heads of the group in turn (k and v stay loaded: nothing is copied per query head) */
template <int NV>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    att_bwd_dkdv_kernel(float *dqkv, const float *Dg, const float *dout, const float *lse, const float *qkv, int T,
                        int C, int H, int Hkv, int window, float scale) {
  constexpr int HP = 32 * NV;
  extern __shared__ float sm[];
  float *Ks = sm;                         /* (ATT_ROWS, HP) */
  float *Vs = Ks + ATT_ROWS * HP;         /* (ATT_ROWS, HP) */
  float *Qs = Vs + ATT_ROWS * HP;         /* (ATT_TILE, HP + 1) */
  float *dOs = Qs + ATT_TILE * (HP + 1);  /* (ATT_TILE, HP + 1) */
  float *Ls = dOs + ATT_TILE * (HP + 1);  /* (ATT_TILE) */
  float *Ds = Ls + ATT_TILE;              /* (ATT_TILE) */
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), b = blockIdx.z, g = blockIdx.y, j0 = blockIdx.x * ATT_ROWS;
  const int G = H / Hkv, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *k = qkv + (size_t)b * T * C3 + C + (size_t)g * hs, *v = k + hs * Hkv;

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
  for (int h = g * G; h < (g + 1) * G; h++) {
    const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *L = lse + ((size_t)b * H + h) * T, *D = Dg + ((size_t)b * H + h) * T;
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
  } /* the group's query heads */
#pragma unroll
  for (int rr = 0; rr < ATT_RPW; rr++) {
    const int j = j0 + warp * ATT_RPW + rr;
    if (j >= T) continue;
    float *dkj = dqkv + ((size_t)b * T + j) * C3 + C + (size_t)g * hs, *dvj = dkj + hs * Hkv;
#pragma unroll
    for (int e = 0; e < NV; e++)
      if (lane + 32 * e < hs) {
        dkj[lane + 32 * e] = scale * dk[rr][e];
        dvj[lane + 32 * e] = dv[rr][e];
      }
  }
}

/* ---- tensor-core kernels ----------------------------------------------------------------------- */

namespace wmma = nvcuda::wmma;

enum { TC_WARPS = 4, TC_ROWS = 16 * TC_WARPS, TC_TILE = 64 };

/* bf16 WMMA needs sm_80: in a build for older architectures too, their code of these kernels is
 * empty (tc_choice never launches it there). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TC_ARCH_OK 0
#else
#define TC_ARCH_OK 1
#endif
/* the parameters of a kernel whose body is compiled out for this architecture */
template <typename... A>
__device__ __forceinline__ void tc_unused(const A &...) {}

/* Byte offsets into a tensor-core kernel's dynamic shared memory: NT tiles (TC_ROWS, pitch) of E,
 * the index matrix Ms (16 x 16 floats), NV floats of per-row values, then WF floats and WE
 * elements of E per warp. Each part starts 128-byte aligned and each warp's 16 x 16 blocks
 * 32-byte aligned, as WMMA loads and stores need. */
template <typename E, int HP, int NT, int NV, int WF, int WE>
struct tc_smem {
  static constexpr int pitch = HP + 8; /* elements per tile row */
  static constexpr size_t tile = (size_t)TC_ROWS * pitch * sizeof(E), idx = NT * tile;
  static constexpr size_t vec = idx + 256 * sizeof(float), wf = vec + NV * sizeof(float);
  static constexpr size_t we = wf + (size_t)TC_WARPS * WF * sizeof(float);
  static constexpr size_t bytes = we + (size_t)TC_WARPS * WE * sizeof(E);
  static_assert(TC_ROWS == TC_TILE, "every tile has TC_ROWS rows");
  static_assert(tile % 128 == 0 && NV % 32 == 0, "128-byte aligned parts");
  static_assert(WF % 256 == 0 && WE % 256 == 0, "per-warp parts of whole 16 x 16 blocks");
};
/* forward: q, k, v tiles; 16 row factors per warp; per warp S (TC_TILE x 16 floats) and P (E) */
template <typename E, int HP>
using fwd_tc_smem = tc_smem<E, HP, 3, TC_ROWS, TC_TILE * 16, TC_TILE * 16>;
/* dq: q, dO, k, v tiles; per warp S and dP (16 x 16 floats each), dS (E) */
template <typename E, int HP>
using dq_tc_smem = tc_smem<E, HP, 4, 0, 2 * 256, 256>;
/* dk, dv: k, v, q, dO tiles; lse and D of the query tile; per warp S and dP (16 x 16 floats
 * each), P and dS (E) */
template <typename E, int HP>
using dkdv_tc_smem = tc_smem<E, HP, 4, 2 * TC_TILE, 2 * 256, 2 * 256>;

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

/* acc (16 x 16) += a b^T: a and b are 16 rows of HP elements in shared memory, `pitch` apart. */
template <typename E, int HP>
__device__ __forceinline__ void mma_abt(frag_acc &acc, const E *a, const E *b, int pitch) {
#pragma unroll
  for (int kd = 0; kd < HP / 16; kd++) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> fb; /* b^T */
    wmma::load_matrix_sync(fa, a + kd * 16, pitch);
    wmma::load_matrix_sync(fb, b + kd * 16, pitch);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

/* dst (16 x 16 floats in shared memory, column-major) = a b^T, as mma_abt. */
template <typename E, int HP>
__device__ __forceinline__ void abt_to_smem(float *dst, const E *a, const E *b, int pitch) {
  frag_acc acc;
  wmma::fill_fragment(acc, 0.0f);
  mma_abt<E, HP>(acc, a, b, pitch);
  wmma::store_matrix_sync(dst, acc, 16, wmma::mem_col_major);
}

/* acc (16 x HP) += a b: a (16 x 16) column-major with ldm 16 (a warp's P or dS block), b 16 rows
 * of HP elements in shared memory, `pitch` apart; acc[dd] holds columns 16 dd .. 16 dd + 15. */
template <typename E, int HP>
__device__ __forceinline__ void mma_ab(frag_acc (&acc)[HP / 16], const E *a, const E *b, int pitch) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::col_major> fa;
  wmma::load_matrix_sync(fa, a, 16);
#pragma unroll
  for (int dd = 0; dd < HP / 16; dd++) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, b + dd * 16, pitch);
    wmma::mma_sync(acc[dd], fa, fb, acc[dd]);
  }
}

/* Ms (16 x 16 floats) = x / 16 at x: loaded row-major as an accumulator it holds each element's row,
 * column-major its column. All threads of the block take part; a __syncthreads must follow. */
__device__ __forceinline__ void fill_index(float *Ms) {
  for (int x = threadIdx.x; x < 256; x += blockDim.x) Ms[x] = (float)(x / 16);
}

/* Rows r0 + (0..15), columns 0..hs-1 of dst (T, stride) = f * rs[row] * acc (16 x HP, acc[dd] its
 * columns 16 dd..); rows from T on are not written. rs: 16 row factors in shared memory, or NULL. */
template <int ND>
__device__ __forceinline__ void store_acc(float *dst, size_t stride, int r0, int T, int hs, const frag_acc (&acc)[ND],
                                          const float *Ms, const float *rs, float f) {
  frag_acc rows, cols;
  wmma::load_matrix_sync(rows, Ms, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(cols, Ms, 16, wmma::mem_col_major);
#pragma unroll
  for (int dd = 0; dd < ND; dd++)
#pragma unroll
    for (int e = 0; e < frag_acc::num_elements; e++) {
      const int r = (int)rows.x[e], c = dd * 16 + (int)cols.x[e];
      if (r0 + r < T && c < hs) dst[(size_t)(r0 + r) * stride + c] = f * (rs ? rs[r] : 1.0f) * acc[dd].x[e];
    }
}

/* grid (ceil(T/TC_ROWS), H, B); out (B,T,C), lse (B,H,T), qkv (B,T,3C) */
template <typename E, int HP>
__global__ void __launch_bounds__(32 * TC_WARPS)
    att_fwd_tc_kernel(float *out, float *lse, const float *qkv, int T, int C, int H, int Hkv, int window, float scale) {
#if TC_ARCH_OK
  typedef fwd_tc_smem<E, HP> L;
  constexpr int P = L::pitch, ND = HP / 16;
  extern __shared__ __align__(128) unsigned char tc_sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  E *Qs = (E *)tc_sm;                                              /* (TC_ROWS, P) */
  E *Ks = Qs + TC_ROWS * P;                                        /* (TC_TILE, P) */
  E *Vs = Ks + TC_TILE * P;                                        /* (TC_TILE, P) */
  float *Ms = (float *)(tc_sm + L::idx);                           /* (16, 16) */
  float *Rs = (float *)(tc_sm + L::vec) + warp * 16;               /* (16): row factors */
  float *Ss = (float *)(tc_sm + L::wf) + warp * (TC_TILE * 16);    /* (TC_TILE, 16): S^T */
  E *Ps = (E *)(tc_sm + L::we) + warp * (TC_TILE * 16);            /* (TC_TILE, 16): P^T */
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * TC_ROWS;
  const int r = lane % 16, half = lane / 16, i = i0 + warp * 16 + r; /* the lane's row */
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs,
              *k = qkv + (size_t)b * T * C3 + backend_key_col(C, H, Hkv, h), *v = k + hs * Hkv;

  load_rows(Qs, P, HP, q, C3, i0, TC_ROWS, T, hs);
  fill_index(Ms);
  frag_acc o[ND];
#pragma unroll
  for (int dd = 0; dd < ND; dd++) wmma::fill_fragment(o[dd], 0.0f);
  float m = -INFINITY, l = 0.0f; /* of row i, kept by both its lanes */
  const int i1 = min(i0 + TC_ROWS, T); /* the block's rows see keys [key_lo(i0), i1) */
  for (int j0 = key_lo(i0, window); j0 < i1; j0 += TC_TILE) {
    __syncthreads(); /* the previous tile is consumed (the first time: Qs, Ms are written) */
    load_rows(Ks, P, HP, k, C3, j0, TC_TILE, i1, hs);
    load_rows(Vs, P, HP, v, C3, j0, TC_TILE, i1, hs);
    __syncthreads();
    /* S (16 rows, TC_TILE keys) = q k^T, to Ss as (key, row) */
#pragma unroll
    for (int jj = 0; jj < TC_TILE / 16; jj++) abt_to_smem<E, HP>(Ss + jj * 256, Qs + warp * 16 * P, Ks + jj * 16 * P, P);
    __syncwarp();
    /* the lane's scores: Ss[32c + lane] is (row r, key j0 + 2c + half); -inf where not visible */
    float sv[TC_TILE / 2], mt = -INFINITY;
#pragma unroll
    for (int c = 0; c < TC_TILE / 2; c++) {
      sv[c] = i < T && visible(i, j0 + 2 * c + half, window) ? scale * Ss[32 * c + lane] : -INFINITY;
      mt = fmaxf(mt, sv[c]);
    }
    const float mn = fmaxf(m, fmaxf(mt, __shfl_xor_sync(GPU_FULL_MASK, mt, 16)));
    const float alpha = mn == -INFINITY ? 1.0f : expf(m - mn); /* no key seen yet: o is 0 */
    float ls = 0.0f;
#pragma unroll
    for (int c = 0; c < TC_TILE / 2; c++) {
      const E p = to_elem<E>(sv[c] == -INFINITY ? 0.0f : expf(sv[c] - mn));
      Ps[32 * c + lane] = p;
      ls += to_float(p); /* the sum of the rounded P that multiply v */
    }
    l = l * alpha + ls + __shfl_xor_sync(GPU_FULL_MASK, ls, 16);
    m = mn;
    if (half == 0) Rs[r] = alpha;
    __syncwarp();
    /* o = alpha o + P (16 rows, TC_TILE keys) v (TC_TILE keys, HP) */
    frag_acc rows;
    wmma::load_matrix_sync(rows, Ms, 16, wmma::mem_row_major);
#pragma unroll
    for (int dd = 0; dd < ND; dd++)
#pragma unroll
      for (int e = 0; e < frag_acc::num_elements; e++) o[dd].x[e] *= Rs[(int)rows.x[e]];
#pragma unroll
    for (int kk = 0; kk < TC_TILE / 16; kk++) mma_ab<E, HP>(o, Ps + kk * 256, Vs + kk * 16 * P, P);
  }
  __syncwarp(); /* every lane is done with Rs */
  if (half == 0) {
    Rs[r] = l > 0.0f ? 1.0f / l : 0.0f; /* l = 0 only for rows from T on */
    if (i < T) lse[((size_t)b * H + h) * T + i] = m + logf(l);
  }
  __syncwarp();
  store_acc(out + (size_t)b * T * C + (size_t)h * hs, C, i0 + warp * 16, T, hs, o, Ms, Rs, 1.0f);
#else
  tc_unused(out, lse, qkv, T, C, H, Hkv, window, scale);
#endif
}

/* grid (ceil(T/TC_ROWS), H, B); writes the q part of dqkv (B,T,3C) and D (B,H,T) */
template <typename E, int HP>
__global__ void __launch_bounds__(32 * TC_WARPS)
    att_bwd_dq_tc_kernel(float *dqkv, float *Dg, const float *dout, const float *out, const float *lse,
                         const float *qkv, int T, int C, int H, int Hkv, int window, float scale) {
#if TC_ARCH_OK
  typedef dq_tc_smem<E, HP> L;
  constexpr int P = L::pitch, ND = HP / 16;
  extern __shared__ __align__(128) unsigned char tc_sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  E *Qs = (E *)tc_sm;                                 /* (TC_ROWS, P) */
  E *dOs = Qs + TC_ROWS * P;                          /* (TC_ROWS, P) */
  E *Ks = dOs + TC_ROWS * P;                          /* (TC_TILE, P) */
  E *Vs = Ks + TC_TILE * P;                           /* (TC_TILE, P) */
  float *Ms = (float *)(tc_sm + L::idx);              /* (16, 16) */
  float *Ss = (float *)(tc_sm + L::wf) + warp * 512;  /* (16 keys, 16 rows): S^T */
  float *dPs = Ss + 256;                              /* (16 keys, 16 rows): dP^T */
  E *dSs = (E *)(tc_sm + L::we) + warp * 256;         /* (16 keys, 16 rows): dS^T */
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * TC_ROWS;
  const int r = lane % 16, half = lane / 16, i = i0 + warp * 16 + r; /* the lane's row */
  const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs,
              *k = qkv + (size_t)b * T * C3 + backend_key_col(C, H, Hkv, h), *v = k + hs * Hkv;
  const float *dO = dout + (size_t)b * T * C + (size_t)h * hs, *o = out + (size_t)b * T * C + (size_t)h * hs;

  load_rows(Qs, P, HP, q, C3, i0, TC_ROWS, T, hs);
  load_rows(dOs, P, HP, dO, C, i0, TC_ROWS, T, hs);
  fill_index(Ms);
  __syncthreads();
  /* D (fp32) of the warp's rows, from dO as rounded for dP = dO v^T: then sum_j P_ij (dP_ij - D_i)
   * stays ~0 as it should (FlashAttention's D uses its bf16 dO too). The lane keeps D and lse of
   * its row. */
  float Di = 0.0f;
  for (int rr = 0; rr < 16; rr++) {
    const int ii = i0 + warp * 16 + rr;
    if (ii >= T) break; /* the same for the whole warp */
    const float d = warp_dot(dOs + (warp * 16 + rr) * P, o + (size_t)ii * C, hs);
    if (lane == 0) Dg[((size_t)b * H + h) * T + ii] = d;
    if (r == rr) Di = d;
  }
  const float Li = i < T ? lse[((size_t)b * H + h) * T + i] : 0.0f;
  frag_acc dq[ND];
#pragma unroll
  for (int dd = 0; dd < ND; dd++) wmma::fill_fragment(dq[dd], 0.0f);
  const int i1 = min(i0 + TC_ROWS, T);
  for (int j0 = key_lo(i0, window); j0 < i1; j0 += TC_TILE) {
    __syncthreads();
    load_rows(Ks, P, HP, k, C3, j0, TC_TILE, i1, hs);
    load_rows(Vs, P, HP, v, C3, j0, TC_TILE, i1, hs);
    __syncthreads();
    for (int jj = 0; jj < TC_TILE / 16; jj++) {
      /* S, dP (16 rows, 16 keys) = q k^T, dO v^T, to Ss, dPs as (key, row) */
      abt_to_smem<E, HP>(Ss, Qs + warp * 16 * P, Ks + jj * 16 * P, P);
      abt_to_smem<E, HP>(dPs, dOs + warp * 16 * P, Vs + jj * 16 * P, P);
      __syncwarp();
      /* dS = P (dP - D), P = exp(scale s - lse): element 32c + lane is (row r, key 2c + half) */
#pragma unroll
      for (int c = 0; c < 8; c++) {
        const int x = 32 * c + lane, j = j0 + jj * 16 + 2 * c + half;
        float ds = 0.0f;
        if (i < T && visible(i, j, window)) ds = expf(scale * Ss[x] - Li) * (dPs[x] - Di);
        dSs[x] = to_elem<E>(ds);
      }
      __syncwarp();
      /* dq (16 rows, HP) += dS (16 rows, 16 keys) k (16 keys, HP) */
      mma_ab<E, HP>(dq, dSs, Ks + jj * 16 * P, P);
      __syncwarp(); /* dSs, Ss, dPs are read before the next block overwrites them */
    }
  }
  store_acc(dqkv + (size_t)b * T * C3 + (size_t)h * hs, C3, i0 + warp * 16, T, hs, dq, Ms, NULL, scale);
#else
  tc_unused(dqkv, Dg, dout, out, lse, qkv, T, C, H, Hkv, window, scale);
#endif
}

/* grid (ceil(T/TC_ROWS), Hkv, B): a block owns TC_ROWS keys of key/value head g; writes the k and v parts of dqkv,
 * summed over the group's query heads in turn */
template <typename E, int HP>
__global__ void __launch_bounds__(32 * TC_WARPS)
    att_bwd_dkdv_tc_kernel(float *dqkv, const float *Dg, const float *dout, const float *lse, const float *qkv,
                           int T, int C, int H, int Hkv, int window, float scale) {
#if TC_ARCH_OK
  typedef dkdv_tc_smem<E, HP> L;
  constexpr int P = L::pitch, ND = HP / 16;
  extern __shared__ __align__(128) unsigned char tc_sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  E *Ks = (E *)tc_sm;                                 /* (TC_ROWS, P) */
  E *Vs = Ks + TC_ROWS * P;                           /* (TC_ROWS, P) */
  E *Qs = Vs + TC_ROWS * P;                           /* (TC_TILE, P) */
  E *dOs = Qs + TC_TILE * P;                          /* (TC_TILE, P) */
  float *Ms = (float *)(tc_sm + L::idx);              /* (16, 16) */
  float *Ls = (float *)(tc_sm + L::vec);              /* (TC_TILE): lse of the query tile */
  float *Ds = Ls + TC_TILE;                           /* (TC_TILE): D of the query tile */
  float *Ss = (float *)(tc_sm + L::wf) + warp * 512;  /* (16 queries, 16 keys): S */
  float *dPs = Ss + 256;                              /* (16 queries, 16 keys): dP */
  E *Pt = (E *)(tc_sm + L::we) + warp * 512;          /* (16 queries, 16 keys): P */
  E *dSt = Pt + 256;                                  /* (16 queries, 16 keys): dS */
  const int hs = C / H, C3 = backend_qkv_width(C, H, Hkv), b = blockIdx.z, g = blockIdx.y, j0 = blockIdx.x * TC_ROWS;
  const int G = H / Hkv, r = lane % 16, half = lane / 16, j = j0 + warp * 16 + r; /* the lane's key */
  const float *k = qkv + (size_t)b * T * C3 + C + (size_t)g * hs, *v = k + hs * Hkv;

  load_rows(Ks, P, HP, k, C3, j0, TC_ROWS, T, hs);
  load_rows(Vs, P, HP, v, C3, j0, TC_ROWS, T, hs);
  fill_index(Ms);
  frag_acc dk[ND], dv[ND];
#pragma unroll
  for (int dd = 0; dd < ND; dd++) wmma::fill_fragment(dk[dd], 0.0f), wmma::fill_fragment(dv[dd], 0.0f);
  /* queries that see keys [j0, j1): i in [j0, j1 - 1 + window) for a local layer, [j0, T) globally */
  const int j1 = min(j0 + TC_ROWS, T);
  const int iend = window > 0 ? min(T, j1 - 1 + window) : T;
  for (int h = g * G; h < (g + 1) * G; h++) {
    const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *Lg = lse + ((size_t)b * H + h) * T, *D = Dg + ((size_t)b * H + h) * T;
    for (int it = j0; it < iend; it += TC_TILE) {
      __syncthreads();
      load_rows(Qs, P, HP, q, C3, it, TC_TILE, iend, hs);
      load_rows(dOs, P, HP, dO, C, it, TC_TILE, iend, hs);
      for (int x = threadIdx.x; x < TC_TILE; x += blockDim.x) {
        Ls[x] = it + x < iend ? Lg[it + x] : 0.0f;
        Ds[x] = it + x < iend ? D[it + x] : 0.0f;
      }
      __syncthreads();
      for (int ii = 0; ii < TC_TILE / 16; ii++) {
        /* S^T, dP^T (16 keys, 16 queries) = k q^T, v dO^T, to Ss, dPs as (query, key) */
        abt_to_smem<E, HP>(Ss, Ks + warp * 16 * P, Qs + ii * 16 * P, P);
        abt_to_smem<E, HP>(dPs, Vs + warp * 16 * P, dOs + ii * 16 * P, P);
        __syncwarp();
        /* P = exp(scale s - lse), dS = P (dP - D): element 32c + lane is (key r, query 2c + half) */
#pragma unroll
        for (int c = 0; c < 8; c++) {
          const int x = 32 * c + lane, iq = ii * 16 + 2 * c + half, i = it + iq;
          float p = 0.0f, ds = 0.0f;
          if (i < iend && visible(i, j, window)) {
            p = expf(scale * Ss[x] - Ls[iq]);
            ds = p * (dPs[x] - Ds[iq]);
          }
          Pt[x] = to_elem<E>(p);
          dSt[x] = to_elem<E>(ds);
        }
        __syncwarp();
        /* dv (16 keys, HP) += P^T (16 keys, 16 queries) dO (16 queries, HP); dk += dS^T q */
        mma_ab<E, HP>(dv, Pt, dOs + ii * 16 * P, P);
        mma_ab<E, HP>(dk, dSt, Qs + ii * 16 * P, P);
        __syncwarp(); /* Pt, dSt, Ss, dPs are read before the next block overwrites them */
      }
    }
  } /* the group's query heads */
  float *dkv = dqkv + (size_t)b * T * C3 + C + (size_t)g * hs;
  store_acc(dkv, C3, j0 + warp * 16, T, hs, dk, Ms, NULL, scale);
  store_acc(dkv + hs * Hkv, C3, j0 + warp * 16, T, hs, dv, Ms, NULL, 1.0f);
#else
  tc_unused(dqkv, Dg, dout, lse, qkv, T, C, H, Hkv, window, scale);
#endif
}

/* ---- launches -------------------------------------------------------------------------------- */

static size_t fwd_smem(int hp) { return (size_t)(ATT_ROWS * hp + ATT_TILE * (hp + 1) + ATT_TILE * hp) * sizeof(float); }
static size_t dq_smem(int hp) { return (size_t)(2 * ATT_ROWS * hp + 2 * ATT_TILE * (hp + 1)) * sizeof(float); }
static size_t dkdv_smem(int hp) {
  return (size_t)(2 * ATT_ROWS * hp + 2 * ATT_TILE * (hp + 1) + 2 * ATT_TILE) * sizeof(float);
}

/* Allow `kernel` the dynamic shared memory it needs (above 48 KiB needs the opt-in). */
template <typename K>
static void allow_smem(const gpu_ctx *g, K kernel, size_t bytes) {
  if (bytes > (size_t)g->prop.sharedMemPerBlockOptin)
    UTIL_FATAL("use more heads (a smaller head size n_embd / n_head)",
               "CUDA attention: %zu bytes of shared memory per block exceed this GPU's %zu", bytes,
               (size_t)g->prop.sharedMemPerBlockOptin);
  GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

size_t gpu_attention_scratch(int T) {
  (void)T;
  return 0; /* the kernels keep their tiles in shared memory; D (B,H,T) goes to the workspace */
}

size_t gpu_attention_workspace(int B, int T, int H) { return (size_t)B * H * T * sizeof(float); }

template <int NV>
static void fwd(gpu_ctx *g, float *out, float *lse, const float *qkv, int B, int T, int C, int H, int Hkv, int window,
                float scale) {
  dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, H, B);
  size_t smem = fwd_smem(32 * NV);
  static bool ready = false; /* the opt-in is set once per kernel */
  if (!ready) allow_smem(g, att_fwd_kernel<NV>, smem), ready = true;
  att_fwd_kernel<NV><<<grid, 32 * ATT_WARPS, smem>>>(out, lse, qkv, T, C, H, Hkv, window, scale);
  GPU_LAUNCHED();
}

template <int NV>
static void bwd(gpu_ctx *g, float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv, int B, int T,
                int C, int H, int Hkv, int window, float scale) {
  dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, H, B), kvgrid(grid.x, Hkv, B);
  float *D = (float *)gpu_workspace(g, gpu_attention_workspace(B, T, H)); /* (B,H,T) */
  size_t s1 = dq_smem(32 * NV), s2 = dkdv_smem(32 * NV);
  static bool ready = false;
  if (!ready) allow_smem(g, att_bwd_dq_kernel<NV>, s1), allow_smem(g, att_bwd_dkdv_kernel<NV>, s2), ready = true;
  att_bwd_dq_kernel<NV><<<grid, 32 * ATT_WARPS, s1>>>(dqkv, D, dout, out, lse, qkv, T, C, H, Hkv, window, scale);
  GPU_LAUNCHED();
  att_bwd_dkdv_kernel<NV><<<kvgrid, 32 * ATT_WARPS, s2>>>(dqkv, D, dout, lse, qkv, T, C, H, Hkv, window, scale);
  GPU_LAUNCHED();
}

template <typename E, int HP>
static void fwd_tc(gpu_ctx *g, float *out, float *lse, const float *qkv, int B, int T, int C, int H, int Hkv, int window,
                   float scale) {
  dim3 grid((T + TC_ROWS - 1) / TC_ROWS, H, B);
  size_t smem = fwd_tc_smem<E, HP>::bytes;
  static bool ready = false;
  if (!ready) allow_smem(g, att_fwd_tc_kernel<E, HP>, smem), ready = true;
  att_fwd_tc_kernel<E, HP><<<grid, 32 * TC_WARPS, smem>>>(out, lse, qkv, T, C, H, Hkv, window, scale);
  GPU_LAUNCHED();
}

template <typename E, int HP>
static void bwd_tc(gpu_ctx *g, float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv, int B, int T,
                   int C, int H, int Hkv, int window, float scale) {
  dim3 grid((T + TC_ROWS - 1) / TC_ROWS, H, B), kvgrid(grid.x, Hkv, B);
  float *D = (float *)gpu_workspace(g, gpu_attention_workspace(B, T, H)); /* (B,H,T) */
  size_t s1 = dq_tc_smem<E, HP>::bytes, s2 = dkdv_tc_smem<E, HP>::bytes;
  static bool ready = false;
  if (!ready) allow_smem(g, att_bwd_dq_tc_kernel<E, HP>, s1), allow_smem(g, att_bwd_dkdv_tc_kernel<E, HP>, s2), ready = true;
  att_bwd_dq_tc_kernel<E, HP><<<grid, 32 * TC_WARPS, s1>>>(dqkv, D, dout, out, lse, qkv, T, C, H, Hkv, window, scale);
  GPU_LAUNCHED();
  att_bwd_dkdv_tc_kernel<E, HP><<<kvgrid, 32 * TC_WARPS, s2>>>(dqkv, D, dout, lse, qkv, T, C, H, Hkv, window, scale);
  GPU_LAUNCHED();
}

/* Which kernels take a call: the tensor-core ones at bf16 and fp16 precision for head sizes 33..128
 * (zero-padded to 64 or 128) on compute capability 8.0 and newer; the fp32 ones otherwise. */
enum tc_kind { TC_NONE, TC_BF16, TC_FP16 };
static tc_kind tc_choice(const gpu_ctx *g, int hs) {
  if (hs <= 32 || hs > 128 || g->prop.major < 8) return TC_NONE;
  return g->prec == BACKEND_PREC_BF16 ? TC_BF16 : g->prec == BACKEND_PREC_FP16 ? TC_FP16 : TC_NONE;
}

enum { ATT_MAX_HEAD = 256, ATT_MAX_GRID = 65535 }; /* head sizes the kernels take; grid rows (heads, sequences) */

void gpu_attention_limits(int *head_size, int *heads, int *batch) {
  *head_size = ATT_MAX_HEAD;
  *heads = *batch = ATT_MAX_GRID;
}

/* The deck was checked against these limits (backends_check): here they are internal. */
static void check_shape(int B, int T, int C, int H) {
  UTIL_CHECK(C / H <= ATT_MAX_HEAD && H <= ATT_MAX_GRID && B <= ATT_MAX_GRID, NULL,
             "internal: CUDA attention of head size %d, %d heads, %d sequences (backends_check)", C / H, H, B);
  (void)T;
}

void gpu_attention_fwd(gpu_ctx *g, float *out, float *lse, const float *qkv, float *scratch, int B, int T, int C, int H,
                       int Hkv, int window, float scale) {
  (void)scratch;
  check_shape(B, T, C, H);
  int hs = C / H;
  switch (tc_choice(g, hs)) {
  case TC_BF16:
    if (hs <= 64) fwd_tc<__nv_bfloat16, 64>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    else fwd_tc<__nv_bfloat16, 128>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    return;
  case TC_FP16:
    if (hs <= 64) fwd_tc<__half, 64>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    else fwd_tc<__half, 128>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    return;
  case TC_NONE:
    break;
  }
  if (hs <= 32) fwd<1>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
  else if (hs <= 64) fwd<2>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
  else if (hs <= 128) fwd<4>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
  else fwd<8>(g, out, lse, qkv, B, T, C, H, Hkv, window, scale);
}

void gpu_attention_bwd(gpu_ctx *g, float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv,
                       float *scratch, int B, int T, int C, int H, int Hkv, int window, float scale) {
  (void)scratch;
  check_shape(B, T, C, H);
  int hs = C / H;
  switch (tc_choice(g, hs)) {
  case TC_BF16:
    if (hs <= 64) bwd_tc<__nv_bfloat16, 64>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    else bwd_tc<__nv_bfloat16, 128>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    return;
  case TC_FP16:
    if (hs <= 64) bwd_tc<__half, 64>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    else bwd_tc<__half, 128>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
    return;
  case TC_NONE:
    break;
  }
  if (hs <= 32) bwd<1>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
  else if (hs <= 64) bwd<2>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
  else if (hs <= 128) bwd<4>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
  else bwd<8>(g, dqkv, dout, out, lse, qkv, B, T, C, H, Hkv, window, scale);
}

/* ---- the KV cache (generation) ----------------------------------------------------------------- */

/* kc, vc (nseq, ring, Ckv): row r's k and v (of qkv (N,C+2Ckv)) into row pos[r] % ring of sequence seq[r] */
template <typename S>
__global__ void kv_store_kernel(S *kc, S *vc, const S *qkv, const int32_t *seq, const int32_t *pos, int C, int Ckv,
                                int ring, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)Ckv, c = i % (size_t)Ckv, W = (size_t)C + 2 * (size_t)Ckv;
    size_t at = ((size_t)seq[r] * ring + (size_t)(pos[r] % ring)) * Ckv + c;
    kc[at] = qkv[r * W + C + c];
    vc[at] = qkv[r * W + C + Ckv + c];
  }
}

void gpu_kv_store(backend_dtype t, void *kc, void *vc, const void *qkv, const int32_t *seq, const int32_t *pos, int N,
                  int C, int Ckv, int ring) {
  size_t n = (size_t)N * Ckv;
  GPU_STORAGE(t, kv_store_kernel<S><<<gpu_blocks(n, 256), 256>>>((S *)kc, (S *)vc, (const S *)qkv, seq, pos, C, Ckv,
                                                                  ring, n));
  GPU_LAUNCHED();
}

enum { KV_MAXD = 8 /* head dimensions per lane: head sizes up to 256 */, KV_WARPS = 4 };

/* One warp per (row, head): lane holds dimensions lane + 32 i of q and of the output; the visible
 * keys are visited in order with an online softmax (running max m, sum l, rescaled accumulator). */
template <typename S>
__global__ void attention_cached_kernel(S *out, const S *qkv, const S *kc, const S *vc, const int32_t *seq,
                                        const int32_t *pos, int N, int C, int H, int Hkv, int ring, int window,
                                        float scale) {
  const int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
  if (warp >= N * H) return; /* the whole warp leaves */
  const int r = warp / H, h = warp % H, hs = C / H, p = pos[r];
  const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  const int Ckv = hs * Hkv;
  const S *q = qkv + (size_t)r * backend_qkv_width(C, H, Hkv) + h * hs;
  /* the key head's columns in a cache row */
  const size_t base = (size_t)seq[r] * ring * Ckv + (size_t)(backend_key_col(C, H, Hkv, h) - C);
  float qr[KV_MAXD], acc[KV_MAXD], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int i = 0; i < KV_MAXD; i++) {
    int d = lane + 32 * i;
    qr[i] = d < hs ? ld(q[d]) : 0.0f;
    acc[i] = 0.0f;
  }
  for (int j = lo; j <= p; j++) {
    const S *k = kc + base + (size_t)(j % ring) * Ckv, *v = vc + base + (size_t)(j % ring) * Ckv;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < KV_MAXD; i++) {
      int d = lane + 32 * i;
      if (d < hs) s += qr[i] * ld(k[d]);
    }
    s = scale * gpu_warp_sum(s);
    const float mn = fmaxf(m, s), c = expf(m - mn), e = expf(s - mn);
    l = l * c + e;
#pragma unroll
    for (int i = 0; i < KV_MAXD; i++) {
      int d = lane + 32 * i;
      if (d < hs) acc[i] = acc[i] * c + e * ld(v[d]);
    }
    m = mn;
  }
  S *o = out + (size_t)r * C + h * hs;
#pragma unroll
  for (int i = 0; i < KV_MAXD; i++) {
    int d = lane + 32 * i;
    if (d < hs) o[d] = st<S>(acc[i] / l);
  }
}

void gpu_attention_cached(backend_dtype t, void *out, const void *qkv, const void *kc, const void *vc,
                          const int32_t *seq, const int32_t *pos, int N, int C, int H, int Hkv, int ring,
                          int window, float scale) {
  UTIL_CHECK(C / H <= 32 * KV_MAXD, NULL, "internal: attention_cached takes head sizes up to %d, not %d", 32 * KV_MAXD,
             C / H);
  const unsigned blocks = (unsigned)(((size_t)N * H + KV_WARPS - 1) / KV_WARPS);
  GPU_STORAGE(t, attention_cached_kernel<S><<<blocks, 32 * KV_WARPS>>>((S *)out, (const S *)qkv, (const S *)kc,
                                                                        (const S *)vc, seq, pos, N, C, H, Hkv, ring, window,
                                                                        scale));
  GPU_LAUNCHED();
}
