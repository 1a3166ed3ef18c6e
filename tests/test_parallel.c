/* test_parallel: every parallel layout reproduces the serial run (run under mpiexec -n 4; with the argument
 * gpt-neox, for a GPT-NeoX with partial rotary embeddings, the parallel residual, an untied head and no attention
 * biases, with llama for a Llama with grouped-query attention (2 key/value heads of 4, so that T = 2 splits the
 * groups) and the SwiGLU MLP: one layout of each decomposition and their products, recomputation, bf16 storage,
 * each with ZeRO-1 from the start and ZeRO-0 from the serial checkpoint, and the checkpoints between the
 * decompositions).
 *
 * A tiny GPT-Neo (4 layers) trains for 10 steps on a dataset this test prepares, with the same
 * global batch, serially (rank 0 alone) and laid out as D=2, D=4, P=2, P=4, P=2 x D=2 (both rank
 * orders), each with ZeRO 0 and 1. Every step's loss must be within 1e-5 relative of the serial
 * run's, the final validation loss too (a blend of the validation split and the training split,
 * weights 3 and 2: the blend's loss is exactly 0.6 and 0.4 of the two, each checked), and the final parameters within 1e-5 (largest difference
 * over the largest parameter). Every rank allocates exactly the backend memory the dry run plans
 * for its stage. Each layout also continues the serial run from a checkpoint written after half
 * the steps (another layout, ZeRO on or off): the same bounds hold for the second half. The layout
 * P=2 x D=2 runs once more with the CPU backend posing as device memory, so that every message
 * and checkpoint goes through host staging (comm.h), as on a GPU without CUDA-aware MPI. With
 * activation recomputation, one rank must repeat the serial run bitwise and P=2 x D=2 match it.
 * Every layout run from the start also writes a checkpoint half-way, through a staging buffer of
 * 10 KiB (&checkpoint stage_mb), so that ranks whose pieces differ in size make different numbers
 * of collective waits, and reads it back in many reads of 20 KiB, three in flight (read_mb,
 * read_requests); rank 0 alone continues from it, within the same bounds of the layout's own
 * continuation. At bf16 storage (&system precision = 'bf16'), P=2, P=2 x D=2 and P=2 x D=2 with
 * host staging reproduce the serial bf16 run within 1e-4 (losses) and 1e-3 (parameters): a
 * different order of gradient sums can flip the rounding of a weight's bf16 copy. The serial bf16
 * run's validation loss is within 0.02 of the fp32 run's. In every run the replicas of a stage end
 * with bit-identical parameters. Checkpoints pass between the three decompositions (T = 2 to P = 2 and
 * to D = 2, and back). Then the compressed exchange (&comm, test_compressed). */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "deck/cfg.h"
#include "parallel/par.h"
#include "text/prepare.h"
#include "testing.h"
#include "testdeck.h"
#include "trainer.h"
#include "base/util.h"

enum { STEPS = 10 };

static int staged; /* the backend claims device memory: MPI goes through host staging buffers */
static int recompute; /* &training recompute: blocks recomputed in the backward pass */
static const char *precision = "fp32"; /* &system precision: the storage type of activations */
static const char *comm_method = "none"; /* &comm: the compressed gradient exchange */
static int comm_bits = 4;
static const char *comm_exchange = "allgather";
static int comm_ef; /* &comm error_feedback */
static int comm_warmup; /* &comm warmup_steps: 2 for PowerSGD in two levels (its fp32 steps are the flat exchange) */
static int ranks_per_node; /* &comm hierarchy = 'node' with these ranks per node; 0: no hierarchy */
static int global_batch = 8; /* &training global_batch_size (6 for 3 replicas) */
static int tensor_par = 1; /* &parallel tensor_parallel */
static const char *arch = "gpt-neo"; /* the command line's: gpt-neo, gpt-neox or llama */
static int rotary; /* the model is a GPT-NeoX or a Llama (rotary embeddings, an untied head), not a GPT-Neo */

typedef struct {
  double loss[STEPS], val, vals[2]; /* the validation loss: the blend's, each dataset's */
  float *params; /* on rank 0 */
  size_t n;
} run_result;

