/* gpu_ops: embedding, LayerNorm, RMSNorm, gelu_new, SwiGLU, rotary embedding, residual, softmax cross-entropy (whole and
 * vocabulary-parallel), AdamW, the sum of squares and the storage conversions on the device; the
 * formulas are cpu/cpu_ops.c's. Every kernel that touches activations is a template on their
 * storage type S (gpu.h: ld, st): fp32 arithmetic, one rounding on store. */
#include "gpu.h"

#include <math.h>

/* ---- embedding ------------------------------------------------------------------------------- */

/* out (B,T,C) = wte[tok[b,t] - v0] + wpe[t]: wte (nv,C) holds the vocabulary rows [v0, v0 + nv), a
 * token outside them adds nothing; wpe NULL: not added */
template <typename S>
__global__ void embed_fwd_kernel(S *out, const int32_t *tok, const S *wte, const S *wpe, int T, int C, int v0, int nv,
                                 size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t row = i / (size_t)C; /* b*T + t */
    int c = (int)(i % (size_t)C), t = (int)(row % (size_t)T), r = tok[row] - v0;
    float x = r >= 0 && r < nv ? ld(wte[(size_t)r * C + c]) : 0.0f;
    if (wpe) x += ld(wpe[(size_t)t * C + c]);
    out[i] = st<S>(x);
  }
}

/* dwte (nv,C) [tok[b,t] - v0] += dout[b,t] for the tokens of the shard, without atomics: the rows are
 * sorted by (token, row), so that each token's rows lie together in row order, and a block sums a
 * run of 256 columns of them in that order (the same bits every run). The sort key of row i is the
 * token's row in the shard (nv for a token outside it: those sort last and add nothing) above i. */
static size_t sort_rows(size_t n) { /* the power of two the bitonic sort takes */
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

size_t gpu_embed_workspace(int N) { return sort_rows((size_t)N) * sizeof(uint64_t); }

__global__ void embed_keys_kernel(uint64_t *key, const int32_t *tok, size_t n, size_t np, int v0, int nv) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < np; i += (size_t)gridDim.x * blockDim.x) {
    int r = i < n ? tok[i] - v0 : nv;
    key[i] = i < n ? (uint64_t)(r >= 0 && r < nv ? r : nv) << 32 | i : UINT64_MAX;
  }
}

/* The bitonic sort of key (np, a power of two), ascending: the compare-exchange steps (k, j) with j
 * below a tile of SORT_TILE keys run in shared memory, a block per tile, all of them for k up to the
 * tile (k = 0) or those of one larger k; the others one kernel per step. np = 8192 takes 10 kernels. */
enum { SORT_TILE = 1024 };

__global__ void bitonic_tile_kernel(uint64_t *key, unsigned tile, size_t k) {
  __shared__ uint64_t s[SORT_TILE];
  const size_t base = (size_t)blockIdx.x * tile;
  const unsigned i = threadIdx.x;
  s[i] = key[base + i];
  __syncthreads();
  for (size_t kk = k ? k : 2; kk <= (k ? k : tile); kk <<= 1)
    for (unsigned j = (unsigned)(kk < tile ? kk : tile) >> 1; j > 0; j >>= 1) {
      const unsigned l = i ^ j;
      if (l > i) {
        uint64_t a = s[i], b = s[l];
        if ((((base + i) & kk) == 0) == (a > b)) s[i] = b, s[l] = a;
      }
      __syncthreads();
    }
  key[base + i] = s[i];
}

__global__ void bitonic_step_kernel(uint64_t *key, size_t np, size_t k, size_t j) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < np; i += (size_t)gridDim.x * blockDim.x) {
    size_t l = i ^ j;
    if (l <= i) continue;
    uint64_t a = key[i], b = key[l];
    if (((i & k) == 0) == (a > b)) key[i] = b, key[l] = a;
  }
}

/* block (p, column chunk): where sorted row p starts a token's run, that chunk of the run's sum */
template <typename S>
__global__ void embed_bwd_wte_kernel(float *dwte, const S *dout, const uint64_t *key, size_t n, int C, int nv) {
  const size_t p = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const uint64_t r = key[p] >> 32;
  if (r >= (uint64_t)nv || c >= C || (p > 0 && key[p - 1] >> 32 == r)) return;
  float s = 0.0f;
  for (size_t q = p; q < n && key[q] >> 32 == r; q++) s += ld(dout[(key[q] & 0xffffffffu) * C + c]);
  dwte[r * C + c] += s;
}

