/* hmap: linear-probing hash tables. */
#include "base/hmap.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

/* ---- u64 -> u64 ------------------------------------------------------------------------------- */

void hmap_u64_init(hmap_u64 *m, size_t expected) {
  m->cap = pow2_at_least(expected * 2);
  m->n = 0;
  m->keys = util_malloc(m->cap * sizeof *m->keys, "hash map");
  m->vals = util_malloc(m->cap * sizeof *m->vals, "hash map");
  memset(m->keys, 0xff, m->cap * sizeof *m->keys);
}

void hmap_u64_free(hmap_u64 *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

void hmap_u64_clear(hmap_u64 *m) {
  memset(m->keys, 0xff, m->cap * sizeof *m->keys);
  m->n = 0;
}

uint64_t *hmap_u64_get(const hmap_u64 *m, uint64_t key) {
  size_t mask = m->cap - 1;
  for (size_t i = hmap_mix64(key) & mask;; i = (i + 1) & mask) {
    if (m->keys[i] == key) return &m->vals[i];
    if (m->keys[i] == HMAP_EMPTY) return NULL;
  }
}

static void u64_grow(hmap_u64 *m) {
  hmap_u64 g;
  hmap_u64_init(&g, m->cap);
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i] != HMAP_EMPTY) *hmap_u64_put(&g, m->keys[i], m->vals[i], NULL) = m->vals[i];
  hmap_u64_free(m);
  *m = g;
}

uint64_t *hmap_u64_put(hmap_u64 *m, uint64_t key, uint64_t init, int *added) {
  if (2 * (m->n + 1) > m->cap) u64_grow(m);
  size_t mask = m->cap - 1;
  for (size_t i = hmap_mix64(key) & mask;; i = (i + 1) & mask) {
    if (m->keys[i] == key) {
      if (added) *added = 0;
      return &m->vals[i];
    }
    if (m->keys[i] == HMAP_EMPTY) {
      m->keys[i] = key;
      m->vals[i] = init;
      m->n++;
      if (added) *added = 1;
      return &m->vals[i];
    }
  }
}

/* ---- bytes -> i64 ----------------------------------------------------------------------------- */

void hmap_str_init(hmap_str *m, size_t expected) {
  memset(m, 0, sizeof *m);
  m->cap = pow2_at_least(expected * 2);
  m->slots = util_calloc(m->cap, sizeof *m->slots, "string map");
}

void hmap_str_free(hmap_str *m) {
  free(m->slots);
  free(m->arena);
  free(m->off);
  free(m->len);
  free(m->hash);
  free(m->val);
  memset(m, 0, sizeof *m);
}

void hmap_str_clear(hmap_str *m) {
  memset(m->slots, 0, m->cap * sizeof *m->slots);
  m->n = 0;
  m->arena_len = 0;
}

static uint64_t str_hash(const void *key, size_t len) { return util_hash64(key, len, 0x6c62272e07bb0142ULL); }

int64_t *hmap_str_get(const hmap_str *m, const void *key, size_t len) {
  uint64_t h = str_hash(key, len);
  size_t mask = m->cap - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    uint32_t s = m->slots[i];
    if (!s) return NULL;
    size_t e = s - 1;
    if (m->hash[e] == h && m->len[e] == len && memcmp(m->arena + m->off[e], key, len) == 0) return &m->val[e];
  }
}

static void str_rehash(hmap_str *m) {
  free(m->slots);
  m->cap *= 2;
  m->slots = util_calloc(m->cap, sizeof *m->slots, "string map");
  size_t mask = m->cap - 1;
  for (size_t e = 0; e < m->n; e++) {
    size_t i = m->hash[e] & mask;
    while (m->slots[i]) i = (i + 1) & mask;
    m->slots[i] = (uint32_t)(e + 1);
  }
}

int64_t *hmap_str_put(hmap_str *m, const void *key, size_t len, int64_t init, int *added) {
  int64_t *v = hmap_str_get(m, key, len);
  if (v) {
    if (added) *added = 0;
    return v;
  }
  if (2 * (m->n + 1) > m->cap) str_rehash(m);
  if (m->n == m->ncap) {
    m->ncap = m->ncap ? 2 * m->ncap : 64;
    m->off = util_realloc(m->off, m->ncap * sizeof *m->off, "string map");
    m->len = util_realloc(m->len, m->ncap * sizeof *m->len, "string map");
    m->hash = util_realloc(m->hash, m->ncap * sizeof *m->hash, "string map");
    m->val = util_realloc(m->val, m->ncap * sizeof *m->val, "string map");
  }
  if (m->arena_len + len > m->arena_cap) {
    while (m->arena_len + len > m->arena_cap) m->arena_cap = m->arena_cap ? 2 * m->arena_cap : 4096;
    m->arena = util_realloc(m->arena, m->arena_cap, "string map");
  }
  size_t e = m->n++;
  memcpy(m->arena + m->arena_len, key, len);
  m->off[e] = m->arena_len;
  m->len[e] = (uint32_t)len;
  m->arena_len += len;
  m->hash[e] = str_hash(key, len);
  m->val[e] = init;
  size_t mask = m->cap - 1, i = m->hash[e] & mask;
  while (m->slots[i]) i = (i + 1) & mask;
  m->slots[i] = (uint32_t)(e + 1);
  if (added) *added = 1;
  return &m->val[e];
}
