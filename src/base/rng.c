/* rng: xoshiro256** seeded through splitmix64. */
#include "base/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void rng_seed(rng_state *r, uint64_t seed, uint64_t purpose, uint64_t index) {
  uint64_t x = seed;
  uint64_t mix = splitmix64(&x) ^ (purpose * 0xd1b54a32d192ed03ULL);
  x = mix;
  mix = splitmix64(&x) ^ (index * 0x8cb92ba72f3d8dd7ULL);
  x = mix;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(rng_state *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double rng_uniform(rng_state *r) { return (double)(rng_u64(r) >> 11) * 0x1.0p-53; }

uint64_t rng_below(rng_state *r, uint64_t n) {
  /* rejection sampling on the top bits: unbiased */
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = rng_u64(r);
  while (x >= limit);
  return x % n;
}

double rng_normal(rng_state *r) {
  double u1 = rng_uniform(r), u2 = rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

