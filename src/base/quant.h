/* quant: unbiased stochastic quantization of gradient buckets (QSGD, NUQSGD, ALQ/AMQ levels), the
 * building block of the compressed gradient exchange. No MPI here: a bucket of n floats becomes a
 * message of quant_bytes(q, n) bytes and back.
 *
 * A bucket v (n values) is scaled by sigma (its L2 norm, or its largest magnitude), each
 * normalised magnitude r = |v_i| / sigma in [0, 1] is rounded stochastically to one of the two
 * magnitude levels around it, l_j <= r <= l_{j+1}, up with probability (r - l_j) / (l_{j+1} - l_j),
 * and sent as a sign bit and the level's index: E[Q(v)] = v for any levels, and the error has the
 * exact expectation E||Q(v) - v||^2 = sigma^2 sum_i (l_{j+1} - r_i)(r_i - l_j) (quant_expected).
 * The min-max form instead maps [min, max] onto 2^b - 1 equal steps (no sign bit).
 *
 * Random bits: 24 per value from a 32-bit counter-based hash of (key, i): the same key (the caller
 * derives it from the seed, the rank, the step and the bucket) gives the same message on any
 * machine.
 *
 * Wire format of a bucket: the scale(s) as fp32 (one; two for min-max), then the n codes of b
 * bits packed 8 to a group of b bytes (code k of a group at bit k*b of a little-endian 64-bit
 * word; the last group's unused codes are 0). At bits = 32 the message is the n floats themselves. */
#ifndef GREENLM_QUANT_H
#define GREENLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { QUANT_L2, QUANT_MAX, QUANT_MINMAX } quant_norm;

enum { QUANT_MAX_LEVELS = 128 }; /* magnitude levels of an 8-bit sign+magnitude code */

typedef struct {
  int bits;        /* 2..8, or 32 (the floats unchanged) */
  quant_norm norm;
  int nlevels;     /* magnitude levels 0 = level[0] < ... < level[nlevels-1] = 1 (sign+magnitude forms) */
  float level[QUANT_MAX_LEVELS];
  int uniform;     /* levels j / (nlevels - 1): found by arithmetic, not by search */
  uint32_t topk_ppm; /* top-k sparsification (quant_topk): parts per million kept; 0 for the quantizers */
} quant_scheme;

/* Uniform levels j / s, s = 2^(b-1) - 1 (QSGD with QUANT_L2, QSGDinf with QUANT_MAX; for
 * QUANT_MINMAX the 2^b codes span [min, max]). */
void quant_uniform(quant_scheme *q, int bits, quant_norm norm);
/* Exponential levels with a zero level (NUQSGD): 0, 2^-k, ..., 1/2, 1 with k = 2^(b-1) - 2. */
void quant_exponential(quant_scheme *q, int bits, quant_norm norm);
/* Given levels (ALQ, AMQ): n increasing magnitudes from 0 to 1, n <= 2^(b-1). Returns -1 (and
 * leaves q unchanged) when they are not. */
int quant_levels(quant_scheme *q, int bits, quant_norm norm, const float *level, int n);
/* bits = 32: the floats pass through unchanged. */
void quant_passthrough(quant_scheme *q);
/* Top-k sparsification: a bucket of n keeps its k = ceil(n ppm / 10^6) largest magnitudes (at least
 * one; ties to the lower index), sent as their indices (16 bits for buckets of up to 65536 values,
 * else 32) and fp32 values. Biased (E[C(v)] != v) but contractive, ||C(v) - v||^2 <= (1 - k/n) ||v||^2:
 * error feedback makes it converge (Stich et al., NeurIPS 2018). quant_expected is its exact error. */
void quant_topk(quant_scheme *q, uint32_t ppm);

/* Bytes of the message of a bucket of n values. */
size_t quant_bytes(const quant_scheme *q, size_t n);
/* Encode v (n) into msg (quant_bytes), rounding with the random bits of key. */
void quant_encode(const quant_scheme *q, const float *v, size_t n, uint64_t key, uint8_t *msg);
/* Decode msg into out (n): out = Q(v), or out += Q(v) when accumulate. */
void quant_decode(const quant_scheme *q, const uint8_t *msg, size_t n, float *out, int accumulate);
/* The exact expectation E||Q(v) - v||^2 of the scheme on v (n), in double. */
double quant_expected(const quant_scheme *q, const float *v, size_t n);

/* The integer form, for summing across replicas with MPI (uniform levels, a scale the replicas
 * share: the largest of their own scales): v_i becomes an integer in [-s, s], s = nlevels - 1, by
 * stochastic rounding of v_i / scale * s, so E[int_i] = v_i / scale * s; the replicas' integers
 * add up exactly, and sum_i * scale / s is the sum of their quantized values. */
float quant_scale(const quant_scheme *q, const float *v, size_t n); /* the bucket's own L2 or max norm */
void quant_int_encode(const quant_scheme *q, const float *v, size_t n, float scale, uint64_t key, int16_t *out);

