/* gpu_quant: the compressed gradient exchange's encoder and decoder on the device (the backend ops
 * quant_encode and quant_decode), bit for bit the CPU's quant_encode_segs and quant_decode_segs: the
 * arithmetic of a value, a code group and a bucket's scale is quant_core.h's, compiled here without
 * fused multiply-adds (-fmad=false, Makefile.am) as the CPU compiles it (ISO C11: no contraction), and
 * a bucket's sums (its L2 norm, its expected error) run in one thread in index order, as on the CPU.
 *
 * Segment s of the table is block s of the per-value kernels (its values or code groups strided over
 * the block's threads) and thread s of the per-bucket ones (scale, contraction). The scheme travels
 * by value as a kernel argument (532 bytes). Bits 2 to 8: the exchange never sends 32-bit codes. Top-k
 * selects each segment in one thread (the radix selection of quant_core.h). */
#include "gpu.h"
extern "C" {
#include "base/rng.h"
}
#include "base/lowrank_core.h"
#include "base/quant_core.h"

enum { Q_THREADS = 256, Q_SEG_THREADS = 128 };
enum { Q_SET = QC_SET, Q_ADD = QC_ADD, Q_RESIDUAL = QC_RESIDUAL }; /* what q_decode does with a value y: out = y, out += y, out = v - y */

/* Error feedback: v += ef on the quantized segments. */
__global__ void q_feedback_add(float *v, const float *ef, const quant_seg *seg) {
  const quant_seg g = seg[blockIdx.x];
  if (!g.quantized) return;
  for (size_t i = threadIdx.x; i < g.n; i += blockDim.x) v[g.at + i] += ef[g.at + i];
}

/* Each quantized segment's scale into its message's header. */
__global__ void q_scale(quant_scheme q, const float *v, const quant_seg *seg, int nseg, uint8_t *msg) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= nseg || !seg[s].quantized) return;
  float h[2] = {0.0f, 0.0f};
  qc_scale(&q, v + seg[s].at, seg[s].n, h);
  memcpy(msg + seg[s].off, h, (size_t)qc_headers(&q) * sizeof(float));
}

/* A segment's codes, packed after its header; a raw segment's floats copied. */
__global__ void q_encode(quant_scheme q, const float *v, const quant_seg *seg, uint64_t key, uint8_t *msg) {
  const quant_seg g = seg[blockIdx.x];
  uint8_t *m = msg + g.off;
  const float *x = v + g.at;
  if (!g.quantized) {
    for (size_t i = threadIdx.x; i < g.n; i += blockDim.x) memcpy(m + i * sizeof(float), x + i, sizeof(float));
    return;
  }
  float h[2] = {0.0f, 0.0f};
  memcpy(h, m, (size_t)qc_headers(&q) * sizeof(float));
  const qc_params p = qc_params_of(&q, h);
  const uint32_t k32 = qc_key32(rng_hash(key, g.id));
  uint8_t *codes = m + (size_t)qc_headers(&q) * sizeof(float);
  for (size_t gi = threadIdx.x; gi * 8 < g.n; gi += blockDim.x) {
    uint64_t word = 0;
    for (size_t k = 0; k < 8 && gi * 8 + k < g.n; k++)
      word |= (uint64_t)qc_code(&q, &p, h, x[gi * 8 + k], k32, gi * 8 + k) << (k * (size_t)q.bits);
    qc_put_group(word, gi, g.n, q.bits, codes);
  }
}

/* Error feedback: each quantized segment's header scaled to a contraction (quant_encode_contract). */
__global__ void q_contract(quant_scheme q, const float *v, const quant_seg *seg, int nseg, uint8_t *msg) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= nseg || !seg[s].quantized) return;
  float h[2] = {0.0f, 0.0f};
  const size_t bytes = (size_t)qc_headers(&q) * sizeof(float);
  memcpy(h, msg + seg[s].off, bytes);
  const float f = qc_contraction(&q, h, v + seg[s].at, seg[s].n);
  for (int i = 0; i < qc_headers(&q); i++) h[i] *= f;
  memcpy(msg + seg[s].off, h, bytes);
}

