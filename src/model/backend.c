/* backend: what every backend shares: element types, precisions, the ops' names. */
#include "config.h" /* first: GREENLM_HAVE_CUDA decides which kinds are built */

#include "model/backend.h"

#include <string.h>

#include "base/util.h"
#include "deck/cfg.h"

/* the precision bits are &system precision's words in order */
_Static_assert(BACKEND_PREC_FP32 == 1u << CFG_PREC_FP32 && BACKEND_PREC_TF32 == 1u << CFG_PREC_TF32 &&
                   BACKEND_PREC_BF16 == 1u << CFG_PREC_BF16 && BACKEND_PREC_FP16 == 1u << CFG_PREC_FP16,
               "BACKEND_PREC_* follow CFG_PRECISIONS");

size_t backend_dtype_size(backend_dtype t) { return t == BACKEND_FP32 ? 4 : 2; }

const char *backend_dtype_name(backend_dtype t) {
  return t == BACKEND_BF16 ? "bf16" : t == BACKEND_FP16 ? "fp16" : "fp32";
}

backend_dtype backend_precision_storage(const char *precision) {
  unsigned bit = backend_precision_bit(precision);
  return bit == BACKEND_PREC_BF16 ? BACKEND_BF16 : bit == BACKEND_PREC_FP16 ? BACKEND_FP16 : BACKEND_FP32;
}

unsigned backend_precision_bit(const char *precision) {
  int i = cfg_choice_index(CFG_CHOICES(CFG_PRECISIONS), precision); /* the bits in the words' order */
  return i < 0 ? 0 : 1u << i;
}

#define BACKEND_OP_NAME(name, params, args) #name,
const char *const backend_op_names[BACKEND_NOPS] = {BACKEND_OPS(BACKEND_OP_NAME)};

void backend_close(const backend *be) {
  if (be) be->close((backend *)be); /* the instance was allocated by its kind's open */
}

/* Every kind greenlm has, built here or not, and how to get a build with it. */
static const struct {
  const char *name, *build;
} all_kinds[] = {{"cpu", "always built"}, {"cuda", "rebuild with ./configure --with-cuda (doc/gpu.md)"}};

static const backend_kind *const built[] = {
    &backend_kind_cpu,
#ifdef GREENLM_HAVE_CUDA
    &backend_kind_cuda,
#endif
};

const backend_kind *const *backend_kinds(int *n) {
  *n = (int)(sizeof built / sizeof built[0]);
  return built;
}

const backend_kind *backend_find_kind(const char *name, const char **build) {
  for (size_t i = 0; i < sizeof built / sizeof built[0]; i++)
    if (strcmp(built[i]->name, name) == 0) return built[i];
  *build = NULL;
  for (size_t i = 0; i < sizeof all_kinds / sizeof all_kinds[0]; i++)
    if (strcmp(all_kinds[i].name, name) == 0) *build = all_kinds[i].build;
  return NULL;
}

const char *backend_precision_names(unsigned mask, char *buf, size_t len) {
#define BACKEND_PREC_WORD(E, w) w,
  static const char *const names[] = {CFG_PRECISIONS(BACKEND_PREC_WORD)};
#undef BACKEND_PREC_WORD
  size_t o = 0;
  buf[0] = '\0';
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
    if ((mask & (1u << i)) && o < len) o += (size_t)util_snprintf(buf + o, len - o, "%s%s", o ? ", " : "", names[i]);
  return buf;
}