/* ---- messages of many buckets (the exchange's, and the backends' quant_encode/quant_decode) ----
 * A message is a sequence of segments: a quantization bucket of n values (quant_bytes(q, n) bytes,
 * rounded with the random bits of rng_hash(key, id)), or n fp32 values as they are. */
typedef struct {
  size_t at, n;   /* values [at, at + n) of the buffer the message is made of */
  size_t off;     /* where its bytes start in the message */
  int quantized;  /* else n fp32 values */
  uint64_t id;    /* its random bits' counter under the message's key */
} quant_seg;

/* Segments seg[0..nseg) of v encoded into msg (each at its off). With ef (error feedback: the
 * residual, indexed as v), the quantized segments first take v += ef, are encoded contracted
 * (quant_encode_contract), and leave ef = v - Q(v). */
void quant_encode_segs(const quant_scheme *q, const quant_seg *seg, int nseg, float *v, float *ef, uint64_t key,
                       uint8_t *msg);
/* Segments seg[0..nseg) of msg, whose byte 0 is the message's byte base, decoded into out (indexed
 * as v was), or added to it. */
void quant_decode_segs(const quant_scheme *q, const quant_seg *seg, int nseg, const uint8_t *msg, size_t base,
                       float *out, int add);

/* ---- error feedback ----
 * A replica carries what its quantizer dropped into the next step (EF-SGD, in gradient units):
 * p_t = g_t + e_t is quantized, and e_{t+1} = p_t - Q(p_t), so that sum_t Q(p_t) + e_T = sum_t g_t
 * (the telescoping identity). The caller adds e to its values (quant_feedback_add), encodes them
 * (quant_encode_contract, or quant_int_encode), and then takes the new residual from the message
 * (quant_feedback_take) or from the integers (quant_int_feedback_take). The integer form is not
 * scaled (its scale is shared by the replicas): contractive at 3 bits and more on buckets of 512. */
/* Encode v as quant_encode does, then scale the message by 1 / (1 + omega), omega = E||Q(v) - v||^2 /
 * ||v||^2 exactly: a biased but contractive compressor (E||C(v) - v||^2 = omega / (1 + omega) ||v||^2),
 * what error feedback needs to keep its residual bounded when omega is not small (QSGD's L2 levels, 2
 * bits); the bias is what the residual carries to the next step. */
void quant_encode_contract(const quant_scheme *q, const float *v, size_t n, uint64_t key, uint8_t *msg);
void quant_feedback_add(float *v, const float *e, size_t n);                      /* v += e */
void quant_feedback_take(const quant_scheme *q, const uint8_t *msg, const float *v, size_t n, float *e); /* e = v - Q */
void quant_int_feedback_take(const quant_scheme *q, const int16_t *ints, float scale, const float *v, size_t n, float *e);

/* ---- adaptive levels (ALQ, AMQ) ----
 * The statistics of normalised magnitudes r = |v_i| / sigma (L2 norm), weighted by sigma^2 so that
 * the objective is the expected error itself: Psi(levels) = sum sigma^2 (l_{j+1} - r)(r - l_j) over
 * every value (Faghri et al., NeurIPS 2020, section 4.1 of the research notes). Kept as a histogram
 * of QUANT_HIST_BINS log-spaced bins over [2^-30, 1] (and one for zeros) holding each bin's weight,
 * first and second moments: Psi is exact while no level falls inside a bin, and the histograms of
 * several replicas add up (MPI_Allreduce SUM of the doubles), so every replica fits the same levels. */
enum { QUANT_HIST_BINS = 4096 };
typedef struct {
  double w[QUANT_HIST_BINS], s[QUANT_HIST_BINS], q[QUANT_HIST_BINS]; /* sum of weights, of w r, of w r^2 */
} quant_hist;
void quant_hist_clear(quant_hist *h);
/* Add a bucket v (n values): its magnitudes over its L2 norm, weighted by the norm squared. */
void quant_hist_add(quant_hist *h, const float *v, size_t n);
/* Psi of the magnitude levels (n, increasing from 0 to 1) on the histogram. */
double quant_hist_psi(const quant_hist *h, const float *level, int n);
/* ALQ: n levels minimising Psi by coordinate descent (each level in turn moved to its best place
 * between its neighbours, `sweeps` passes) from three starts (exponential, uniform, equal-mass
 * quantiles), the best kept. Returns Psi. */
double quant_fit_alq(const quant_hist *h, int n, int sweeps, float *level);
/* AMQ: levels 0, p^(n-2), ..., p, 1 with the ratio p in (0, 1) minimising Psi (golden-section search
 * from a grid of starts). Returns Psi; *ratio gets p. */
double quant_fit_amq(const quant_hist *h, int n, float *level, float *ratio);

/* n codes of b bits (b = 1..8) packed as in the wire format into ceil(n * b / 8) bytes, and back. */
size_t quant_packed_bytes(size_t n, int bits);
void quant_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out);
void quant_unpack(const uint8_t *in, size_t n, int bits, uint8_t *codes);

#endif
