/* nfc: Unicode normalization form C of UTF-8 text. */
#include "text/nfc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "text/nfc_table.h"

/* Hangul syllables (Unicode 3.12): S = SBASE + (L * VCOUNT + V) * TCOUNT + T */
enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28,
       NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };
/* A byte that is not valid UTF-8 travels as RAW + the byte: class 0, composes with nothing. */
enum { RAW = 0x110000 };

#define NELEM(a) (sizeof(a) / sizeof *(a))

/* Below U+0300 no code point combines, and none below U+00C0 decomposes (the tables' first rows). */
enum { FIRST_MARK = 0x300, FIRST_DECOMP = 0xC0 };

static int ccc_of(uint32_t cp) {
  if (cp < FIRST_MARK) return 0;
  size_t lo = 0, hi = NELEM(nfc_ccc);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < nfc_ccc[mid][0]) hi = mid;
    else if (cp > nfc_ccc[mid][1]) lo = mid + 1;
    else return (int)nfc_ccc[mid][2];
  }
  return 0;
}

/* The table row of cp's canonical decomposition, or NULL. */
static const uint32_t *decomp_of(uint32_t cp) {
  if (cp < FIRST_DECOMP) return NULL;
  size_t lo = 0, hi = NELEM(nfc_decomp);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < nfc_decomp[mid][0]) hi = mid;
    else if (cp > nfc_decomp[mid][0]) lo = mid + 1;
    else return nfc_decomp[mid];
  }
  return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
    return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
  if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
    return a + (b - TBASE);
  if (a >= RAW || b >= RAW || b < FIRST_MARK) return 0;
  uint64_t key = ((uint64_t)a << 21) | b;
  size_t lo = 0, hi = NELEM(nfc_comp);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (key < nfc_comp[mid][0]) hi = mid;
    else if (key > nfc_comp[mid][0]) lo = mid + 1;
    else return (uint32_t)nfc_comp[mid][1];
  }
  return 0;
}

/* One code point of UTF-8 at s (n bytes left): its length, *cp = the code point, or RAW + the
 * first byte when it is not a valid sequence (overlong, surrogate, beyond U+10FFFF, truncated). */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
  int len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
  uint32_t c = len == 1 ? s[0] : len == 2 ? s[0] & 0x1Fu : len == 3 ? s[0] & 0x0Fu : s[0] & 0x07u;
  if (len == 0 || (size_t)len > n) return *cp = RAW + s[0], 1;
  for (int k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) return *cp = RAW + s[0], 1;
    c = (c << 6) | (s[k] & 0x3Fu);
  }
  if (c < min[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return *cp = RAW + s[0], 1;
  return *cp = c, len;
}

static size_t utf8_encode(uint32_t c, char *o) {
  if (c >= RAW) return o[0] = (char)(c - RAW), 1;
  if (c < 0x80) return o[0] = (char)c, 1;
  if (c < 0x800) return o[0] = (char)(0xC0 | (c >> 6)), o[1] = (char)(0x80 | (c & 0x3F)), 2;
  if (c < 0x10000)
    return o[0] = (char)(0xE0 | (c >> 12)), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F)), 3;
  o[0] = (char)(0xF0 | (c >> 18)), o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((c >> 6) & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
  return 4;
}

int nfc_quick(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0; i < len; i++)
    if (s[i] >= 0xCC) return 0; /* lead bytes of U+0300 and above */
  return 1;
}

/* Append c to d (*k code points) and move it back past marks of a higher class: canonical ordering
 * as a stable insertion sort. */
static void push_ordered(uint32_t *d, size_t *k, uint32_t c) {
  size_t j = (*k)++;
  d[j] = c;
  int cj = c < RAW ? ccc_of(c) : 0;
  if (cj == 0) return;
  for (; j > 0; j--) {
    int cp = d[j - 1] < RAW ? ccc_of(d[j - 1]) : 0;
    if (cp <= cj) break;
    d[j] = d[j - 1], d[j - 1] = c;
  }
}

/* Text -> the full canonical decomposition, canonically ordered: *n code points (malloc'd). A code
 * point decomposes into at most 4 (nfc_pool's longest; Hangul 3), and only one of 2 bytes or more
 * decomposes, so 2 per byte bound it. */
static uint32_t *decompose(const char *text, size_t len, size_t *n) {
  uint32_t *d = util_malloc((2 * len + 1) * sizeof *d, "NFC");
  size_t k = 0;
  for (size_t i = 0; i < len;) {
    uint32_t c;
    i += (size_t)utf8_decode((const unsigned char *)text + i, len - i, &c);
    const uint32_t *row = c < RAW ? decomp_of(c) : NULL;
    if (c >= SBASE && c < SBASE + SCOUNT) {
      uint32_t s = c - SBASE;
      push_ordered(d, &k, LBASE + s / NCOUNT);
      push_ordered(d, &k, VBASE + (s % NCOUNT) / TCOUNT);
      if (s % TCOUNT) push_ordered(d, &k, TBASE + s % TCOUNT);
    } else if (row) {
      for (uint32_t j = 0; j < row[2]; j++) push_ordered(d, &k, nfc_pool[row[1] + j]);
    } else {
      push_ordered(d, &k, c);
    }
  }
  *n = k;
  return d;
}

/* Canonical composition in place (UAX #15's algorithm); returns the new count. */
static size_t recompose(uint32_t *d, size_t n) {
  if (n == 0) return 0;
  size_t starter = 0, k = 1;
  int last = d[0] < RAW ? ccc_of(d[0]) : 0;
  if (last != 0) last = 256; /* no starter yet: nothing composes */
  for (size_t i = 1; i < n; i++) {
    uint32_t c = d[i];
    int cc = c < RAW ? ccc_of(c) : 0;
    uint32_t comp = compose(d[starter], c);
    if (comp && (last < cc || last == 0)) {
      d[starter] = comp;
      continue;
    }
    if (cc == 0) starter = k;
    last = cc;
    d[k++] = c;
  }
  return k;
}

char *nfc_normalize(const char *text, size_t len, size_t *out_len) {
  size_t n;
  uint32_t *d = decompose(text, len, &n);
  n = recompose(d, n);
  char *out = util_malloc(4 * n + 1, "NFC");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += utf8_encode(d[i], out + k);
  free(d);
  *out_len = k;
  return out;
}