/* dwpe[t] += sum_b dout[b,t]: one thread per (t,c), summing over b in order */
template <typename S>
__global__ void embed_bwd_wpe_kernel(float *dwpe, const S *dout, int B, int T, int C) {
  size_t n = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += ld(dout[(size_t)b * n + i]);
    dwpe[i] += s;
  }
}

void gpu_embed_fwd(backend_dtype t, void *out, const int32_t *tok, const void *wte, const void *wpe, int B, int T,
                   int C, int v0, int nv) {
  size_t n = (size_t)B * T * C;
  GPU_STORAGE(t, embed_fwd_kernel<S><<<gpu_blocks(n, 256), 256>>>((S *)out, tok, (const S *)wte, (const S *)wpe, T, C,
                                                                  v0, nv, n));
  GPU_LAUNCHED();
}

void gpu_embed_bwd(gpu_ctx *g, backend_dtype t, float *dwte, float *dwpe, const void *dout, const int32_t *tok, int B,
                   int T, int C, int v0, int nv) {
  const size_t n = (size_t)B * T, np = sort_rows(n);
  uint64_t *key = (uint64_t *)gpu_workspace(g, gpu_embed_workspace(B * T));
  embed_keys_kernel<<<gpu_blocks(np, 256), 256>>>(key, tok, n, np, v0, nv);
  GPU_LAUNCHED();
  const unsigned tile = np < SORT_TILE ? (unsigned)np : (unsigned)SORT_TILE;
  bitonic_tile_kernel<<<(unsigned)(np / tile), tile>>>(key, tile, 0);
  GPU_LAUNCHED();
  for (size_t k = 2 * (size_t)tile; k <= np; k <<= 1) {
    for (size_t j = k >> 1; j >= tile; j >>= 1) {
      bitonic_step_kernel<<<gpu_blocks(np, 256), 256>>>(key, np, k, j);
      GPU_LAUNCHED();
    }
    bitonic_tile_kernel<<<(unsigned)(np / tile), tile>>>(key, tile, k);
    GPU_LAUNCHED();
  }
  if (n > 0) {
    GPU_STORAGE(t, embed_bwd_wte_kernel<S><<<dim3((unsigned)n, (C + 255) / 256), 256>>>(dwte, (const S *)dout, key, n, C,
                                                                                        nv));
    GPU_LAUNCHED();
  }
  if (!dwpe) return;
  GPU_STORAGE(t, embed_bwd_wpe_kernel<S><<<gpu_blocks((size_t)T * C, 256), 256>>>(dwpe, (const S *)dout, B, T, C));
  GPU_LAUNCHED();
}

/* ---- LayerNorm: one warp per row --------------------------------------------------------------- */

enum { LN_WARPS = 8 };

/* The warp-per-row kernels' lanes take W consecutive elements at a time (gpu_load, gpu_store): 16
 * bytes at 16-bit storage where C and the arrays allow it, else 1. */

/* out (N,C) = (x - mean) * rstd * w + b; mean, rstd (N). x is inp; with ra and rb (the fused residual)
 * x = ra + rb is formed first and stored into inp (rounded), and the statistics are those of the
 * stored value: residual_fwd then layernorm_fwd, bit for bit. */