static cfg_config *deck(const char *dir, int P, int D, int zero, const char *order, int nranks) {
  char text[24000]; /* four paths of up to 4096 bytes, and the rest */
  const char *top = getenv("TOP_SRCDIR");
  snprintf(text, sizeof text,
           "&job task = 'prepare', 'train', seed = 5, run_dir = '%s/run' /\n"
           "&prepare input = '%s/tests/data/kjv-genesis.txt', documents = 'line', val_fraction = 0.1,\n"
           "  train_out = '%s/train.nc', val_out = '%s/val.nc' /\n"
           "&data val = '%s/val.nc', '%s/train.nc', val_weights = 3, 2 /\n"
           "&model vocab_size = 256, block_size = 32, n_layer = 4, n_embd = 32, n_head = 4,\n"
           "  %s /\n"
           "&training seq_len = 32, micro_batch_size = 2, global_batch_size = %d, max_steps = %d,\n"
           "  lr = 3e-3, min_lr = 3e-4, warmup_steps = 2, grad_clip = 1.0, eval_batches = 4, recompute = %s /\n"
           "&parallel pipeline_stages = %d, data_parallel = %d, zero_stage = %d, rank_order = '%s',\n"
           "  bucket_mb = 0.01, tensor_parallel = %d /\n"
           "&checkpoint stage_mb = 0.01, read_mb = 0.02, read_requests = 3 /\n"
           "&system backend = 'cpu', precision = '%s' /\n"
           "&comm method = '%s', bits = %d, min_numel = 1000, exchange = '%s', error_feedback = %s,\n"
           "  hierarchy = '%s', ranks_per_node = %d, warmup_steps = %d /\n",
           dir, top ? top : ".", dir, dir, dir, dir,
           /* no attention biases: the dims of k's bias that no rotation turns add the same to every score of a
            * query and have no gradient but rounding noise, which AdamW scales up to whole steps; where the layouts'
            * noise differs, so do those parameters (the biases' exactness is test_reference's) */
           strcmp(arch, "gpt-neox") == 0 ? "arch = 'gpt-neox', attention_types = 'global', rotary_pct = 0.5, "
                                           "attention_bias = .false."
           : strcmp(arch, "llama") == 0 ? "arch = 'llama', attention_types = 'global', n_kv_head = 2, n_inner = 80"
                                        : "attention_types = 'global', 'local', window_size = 8",
           global_batch, STEPS, recompute ? ".true." : ".false.", P, D, zero, order,
           tensor_par, precision,
           comm_method, comm_bits, comm_exchange, comm_ef ? ".true." : ".false.", ranks_per_node ? "node" : "none",
           ranks_per_node, comm_warmup);
  return t_load_deck(text, "parallel.nml", nranks);
}

/* Train STEPS steps on comm; with restart, from that checkpoint (written after STEPS/2 steps). With
 * save, write a checkpoint there after STEPS/2 steps. */
