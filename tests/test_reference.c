/* test_reference: the whole model against Hugging Face Transformers.
 *
 * tests/reference/{gpt-neo,gpt2,gpt-neox-a,b,c,llama-a..f}.nc were written by tests/reference/make_fixtures.py from a
 * tiny random GPTNeoForCausalLM (global + local layers), GPT2LMHeadModel, GPTNeoXForCausalLM in three
 * configurations (partial and full rotary, parallel and sequential residual, with and without attention
 * biases, gelu and gelu_new, untied and tied head) and LlamaForCausalLM in six (untied without biases; tied with
 * attention and MLP biases, rope_theta 500000; grouped-query attention with 2 key/value heads of 8, 1 of 4 and 4 of
 * 8, with and without biases, tied and untied; Llama 3's scaled rotary embedding). For each, this test loads
 * the parameters into a greenlm model and checks, relative to each tensor's largest value, the logits, the loss
 * and the gradient of every parameter to 1e-5, and the losses (1e-5) and parameters (2e-5) after three AdamW steps
 * with gradient clipping. */
#include <mpi.h>
#include <pnetcdf.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deck/cfg.h"
#include "model/gpt.h"
#include "model/optim.h"
#include "testing.h"
#include "base/util.h"

/* Relative errors allowed (max error over max value of each tensor): logits and gradients of one pass within 1e-5
 * (they measure under 1e-6 with every OpenBLAS kernel set); parameters after three AdamW steps within 2e-5 (they
 * measure 2.3e-6 to 6.3e-6 by kernel set: AdamW divides by the root of tiny second moments, where the two
 * implementations' gradients differ in their last bits). */
#define TOL_PASS 1e-5
#define TOL_ADAMW 2e-5

static int nc_ok(int err, const char *what) {
  if (err != NC_NOERR) fprintf(stderr, "PnetCDF error (%s): %s\n", what, ncmpi_strerror(err));
  return err == NC_NOERR;
}

static long att_int(int nc, const char *name) {
  long long v = 0;
  nc_ok(ncmpi_get_att_longlong(nc, NC_GLOBAL, name, &v), name);
  return (long)v;
}

static float att_float(int nc, const char *name) {
  float v = 0;
  nc_ok(ncmpi_get_att_float(nc, NC_GLOBAL, name, &v), name);
  return v;
}

static void att_text(int nc, const char *name, char *buf, size_t len) {
  MPI_Offset n = 0;
  buf[0] = '\0';
  if (!nc_ok(ncmpi_inq_attlen(nc, NC_GLOBAL, name, &n), name) || (size_t)n >= len) return;
  nc_ok(ncmpi_get_att_text(nc, NC_GLOBAL, name, buf), name);
  buf[n] = '\0';
}

/* Read a whole variable of n elements; returns 0 when it is missing or has another size. */
static int read_var(int nc, const char *name, nc_type type, void *out, size_t n) {
  int id, ndims, dims[8];
  if (ncmpi_inq_varid(nc, name, &id) != NC_NOERR) return 0;
  ncmpi_inq_varndims(nc, id, &ndims);
  if (ndims > 8) return 0;
  ncmpi_inq_vardimid(nc, id, dims);
  MPI_Offset total = 1;
  for (int d = 0; d < ndims; d++) {
    MPI_Offset len;
    ncmpi_inq_dimlen(nc, dims[d], &len);
    total *= len;
  }
  if ((size_t)total != n) return 0;
  int err = type == NC_FLOAT ? ncmpi_get_var_float_all(nc, id, out)
          : type == NC_INT   ? ncmpi_get_var_int_all(nc, id, out)
                             : ncmpi_get_var_double_all(nc, id, out);
  return nc_ok(err, name);
}

/* Load parameters (prefix "" for the initial ones) into a host buffer in model layout. */
static int load_params(int nc, const gpt_model *m, const char *prefix, float *host) {
  int ok = 1;
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    int got = read_var(nc, name, NC_FLOAT, host + t->offset, t->numel);
    T_CHECK(got, "fixture variable %s missing or of the wrong size (%d x %d)", name, t->rows, t->cols);
    ok &= got;
  }
  return ok;
}