template <typename S, int W>
__global__ void layernorm_fwd_kernel(S *out, float *mean, float *rstd, S *inp, const S *ra, const S *rb, const S *w,
                                     const S *b, int N, int C, float eps) {
  int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t at = (size_t)row * C;
  S *x = inp + at, *o = out + at;
  float s = 0.0f, v[W], p[W], q[W];
  for (int c = lane * W; c < C; c += 32 * W) {
    if (ra) { /* stored, then read back below by this lane only */
      gpu_load<W>(p, ra + at + c), gpu_load<W>(q, rb + at + c);
      for (int k = 0; k < W; k++) v[k] = ld(st<S>(p[k] + q[k]));
      gpu_store<W>(x + c, v);
    } else {
      gpu_load<W>(v, x + c);
    }
    for (int k = 0; k < W; k++) s += v[k];
  }
  const float m = gpu_warp_sum(s) / (float)C;
  float var = 0.0f; /* two passes over the row, as on the CPU */
  for (int c = lane * W; c < C; c += 32 * W) {
    gpu_load<W>(v, x + c);
    for (int k = 0; k < W; k++) var += (v[k] - m) * (v[k] - m);
  }
  const float r = 1.0f / sqrtf(gpu_warp_sum(var) / (float)C + eps);
  for (int c = lane * W; c < C; c += 32 * W) {
    gpu_load<W>(v, x + c), gpu_load<W>(p, w + c), gpu_load<W>(q, b + c);
    for (int k = 0; k < W; k++) v[k] = (v[k] - m) * r * p[k] + q[k];
    gpu_store<W>(o + c, v);
  }
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

/* dinp (N,C) += the gradient through LayerNorm (mean NULL: through RMSNorm, m = 0): one warp per row, no atomics */
template <typename S, int W>
__global__ void layernorm_bwd_dx_kernel(S *dinp, const S *dout, const S *inp, const S *w, const float *mean,
                                        const float *rstd, int N, int C) {
  const int lane = threadIdx.x % 32, row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
  if (row >= N) return;
  const S *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
  S *dx = dinp + (size_t)row * C;
  const float m = mean ? mean[row] : 0.0f, r = rstd[row];
  float s1 = 0.0f, s2 = 0.0f, xv[W], dv[W], wv[W], o[W]; /* sums of dnorm and dnorm * norm, dnorm = dout * w */
  for (int c = lane * W; c < C; c += 32 * W) {
    gpu_load<W>(xv, x + c), gpu_load<W>(dv, d + c), gpu_load<W>(wv, w + c);
    for (int k = 0; k < W; k++) {
      float n = (xv[k] - m) * r, dn = dv[k] * wv[k];
      s1 += dn;
      s2 += dn * n;
    }
  }
  s1 = mean ? gpu_warp_sum(s1) / (float)C : 0.0f; /* RMSNorm's (mean NULL) has no sum of dnorm */
  s2 = gpu_warp_sum(s2) / (float)C;
  for (int c = lane * W; c < C; c += 32 * W) {
    gpu_load<W>(xv, x + c), gpu_load<W>(dv, d + c), gpu_load<W>(wv, w + c), gpu_load<W>(o, dx + c);
    for (int k = 0; k < W; k++) {
      float n = (xv[k] - m) * r, dn = dv[k] * wv[k];
      o[k] += (dn - s1 - n * s2) * r;
    }
    gpu_store<W>(dx + c, o);
  }
}

/* dw (C) += the column sums of dout * norm, db (C) += those of dout, in two kernels without atomics (the
 * same bits every run): a block of (32, LN_SUM_ROWS) threads sums a tile of 32 W columns over a chunk
 * of rows, its rows of threads added in a fixed order, into the chunk's partials (workspace, (R,2,C));
 * then the R partials of each column are added in order. */
enum { LN_SUM_ROWS = 8, LN_CHUNK = 64 /* rows per chunk, at least */, LN_CHUNKS = 128 /* at most */ };

static int ln_chunks(int N) {
  int r = (N + LN_CHUNK - 1) / LN_CHUNK;
  return r < 1 ? 1 : r > LN_CHUNKS ? LN_CHUNKS : r;
}

size_t gpu_layernorm_workspace(int N, int C) { return (size_t)ln_chunks(N) * 2 * C * sizeof(float); }

template <typename S, int W>
__global__ void layernorm_bwd_part_kernel(float *part, const S *dout, const S *inp, const float *mean,
                                          const float *rstd, int N, int C) {
  __shared__ float pw[LN_SUM_ROWS][32 * W], pb[LN_SUM_ROWS][32 * W];
  const int R = gridDim.y, per = (N + R - 1) / R, r0 = blockIdx.y * per, r1 = min(N, r0 + per);
  const int col = (blockIdx.x * 32 + threadIdx.x) * W, x = threadIdx.x * W, y = threadIdx.y;
  float sw[W] = {0}, sb[W] = {0}, d[W], v[W];
  if (col < C)
    for (int r = r0 + y; r < r1; r += LN_SUM_ROWS) {
      gpu_load<W>(d, dout + (size_t)r * C + col), gpu_load<W>(v, inp + (size_t)r * C + col);
      const float m = mean ? mean[r] : 0.0f, rs = rstd[r];
      for (int k = 0; k < W; k++) sw[k] += d[k] * (v[k] - m) * rs, sb[k] += d[k];
    }
  for (int k = 0; k < W; k++) pw[y][x + k] = sw[k], pb[y][x + k] = sb[k];
  __syncthreads();
  if (y == 0 && col < C) {
    float *out = part + (size_t)blockIdx.y * 2 * C;
    for (int k = 0; k < W && col + k < C; k++) {
      float tw = 0.0f, tb = 0.0f;
      for (int j = 0; j < LN_SUM_ROWS; j++) tw += pw[j][x + k], tb += pb[j][x + k];
      out[col + k] = tw, out[C + col + k] = tb;
    }
  }
}

__global__ void layernorm_bwd_sum_kernel(float *dw, float *db, const float *part, int R, int C, int acc) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float tw = 0.0f, tb = 0.0f;
    for (int r = 0; r < R; r++) tw += part[(size_t)r * 2 * C + c], tb += part[(size_t)r * 2 * C + C + c];
    dw[c] = acc ? dw[c] + tw : tw;
    if (db) db[c] = acc ? db[c] + tb : tb;
  }
}

