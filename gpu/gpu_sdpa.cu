/* gpu_sdpa: GPT-Neo's attention through cuDNN's fused scaled-dot-product attention (a flash
 * attention: no T x T score matrix in memory) at bf16 and fp16 storage; built with --with-cudnn.
 *
 * The attention_fwd/bwd contract of backend.h, unchanged: qkv S (B,T,W) = [q (C) | k (Ckv) | v (Ckv)], W = C + 2 Ckv,
 * with head h in columns h*D..(h+1)*D (D = C/H) of each part (H query heads, Hkv key/value heads: grouped-query
 * attention, which cuDNN takes as it is), out S (B,T,C), lse F (B,H,T) the natural log-sum-exp of each row of
 * scale * q k^T (cuDNN's "Stats"), dqkv S (B,T,W) overwritten. cuDNN reads and writes these in place through
 * strides: q and dq are (B,H,T,D) views with strides (WT, D, W, 1), k, v, dk, dv (B,Hkv,T,D) ones, out and dout
 * (CT, D, C, 1); nothing is transposed or copied.
 *
 * Masks: causal (query i sees keys j <= i, the band's right bound 0 from the top-left diagonal);
 * a local layer keeps keys with j + window > i (the band's left bound = window), GPT-Neo's
 * i - window < j <= i. The scale is the op's (1.0 for GPT-Neo). Softmax and accumulation in fp32.
 *
 * Graphs are built once per shape (direction, storage type, B, T, C, H, Hkv, window, scale) and kept in
 * the instance; a shape cuDNN declines (head size, architecture, cuDNN version) is remembered as
 * declined, said once on stderr, and computed by greenlm's kernels (gpu_attention.cu). The backward
 * graph asks for cuDNN's deterministic algorithm first, so that a step repeats bit for bit. A graph's
 * workspace comes from the instance's planned workspace (gpu_workspace); a graph needing more than
 * was planned is declined too, so the dry run's memory plan stays exact. */
#include "gpu.h"
#include "gpu_sdpa.h"

#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cstring> /* the frontend uses std::strlen */
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

namespace fe = cudnn_frontend;
using fe_tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

enum : int64_t { U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV };

/* what a graph is built for */
typedef std::tuple<int, int, int, int, int, int, int, int, float> sdpa_key; /* bwd, type, B, T, C, H, Hkv, window, scale */
static sdpa_key key_of(int bwd, int type, int B, int T, int C, int H, int Hkv, int window, float scale) {
  return sdpa_key(bwd, type, B, T, C, H, Hkv, window > 0 ? window : 0, scale); /* every global window is 0 */
}

struct sdpa_plan {
  std::shared_ptr<fe::graph::Graph> graph; /* NULL: declined */
  int64_t work = 0;                        /* workspace bytes */
  bool deterministic = false;
};

struct gpu_sdpa {
  cudnnHandle_t handle;
  std::map<sdpa_key, sdpa_plan> plans;
};

gpu_sdpa *gpu_sdpa_open(char *why, size_t len) {
  cudnnHandle_t h;
  cudnnStatus_t s = cudnnCreate(&h);
  if (s != CUDNN_STATUS_SUCCESS) {
    util_snprintf(why, len, "cudnnCreate: %s", cudnnGetErrorString(s));
    return NULL;
  }
  gpu_sdpa *p = new gpu_sdpa();
  p->handle = h;
  return p;
}

void gpu_sdpa_close(gpu_sdpa *p) {
  if (!p) return;
  p->plans.clear();
  cudnnDestroy(p->handle);
  delete p;
}

size_t gpu_sdpa_version(void) { return cudnnGetVersion(); }

/* ---- building ------------------------------------------------------------------------------------ */

/* t as a (B,H,T,D) view of rows of `row` elements, head h at column h*D */
static void rows(fe::graph::Tensor_attributes &t, int64_t uid, int B, int H, int T, int D, int64_t row) {
  t.set_uid(uid).set_dim({B, H, T, D}).set_stride({(int64_t)T * row, D, row, 1});
}