/* The fixture's model shape, as a deck's &model would give it. */
static void fixture_model(int nc, cfg_model *mc) {
  cfg_model_defaults(mc);
  mc->attention_types.n = 0;
  att_text(nc, "arch", mc->arch, sizeof mc->arch);
  mc->vocab_size = att_int(nc, "vocab_size");
  mc->block_size = att_int(nc, "block_size");
  mc->n_layer = att_int(nc, "n_layer");
  mc->n_embd = att_int(nc, "n_embd");
  mc->n_head = att_int(nc, "n_head");
  mc->window_size = att_int(nc, "window_size");
  mc->layer_norm_epsilon = 1e-5;
  mc->init_std = 0.02;
  char types[256];
  att_text(nc, "attention_types", types, sizeof types);
  for (char *tok = strtok(types, ","); tok; tok = strtok(NULL, ","))
    util_strlcpy(mc->attention_types.v[mc->attention_types.n++], tok, CFG_ITEM_LEN);
  if (cfg_model_arch_of(mc) == CFG_ARCH_LLAMA) {
    mc->rotary_emb_base = att_float(nc, "rotary_emb_base");
    mc->layer_norm_epsilon = att_float(nc, "layer_norm_epsilon");
    mc->n_inner = att_int(nc, "n_inner");
    mc->attention_bias = (int)att_int(nc, "attention_bias");
    mc->mlp_bias = (int)att_int(nc, "mlp_bias");
    mc->n_kv_head = att_int(nc, "n_kv_head");
    att_text(nc, "rope_scaling", mc->rope_scaling, sizeof mc->rope_scaling);
    if (cfg_model_rope_scaling_of(mc) == CFG_ROPE_LLAMA3) {
      mc->rope_factor = att_float(nc, "rope_factor");
      mc->rope_low_freq_factor = att_float(nc, "rope_low_freq_factor");
      mc->rope_high_freq_factor = att_float(nc, "rope_high_freq_factor");
      mc->rope_original_positions = att_int(nc, "rope_original_positions");
    }
    att_text(nc, "head", mc->head, sizeof mc->head);
    return;
  }
  if (cfg_model_arch_of(mc) != CFG_ARCH_GPT_NEOX) return;
  mc->rotary_pct = att_float(nc, "rotary_pct");
  mc->rotary_emb_base = att_float(nc, "rotary_emb_base");
  mc->use_parallel_residual = (int)att_int(nc, "use_parallel_residual");
  mc->attention_bias = (int)att_int(nc, "attention_bias");
  att_text(nc, "activation", mc->activation, sizeof mc->activation);
  att_text(nc, "head", mc->head, sizeof mc->head);
}

/* The worst relative error of any tensor of x against ref, each checked against tol. */
static double check_tensors(const gpt_model *m, const float *x, const float *ref, const char *path, const char *what,
                            double tol) {
  double worst = 0.0;
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    double e = t_rel_err(x + t->offset, ref + t->offset, t->numel);
    T_CHECK(e < tol, "%s %s of %s: relative error %.3g", path, what, t->name, e);
    if (e > worst) worst = e;
  }
  return worst;
}

/* Logits, loss and every gradient of one batch against the fixture's. */
static void check_forward_backward(int nc, gpt_model *m, int B, int T, int32_t *x, int32_t *y, float *ref, const char *path) {
  const int N = B * T, V = m->s.V;
  float *logits = malloc((size_t)N * V * sizeof(float));
  double loss_ref;
  read_var(nc, "input_ids", NC_INT, x, (size_t)N);
  read_var(nc, "targets", NC_INT, y, (size_t)N);
  read_var(nc, "logits", NC_FLOAT, logits, (size_t)N * V);
  read_var(nc, "loss", NC_DOUBLE, &loss_ref, 1);
  gpt_set_batch(m, 0, x, y, B, T);
  gpt_forward(m, 0, B, T);
  float *got = t_logits(m, 0, (size_t)N);
  double e = t_rel_err(got, logits, (size_t)N * V);
  free(got);
  T_CHECK(e < TOL_PASS, "%s logits: relative error %.3g", path, e);
  printf("  logits rel err %.2e\n", e);
  double sums[2];
  gpt_sums_clear(m);
  gpt_loss(m, 0, B, T, 1.0f / (float)N);
  gpt_sums_read(m, sums);
  const double loss = sums[0] / N;
  T_CHECK(fabs(loss - loss_ref) < 1e-5 * fabs(loss_ref), "%s loss %.8f vs %.8f", path, loss, loss_ref);
  printf("  loss %.7f (reference %.7f)\n", loss, loss_ref);
  gpt_zero_grad(m);
  gpt_backward(m, 0, B, T, NULL, NULL);
  load_params(nc, m, "grad.", ref);
  printf("  gradients of %d tensors: worst rel err %.2e\n", m->ntensors, check_tensors(m, m->grads, ref, path, "gradient", TOL_PASS));
  free(logits);
}