void gpu_layernorm_fwd(backend_dtype t, void *out, float *mean, float *rstd, const void *inp, const void *w,
                       const void *b, int N, int C, float eps) {
  gpu_residual_layernorm_fwd(t, (void *)inp, out, mean, rstd, NULL, NULL, w, b, N, C, eps); /* inp only read */
}

/* The lanes' width for rows of C elements at these addresses: 16 bytes at 16-bit storage where C and
 * every address allow it (fp32 storage keeps the scalar accesses measured on a GPU so far). */
template <typename S>
static bool ln_vec(int C, const void *p0, const void *p1, const void *p2, const void *p3, const void *p4) {
  return sizeof(S) == 2 && C % gpu_vec<S>() == 0 && gpu_aligned16(p0) && gpu_aligned16(p1) && gpu_aligned16(p2) &&
         gpu_aligned16(p3) && gpu_aligned16(p4);
}

void gpu_residual_layernorm_fwd(backend_dtype t, void *res, void *out, float *mean, float *rstd, const void *a,
                                const void *b, const void *w, const void *bias, int N, int C, float eps) {
  const unsigned blocks = (N + LN_WARPS - 1) / LN_WARPS;
  GPU_STORAGE(t, {
    auto k = ln_vec<S>(C, res, out, a, b, w) && gpu_aligned16(bias) ? layernorm_fwd_kernel<S, gpu_vec<S>()>
                                                                       : layernorm_fwd_kernel<S, 1>;
    k<<<blocks, 32 * LN_WARPS>>>((S *)out, mean, rstd, (S *)res, (const S *)a, (const S *)b, (const S *)w,
                                 (const S *)bias, N, C, eps);
  });
  GPU_LAUNCHED();
}

void gpu_layernorm_bwd(gpu_ctx *g, backend_dtype t, void *dinp, float *dw, float *db, const void *dout,
                       const void *inp, const void *w, const float *mean, const float *rstd, int N, int C, int acc) {
  if (N <= 0 && !acc) { /* no rows: the gradients written are zero */
    GPU_CHECK(cudaMemsetAsync(dw, 0, (size_t)C * sizeof(float)));
    if (db) GPU_CHECK(cudaMemsetAsync(db, 0, (size_t)C * sizeof(float)));
  }
  if (N <= 0) return;
  GPU_STORAGE(t, {
    auto k = ln_vec<S>(C, dinp, dout, inp, w, NULL) ? layernorm_bwd_dx_kernel<S, gpu_vec<S>()>
                                                    : layernorm_bwd_dx_kernel<S, 1>;
    k<<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS>>>((S *)dinp, (const S *)dout, (const S *)inp, (const S *)w, mean,
                                                        rstd, N, C);
  });
  GPU_LAUNCHED();
  const int R = ln_chunks(N);
  float *part = (float *)gpu_workspace(g, gpu_layernorm_workspace(N, C));
  GPU_STORAGE(t, {
    const bool v = ln_vec<S>(C, dout, inp, NULL, NULL, NULL);
    const int W = v ? gpu_vec<S>() : 1;
    auto k = v ? layernorm_bwd_part_kernel<S, gpu_vec<S>()> : layernorm_bwd_part_kernel<S, 1>;
    k<<<dim3((C + 32 * W - 1) / (32 * W), R), dim3(32, LN_SUM_ROWS)>>>(part, (const S *)dout, (const S *)inp, mean,
                                                                      rstd, N, C);
  });
  GPU_LAUNCHED();
  layernorm_bwd_sum_kernel<<<gpu_blocks((size_t)C, 256), 256>>>(dw, db, part, R, C, acc);
  GPU_LAUNCHED();
}