static void train_from(cfg_config *c, MPI_Comm comm, run_result *r, const char *restart, const char *save) {
  err_list e = {0};
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  t_counted = 0;
  const backend *be = t_counting_backend(c->system.precision, staged);
  trainer *t = trainer_open(c, be, comm, &e);
  err_print(&e, 10);
  T_CHECK(t != NULL, "trainer_open failed");
  if (!t) return;
  /* what this rank allocated is what the dry run plans for its stage and replica */
  par_layout lay;
  par_plan(&lay, c, size, rank);
  trainer_memory plan = trainer_plan_memory(c, be, &lay, lay.stage, lay.replica);
  long diff = (long)t_counted - (long)plan.total, worst;
  MPI_Allreduce(&diff, &worst, 1, MPI_LONG, MPI_MAX, comm);
  T_CHECK(worst == 0 && diff == 0, "P=%d D=%d: a rank allocated %ld bytes more than planned", lay.P, lay.D, worst);
  par_free(&lay);
  long first = 0;
  if (restart) {
    double tokens;
    ckpt_stats st;
    T_CHECK(trainer_restore(t, restart, &first, &tokens, &st, &e) == 0, "restart from %s failed", restart);
    err_print(&e, 10);
    T_CHECK(first == STEPS / 2, "restarted at step %ld", first);
  }
  for (long s = first; s < STEPS; s++) {
    trainer_step_info info;
    T_CHECK(trainer_step(t, s, &info) == 0, "step %ld diverged", s);
    r->loss[s] = info.loss;
    if (save && s + 1 == STEPS / 2) {
      ckpt_stats st;
      err_list cerr = {0};
      T_CHECK(trainer_checkpoint(t, s + 1, 0.0, &st, &cerr) == 0, "checkpoint: %s", cerr.n ? cerr.v[0].msg : "");
      err_free(&cerr);
      util_strlcpy((char *)save, st.path, CFG_STR_LEN);
    }
  }
  r->val = trainer_eval(t, r->vals); /* a blend of validation datasets, weights 0.6 and 0.4 */
  T_CHECK(t->data.nval == 2 && r->val == 0.6 * r->vals[0] + 0.4 * r->vals[1] && r->vals[0] != r->vals[1],
          "validation blend: %.9g is not 0.6 x %.9g + 0.4 x %.9g", r->val, r->vals[0], r->vals[1]);
  /* every replica of a stage holds the same parameters, bit for bit */
  uint64_t h = 1469598103934665603ULL, *all = malloc((size_t)t->lay.D * sizeof *all);
  const unsigned char *p = (const unsigned char *)t->model.params;
  for (size_t i = 0; i < t->model.nparams * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ULL;
  MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, t->lay.dp);
  int same = 1;
  for (int i = 1; i < t->lay.D; i++) same &= all[i] == all[0];
  T_CHECK(same, "the replicas of stage %d hold different parameters", t->lay.stage);
  free(all);
  const gpt_tensor *w = NULL; /* the tied embedding (none with an untied head) */
  for (int i = 0; i < t->model.ntensors; i++)
    if (t->model.tensors[i].tied) w = &t->model.tensors[i];
  if (t->lay.embed != MPI_COMM_NULL && w) { /* the first and the last stage's copies of the tied embedding agree */
    uint64_t e = util_hash64(t->model.params + w->offset, w->numel * sizeof(float), 7), ends[2];
    MPI_Allgather(&e, 1, MPI_UINT64_T, ends, 1, MPI_UINT64_T, t->lay.embed);
    T_CHECK(ends[0] == ends[1], "replica %d: the tied embedding differs between the first and the last stage",
            t->lay.replica);
  }
  if (t->lay.tp > 1) { /* the tensors every tensor rank holds stay the same on all of them, bit for bit */
    uint64_t h = UTIL_HASH64_EMPTY, *hs = malloc((size_t)t->lay.tp * sizeof *hs);
    for (int i = 0; i < t->model.ntensors; i++)
      if (t->model.tensors[i].split == GPT_SPLIT_NONE)
        h = util_hash64_more(h, t->model.params + t->model.tensors[i].offset, t->model.tensors[i].numel * sizeof(float));
    MPI_Allgather(&h, 1, MPI_UINT64_T, hs, 1, MPI_UINT64_T, t->lay.tensor);
    int agree = 1;
    for (int i = 1; i < t->lay.tp; i++) agree &= hs[i] == hs[0];
    T_CHECK(agree, "stage %d replica %d: the tensor ranks' copies of the replicated tensors differ", t->lay.stage,
            t->lay.replica);
    free(hs);
  }
  r->params = trainer_gather_params(t, &r->n);
  size_t hn; /* the verdict's streamed hash is the hash of the gathered model */
  uint64_t ph = trainer_params_hash(t, &hn);
  T_CHECK(!r->params || (hn == r->n && ph == util_hash64(r->params, r->n * sizeof(float), 0)),
          "P=%d D=%d: the streamed parameter hash %016llx differs from the gathered model's", t->lay.P, t->lay.D,
          (unsigned long long)ph);
  trainer_close(t);
  err_free(&e);
}

/* A case of the compressed exchange: &comm method, bits, exchange and error feedback on P stages x D
 * replicas with ZeRO-zero; bounds against the serial fp32 run (losses tl, parameters tp); dev: also
 * with the gradients in "device" memory; rpn: &comm hierarchy = 'node' with rpn ranks per node. */
typedef struct {
  const char *method;
  int bits, D, zero;
  double tl, tp;
  const char *exchange;
  int ef, P, dev, rpn;
} comm_case;

/* Case k on the first P x D ranks: close to the serial run ref; a restart from the layout's own
 * checkpoint continues it bit for bit; with dev, the device path's run and restart are the host
 * path's bit for bit. The replicas' agreement is train_from's. */