/* Three AdamW steps with clipping from the fixture's initial parameters (in host). */
static void check_adamw(int nc, gpt_model *m, optim_state *opt, int B, int T, int32_t *x, int32_t *y, const float *host,
                        float *ref, const char *path) {
  const int N = B * T;
  cfg_training tc;
  memset(&tc, 0, sizeof tc);
  tc.lr = att_float(nc, "lr");
  tc.beta1 = att_float(nc, "beta1");
  tc.beta2 = att_float(nc, "beta2");
  tc.adam_eps = att_float(nc, "adam_eps");
  tc.weight_decay = att_float(nc, "weight_decay");
  tc.grad_clip = att_float(nc, "grad_clip");
  strcpy(tc.lr_decay, "constant");
  double loss_ref[3];
  read_var(nc, "adam_inputs", NC_INT, x, (size_t)3 * N);
  read_var(nc, "adam_targets", NC_INT, y, (size_t)3 * N);
  read_var(nc, "adam_losses", NC_DOUBLE, loss_ref, 3);
  memcpy(m->params, host, m->nparams * sizeof(float));
  gpt_params_changed(m, 0, m->nparams);
  for (int step = 0; step < 3; step++) {
    gpt_zero_grad(m);
    gpt_sums_clear(m);
    gpt_set_batch(m, 0, x + (size_t)step * N, y + (size_t)step * N, B, T);
    gpt_forward(m, 0, B, T);
    gpt_loss(m, 0, B, T, 1.0f / (float)N);
    gpt_backward(m, 0, B, T, NULL, NULL);
    m->be->reduce_sum(m->be, m->sums + 1, m->grads, m->nparams, 1);
    optim_adamw_step(opt, m, &tc, step, optim_lr(&tc, step), 1.0, m->sums); /* clipped by the norm of the sums */
    double sums[2];
    gpt_sums_read(m, sums);
    const double l = sums[0] / N, norm = sqrt(sums[1]);
    T_CHECK(fabs(l - loss_ref[step]) < 1e-5 * fabs(loss_ref[step]), "%s AdamW step %d loss %.8f vs %.8f", path,
            step + 1, l, loss_ref[step]);
    printf("  AdamW step %d: loss %.7f (reference %.7f), grad norm %.4f\n", step + 1, l, loss_ref[step], norm);
  }
  load_params(nc, m, "step3.", ref);
  printf("  parameters after 3 AdamW steps: worst rel err %.2e\n",
         check_tensors(m, m->params, ref, path, "parameters after 3 AdamW steps", TOL_ADAMW));
}

static void run_fixture(const char *path) {
  int nc;
  if (!nc_ok(ncmpi_open(MPI_COMM_SELF, path, NC_NOWRITE, MPI_INFO_NULL, &nc), path)) {
    T_CHECK(0, "cannot open fixture %s", path);
    return;
  }
  printf("fixture %s\n", path);
  cfg_model mc;
  fixture_model(nc, &mc);
  const int B = (int)att_int(nc, "batch"), T = (int)att_int(nc, "seq_len"), N = B * T;
  gpt_shape s;
  gpt_shape_from_cfg(&s, &mc);
  gpt_model m;
  gpt_init(&m, &s, backend_cpu(), B, T, gpt_whole(&s), 1);
  optim_state opt;
  optim_init(&opt, backend_cpu(), 0, m.nparams);
  T_CHECK(m.nparams == gpt_count_params(&s), "parameter count");
  float *host = malloc(m.nparams * sizeof(float)), *ref = malloc(m.nparams * sizeof(float));
  int32_t *x = malloc((size_t)3 * N * sizeof(int32_t)), *y = malloc((size_t)3 * N * sizeof(int32_t));
  if (load_params(nc, &m, "", host)) {
    memcpy(m.params, host, m.nparams * sizeof(float));
    check_forward_backward(nc, &m, B, T, x, y, ref, path);
    check_adamw(nc, &m, &opt, B, T, x, y, host, ref, path);
  }
  free(x), free(y), free(host), free(ref);
  optim_free(&opt);
  gpt_free(&m);
  gpt_shape_free(&s);
  ncmpi_close(nc);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  const char *top = getenv("TOP_SRCDIR");
  char path[4096];
  const char *arch[] = {"gpt-neo", "gpt2",    "gpt-neox-a", "gpt-neox-b", "gpt-neox-c", "llama-a",
                        "llama-b", "llama-c", "llama-d",    "llama-e",    "llama-f"};
  for (int i = 0; i < (int)(sizeof arch / sizeof arch[0]); i++) {
    snprintf(path, sizeof path, "%s/tests/reference/%s.nc", top ? top : ".", arch[i]);
    run_fixture(path);
  }
  int rc = t_done("test_reference");
  MPI_Finalize();
  return rc;
}