/* out (N,C) = w * (x * rstd rounded to S), rstd (N) = 1 / sqrt(mean(x^2) + eps): one warp per row */
template <typename S>
__global__ void rmsnorm_fwd_kernel(S *out, float *rstd, const S *inp, const S *w, int N, int C, float eps) {
  const int row = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const S *x = inp + (size_t)row * C;
  S *o = out + (size_t)row * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += ld(x[c]) * ld(x[c]);
  const float r = 1.0f / sqrtf(gpu_warp_sum(ss) / (float)C + eps);
  for (int c = lane; c < C; c += 32) o[c] = st<S>(ld(st<S>(ld(x[c]) * r)) * ld(w[c]));
  if (lane == 0) rstd[row] = r;
}

void gpu_rmsnorm_fwd(backend_dtype t, void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps) {
  if (N <= 0) return;
  GPU_STORAGE(t, rmsnorm_fwd_kernel<S><<<(N + LN_WARPS - 1) / LN_WARPS, 32 * LN_WARPS>>>(
                     (S *)out, rstd, (const S *)inp, (const S *)w, N, C, eps));
  GPU_LAUNCHED();
}

/* ---- elementwise ----------------------------------------------------------------------------- */

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* The maps, in fp32: x the first input, y the second. */
struct gelu_fwd_f {
  __device__ float operator()(float x, float) const { return 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_A * x * x * x))); }
};
struct gelu_bwd_f { /* x = dout, y = the pre-activation */
  __device__ float operator()(float d, float x) const {
    float t = tanhf(GELU_S * (x + GELU_A * x * x * x));
    float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
    return d * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
};
#define GELU_R 0.7071067811865476f /* 1/sqrt(2) */
#define GELU_P 0.3989422804014327f /* 1/sqrt(2 pi) */
struct gelu_erf_fwd_f {
  __device__ float operator()(float x, float) const { return 0.5f * x * (1.0f + erff(x * GELU_R)); }
};
struct gelu_erf_bwd_f { /* x = dout, y = the pre-activation */
  __device__ float operator()(float d, float x) const {
    return d * (0.5f * (1.0f + erff(x * GELU_R)) + x * GELU_P * expf(-0.5f * x * x));
  }
};
struct add_f {
  __device__ float operator()(float x, float y) const { return x + y; }
};

/* out (n) = f(x, y) elementwise (y NULL: f(x, 0)). With vec (every pointer 16-byte aligned) each
 * thread moves 16 bytes of each array at a time, then the tail one by one. out may alias x or y:
 * each element is read before it is written, by the same thread. */
template <typename S, typename F>
__global__ void map_kernel(S *out, const S *x, const S *y, size_t n, int vec, F f) {
  const size_t step = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  constexpr int W = gpu_vec<S>();
  const size_t nv = vec ? n / W : 0;
  for (size_t i = tid; i < nv; i += step) {
    float a[W], b[W] = {0};
    gpu_load<W>(a, x + i * W);
    if (y) gpu_load<W>(b, y + i * W);
    for (int k = 0; k < W; k++) a[k] = f(a[k], b[k]);
    gpu_store<W>(out + i * W, a);
  }
  for (size_t i = nv * W + tid; i < n; i += step) out[i] = st<S>(f(ld(x[i]), y ? ld(y[i]) : 0.0f));
}

template <typename S, typename F>
static void map(void *out, const void *x, const void *y, size_t n, F f) {
  const int vec = gpu_aligned16(out) && gpu_aligned16(x) && gpu_aligned16(y);
  map_kernel<S, F><<<gpu_blocks(vec ? n / gpu_vec<S>() + 1 : n, 256), 256>>>((S *)out, (const S *)x, (const S *)y, n,
                                                                            vec, f);
  GPU_LAUNCHED();
}

/* dst (n) = src (n), converted: fp32 <-> the storage type */
template <typename D, typename E>
__global__ void convert_kernel(D *dst, const E *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = st<D>(ld(src[i]));
}

void gpu_gelu_fwd(backend_dtype t, void *out, const void *inp, size_t n, int act) {
  if (act == BACKEND_GELU_ERF) GPU_STORAGE(t, map<S>(out, inp, NULL, n, gelu_erf_fwd_f()));
  else GPU_STORAGE(t, map<S>(out, inp, NULL, n, gelu_fwd_f()));
}

void gpu_gelu_bwd(backend_dtype t, void *dinp, const void *dout, const void *inp, size_t n, int act) {
  if (act == BACKEND_GELU_ERF) GPU_STORAGE(t, map<S>(dinp, dout, inp, n, gelu_erf_bwd_f()));
  else GPU_STORAGE(t, map<S>(dinp, dout, inp, n, gelu_bwd_f()));
}

/* SwiGLU, one thread per (row, unit j): h (N,F) = silu(g) u, or dgu (N,2F) = [dh u silu'(g) | dh silu(g)], from
 * gu (N,2F) = [g | u] */
template <typename S>
__global__ void swiglu_kernel(S *h, S *dgu, const S *dh, const S *gu, int N, int F) {
  const size_t n = (size_t)N * F;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t r = e / F, j = e % F, at = r * 2 * F + j;
    const float g = ld(gu[at]), u = ld(gu[at + F]), sg = 1.0f / (1.0f + expf(-g)), silu = g / (1.0f + expf(-g));
    if (h) {
      h[e] = st<S>(silu * u);
    } else {
      const float d = ld(dh[e]);
      dgu[at] = st<S>(d * u * sg * (1.0f + g * (1.0f - sg)));
      dgu[at + F] = st<S>(d * silu);
    }
  }
}

