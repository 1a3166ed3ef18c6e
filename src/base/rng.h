/* rng: a small, fast, seedable generator (xoshiro256**) with independent streams.
 *
 * Every consumer derives its own stream from (seed, purpose, index), so that results do not depend
 * on the order in which ranks or tensors draw numbers: tensor i of the model is initialised from
 * stream (seed, RNG_INIT, i) whichever rank owns it. The state is four 64-bit words, small enough
 * to save in a checkpoint. */
#ifndef GREENLM_RNG_H
#define GREENLM_RNG_H

#include <stdint.h>

typedef struct {
  uint64_t s[4];
} rng_state;

enum { RNG_INIT = 1, RNG_DATA = 2, RNG_SAMPLE = 3, RNG_LOWRANK = 4 };

void rng_seed(rng_state *r, uint64_t seed, uint64_t purpose, uint64_t index);
uint64_t rng_u64(rng_state *r);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(rng_state *r);
/* Uniform integer in [0, n), unbiased. */
uint64_t rng_below(rng_state *r, uint64_t n);
/* Standard normal (Box-Muller, one value from each pair of uniforms). */
double rng_normal(rng_state *r);

/* Counter-based: 64 random bits that depend only on (key, counter), so that any rank, thread or
 * order of work draws the same bits for the same element (splitmix64's finaliser of a mix). Inline:
 * the quantizer draws one per gradient value. */
#ifdef __CUDACC__
#define RNG_HD __host__ __device__ /* the GPU's quantizer draws the same bits (gpu/gpu_quant.cu) */
#else
#define RNG_HD
#endif
static inline RNG_HD uint64_t rng_hash(uint64_t key, uint64_t counter) {
  uint64_t x = key ^ (counter * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

#endif
