/* gpu_lt: GEMMs with fused epilogues through cuBLASLt, at bf16 and fp16 storage.
 *
 * An epilogue works on the product in fp32, before it is rounded to the storage type, and saves
 * the pass over memory a separate kernel makes: the bias of a linear layer; bias + gelu_new, the
 * pre-activation kept as the auxiliary output (the MLP's first layer); the gradient of gelu_new,
 * read from the kept pre-activation (the MLP's backward). cuBLASLt's GELU is the tanh form, GPT-2's
 * and GPT-Neo's gelu_new.
 *
 * A plan (the operation and layout descriptors and the heuristic's algorithm) is made once per
 * shape, epilogue and operand alignment, and kept. Where cuBLASLt has no algorithm for one (or an
 * auxiliary leading dimension is not a multiple of 8, or cuBLASLt refuses to run it), the shape is
 * declined: said once on stderr, and the caller computes it with cublasGemmEx and greenlm's kernels.
 * The workspace is the instance's (GPU_LT_WORKSPACE bytes of it, counted in the memory plan). */
#include <vector>

#include "gpu.h"

typedef struct {
  int type, ta, tb, m, n, k, lda, ldb, ldd, ldaux, epilogue;
  unsigned align[5]; /* bytes: A, B, D, bias, aux */
} lt_key;

typedef struct {
  lt_key key;
  bool ok;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

struct gpu_lt {
  cublasLtHandle_t h;
  std::vector<lt_plan> plans;
};

/* The largest power of two (up to 256) that divides the address; 256 for NULL. */
static unsigned alignment(const void *p) {
  uintptr_t u = (uintptr_t)p | 256u;
  return (unsigned)(u & (~u + 1));
}

static lt_key key_of(backend_dtype t, const gpu_lt_args *a) {
  lt_key k;
  memset(&k, 0, sizeof k); /* compared with memcmp */
  k.type = (int)t, k.ta = (int)a->ta, k.tb = (int)a->tb, k.m = a->m, k.n = a->n, k.k = a->k;
  k.lda = a->lda, k.ldb = a->ldb, k.ldd = a->ldd, k.ldaux = a->aux ? a->ldaux : 0, k.epilogue = (int)a->epilogue;
  const void *p[5] = {a->A, a->B, a->D, a->bias, a->aux};
  for (int i = 0; i < 5; i++) k.align[i] = alignment(p[i]);
  return k;
}

static const char *epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
  case CUBLASLT_EPILOGUE_BIAS: return "bias";
  case CUBLASLT_EPILOGUE_GELU_AUX: return "gelu_new";
  case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "bias + gelu_new";
  case CUBLASLT_EPILOGUE_DGELU: return "gelu_new gradient";
  default: return "other";
  }
}

static void desc_set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t what, const void *v, size_t bytes) {
  GPU_BLAS(cublasLtMatmulDescSetAttribute(op, what, v, bytes));
}

/* The per-call pointers of the epilogue (the descriptor keeps them). */
static void set_pointers(lt_plan *p, const gpu_lt_args *a) {
  if (a->bias) desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a->bias, sizeof a->bias);
  if (a->aux) desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &a->aux, sizeof a->aux);
}

/* The descriptors of a plan and the heuristic's best algorithm for them (p->ok: one was found). */
static void make_plan(gpu_lt *lt, const gpu_lt_args *a, lt_plan *p) {
  const cudaDataType_t dt = p->key.type == BACKEND_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  GPU_BLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  int32_t ta = a->ta, tb = a->tb;
  uint32_t epi = a->epilogue;
  desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  if (a->aux) {
    int64_t ld = a->ldaux;
    desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
  }
  set_pointers(p, a); /* the heuristic reads their alignment */
  const bool na = a->ta == CUBLAS_OP_N, nb = a->tb == CUBLAS_OP_N;
  GPU_BLAS(cublasLtMatrixLayoutCreate(&p->a, dt, na ? a->m : a->k, na ? a->k : a->m, a->lda));
  GPU_BLAS(cublasLtMatrixLayoutCreate(&p->b, dt, nb ? a->k : a->n, nb ? a->n : a->k, a->ldb));
  GPU_BLAS(cublasLtMatrixLayoutCreate(&p->d, dt, a->m, a->n, a->ldd));
  cublasLtMatmulPreference_t pref;
  GPU_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t work = GPU_LT_WORKSPACE;
  GPU_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &work, sizeof work));
  const cublasLtMatmulPreferenceAttributes_t at[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++) {
    uint32_t al = p->key.align[i < 2 ? i : 2]; /* C is D */
    GPU_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, at[i], &al, sizeof al));
  }
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt->h, p->op, p->a, p->b, p->d, p->d, pref, 1, &r, &found);
  GPU_BLAS(cublasLtMatmulPreferenceDestroy(pref));
  p->ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p->ok) p->algo = r.algo;
}