void gpu_swiglu(backend_dtype t, void *h, void *dgu, const void *dh, const void *gu, int N, int F) {
  const size_t n = (size_t)N * F;
  if (n == 0) return;
  GPU_STORAGE(t, swiglu_kernel<S><<<gpu_blocks(n, 256), 256>>>((S *)h, (S *)dgu, (const S *)dh, (const S *)gu, N, F));
  GPU_LAUNCHED();
}

/* ---- rotary embedding ------------------------------------------------------------------------ */

/* One thread per (row, pair i): the angle of pair i at the row's position in fp32 as the CPU reference forms it
 * (backend_rope_inv_freq, times the position), its cos and sin in full precision, applied to pair i of every
 * head of q and k. */
template <typename S>
__global__ void rope_kernel(S *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot, backend_rope rope,
                            int sign) {
  const int half = rot / 2, hs = C / H, W = backend_qkv_width(C, H, Hkv);
  const size_t n = (size_t)N * half;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const int r = (int)(e / half), i = (int)(e % half);
    const float p = (float)(pos ? pos[r] : r % T);
    const float inv = backend_rope_inv_freq(&rope, i, rot);
    double sd, cd;
    sincos((double)(p * inv), &sd, &cd);
    const float c = (float)cd, s = (float)sd * (float)sign;
    for (int h = 0; h < H + Hkv; h++) { /* q's heads, then k's (columns C + (h - H) hs) */
      S *x = qkv + (size_t)r * W + (size_t)h * hs;
      const float a = ld(x[i]), b = ld(x[i + half]);
      x[i] = st<S>(a * c - b * s);
      x[i + half] = st<S>(b * c + a * s);
    }
  }
}

void gpu_rope(backend_dtype t, void *qkv, const int32_t *pos, int N, int T, int C, int H, int Hkv, int rot,
              const backend_rope *rope, int sign) {
  const size_t n = (size_t)N * (rot / 2);
  if (n == 0) return;
  GPU_STORAGE(t, rope_kernel<S><<<gpu_blocks(n, 256), 256>>>((S *)qkv, pos, N, T, C, H, Hkv, rot, *rope, sign));
  GPU_LAUNCHED();
}

void gpu_residual_fwd(backend_dtype t, void *out, const void *a, const void *b, size_t n) {
  GPU_STORAGE(t, map<S>(out, a, b, n, add_f()));
}

void gpu_accumulate(backend_dtype t, void *dst, const void *src, size_t n) {
  GPU_STORAGE(t, map<S>(dst, dst, src, n, add_f()));
}

void gpu_to_storage(backend_dtype t, void *dst, const float *src, size_t n) {
  if (n == 0) return;
  GPU_STORAGE(t, convert_kernel<S, float><<<gpu_blocks(n, 256), 256>>>((S *)dst, src, n));
  GPU_LAUNCHED();
}