static void check_case(const char *dir, const run_result *ref, int rank, const comm_case *k) {
  const int D = k->D, P = k->P;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rank < P * D ? 0 : MPI_UNDEFINED, rank, &sub);
  run_result r = {0}, again = {0}, dev = {0}, dev_again = {0};
  char mine[CFG_STR_LEN] = "", shape[48] = "";
  comm_method = k->method, comm_bits = k->bits, comm_exchange = k->exchange, comm_ef = k->ef, ranks_per_node = k->rpn;
  comm_warmup = strcmp(k->method, "powersgd") == 0 && k->rpn ? 2 : 0;
  global_batch = D == 3 ? 6 : D == 6 ? 12 : 8;
  if (k->rpn) snprintf(shape, sizeof shape, ", hierarchy on nodes of %d rank%s", k->rpn, k->rpn > 1 ? "s" : "");
  char what[32]; /* top-k has no bits */
  if (strcmp(k->method, "topk") == 0) snprintf(what, sizeof what, "topk 1%%");
  else if (strcmp(k->method, "powersgd") == 0) snprintf(what, sizeof what, "powersgd rank 4");
  else snprintf(what, sizeof what, "%s %d-bit", k->method, k->bits);
  if (sub != MPI_COMM_NULL) {
    cfg_config *c = deck(dir, P, D, k->zero, "replicas_adjacent", P * D);
    train_from(c, sub, &r, NULL, mine);
    train_from(c, sub, &again, mine, NULL);
    if (k->dev) { /* the same run with the gradients in "device" memory, restart included */
      staged = 1;
      train_from(c, sub, &dev, NULL, mine);
      train_from(c, sub, &dev_again, mine, NULL);
      staged = 0;
    }
    free(c);
    MPI_Comm_free(&sub);
  }
  if (rank == 0) {
    double worst = 0;
    for (int s = 0; s < STEPS; s++) worst = fmax(worst, fabs(r.loss[s] - ref->loss[s]) / fabs(ref->loss[s]));
    double pe = r.params && r.n == ref->n ? t_rel_err(r.params, ref->params, r.n) : INFINITY;
    int bitwise = again.params && r.params && again.n == r.n && !memcmp(again.params, r.params, r.n * sizeof(float)) &&
                  !memcmp(again.loss + STEPS / 2, r.loss + STEPS / 2, STEPS / 2 * sizeof(double));
    printf("compressed %s %s%s, P=%d D=%d ZeRO-%d%s: step losses rel err %.2e, val %.5f (serial %.5f), "
           "parameters %.2e; restart %s\n", what, k->exchange, k->ef ? " + error feedback" : "", P, D,
           k->zero, shape, worst, r.val, ref->val, pe, bitwise ? "bit for bit" : "DIFFERS");
    T_CHECK(worst <= k->tl, "%s D=%d%s: a step's loss differs by %.3g", what, D, shape, worst);
    T_CHECK(pe <= k->tp, "%s D=%d%s: parameters differ by %.3g", what, D, shape, pe);
    T_CHECK(bitwise, "%s D=%d%s: the restart from step %d does not continue bit for bit", what, D, shape, STEPS / 2);
    if (k->dev) {
      int same = dev.params && dev_again.params && dev.n == r.n && !memcmp(dev.params, r.params, r.n * sizeof(float)) &&
                 !memcmp(dev.loss, r.loss, sizeof r.loss) && dev.val == r.val && dev_again.n == r.n &&
                 !memcmp(dev_again.params, r.params, r.n * sizeof(float));
      printf("compressed %s %s%s, P=%d D=%d%s: on \"device\" memory (the ops there, messages staged) %s\n",
             what, k->exchange, k->ef ? " + error feedback" : "", P, D, shape,
             same ? "bit for bit the host path's, restart included" : "DIFFERS");
      T_CHECK(same, "%s %s D=%d%s: the device path differs from the host path", what, k->exchange, D, shape);
    }
  }
  free(r.params), free(again.params), free(dev.params), free(dev_again.params);
  MPI_Barrier(MPI_COMM_WORLD);
  global_batch = 8;
  comm_method = "none", comm_bits = 4, comm_exchange = "allgather", comm_ef = 0, ranks_per_node = 0, comm_warmup = 0;
}

/* The compressed exchange (&comm) on D = 2 and D = 4, ZeRO 0 and 1, with and without error
 * feedback, and on 2 pipeline stages x 2 replicas: close to the serial run; a restart from the
 * layout's own checkpoint continues it bit for bit (the rounding is keyed by the step; ALQ's and
 * AMQ's levels, refitted after every step of these 10-step runs, and the error-feedback residuals
 * come from the checkpoint); bits = 32 is the fp32 exchange bit for bit. The cases marked dev run
 * again with the gradients in "device" memory (the counting backend poses as one): encoded and
 * decoded by the backend's ops there, the messages staged through the host, the residual copied to
 * and from checkpoints, with the exact memory plan that train_from checks. The bounds against the
 * serial run are loose: quantization noise moves a 10-step run (NUQSGD's L2 buckets of 8192 the
 * most); doc/compression.md measures what it costs a full run. */