static void decline(const gpu_lt_args *a, const char *why) {
  fprintf(stderr,
          "greenlm: warning: cuBLASLt %s for the %d x %d x %d GEMM with the %s epilogue: cuBLAS and greenlm's "
          "kernels compute it\n",
          why, a->m, a->n, a->k, epilogue_name(a->epilogue));
}

static lt_plan *plan_of(gpu_lt *lt, backend_dtype t, const gpu_lt_args *a) {
  lt_key k = key_of(t, a);
  for (lt_plan &p : lt->plans)
    if (memcmp(&p.key, &k, sizeof k) == 0) return &p;
  lt_plan p;
  memset(&p, 0, sizeof p);
  p.key = k;
  make_plan(lt, a, &p);
  if (!p.ok) decline(a, "has no algorithm");
  lt->plans.push_back(p);
  return &lt->plans.back();
}

/* The instance's cuBLASLt, started at the first 16-bit GEMM that wants it; NULL at fp32 storage or
 * where it is off (g->lt_off says why). */
static gpu_lt *lt_of(gpu_ctx *g, backend_dtype t) {
  if (t == BACKEND_FP32 || g->lt_off[0]) return NULL;
  if (!g->lt) {
    cublasLtHandle_t h;
    cublasStatus_t s = cublasLtCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
      util_snprintf(g->lt_off, sizeof g->lt_off, "cannot start: %s", cublasGetStatusString(s));
      fprintf(stderr, "greenlm: warning: cuBLASLt %s: greenlm's kernels compute the epilogues\n", g->lt_off);
      return NULL;
    }
    g->lt = new gpu_lt();
    g->lt->h = h;
  }
  return g->lt;
}

bool gpu_lt_gemm(gpu_ctx *g, backend_dtype t, const gpu_lt_args *a) {
  gpu_lt *lt = lt_of(g, t);
  if (!lt || (a->aux && a->ldaux % 8)) return false; /* cuBLASLt's rule for the auxiliary matrix */
  lt_plan *p = plan_of(lt, t, a);
  if (!p->ok) return false;
  set_pointers(p, a);
  const float alpha = 1.0f, beta = 0.0f;
  void *work = gpu_workspace(g, GPU_LT_WORKSPACE);
  cublasStatus_t s = cublasLtMatmul(lt->h, p->op, &alpha, a->A, p->a, a->B, p->b, &beta, a->D, p->d, a->D, p->d,
                                    &p->algo, work, GPU_LT_WORKSPACE, 0);
  if (s != CUBLAS_STATUS_SUCCESS) { /* the caller computes the whole output again; the kernels take the shape */
    p->ok = false;
    char why[160];
    util_snprintf(why, sizeof why, "refuses the heuristic's algorithm (%s)", cublasGetStatusString(s));
    decline(a, why);
    return false;
  }
  return true;
}

void gpu_lt_close(gpu_ctx *g) {
  if (!g->lt) return;
  for (lt_plan &p : g->lt->plans) {
    GPU_BLAS(cublasLtMatrixLayoutDestroy(p.a));
    GPU_BLAS(cublasLtMatrixLayoutDestroy(p.b));
    GPU_BLAS(cublasLtMatrixLayoutDestroy(p.d));
    GPU_BLAS(cublasLtMatmulDescDestroy(p.op));
  }
  GPU_BLAS(cublasLtDestroy(g->lt->h));
  delete g->lt;
  g->lt = nullptr;
}