/* Top-k: a segment's message by one thread (quant_core.h's selection), a raw segment's floats copied. */
__global__ void q_topk_encode(quant_scheme q, const float *v, const quant_seg *seg, int nseg, uint8_t *msg) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= nseg) return;
  const quant_seg g = seg[s];
  if (g.quantized) qc_topk_encode(&q, v + g.at, g.n, msg + g.off);
  else memcpy(msg + g.off, v + g.at, g.n * sizeof(float));
}

/* A segment of msg (its byte 0 the message's byte base) decoded: out = y, out += y, or (error
 * feedback, quantized segments only) out = v - y. */
__global__ void q_decode(quant_scheme q, float *out, const uint8_t *msg, size_t base, const quant_seg *seg, int mode,
                         const float *v) {
  const quant_seg g = seg[blockIdx.x];
  const uint8_t *m = msg + g.off - base;
  float *o = out + g.at;
  if (!g.quantized) {
    if (mode == Q_RESIDUAL) return;
    for (size_t i = threadIdx.x; i < g.n; i += blockDim.x) {
      float y;
      memcpy(&y, m + i * sizeof(float), sizeof y);
      o[i] = mode == Q_ADD ? o[i] + y : y;
    }
    return;
  }
  if (q.topk_ppm) { /* the values not sent: 0, unchanged, or the residual's v; then the sent ones by one thread */
    if (mode != Q_ADD)
      for (size_t i = threadIdx.x; i < g.n; i += blockDim.x) o[i] = mode == Q_RESIDUAL ? v[g.at + i] : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) qc_topk_scatter(&q, m, g.n, o, mode, v ? v + g.at : NULL);
    return;
  }
  float h[2] = {0.0f, 0.0f};
  memcpy(h, m, (size_t)qc_headers(&q) * sizeof(float));
  const uint8_t *codes = m + (size_t)qc_headers(&q) * sizeof(float);
  const uint64_t mask = (1u << q.bits) - 1;
  for (size_t gi = threadIdx.x; gi * 8 < g.n; gi += blockDim.x) {
    const uint64_t word = qc_get_group(codes, gi, g.n, q.bits);
    for (size_t k = 0; k < 8 && gi * 8 + k < g.n; k++) {
      const size_t i = gi * 8 + k;
      const float y = qc_value(&q, h, (unsigned)((word >> (k * (size_t)q.bits)) & mask));
      o[i] = mode == Q_ADD ? o[i] + y : mode == Q_RESIDUAL ? v[g.at + i] - y : y;
    }
  }
}

void gpu_quant_encode(uint8_t *msg, float *v, float *ef, const quant_seg *seg, int nseg, const quant_scheme *q,
                      uint64_t key) {
  if (nseg <= 0) return;
  const unsigned per_seg = gpu_blocks((size_t)nseg, Q_SEG_THREADS);
  if (ef) q_feedback_add<<<nseg, Q_THREADS>>>(v, ef, seg);
  if (q->topk_ppm) { /* a contraction as it is */
    q_topk_encode<<<per_seg, Q_SEG_THREADS>>>(*q, v, seg, nseg, msg);
    if (ef) q_decode<<<nseg, Q_THREADS>>>(*q, ef, msg, 0, seg, Q_RESIDUAL, v);
    GPU_CHECK(cudaGetLastError());
    return;
  }
  q_scale<<<per_seg, Q_SEG_THREADS>>>(*q, v, seg, nseg, msg);
  q_encode<<<nseg, Q_THREADS>>>(*q, v, seg, key, msg);
  if (ef) {
    q_contract<<<per_seg, Q_SEG_THREADS>>>(*q, v, seg, nseg, msg);
    q_decode<<<nseg, Q_THREADS>>>(*q, ef, msg, 0, seg, Q_RESIDUAL, v);
  }
  GPU_CHECK(cudaGetLastError());
}

void gpu_quant_decode(float *out, const uint8_t *msg, size_t base, const quant_seg *seg, int nseg, const quant_scheme *q,
                      int add) {
  if (nseg <= 0) return;
  q_decode<<<nseg, Q_THREADS>>>(*q, out, msg, base, seg, add ? Q_ADD : Q_SET, NULL);
  GPU_CHECK(cudaGetLastError());
}