static void test_compressed(const char *dir, const run_result *ref, int rank) {
  static const comm_case cases[] = {
      {"qsgdinf", 8, 2, 0, 2e-3, 2e-2, "allgather", 0, 1, 0, 0}, {"qsgdinf", 4, 4, 1, 2e-2, 1e-1, "allgather", 0, 1, 1, 0},
      {"nuqsgd", 4, 2, 1, 6e-2, 1e-1, "allgather", 0, 1, 0, 0},  {"minmax", 4, 2, 0, 2e-2, 1e-1, "allgather", 0, 1, 0, 0},
      {"qsgdinf", 8, 2, 1, 2e-2, 1e-1, "intsum", 0, 1, 0, 0},    {"alq", 4, 2, 0, 6e-2, 1e-1, "allgather", 0, 1, 0, 0},
      {"qsgdinf", 4, 4, 1, 6e-2, 1e-1, "sra", 0, 1, 1, 0},
      {"alq", 4, 2, 0, 6e-2, 1e-1, "sra", 0, 1, 0, 0},           {"qsgdinf", 2, 2, 0, 6e-2, 1e-1, "allgather", 1, 1, 0, 0},
      {"qsgd", 4, 4, 1, 1.5e-1, 1e-1, "sra", 1, 1, 1, 0},        {"qsgdinf", 4, 4, 1, 2e-2, 1e-1, "intsum", 1, 1, 1, 0},
      {"alq", 4, 2, 1, 6e-2, 1e-1, "allgather", 1, 2, 1, 0},     {"qsgdinf", 4, 2, 0, 2e-2, 1e-1, "intsum", 0, 2, 0, 0},
      {"qsgdinf", 4, 3, 1, 1e-1, 2e-1, "allgather", 0, 1, 0, 0}, {"nuqsgd", 4, 3, 1, 1e-1, 2e-1, "sra", 1, 1, 1, 0},
      {"qsgdinf", 4, 3, 0, 1e-1, 2e-1, "intsum", 0, 1, 0, 0}, {"topk", 4, 4, 1, 3e-1, 3e-1, "allgather", 1, 1, 1, 0},
      {"powersgd", 4, 4, 1, 3e-1, 3e-1, "allgather", 1, 1, 1, 0}, {"powersgd", 4, 2, 0, 3e-1, 3e-1, "allgather", 1, 2, 1, 0}};
  /* QSGD's L2 levels at 4 bits on buckets of 1000-8192 have a relative variance near 10: with error
   * feedback the messages are scaled by about 1/11 (a contraction), and the first steps lag. Three
   * replicas take batches of 6, not the serial run's 8: the bounds only say they train alike; their
   * replicas' agreement and the restart are what is checked. */
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) check_case(dir, ref, rank, &cases[k]);
  global_batch = 8;
  /* bits = 32: the fp32 exchange itself */
  run_result a = {0}, b = {0};
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &sub);
  if (sub != MPI_COMM_NULL) {
    comm_method = "qsgd", comm_bits = 32;
    cfg_config *c = deck(dir, 1, 2, 0, "replicas_adjacent", 2);
    train_from(c, sub, &a, NULL, NULL);
    free(c);
    comm_method = "none", comm_bits = 4;
    c = deck(dir, 1, 2, 0, "replicas_adjacent", 2);
    train_from(c, sub, &b, NULL, NULL);
    free(c);
    MPI_Comm_free(&sub);
  }
  if (rank == 0)
    T_CHECK(a.params && b.params && a.n == b.n && !memcmp(a.params, b.params, a.n * sizeof(float)) &&
                !memcmp(a.loss, b.loss, sizeof a.loss),
            "bits = 32 differs from the fp32 exchange");
  free(a.params), free(b.params);
  comm_method = "none", comm_bits = 4, comm_exchange = "allgather", comm_ef = 0;
}

/* The two-level exchange (&comm hierarchy = 'node', nodes of ranks_per_node ranks): fp32 inside the
 * nodes, every method between them, on 2 nodes x 2 replicas and 3 x 2, with ZeRO 0 and 1, error
 * feedback and the device path (PowerSGD: its tensors dealt out to a node's replicas, summed onto and
 * broadcast from their leaders, after 2 warm-up steps of the flat fp32 exchange); pipelines whose stages' replicas are one node each (nothing leaves
 * it) and a node each (R = 1); without compression the two-level sum is the serial run's within
 * rounding. The replicas agree and restarts continue bit for bit (check_case). The cases of 3 x 2 run
 * alone on 6 ranks (size 6), the others on 4. */
