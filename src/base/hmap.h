/* hmap: open-addressing hash maps for the tokenizer and the BPE trainer.
 *
 * hmap_u64: 64-bit key -> 64-bit value (keys must not be HMAP_EMPTY).
 * hmap_str: byte-string key -> 64-bit value; entries keep insertion order and can be walked by
 *           index (0 .. n-1), which makes iteration deterministic. */
#ifndef GREENLM_HMAP_H
#define GREENLM_HMAP_H

#include <stddef.h>
#include <stdint.h>

#define HMAP_EMPTY UINT64_MAX

typedef struct {
  uint64_t *keys, *vals;
  size_t cap, n; /* cap is a power of two */
} hmap_u64;

void hmap_u64_init(hmap_u64 *m, size_t expected);
void hmap_u64_free(hmap_u64 *m);
/* Pointer to the value of key, or NULL. */
uint64_t *hmap_u64_get(const hmap_u64 *m, uint64_t key);
/* Pointer to the value of key, inserting init when absent (*added = 1 then). */
uint64_t *hmap_u64_put(hmap_u64 *m, uint64_t key, uint64_t init, int *added);
void hmap_u64_clear(hmap_u64 *m);

typedef struct {
  uint32_t *slots; /* entry index + 1; 0 = empty */
  size_t cap;      /* power of two */
  char *arena;     /* key bytes of all entries */
  size_t arena_len, arena_cap;
  size_t *off;
  uint32_t *len;
  uint64_t *hash;
  int64_t *val;
  size_t n, ncap;
} hmap_str;

void hmap_str_init(hmap_str *m, size_t expected);
void hmap_str_free(hmap_str *m);
void hmap_str_clear(hmap_str *m);
int64_t *hmap_str_get(const hmap_str *m, const void *key, size_t len);
int64_t *hmap_str_put(hmap_str *m, const void *key, size_t len, int64_t init, int *added);
/* Key bytes of entry i (not NUL-terminated). */
static inline const char *hmap_str_key(const hmap_str *m, size_t i, size_t *len) {
  *len = m->len[i];
  return m->arena + m->off[i];
}

/* Hash of a 64-bit integer (splitmix64 finalizer). */
static inline uint64_t hmap_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

#endif