void gpu_to_fp32(backend_dtype t, float *dst, const void *src, size_t n) {
  if (n == 0) return;
  GPU_STORAGE(t, convert_kernel<float, S><<<gpu_blocks(n, 256), 256>>>(dst, (const S *)src, n));
  GPU_LAUNCHED();
}

/* ---- softmax + cross-entropy: one block per row ------------------------------------------------- */

enum { XENT_THREADS = 512 };

/* (m, s) <- the log-sum-exp pair of both: s * exp(m) + s2 * exp(m2) = s' * exp(m') */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
  float M = fmaxf(m, m2);
  if (M == -INFINITY) return;
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

/* The log-sum-exp pair of row x (V) over the block, in every thread: M its maximum, *sum the sum of
 * exp(x - M). One pass finds both (online softmax); every thread of the block must call it. */
template <typename S>
__device__ void xent_row_lse(const S *x, int V, float *M, float *sum) {
  __shared__ float sm[XENT_THREADS / 32], ss[XENT_THREADS / 32];
  __shared__ float row_m, row_s;
  float m = -INFINITY, s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float xv = ld(x[v]);
    if (xv > m) {
      s = s * expf(m - xv) + 1.0f;
      m = xv;
    } else {
      s += expf(xv - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(GPU_FULL_MASK, m, o), s2 = __shfl_xor_sync(GPU_FULL_MASK, s, o);
    lse_merge(m, s, m2, s2);
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float bm = sm[0], bs = ss[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) lse_merge(bm, bs, sm[w], ss[w]);
    row_m = bm;
    row_s = bs;
  }
  __syncthreads();
  *M = row_m;
  *sum = row_s;
}

/* losses (N) = logsumexp(logits[i]) - logits[i, targets[i]]; with dscale != 0 the logits (N,V; rows
 * ldr apart) become dscale * (softmax - onehot(target)), written in a second pass. */
template <typename S>
__global__ void xent_kernel(float *losses, S *logits, const int32_t *targets, int V, int ldr, float dscale) {
  S *x = logits + (size_t)blockIdx.x * ldr;
  const int tgt = targets[blockIdx.x];
  const float xt = ld(x[tgt]); /* read before any thread overwrites the row */
  float M, sum;
  xent_row_lse(x, V, &M, &sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = M + logf(sum) - xt;
  if (dscale != 0.0f) {
    const float k = dscale / sum;
    for (int v = threadIdx.x; v < V; v += blockDim.x) x[v] = st<S>(expf(ld(x[v]) - M) * k - (v == tgt ? dscale : 0.0f));
  }
}

/* The vocabulary shard [v0, v0 + nv) of each row of logits (N,nv; rows ldr apart): part (N,2) = {its
 * log-sum-exp, the target's logit when the shard holds it, else 0} */
template <typename S>
__global__ void xent_part_kernel(float *part, const S *logits, const int32_t *targets, int nv, int v0, int ldr) {
  const S *x = logits + (size_t)blockIdx.x * ldr;
  float M, sum;
  xent_row_lse(x, nv, &M, &sum);
  if (threadIdx.x == 0) {
    int r = targets[blockIdx.x] - v0;
    part[2 * (size_t)blockIdx.x] = M + logf(sum);
    part[2 * (size_t)blockIdx.x + 1] = r >= 0 && r < nv ? ld(x[r]) : 0.0f;
  }
}

/* logits (N,nv; rows ldr apart) = dscale * (exp(logits - lse[i]) - onehot(targets[i] - v0)), lse (N)
 * the rows' log-sum-exp over the whole vocabulary */
template <typename S>
__global__ void xent_grad_kernel(S *logits, const float *lse, const int32_t *targets, int nv, int v0, int ldr,
                                 float dscale) {
  S *x = logits + (size_t)blockIdx.x * ldr;
  const float l = lse[blockIdx.x];
  const int r = targets[blockIdx.x] - v0; /* outside [0, nv): no column is the target */
  for (int v = threadIdx.x; v < nv; v += blockDim.x)
    x[v] = st<S>(dscale * expf(ld(x[v]) - l) - (v == r ? dscale : 0.0f));
}

void gpu_xent_fwd_bwd(backend_dtype t, float *losses, void *logits, const int32_t *targets, int N, int V, int ldr,
                      float dscale) {
  if (N <= 0) return;
  GPU_STORAGE(t, xent_kernel<S><<<N, XENT_THREADS>>>(losses, (S *)logits, targets, V, ldr, dscale));
  GPU_LAUNCHED();
}

void gpu_xent_part(backend_dtype t, float *part, const void *logits, const int32_t *targets, int N, int nv, int v0,
                   int ldr) {
  if (N <= 0) return;
  GPU_STORAGE(t, xent_part_kernel<S><<<N, XENT_THREADS>>>(part, (const S *)logits, targets, nv, v0, ldr));
  GPU_LAUNCHED();
}

void gpu_xent_grad(backend_dtype t, void *logits, const float *lse, const int32_t *targets, int N, int nv, int v0,
                   int ldr, float dscale) {
  if (N <= 0) return;
  GPU_STORAGE(t, xent_grad_kernel<S><<<N, XENT_THREADS>>>((S *)logits, lse, targets, nv, v0, ldr, dscale));
  GPU_LAUNCHED();
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

/* PyTorch's AdamW, as cpu_adamw: the bias corrections come from the host in float, the gradients' factor from
 * backend_adamw_factor, evaluated once per block where the step's sums are (device memory) */
template <typename S>
__global__ void adamw_kernel(float *p, S *pc, const float *g, float *m, float *v, size_t n, backend_adamw_args a,
                             float step_size, float rbc2, float decay) {
  __shared__ float gs;
  if (threadIdx.x == 0) gs = backend_adamw_factor(&a);
  __syncthreads();
  if (gs < 0.0f) return; /* a non-finite step: skipped */
  const float b1 = a.beta1, b2 = a.beta2;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float gi = g[i] * gs;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * decay - step_size * mi / (sqrtf(vi) * rbc2 + a.eps);
    p[i] = pi;
    if (pc) pc[i] = st<S>(pi); /* the compute copy, rounded from the updated master */
  }
}

void gpu_adamw(backend_dtype t, float *p, void *pc, const float *g, float *m, float *v, size_t n,
               const backend_adamw_args *a) {
  if (n == 0) return;
  const float b1 = a->beta1, b2 = a->beta2;
  const float bc1 = 1.0f - powf(b1, (float)a->step), bc2 = 1.0f - powf(b2, (float)a->step);
  const float step_size = a->lr / bc1, rbc2 = 1.0f / sqrtf(bc2);
  const float decay = 1.0f - a->lr * a->weight_decay;
  GPU_STORAGE(t, adamw_kernel<S><<<gpu_blocks(n, 256), 256>>>(p, (S *)pc, g, m, v, n, *a, step_size, rbc2, decay));
  GPU_LAUNCHED();
}

/* ---- sums in double -------------------------------------------------------------------------- */

enum { SUM_BLOCKS = 1024, SUM_THREADS = 256 };

/* part (gridDim.x): each block's sum of x (of x^2 when SQ) in double */
template <bool SQ>
__global__ void sum_kernel(double *part, const float *x, size_t n) {
  __shared__ double ws[SUM_THREADS / 32];
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    s += SQ ? (double)x[i] * (double)x[i] : (double)x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(GPU_FULL_MASK, s, o);
  if (threadIdx.x % 32 == 0) ws[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < SUM_THREADS / 32; w++) t += ws[w];
    part[blockIdx.x] = t;
  }
}

/* *acc += the blocks' sums in a fixed order (one thread): the same result every time */
__global__ void sum_finish_kernel(double *acc, const double *part, unsigned blocks) {
  double t = 0.0;
  for (unsigned b = 0; b < blocks; b++) t += part[b];
  *acc += t;
}

size_t gpu_sum_workspace(void) { return SUM_BLOCKS * sizeof(double); }

void gpu_reduce_sum(gpu_ctx *g, double *acc, const float *x, size_t n, int square) {
  if (n == 0) return;
  unsigned blocks = gpu_blocks(n, SUM_THREADS);
  if (blocks > SUM_BLOCKS) blocks = SUM_BLOCKS;
  double *part = (double *)gpu_workspace(g, gpu_sum_workspace());
  if (square) sum_kernel<true><<<blocks, SUM_THREADS>>>(part, x, n);
  else sum_kernel<false><<<blocks, SUM_THREADS>>>(part, x, n);
  GPU_LAUNCHED();
  sum_finish_kernel<<<1, 1>>>(acc, part, blocks);
  GPU_LAUNCHED();
}