static void test_hierarchy(const char *dir, const run_result *ref, int rank, int size) {
  static const comm_case cases[] = {
      {"none", 4, 4, 1, 1e-5, 1e-5, "allgather", 0, 1, 1, 2},    {"qsgdinf", 4, 4, 1, 2e-2, 1e-1, "allgather", 0, 1, 1, 2},
      {"nuqsgd", 4, 4, 1, 1e-1, 1e-1, "sra", 1, 1, 1, 2},        {"qsgd", 8, 4, 0, 2e-2, 1e-1, "allgather", 0, 1, 0, 2},
      {"minmax", 4, 4, 0, 2e-2, 1e-1, "allgather", 0, 1, 0, 2},  {"amq", 4, 4, 1, 6e-2, 1e-1, "allgather", 0, 1, 0, 2},
      {"qsgdinf", 4, 4, 0, 2e-2, 1e-1, "intsum", 1, 1, 0, 2},    {"alq", 4, 2, 1, 6e-2, 1e-1, "allgather", 1, 2, 1, 1},
      {"qsgdinf", 4, 2, 0, 2e-2, 1e-1, "allgather", 0, 2, 0, 2}, {"qsgdinf", 4, 6, 1, 1e-1, 2e-1, "allgather", 1, 1, 1, 2},
      {"alq", 4, 6, 0, 1e-1, 2e-1, "sra", 0, 1, 0, 2},          {"topk", 4, 4, 0, 3e-1, 3e-1, "sra", 1, 1, 0, 2},
      {"powersgd", 4, 4, 1, 3e-1, 3e-1, "allgather", 1, 1, 1, 2}, {"powersgd", 4, 6, 0, 3e-1, 3e-1, "allgather", 1, 1, 1, 2}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    if ((cases[k].P * cases[k].D == 6) == (size == 6)) check_case(dir, ref, rank, &cases[k]);
}

static const char *const precisions[] = {"fp32", "bf16"}; /* of the serial references */

/* Every layout against the serial reference at its precision (refs, with their half-way
 * checkpoints ckpts): ZeRO 0 and 1, from the start and from the serial checkpoint. */
static void test_layouts(const char *dir, const run_result refs[2], char ckpts[2][CFG_STR_LEN], int rank) {
  static const struct {
    int P, D;
    const char *order;
    int staged, recompute, bf16;
    int T; /* tensor ranks */
    int both; /* also run for GPT-NeoX (one of each decomposition, their products, recomputation, bf16) */
  } layouts[] = {{1, 2, "replicas_adjacent", 0, 0, 0, 1, 1}, {1, 4, "replicas_adjacent", 0, 0, 0, 1, 0},
                 {2, 1, "replicas_adjacent", 0, 0, 0, 1, 1}, {4, 1, "replicas_adjacent", 0, 0, 0, 1, 0},
                 {2, 2, "replicas_adjacent", 0, 0, 0, 1, 1}, {2, 2, "stages_adjacent", 0, 0, 0, 1, 0},
                 {2, 2, "replicas_adjacent", 1, 0, 0, 1, 0}, {1, 1, "replicas_adjacent", 0, 1, 0, 1, 1},
                 {2, 2, "replicas_adjacent", 0, 1, 0, 1, 1}, {2, 1, "replicas_adjacent", 0, 0, 1, 1, 1},
                 {2, 2, "replicas_adjacent", 0, 0, 1, 1, 0}, {2, 2, "replicas_adjacent", 1, 0, 1, 1, 0},
                 {1, 1, "replicas_adjacent", 0, 0, 0, 2, 1}, {2, 1, "replicas_adjacent", 0, 0, 0, 2, 1},
                 {1, 2, "replicas_adjacent", 0, 0, 0, 2, 1}, {1, 2, "stages_adjacent", 0, 0, 0, 2, 0},
                 {1, 1, "replicas_adjacent", 0, 0, 0, 4, 0}, {1, 2, "replicas_adjacent", 1, 1, 0, 2, 0},
                 {2, 1, "replicas_adjacent", 0, 0, 1, 2, 1}};
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
    for (int mode = 0; mode < 4 && (!rotary || layouts[i].both); mode++) { /* ZeRO 0 and 1, from the start and from the serial checkpoint */
      if (rotary && (mode == 0 || mode == 3)) continue; /* GPT-NeoX: ZeRO-1 from the start, ZeRO-0 restarted */
      int zero = mode & 1, resumed = mode >> 1;
      int P = layouts[i].P, D = layouts[i].D, n = P * layouts[i].T * D;
      tensor_par = layouts[i].T;
      MPI_Comm sub;
      MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &sub);
      run_result r = {0}, back = {0};
      char mine[CFG_STR_LEN] = ""; /* the layout's own checkpoint */
      staged = layouts[i].staged;
      recompute = layouts[i].recompute;
      precision = precisions[layouts[i].bf16];
      const run_result *rf = &refs[layouts[i].bf16];
      const char *ckpt = ckpts[layouts[i].bf16];
      /* bf16 storage: another order of the gradient sums moves a master weight by fp32 ulps, which
       * can flip the rounding of its bf16 compute copy (2^-8 relative): looser bounds */
      double tl = layouts[i].bf16 ? 1e-4 : 1e-5, tp = layouts[i].bf16 ? 1e-3 : 1e-5;
      /* tensor ranks at bf16: each rank's partial projection is rounded to bf16 before the sum, where
       * the serial run rounds the whole product once (2^-8 relative per partial) */
      if (layouts[i].bf16 && layouts[i].T > 1) tl = 3e-4, tp = 1e-2;
      /* an untied token embedding (GPT-NeoX) has rows that only a rare token's lookups move: AdamW's first steps on
       * them are near lr whatever the gradient's size, so its sign in a rounding-noise dimension decides them
       * (measured: 1.7e-2 in embed_in of P=2 x T=2 at bf16; every other tensor within 4.3e-3) */
      if (layouts[i].bf16 && layouts[i].T > 1 && rotary) tp = 3e-2;
      if (sub != MPI_COMM_NULL) {
        cfg_config *c = deck(dir, P, D, zero, layouts[i].order, n);
        train_from(c, sub, &r, resumed ? ckpt : NULL, resumed ? NULL : mine);
        free(c);
        MPI_Comm_free(&sub);
      }
      tensor_par = 1;
      if (!resumed && rank == 0) { /* the layout's checkpoint, continued by one rank */
        cfg_config *c = deck(dir, 1, 1, 0, "replicas_adjacent", 1);
        train_from(c, MPI_COMM_SELF, &back, mine, NULL);
        free(c);
        double pe = back.params && back.n == r.n ? t_rel_err(back.params, r.params, r.n) : INFINITY;
        printf("P=%d T=%d D=%d ZeRO-%d %-17s checkpoint continued by 1 rank: parameters %.2e from the layout's\n", P,
               layouts[i].T, D, zero, layouts[i].order, pe);
        T_CHECK(pe <= tp, "P=%d D=%d ZeRO-%d: the layout's checkpoint continued on 1 rank differs by %.3g", P, D,
                zero, pe);
        T_CHECK(back.val == back.val && fabs(back.val - r.val) <= tl * fabs(r.val),
                "P=%d D=%d ZeRO-%d: validation after the continuation %.6g, the layout's %.6g", P, D, zero, back.val,
                r.val);
        free(back.params);
      }
      if (resumed && rank == 0) memcpy(r.loss, rf->loss, STEPS / 2 * sizeof(double)); /* the first half is the serial run's */
      if (rank == 0) {
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
          double e = fabs(r.loss[s] - rf->loss[s]) / fabs(rf->loss[s]);
          if (e > worst) worst = e;
        }
        double ve = fabs(r.val - rf->val) / fabs(rf->val);
        for (int v = 0; v < 2; v++) ve = fmax(ve, fabs(r.vals[v] - rf->vals[v]) / fabs(rf->vals[v]));
        double pe = r.params && r.n == rf->n ? t_rel_err(r.params, rf->params, r.n) : INFINITY;
        printf("P=%d T=%d D=%d ZeRO-%d %-17s %s%s%s, %s: step losses rel err %.2e, val %.2e, parameters %.2e\n", P,
               layouts[i].T, D, zero, layouts[i].order, resumed ? "restarted" : "from start", staged ? ", host staging" : "",
               recompute ? ", recomputation" : "", precision, worst, ve, pe);
        if (n == 1) /* recomputation alone repeats the same arithmetic: bitwise the serial run */
          T_CHECK(worst == 0 && ve == 0 && pe == 0, "recomputation on one rank differs from the serial run");
        T_CHECK(worst <= tl, "P=%d D=%d ZeRO-%d %s: a step's loss differs by %.3g relative", P, D, zero,
                layouts[i].order, worst);
        T_CHECK(ve <= tl, "P=%d D=%d ZeRO-%d: validation loss differs by %.3g", P, D, zero, ve);
        T_CHECK(pe <= tp, "P=%d D=%d ZeRO-%d: final parameters differ by %.3g", P, D, zero, pe);
      }
      free(r.params);
      MPI_Barrier(MPI_COMM_WORLD);
    }
}