/* ---- PowerSGD's factors: lowrank_core.h's sums, one thread per element (a block per matrix for the
 * column dot products of the orthogonalization, its LR_LANES threads the lanes). ---- */

__global__ void lr_add(float *M, const float *ef, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) M[i] += ef[i];
}

__global__ void lr_left_k(float *P, const float *M, const float *Q, size_t n, size_t m, int r) {
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n * (size_t)r; e += (size_t)gridDim.x * blockDim.x)
    P[e] = lr_left(M, Q, m, r, e / (size_t)r, (int)(e % (size_t)r));
}

/* Q[j,k] summed over the rows in order (lowrank_core.h), by thread (j, k). */
__global__ void lr_right_k(float *Q, const float *M, const float *P, size_t n, size_t m, int r) {
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < m * (size_t)r; e += (size_t)gridDim.x * blockDim.x) {
    const size_t j = e / (size_t)r, k = e % (size_t)r;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s = s + M[i * m + j] * P[i * (size_t)r + k];
    Q[e] = s;
  }
}

__global__ void lr_expand_k(float *M, const float *P, const float *Q, size_t n, size_t m, int r, int sub) {
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n * m; e += (size_t)gridDim.x * blockDim.x) {
    const float y = lr_expand(P, Q, r, e / m, e % m);
    M[e] = sub ? M[e] - y : y;
  }
}

/* The dot product of columns a and b of P by the block's LR_LANES threads, halved pairwise as on the CPU. */
__device__ float lr_block_dot(const float *P, size_t n, int r, int a, int b, float *lane) {
  lane[threadIdx.x] = lr_lane(P, n, r, a, b, (int)threadIdx.x);
  __syncthreads();
  for (int h = LR_LANES / 2; h > 0; h /= 2) {
    if ((int)threadIdx.x < h) lane[threadIdx.x] = lane[threadIdx.x] + lane[threadIdx.x + h];
    __syncthreads();
  }
  const float d = lane[0];
  __syncthreads();
  return d;
}

__global__ void lr_orth_k(float *P, size_t n, int r) {
  __shared__ float lane[LR_LANES];
  for (int a = 0; a < r; a++) {
    const float sumsq = lr_block_dot(P, n, r, a, a, lane);
    for (size_t i = threadIdx.x; i < n; i += LR_LANES) P[i * (size_t)r + a] = lr_unit(P[i * (size_t)r + a], sumsq);
    __syncthreads();
    for (int b = a + 1; b < r; b++) {
      const float d = lr_block_dot(P, n, r, a, b, lane);
      for (size_t i = threadIdx.x; i < n; i += LR_LANES)
        P[i * (size_t)r + b] = P[i * (size_t)r + b] - d * P[i * (size_t)r + a];
      __syncthreads();
    }
  }
}

void gpu_lowrank_left(float *P, float *M, const float *ef, const float *Q, size_t n, size_t m, int r) {
  if (ef) lr_add<<<gpu_blocks(n * m, Q_THREADS), Q_THREADS>>>(M, ef, n * m);
  lr_left_k<<<gpu_blocks(n * (size_t)r, Q_THREADS), Q_THREADS>>>(P, M, Q, n, m, r);
  GPU_CHECK(cudaGetLastError());
}

void gpu_lowrank_right(float *Q, const float *M, const float *P, size_t n, size_t m, int r) {
  lr_right_k<<<gpu_blocks(m * (size_t)r, Q_THREADS), Q_THREADS>>>(Q, M, P, n, m, r);
  GPU_CHECK(cudaGetLastError());
}

void gpu_lowrank_orth(float *P, size_t n, int r) {
  lr_orth_k<<<1, LR_LANES>>>(P, n, r);
  GPU_CHECK(cudaGetLastError());
}

void gpu_lowrank_expand(float *M, const float *P, const float *Q, size_t n, size_t m, int r, int sub) {
  lr_expand_k<<<gpu_blocks(n * m, Q_THREADS), Q_THREADS>>>(M, P, Q, n, m, r, sub);
  GPU_CHECK(cudaGetLastError());
}