/* t as the log-sum-exp, lse F (B,H,T) */
static void lse_of(fe::graph::Tensor_attributes &t, int B, int H, int T) {
  t.set_uid(U_STATS).set_dim({B, H, T, 1}).set_stride({(int64_t)H * T, T, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
}

/* an input of the graph, a view of rows */
static fe_tensor view(fe::graph::Graph &gr, const char *name, int64_t uid, int B, int H, int T, int D, int64_t row) {
  fe::graph::Tensor_attributes t;
  rows(t.set_name(name), uid, B, H, T, D, row);
  return gr.tensor(t);
}

/* an output of the graph, a view of rows */
static void as_view(const fe_tensor &t, int64_t uid, int B, int H, int T, int D, int64_t row) {
  rows(t->set_output(true), uid, B, H, T, D, row);
}

template <typename A> static void mask(A &opt, int window, float scale) {
  opt.set_attn_scale(scale)
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0);
  if (window > 0) opt.set_diagonal_band_left_bound(window);
}

/* the device a graph is built for, when it is not the current one (ahead of time) */
typedef std::shared_ptr<const fe::DeviceProperties> fe_device;

static std::shared_ptr<fe::graph::Graph> new_graph(backend_dtype t, const fe_device &dp, int sm) {
  auto gr = std::make_shared<fe::graph::Graph>();
  if (dp) gr->set_device_properties(dp).set_sm_version(sm); /* before the nodes, which copy it */
  gr->set_io_data_type(t == BACKEND_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return gr;
}

static std::shared_ptr<fe::graph::Graph> fwd_graph(backend_dtype t, const fe_device &dp, int sm, int B, int T, int C,
                                                   int H, int Hkv, int window, float scale) {
  auto gr = new_graph(t, dp, sm);
  const int D = C / H, W = C + 2 * D * Hkv;
  auto q = view(*gr, "q", U_Q, B, H, T, D, W), k = view(*gr, "k", U_K, B, Hkv, T, D, W),
       v = view(*gr, "v", U_V, B, Hkv, T, D, W);
  auto opt = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true);
  mask(opt, window, scale);
  auto [o, stats] = gr->sdpa(q, k, v, opt);
  as_view(o, U_O, B, H, T, D, C);
  lse_of(stats->set_output(true), B, H, T);
  return gr;
}

static std::shared_ptr<fe::graph::Graph> bwd_graph(backend_dtype t, const fe_device &dp, int sm, int B, int T, int C,
                                                   int H, int Hkv, int window, float scale, bool deterministic) {
  auto gr = new_graph(t, dp, sm);
  const int D = C / H, W = C + 2 * D * Hkv;
  auto q = view(*gr, "q", U_Q, B, H, T, D, W), k = view(*gr, "k", U_K, B, Hkv, T, D, W),
       v = view(*gr, "v", U_V, B, Hkv, T, D, W), o = view(*gr, "o", U_O, B, H, T, D, C),
       dout = view(*gr, "dout", U_DO, B, H, T, D, C);
  fe::graph::Tensor_attributes lse;
  lse_of(lse.set_name("lse"), B, H, T);
  auto stats = gr->tensor(lse);
  auto opt = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_deterministic_algorithm(deterministic);
  mask(opt, window, scale);
  auto [dq, dk, dv] = gr->sdpa_backward(q, k, v, o, dout, stats, opt);
  as_view(dq, U_DQ, B, H, T, D, W);
  as_view(dk, U_DK, B, Hkv, T, D, W);
  as_view(dv, U_DV, B, Hkv, T, D, W);
  return gr;
}

/* Ahead of time: whether cuDNN has engines for the graph on the device it was made for: the graph
 * validated and lowered, and the engine configurations of cuDNN's heuristics that the device
 * supports (compiled for it); the plans themselves are built only on the device, which loads
 * their kernels. */
static fe::error_t supported(fe::graph::Graph &gr) {
  fe::error_t v = gr.validate();
  if (!v.is_good()) return v;
  fe::error_t o = gr.build_operation_graph();
  if (!o.is_good()) return o;
  fe::error_t c = gr.create_execution_plans({fe::HeurMode_t::A});
  return c;
}

/* The graph for key k built for a device: the instance's (h), or the one dp describes (ahead of
 * time, without a GPU: gpu_sdpa_aot, which stops before the plans). The backward asks for the
 * deterministic algorithm first (det says which was built). NULL, with the reason in why, where
 * cuDNN declines. */
static std::shared_ptr<fe::graph::Graph> compile(const sdpa_key &k, cudnnHandle_t h, const fe_device &dp, int sm,
                                                 bool &det, int64_t &work, std::string &why) {
  auto [bwd, type, B, T, C, H, Hkv, window, scale] = k;
  const backend_dtype t = (backend_dtype)type;
  for (int d = 1; d >= 0; d--) { /* the forward pass has no nondeterministic variant */
    auto gr = bwd ? bwd_graph(t, dp, sm, B, T, C, H, Hkv, window, scale, d)
                  : fwd_graph(t, dp, sm, B, T, C, H, Hkv, window, scale);
    fe::error_t e = dp ? supported(*gr) : gr->build(h, {fe::HeurMode_t::A});
    if (e.is_good() && !dp) {
      fe::error_t w = gr->get_workspace_size(work);
      e = w;
    }
    if (e.is_good()) {
      det = !bwd || d;
      return gr;
    }
    std::string m = e.get_message();
    why = (d ? "" : why + "; nondeterministic: ") + m.substr(0, m.find('\n')); /* its first line says it */
    if (!bwd) break;
  }
  return nullptr;
}

/* Build the plan for key k on the instance, or say why not (false, the reason in why). */
static bool build(gpu_ctx *g, const sdpa_key &k, sdpa_plan &p, std::string &why) {
  auto gr = compile(k, g->sdpa->handle, nullptr, 0, p.deterministic, p.work, why);
  if (!gr) return false;
  if (g->work_bytes && (size_t)p.work > g->work_bytes) {
    why = "its workspace (" + std::to_string(p.work) + " bytes) exceeds the planned one (" +
          std::to_string(g->work_bytes) + ")";
    return false;
  }
  if (!p.deterministic)
    fprintf(stderr,
            "greenlm: warning: cuDNN has no deterministic attention backward for B = %d, T = %d, C = %d, H = %d (%s): "
            "its atomic one runs, so repeated steps may differ in the last bits\n",
            std::get<2>(k), std::get<3>(k), std::get<4>(k), std::get<5>(k), why.c_str());
  p.graph = gr;
  return true;
}

/* cuDNN's layout rules: head size and row strides in 16-byte units (k and v start C elements in) */
static bool shape_ok(const sdpa_key &k, std::string &why) {
  const int C = std::get<4>(k), H = std::get<5>(k);
  if (C % H == 0 && (C / H) % 8 == 0 && C / H <= 256) return true;
  why = "the head size must be a multiple of 8, at most 256";
  return false;
}

/* The plan for a call: found, or built now (and remembered either way); NULL where declined. */
static const sdpa_plan *plan_for(gpu_ctx *g, const sdpa_key &k) {
  auto it = g->sdpa->plans.find(k);
  if (it != g->sdpa->plans.end()) return it->second.graph ? &it->second : NULL;
  sdpa_plan p;
  std::string why;
  bool ok = shape_ok(k, why) && build(g, k, p, why);
  auto [bwd, type, B, T, C, H, Hkv, window, scale] = k;
  if (!ok)
    fprintf(stderr,
            "greenlm: warning: cuDNN declines the attention %s (%s storage, B = %d, T = %d, C = %d, H = %d, Hkv = %d, "
            "window %d): %s; greenlm's kernels compute it\n",
            bwd ? "backward" : "forward", backend_dtype_name((backend_dtype)type), B, T, C, H, Hkv, window,
            why.empty() ? "unsupported shape" : why.c_str());
  auto &slot = g->sdpa->plans[k] = p;
  return ok ? &slot : NULL;
}

/* ---- running ------------------------------------------------------------------------------------- */

static void run(gpu_ctx *g, const sdpa_plan *p, std::unordered_map<int64_t, void *> &pack) {
  void *work = p->work ? gpu_workspace(g, (size_t)p->work) : NULL;
  fe::error_t e = p->graph->execute(g->sdpa->handle, pack, work);
  if (!e.is_good()) util_fatal_at(__FILE__, __LINE__, GPU_HINT, "cuDNN attention: %s", e.get_message().c_str());
}

/* element e of a 16-bit array */
static void *at(const void *p, size_t e) { return (char *)p + 2 * e; }

bool gpu_sdpa_fwd(gpu_ctx *g, backend_dtype t, void *out, float *lse, const void *qkv, int B, int T, int C, int H,
                  int Hkv, int window, float scale) {
  const sdpa_plan *p = plan_for(g, key_of(0, t, B, T, C, H, Hkv, window, scale));
  if (!p) return false;
  const size_t Ckv = (size_t)(C / H) * Hkv;
  std::unordered_map<int64_t, void *> pack = {{U_Q, at(qkv, 0)}, {U_K, at(qkv, C)}, {U_V, at(qkv, C + Ckv)},
                                              {U_O, out}, {U_STATS, lse}};
  run(g, p, pack);
  return true;
}

bool gpu_sdpa_bwd(gpu_ctx *g, backend_dtype t, void *dqkv, const void *dout, const void *out, const float *lse,
                  const void *qkv, int B, int T, int C, int H, int Hkv, int window, float scale) {
  const sdpa_plan *p = plan_for(g, key_of(1, t, B, T, C, H, Hkv, window, scale));
  if (!p) return false;
  const size_t Ckv = (size_t)(C / H) * Hkv;
  std::unordered_map<int64_t, void *> pack = {
      {U_Q, at(qkv, 0)},    {U_K, at(qkv, C)},         {U_V, at(qkv, C + Ckv)}, {U_O, (void *)out},
      {U_DO, (void *)dout}, {U_STATS, (void *)lse},    {U_DQ, at(dqkv, 0)},     {U_DK, at(dqkv, C)},
      {U_DV, at(dqkv, C + Ckv)}};
  run(g, p, pack);
  return true;
}

/* ---- ahead of time, without a GPU -------------------------------------------------------------- */

int gpu_sdpa_aot(const char *device_json, int sm, int bwd, int storage, int B, int T, int C, int H, int Hkv, int window,
                 float scale, int *deterministic, char *why, size_t len) {
  std::string reason;
  const sdpa_key k = key_of(bwd, storage, B, T, C, H, Hkv, window, scale);
  auto dp = std::make_shared<fe::DeviceProperties>();
  std::vector<uint8_t> js(device_json, device_json + strlen(device_json));
  fe::error_t e = dp->deserialize(js);
  if (!e.is_good()) {
    util_snprintf(why, len, "the device description: %s", e.get_message().c_str());
    return -1;
  }
  bool det = false;
  int64_t work = 0;
  if (!shape_ok(k, reason) || !compile(k, nullptr, dp, sm, det, work, reason)) {
    util_snprintf(why, len, "%s", reason.c_str());
    return -1;
  }
  *deterministic = det;
  return 0;
}