/* Checkpoints across the three decompositions: written by T = 2 and continued by P = 2 and by D = 2,
 * written by P = 2 and by D = 2 (ZeRO-1) and continued by T = 2; each continuation within 1e-5 of the
 * writer's own (parameters and validation). */
static void test_tensor_restarts(const char *dir, int rank) {
  static const struct {
    int P, T, D; /* the writer */
    int cP, cT, cD; /* the continuation */
  } cases[] = {{1, 2, 1, 2, 1, 1}, {1, 2, 1, 1, 1, 2}, {2, 1, 1, 1, 2, 1}, {1, 1, 2, 1, 2, 1}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    run_result w = {0}, c = {0};
    char mine[CFG_STR_LEN] = "";
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &sub);
    if (sub != MPI_COMM_NULL) {
      tensor_par = cases[k].T;
      cfg_config *cw = deck(dir, cases[k].P, cases[k].D, cases[k].D > 1, "replicas_adjacent", 2);
      train_from(cw, sub, &w, NULL, mine);
      free(cw);
      tensor_par = cases[k].cT;
      cfg_config *cc = deck(dir, cases[k].cP, cases[k].cD, 0, "replicas_adjacent", 2);
      train_from(cc, sub, &c, mine, NULL);
      free(cc);
      MPI_Comm_free(&sub);
    }
    tensor_par = 1;
    if (rank == 0) {
      double pe = c.params && c.n == w.n ? t_rel_err(c.params, w.params, w.n) : INFINITY;
      printf("checkpoint of P=%d T=%d D=%d continued by P=%d T=%d D=%d: parameters %.2e, val %.6g (writer %.6g)\n",
             cases[k].P, cases[k].T, cases[k].D, cases[k].cP, cases[k].cT, cases[k].cD, pe, c.val, w.val);
      T_CHECK(pe <= 1e-5 && fabs(c.val - w.val) <= 1e-5 * fabs(w.val),
              "the checkpoint of P=%d T=%d D=%d continued by P=%d T=%d D=%d differs: parameters %.3g", cases[k].P,
              cases[k].T, cases[k].D, cases[k].cP, cases[k].cT, cases[k].cD, pe);
    }
    free(w.params), free(c.params);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  setenv("GREENLM_CUDA_AWARE_MPI", "0", 1); /* the staged layout stages, whatever this MPI can do */
  if (argc > 1) arch = argv[1];
  const int hierarchy = strcmp(arch, "hierarchy") == 0; /* test_hierarchy's cases of 6 ranks alone */
  if (hierarchy) arch = "gpt-neo";
  rotary = strcmp(arch, "gpt-neo") != 0;
  const char *out = getenv("TEST_OUT");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/parallel%s%s", out ? out : "tests/out", rotary || hierarchy ? "-" : "",
           hierarchy ? "hierarchy" : rotary ? arch : "");
  if (rank == 0) util_mkdir_p(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  if (size < (hierarchy ? 6 : 4)) {
    if (rank == 0) printf("SKIP: needs %d ranks (run under mpiexec -n %d)\n", hierarchy ? 6 : 4, hierarchy ? 6 : 4);
    MPI_Finalize();
    return 77;
  }
  /* the dataset, prepared by all ranks */
  cfg_config *c0 = deck(dir, 1, 1, 0, "replicas_adjacent", 1);
  err_list perr = {0};
  T_CHECK(prepare_run(c0, MPI_COMM_WORLD, &perr) == 0, "prepare failed");
  err_print(&perr, 10);
  err_free(&perr);
  free(c0);
  /* the serial references on rank 0 at each precision (storage type), with a checkpoint half-way */
  run_result refs[2];
  memset(refs, 0, sizeof refs);
  char ckpts[2][CFG_STR_LEN] = {"", ""};
  for (int k = 0; k < (hierarchy ? 1 : 2); k++) {
    precision = precisions[k];
    cfg_config *c = deck(dir, 1, 1, 0, "replicas_adjacent", 1);
    if (rank == 0) train_from(c, MPI_COMM_SELF, &refs[k], NULL, ckpts[k]);
    MPI_Bcast(ckpts[k], sizeof ckpts[k], MPI_CHAR, 0, MPI_COMM_WORLD);
    free(c);
  }
  if (hierarchy) {
    test_hierarchy(dir, &refs[0], rank, size);
    free(refs[0].params);
    int rc = rank == 0 ? t_done("test_parallel hierarchy") : 0;
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
  }
  test_layouts(dir, refs, ckpts, rank);
  precision = "fp32", staged = 0, recompute = 0;
  test_tensor_restarts(dir, rank);
  if (!rotary) { /* the exchange does not depend on the architecture */
    test_compressed(dir, &refs[0], rank);
    test_hierarchy(dir, &refs[0], rank, size);
  }
  for (int k = 0; k < 2 && rank == 0; k++)
    printf("serial, %s: losses %.5f ... %.5f, validation %.5f\n", precisions[k], refs[k].loss[0], refs[k].loss[STEPS - 1],
           refs[k].val);
  if (rank == 0) /* bf16 storage trains as fp32 does, within its rounding */
    T_CHECK(fabs(refs[1].val - refs[0].val) < 0.02, "bf16 storage: validation loss %.5f, fp32 %.5f", refs[1].val, refs[0].val);
  free(refs[0].params), free(refs[1].params);
  int rc = rank == 0 ? t_done("test_parallel") : 0;
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
