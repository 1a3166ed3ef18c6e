/* testquant: a message layout for the compressed exchange's ops (test_ops, test_gpu_parity):
 * quantized segments of awkward lengths (1, odd, one group short, a whole bucket) between raw ones,
 * so that byte offsets are unaligned, and the level sets of every method. */
#ifndef GREENLM_TESTQUANT_H
#define GREENLM_TESTQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/quant.h"

enum { TQ_NSEG = 7, TQ_NSCHEMES = 8 };

/* The segments under scheme q: their values' and bytes' totals into *nvals and *bytes. */
static inline void tq_segments(const quant_scheme *q, quant_seg seg[TQ_NSEG], size_t *nvals, size_t *bytes) {
  static const size_t n[TQ_NSEG] = {513, 37, 8192, 1, 7, 5, 1000};
  static const int quantized[TQ_NSEG] = {1, 0, 1, 1, 1, 0, 1};
  size_t at = 0, off = 0;
  for (int s = 0; s < TQ_NSEG; s++) {
    seg[s] = (quant_seg){.at = at, .n = n[s], .off = off, .quantized = quantized[s], .id = (uint64_t)s << 40 | 17u * (unsigned)s};
    at += n[s];
    off += quantized[s] ? quant_bytes(q, n[s]) : n[s] * sizeof(float);
  }
  *nvals = at, *bytes = off;
}

/* Scheme k: QSGD 4-bit (L2), QSGDinf 3-bit (max), NUQSGD 5-bit, min-max 2-bit, a table of 4-bit
 * levels (as ALQ fits them), 8-bit uniform, top-k at 1% and 50%. Returns its name. */
static inline const char *tq_scheme(int k, quant_scheme *q) {
  static const float lv[8] = {0.0f, 0.01f, 0.03f, 0.08f, 0.15f, 0.3f, 0.6f, 1.0f};
  switch (k) {
  case 0: quant_uniform(q, 4, QUANT_L2); return "qsgd 4-bit";
  case 1: quant_uniform(q, 3, QUANT_MAX); return "qsgdinf 3-bit";
  case 2: quant_exponential(q, 5, QUANT_L2); return "nuqsgd 5-bit";
  case 3: quant_uniform(q, 2, QUANT_MINMAX); return "min-max 2-bit";
  case 4: quant_levels(q, 4, QUANT_L2, lv, 8); return "levels 4-bit";
  case 6: quant_topk(q, 10000); return "topk 1%";
  case 7: quant_topk(q, 500000); return "topk 50%";
  default: quant_uniform(q, 8, QUANT_MAX); return "qsgdinf 8-bit";
  }
}

/* Case k: scheme k and its segments; returns its name. */
static inline const char *tq_case(int k, quant_scheme *q, quant_seg seg[TQ_NSEG], size_t *nvals, size_t *bytes) {
  const char *name = tq_scheme(k, q);
  tq_segments(q, seg, nvals, bytes);
  return name;
}

#endif
