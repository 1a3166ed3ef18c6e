/* hf: Hugging Face GPT-Neo, GPT-2 and GPT-NeoX model directories: config check, weight import, export. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "io/hf.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/progress.h"
#include "base/util.h"
#include "io/safetensors.h"
#include "text/tok.h"
#include "text/tokjson.h"

#define HF_HINT_SAVE "save the model with transformers' save_pretrained(dir, safe_serialization=True)"

static long added_since(const err_list *errs, long before) { return err_count(errs) - before; }

/* ---- config.json -------------------------------------------------------------------------------- */

/* The JSON file path (a config or an index, at most HF_JSON_MAX bytes), or NULL after an error at the
 * file (its line and column for bad JSON; a directory or a FIFO by name, never read). */
enum { HF_JSON_MAX = 64 << 20 };
static json_t *load_json(const char *path, const char *what, const char *hint, err_list *errs) {
  size_t len;
  char *text = util_read_file(path, HF_JSON_MAX, &len, what, hint, errs);
  if (!text) return NULL;
  json_error_t je;
  json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  free(text);
  if (!j || !json_is_object(j))
    err_add(errs, path, j ? 0 : je.line, j ? 0 : je.column, hint, "cannot read the %s: %s", what,
            j ? "not a JSON object" : je.text);
  if (j && !json_is_object(j)) json_decref(j), j = NULL;
  return j;
}

/* An integer key of the config (absent: def; null allowed when null_ok, giving 0), at most what the
 * deck's &model key for it allows (so that no product or loop over it can overflow or run away).
 * -1 after an error. */
static int get_int(const json_t *c, const char *key, const char *deck_key, long def, int null_ok, long *out,
                   const char *path, err_list *errs) {
  const json_t *v = json_object_get(c, key);
  if (!v || (null_ok && json_is_null(v))) {
    *out = v ? 0 : def;
    return 0;
  }
  const double most = cfg_key_max("model", deck_key);
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    err_add(errs, path, 0, 0, HF_HINT_SAVE, "%s must be an integer >= 0%s", key, null_ok ? " or null" : "");
    return -1;
  }
  if ((double)json_integer_value(v) > most) {
    char hint[160];
    util_snprintf(hint, sizeof hint, "greenlm's &model %s is at most %.0f: this model is beyond what it trains", deck_key, most);
    err_add(errs, path, 0, 0, hint, "%s = %lld is more than greenlm takes (&model %s, at most %.0f)", key,
            (long long)json_integer_value(v), deck_key, most);
    return -1;
  }
  *out = (long)json_integer_value(v);
  return 0;
}

/* A boolean key that must have the value want (absent: def). */
static int want_bool(const json_t *c, const char *key, int def, int want, const char *path, err_list *errs) {
  const json_t *v = json_object_get(c, key);
  int got = !v ? def : json_is_boolean(v) ? json_is_true(v) : -1;
  if (got == want) return 0;
  err_add(errs, path, 0, 0, "greenlm computes GPT-Neo and GPT-2 as Hugging Face does with their default settings",
          "%s = %s is not supported (greenlm computes %s = %s)", key, got < 0 ? "(not a boolean)" : got ? "true" : "false", key,
          want ? "true" : "false");
  return -1;
}

/* An activation name of config.json as &model activation's word: the tanh forms (gelu_new, gelu_fast,
 * gelu_pytorch_tanh) are gelu_new, the erf form is gelu; NULL for one greenlm does not compute. */
static const char *activation_word(const char *act) {
  static const char *tanh_forms[] = {"gelu_new", "gelu_fast", "gelu_pytorch_tanh"};
  for (int i = 0; i < 3; i++)
    if (strcmp(act, tanh_forms[i]) == 0) return "gelu_new";
  return strcmp(act, "gelu") == 0 ? "gelu" : NULL;
}

/* The string key `key` (absent: def) as &model activation's word into out; -1 after an error. */
static int get_activation(const json_t *c, const char *key, const char *def, cfg_model *out, const char *path,
                          err_list *errs) {
  const json_t *v = json_object_get(c, key);
  const char *got = !v ? def : json_is_string(v) ? json_string_value(v) : "(not a string)", *w = activation_word(got);
  if (!w) {
    err_add(errs, path, 0, 0, "greenlm computes gelu (the erf form) and gelu_new (the tanh form: gelu_new, gelu_fast, "
            "gelu_pytorch_tanh)", "%s = \"%s\" is not an activation greenlm computes", key, got);
    return -1;
  }
  util_strlcpy(out->activation, w, sizeof out->activation);
  return 0;
}

/* tie_word_embeddings (absent: def) as &model head into out; -1 after an error. */
static int get_head(const json_t *c, int def, cfg_model *out, const char *path, err_list *errs) {
  const json_t *v = json_object_get(c, "tie_word_embeddings");
  if (v && !json_is_boolean(v)) {
    err_add(errs, path, 0, 0, HF_HINT_SAVE, "tie_word_embeddings must be true or false");
    return -1;
  }
  util_strlcpy(out->head, (v ? json_is_true(v) : def) ? "tied" : "untied", sizeof out->head);
  return 0;
}

/* The per-layer kinds of a list that repeats over the layers, as its shortest period. */
static void set_pattern(cfg_strlist *out, char kinds[][8], int L) {
  int p = 1;
  while (p < L) {
    int ok = 1;
    for (int l = p; l < L && ok; l++) ok = strcmp(kinds[l], kinds[l % p]) == 0;
    if (ok) break;
    p++;
  }
  out->n = p < CFG_LIST_MAX ? p : CFG_LIST_MAX;
  for (int i = 0; i < out->n; i++) util_strlcpy(out->v[i], kinds[i], CFG_ITEM_LEN);
}

/* GPT-Neo's attention_types [[["global", "local"], n], ...] expanded to L layers into out. */
static int neo_attention(const json_t *c, long L, cfg_model *out, const char *path, err_list *errs) {
  const json_t *at = json_object_get(c, "attention_types");
  static const char HINT[] = "attention_types is a list of [[kinds...], repeats] whose expansion has num_layers entries, "
                             "each \"global\" or \"local\"";
  char(*kinds)[8] = util_calloc((size_t)L + 1, 8, "layer kinds");
  long n = 0;
  int ok = json_is_array(at);
  for (size_t i = 0; ok && i < json_array_size(at); i++) {
    const json_t *item = json_array_get(at, i), *ks = json_array_get(item, 0), *rep = json_array_get(item, 1);
    ok = json_is_array(item) && json_array_size(item) == 2 && json_is_array(ks) && json_is_integer(rep);
    if (ok && (json_integer_value(rep) < 0 || json_integer_value(rep) > L)) { /* a repeat count bounded by the layers */
      err_add(errs, path, 0, 0, HINT, "attention_types entry %zu repeats its kinds %lld times: not in 0 .. %ld, the layers", i,
              (long long)json_integer_value(rep), L);
      free(kinds);
      return -1;
    }
    for (json_int_t r = 0; ok && r < json_integer_value(rep); r++)
      for (size_t k = 0; ok && k < json_array_size(ks); k++) {
        const char *kind = json_string_value(json_array_get(ks, k));
        ok = kind && (strcmp(kind, "global") == 0 || strcmp(kind, "local") == 0) && n < L;
        if (ok) util_strlcpy(kinds[n++], kind, 8);
      }
  }
  if (!ok || n != L)
    err_add(errs, path, 0, 0, HINT, "attention_types does not expand to %ld layer kinds, one per layer", L);
  else
    set_pattern(&out->attention_types, kinds, (int)L);
  free(kinds);
  return ok && n == L ? 0 : -1;
}

/* GPT-NeoX's config.json fields that change nothing greenlm computes (ids, dtypes, bookkeeping, the
 * classification head's dropout). */
static int neox_inert(const char *key) {
  static const char *inert[] = {"architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id",
                                "torch_dtype", "dtype", "transformers_version", "use_cache", "is_decoder",
                                "classifier_dropout", "_name_or_path", "initializer_range", "tokenizer_class"};
  for (size_t i = 0; i < sizeof inert / sizeof inert[0]; i++)
    if (strcmp(key, inert[i]) == 0) return 1;
  return 0;
}

/* A number key (absent: def) into *out; -1 after an error. */
static int get_real(const json_t *c, const char *key, double def, double *out, const char *path, err_list *errs) {
  const json_t *v = json_object_get(c, key);
  if (v && !json_is_number(v)) {
    err_add(errs, path, 0, 0, HF_HINT_SAVE, "%s must be a number", key);
    return -1;
  }
  *out = v ? json_number_value(v) : def;
  return 0;
}

/* Whether key is one of the n names of list. */
static int listed(const char *key, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(key, list[i]) == 0) return 1;
  return 0;
}

/* The rope_type of a rope_parameters or rope_scaling object (older files: "type"); "default" when absent. */
static const char *rope_type_of(const json_t *o) {
  const json_t *t = json_object_get(o, "rope_type");
  if (!t) t = json_object_get(o, "type");
  return !t ? "default" : json_is_string(t) ? json_string_value(t) : "(not a string)";
}

static const char ROPE_HINT[] = "greenlm computes the default rotary embedding and, for llama, Llama 3's scaling "
                                "(rope_type \"llama3\")";

/* The fields of rope object o (named `where`) that are not among the n of known: refused by name. */
static int rope_unknown(const json_t *o, const char *where, const char *const *known, size_t n, const char *path,
                        err_list *errs) {
  const char *key;
  json_t *v;
  int rc = 0;
  json_object_foreach((json_t *)o, key, v)
    if (!listed(key, known, n))
      err_add(errs, path, 0, 0, ROPE_HINT, "%s.%s is not a field greenlm implements", where, key), rc = -1;
  return rc;
}

/* Llama 3's scaling from o (rope_parameters or rope_scaling, named `where`) into out's rope_* keys; -1 after an
 * error. Every field is needed, in the ranges of the deck's keys. */
static int llama3_scaling(const json_t *o, const char *where, cfg_model *out, const char *path, err_list *errs) {
  static const char *const known[] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                      "high_freq_factor", "original_max_position_embeddings"};
  int rc = rope_unknown(o, where, known, sizeof known / sizeof known[0], path, errs);
  double v[4];
  for (int k = 0; k < 4; k++) {
    const char *key = known[3 + k];
    if (!json_object_get(o, key))
      err_add(errs, path, 0, 0, HF_HINT_SAVE, "%s.%s is missing: Llama 3's scaling needs it", where, key), rc = -1;
    else
      rc |= get_real(o, key, 0.0, &v[k], path, errs);
  }
  if (rc != 0) return -1;
  if (v[0] < 1 || v[0] > 1e6 || v[1] <= 0 || v[2] <= v[1] || v[2] > 1e6 || v[3] < 1 || v[3] > 1048576 ||
      v[3] != floor(v[3])) {
    err_add(errs, path, 0, 0, "Llama 3.1 has factor 8, low_freq_factor 1, high_freq_factor 4 and a context of 8192",
            "%s: factor %g, low_freq_factor %g, high_freq_factor %g or original_max_position_embeddings %g out of "
            "range", where, v[0], v[1], v[2], v[3]);
    return -1;
  }
  util_strlcpy(out->rope_scaling, "llama3", sizeof out->rope_scaling);
  out->rope_factor = v[0], out->rope_low_freq_factor = v[1], out->rope_high_freq_factor = v[2];
  out->rope_original_positions = (long)v[3];
  return 0;
}

/* rope_scaling: null, or (llama3_ok) Llama 3's; -1 after an error. */
static int rope_scaling(const json_t *sc, int llama3_ok, cfg_model *out, const char *path, err_list *errs) {
  if (!sc || json_is_null(sc)) return 0;
  const char *type = json_is_object(sc) ? rope_type_of(sc) : "(not an object)";
  if (llama3_ok && strcmp(type, "llama3") == 0) return llama3_scaling(sc, "rope_scaling", out, path, errs);
  err_add(errs, path, 0, 0, ROPE_HINT, "rope_scaling is set: scaled rotary embeddings of type %s are not supported", type);
  return -1;
}

/* The rotary embedding of a GPT-NeoX or Llama config: rope_parameters (current transformers: rope_type "default"
 * with rope_theta, partial_rotary_factor; for llama also "llama3" with its scaling), else rope_theta /
 * partial_rotary_factor or the older rotary_emb_base / rotary_pct (absent: def_pct), and rope_scaling (null, or for
 * llama Llama 3's); another scaling is refused by name. */
static int get_rope(const json_t *c, double def_pct, int llama3_ok, cfg_model *out, const char *path, err_list *errs) {
  const json_t *rp = json_object_get(c, "rope_parameters");
  if (rope_scaling(json_object_get(c, "rope_scaling"), llama3_ok, out, path, errs) != 0) return -1;
  double base = 10000.0, pct = def_pct;
  int rc = get_real(c, json_object_get(c, "rope_theta") ? "rope_theta" : "rotary_emb_base", 10000.0, &base, path, errs);
  rc |= get_real(c, json_object_get(c, "partial_rotary_factor") ? "partial_rotary_factor" : "rotary_pct", def_pct, &pct,
                 path, errs);
  if (rp && !json_is_null(rp)) {
    if (!json_is_object(rp)) {
      err_add(errs, path, 0, 0, HF_HINT_SAVE, "rope_parameters must be an object");
      return -1;
    }
    static const char *const known[] = {"rope_type", "rope_theta", "partial_rotary_factor"};
    const char *type = rope_type_of(rp);
    if (llama3_ok && strcmp(type, "llama3") == 0)
      rc |= llama3_scaling(rp, "rope_parameters", out, path, errs);
    else if (strcmp(type, "default") != 0) { /* its fields are its own */
      err_add(errs, path, 0, 0, ROPE_HINT, "rope_parameters.rope_type = %s is not supported", type);
      return -1;
    } else
      rc |= rope_unknown(rp, "rope_parameters", known, 3, path, errs);
    rc |= get_real(rp, "rope_theta", base, &base, path, errs);
    rc |= get_real(rp, "partial_rotary_factor", pct, &pct, path, errs);
  }
  if (rc == 0 && (pct < 0 || pct > 1 || base < 1 || base > 1e12)) {
    err_add(errs, path, 0, 0, "greenlm takes a share of rotary dims in [0, 1] and a base in [1, 1e12]",
            "rotary share %g or base %g out of range", pct, base);
    rc = -1;
  }
  out->rotary_pct = pct, out->rotary_emb_base = base;
  return rc;
}

/* A GPT-NeoX config (transformers' defaults for absent keys): every field is mapped to &model, known to change
 * nothing greenlm computes, or refused by name. */
static int parse_neox(const json_t *c, const char *path, cfg_model *out, err_list *errs) {
  static const char *keys[6] = {"vocab_size", "max_position_embeddings", "num_hidden_layers", "hidden_size",
                                "num_attention_heads", "intermediate_size"};
  static const char *deck_keys[6] = {"vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_inner"};
  static const long defs[6] = {50432, 2048, 44, 6144, 64, 24576};
  static const char *mapped[] = {"hidden_act", "layer_norm_eps", "use_parallel_residual", "attention_bias",
                                 "tie_word_embeddings", "rope_parameters", "rope_scaling", "rope_theta",
                                 "rotary_emb_base", "partial_rotary_factor", "rotary_pct", "attention_dropout",
                                 "hidden_dropout"};
  long v[6];
  int rc = 0;
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)c, key, val) {
    int known = neox_inert(key);
    for (int k = 0; k < 6; k++) known |= strcmp(key, keys[k]) == 0;
    for (size_t k = 0; k < sizeof mapped / sizeof mapped[0]; k++) known |= strcmp(key, mapped[k]) == 0;
    if (!known)
      err_add(errs, path, 0, 0, "greenlm imports GPTNeoXForCausalLM as transformers computes it; a field it does not "
              "implement would change the model", "config.json field \"%s\" is not one greenlm implements", key), rc = -1;
  }
  for (int k = 0; k < 6; k++) rc |= get_int(c, keys[k], deck_keys[k], defs[k], 0, &v[k], path, errs);
  double eps = 1e-5, drop[2] = {0.0, 0.0};
  rc |= get_real(c, "layer_norm_eps", 1e-5, &eps, path, errs);
  rc |= get_real(c, "attention_dropout", 0.0, &drop[0], path, errs) | get_real(c, "hidden_dropout", 0.0, &drop[1], path, errs);
  for (int k = 0; k < 2; k++)
    if (drop[k] != 0.0)
      err_add(errs, path, 0, 0, "greenlm trains without dropout: set it to 0.0 in config.json to fine-tune without it",
              "%s = %g", k ? "hidden_dropout" : "attention_dropout", drop[k]), rc = -1;
  rc |= get_activation(c, "hidden_act", "gelu", out, path, errs) | get_head(c, 0, out, path, errs);
  rc |= get_rope(c, 0.25, 0, out, path, errs);
  const json_t *par = json_object_get(c, "use_parallel_residual"), *bias = json_object_get(c, "attention_bias");
  if ((par && !json_is_boolean(par)) || (bias && !json_is_boolean(bias)))
    err_add(errs, path, 0, 0, HF_HINT_SAVE, "use_parallel_residual and attention_bias are true or false"), rc = -1;
  if (rc != 0) return -1;
  util_strlcpy(out->arch, "gpt-neox", sizeof out->arch);
  out->vocab_size = v[0], out->block_size = v[1], out->n_layer = v[2], out->n_embd = v[3], out->n_head = v[4];
  out->n_inner = v[5] == 4 * v[3] ? 0 : v[5];
  out->layer_norm_epsilon = eps;
  out->use_parallel_residual = !par || json_is_true(par);
  out->attention_bias = !bias || json_is_true(bias);
  out->attention_types.n = 1;
  util_strlcpy(out->attention_types.v[0], "global", CFG_ITEM_LEN);
  return 0;
}

/* A boolean key (absent: false) into *out; -1 after an error. */
static int get_bool(const json_t *c, const char *key, int *out, const char *path, err_list *errs) {
  const json_t *v = json_object_get(c, key);
  if (v && !json_is_boolean(v)) {
    err_add(errs, path, 0, 0, HF_HINT_SAVE, "%s must be true or false", key);
    return -1;
  }
  *out = v && json_is_true(v);
  return 0;
}

/* A Llama config (LlamaConfig's defaults for absent keys): every field mapped to &model, known to change nothing
 * greenlm computes, or refused by name. */
static int parse_llama(const json_t *c, const char *path, cfg_model *out, err_list *errs) {
  static const char *keys[7] = {"vocab_size", "max_position_embeddings", "num_hidden_layers", "hidden_size",
                                "num_attention_heads", "intermediate_size", "num_key_value_heads"};
  static const char *deck_keys[7] = {"vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_inner", "n_kv_head"};
  static const long defs[7] = {32000, 2048, 32, 4096, 32, 11008, 0};
  static const char *mapped[] = {"hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias", "tie_word_embeddings",
                                 "rope_parameters", "rope_scaling", "rope_theta", "attention_dropout", "head_dim",
                                 "pretraining_tp"};
  long v[7];
  int rc = 0, abias = 0, mbias = 0;
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)c, key, val)
    if (!neox_inert(key) && !listed(key, keys, 7) && !listed(key, mapped, sizeof mapped / sizeof mapped[0]))
      err_add(errs, path, 0, 0, "greenlm imports LlamaForCausalLM as transformers computes it; a field it does not "
              "implement would change the model", "config.json field \"%s\" is not one greenlm implements", key), rc = -1;
  for (int k = 0; k < 7; k++) rc |= get_int(c, keys[k], deck_keys[k], defs[k], k == 6, &v[k], path, errs);
  double eps = 1e-6, drop = 0.0;
  rc |= get_real(c, "rms_norm_eps", 1e-6, &eps, path, errs) | get_real(c, "attention_dropout", 0.0, &drop, path, errs);
  if (drop != 0.0)
    err_add(errs, path, 0, 0, "greenlm trains without dropout: set it to 0.0 in config.json to fine-tune without it",
            "attention_dropout = %g", drop), rc = -1;
  const json_t *act = json_object_get(c, "hidden_act"), *hd = json_object_get(c, "head_dim");
  if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
    err_add(errs, path, 0, 0, "greenlm's llama MLP is SwiGLU: silu(gate) * up", "hidden_act = \"%s\" is not silu",
            json_is_string(act) ? json_string_value(act) : "(not a string)"), rc = -1;
  if (hd && !json_is_null(hd) && rc == 0 && (!json_is_integer(hd) || v[4] == 0 || json_integer_value(hd) * v[4] != v[3]))
    err_add(errs, path, 0, 0, "greenlm's heads split the hidden size: head_dim = hidden_size / num_attention_heads",
            "head_dim = %lld with hidden_size %ld and %ld heads", json_is_integer(hd) ? (long long)json_integer_value(hd) : -1LL,
            v[3], v[4]), rc = -1;
  rc |= get_bool(c, "attention_bias", &abias, path, errs) | get_bool(c, "mlp_bias", &mbias, path, errs);
  rc |= get_head(c, 0, out, path, errs) | get_rope(c, 1.0, 1, out, path, errs);
  if (rc == 0 && out->rotary_pct != 1.0)
    err_add(errs, path, 0, 0, "Llama turns every dim of a head", "partial_rotary_factor = %g", out->rotary_pct), rc = -1;
  if (rc != 0) return -1;
  util_strlcpy(out->arch, "llama", sizeof out->arch);
  out->vocab_size = v[0], out->block_size = v[1], out->n_layer = v[2], out->n_embd = v[3], out->n_head = v[4];
  out->n_inner = v[5] == 4 * v[3] ? 0 : v[5];
  out->n_kv_head = v[6] == v[4] ? 0 : v[6];
  out->layer_norm_epsilon = eps;
  out->attention_bias = abias, out->mlp_bias = mbias;
  out->attention_types.n = 1;
  util_strlcpy(out->attention_types.v[0], "global", CFG_ITEM_LEN);
  return 0;
}

/* The shape keys of a GPT-Neo or GPT-2 config (transformers' defaults for absent keys). */
static int parse_config(const json_t *c, const char *path, cfg_model *out, err_list *errs) {
  const json_t *mt = json_object_get(c, "model_type");
  const char *type = json_string_value(mt);
  long v[8], L = 0, eps_ok = 1;
  int neo = type && strcmp(type, "gpt_neo") == 0, rc = 0;
  if (type && strcmp(type, "gpt_neox") == 0) return parse_neox(c, path, out, errs);
  if (type && strcmp(type, "llama") == 0) return parse_llama(c, path, out, errs);
  if (!type || (!neo && strcmp(type, "gpt2") != 0)) {
    err_add(errs, path, 0, 0, "greenlm imports GPTNeoForCausalLM (model_type gpt_neo), GPT2LMHeadModel (gpt2), "
            "GPTNeoXForCausalLM (gpt_neox) and LlamaForCausalLM (llama) models", "unsupported architecture: model_type = \"%s\"",
            type ? type : "(missing)");
    return -1;
  }
  static const char *keys[2][6] = {{"vocab_size", "n_positions", "n_layer", "n_embd", "n_head", "n_inner"},
                                   {"vocab_size", "max_position_embeddings", "num_layers", "hidden_size", "num_heads",
                                    "intermediate_size"}};
  static const char *deck_keys[6] = {"vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_inner"};
  static const long defs[2][6] = {{50257, 1024, 12, 768, 12, 0}, {50257, 2048, 24, 2048, 16, 0}};
  for (int k = 0; k < 6; k++) rc |= get_int(c, keys[neo][k], deck_keys[k], defs[neo][k], k == 5, &v[k], path, errs);
  rc |= get_int(c, "window_size", "window_size", 256, 0, &v[6], path, errs);
  const json_t *e = json_object_get(c, "layer_norm_epsilon");
  if (e && !json_is_number(e)) err_add(errs, path, 0, 0, HF_HINT_SAVE, "layer_norm_epsilon must be a number"), eps_ok = 0;
  rc |= get_activation(c, "activation_function", "gelu_new", out, path, errs);
  rc |= get_head(c, 1, out, path, errs);
  if (!neo) {
    rc |= want_bool(c, "scale_attn_weights", 1, 1, path, errs);
    rc |= want_bool(c, "scale_attn_by_inverse_layer_idx", 0, 0, path, errs);
  }
  if (rc != 0 || !eps_ok) return -1;
  L = v[2];
  util_strlcpy(out->arch, neo ? "gpt-neo" : "gpt2", sizeof out->arch);
  out->vocab_size = v[0], out->block_size = v[1], out->n_layer = v[2], out->n_embd = v[3], out->n_head = v[4];
  out->n_inner = v[5] == 4 * v[3] ? 0 : v[5];
  out->window_size = v[6];
  out->layer_norm_epsilon = e ? json_number_value(e) : 1e-5;
  if (!neo) {
    out->attention_types.n = 1;
    util_strlcpy(out->attention_types.v[0], "global", CFG_ITEM_LEN);
    return 0;
  }
  if (!json_object_get(c, "attention_types")) {
    set_pattern(&out->attention_types, (char[][8]){"global", "local"}, 2);
    return 0;
  }
  return neo_attention(c, L, out, path, errs);
}

int hf_config_to_model(const char *dir, cfg_model *out, err_list *errs) {
  long before = err_count(errs);
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *c = load_json(path, "model config", "a Hugging Face model directory has a config.json", errs);
  if (c) parse_config(c, path, out, errs);
  json_decref(c);
  return (int)added_since(errs, before);
}

/* The attention kind of layer l under a deck's pattern. */
static const char *layer_kind(const cfg_model *m, int l) {
  return m->attention_types.n ? m->attention_types.v[l % m->attention_types.n] : "global";
}

/* The names config.json gives the shape keys (vocab_size, block_size, n_layer, n_embd, n_head, n_inner) in an
 * architecture's model type. */
static const char *const *shape_names(cfg_model_arch arch) {
  static const char *names[3][6] = {
      {"vocab_size", "max_position_embeddings", "num_layers", "hidden_size", "num_heads", "intermediate_size"},
      {"vocab_size", "n_positions", "n_layer", "n_embd", "n_head", "n_inner"},
      {"vocab_size", "max_position_embeddings", "num_hidden_layers", "hidden_size", "num_attention_heads",
       "intermediate_size"}};
  return names[arch == CFG_ARCH_GPT2 ? 1 : arch == CFG_ARCH_GPT_NEOX || arch == CFG_ARCH_LLAMA ? 2 : 0];
}

#define HF_MISMATCH(key, hfkey, fv, dv, fmt)                                                                        \
  do {                                                                                                           \
    util_snprintf(hint, sizeof hint, "set &model " key " = " fmt " to match the Hugging Face model", fv);         \
    err_add(errs, path, 0, 0, hint, "%s = " fmt " in config.json, but &model " key " = " fmt " in the deck", hfkey, fv, dv); \
  } while (0)

/* The keys every architecture has: shape, epsilon, activation and head. */
static void check_common(const cfg_model *f, const cfg_model *m, const char *path, err_list *errs) {
  char hint[160];
  const char *const *n = shape_names(cfg_model_arch_of(f));
  if (cfg_model_arch_of(f) != cfg_model_arch_of(m)) HF_MISMATCH("arch", "model_type", f->arch, m->arch, "'%s'");
  if (f->vocab_size != m->vocab_size) HF_MISMATCH("vocab_size", n[0], f->vocab_size, m->vocab_size, "%ld");
  if (f->block_size != m->block_size) HF_MISMATCH("block_size", n[1], f->block_size, m->block_size, "%ld");
  if (f->n_layer != m->n_layer) HF_MISMATCH("n_layer", n[2], f->n_layer, m->n_layer, "%ld");
  if (f->n_embd != m->n_embd) HF_MISMATCH("n_embd", n[3], f->n_embd, m->n_embd, "%ld");
  if (f->n_head != m->n_head) HF_MISMATCH("n_head", n[4], f->n_head, m->n_head, "%ld");
  long fi = f->n_inner ? f->n_inner : 4 * f->n_embd, di = m->n_inner ? m->n_inner : 4 * m->n_embd;
  if (fi != di) HF_MISMATCH("n_inner", n[5], fi, di, "%ld");
  if (fabs(f->layer_norm_epsilon - m->layer_norm_epsilon) > 1e-6 * fabs(f->layer_norm_epsilon))
    HF_MISMATCH("layer_norm_epsilon", "layer_norm_epsilon", f->layer_norm_epsilon, m->layer_norm_epsilon, "%g");
  const char *fa = cfg_model_gelu_erf(f) ? "gelu" : "gelu_new", *da = cfg_model_gelu_erf(m) ? "gelu" : "gelu_new";
  if (strcmp(fa, da) != 0)
    HF_MISMATCH("activation", cfg_model_arch_of(f) == CFG_ARCH_GPT_NEOX ? "hidden_act" : "activation_function", fa, da, "'%s'");
  const char *fh = cfg_model_untied(f) ? "untied" : "tied", *dh = cfg_model_untied(m) ? "untied" : "tied";
  if (strcmp(fh, dh) != 0)
    HF_MISMATCH("head", cfg_model_untied(f) ? "tie_word_embeddings = false: the head" : "tie_word_embeddings = true: the head",
                fh, dh, "'%s'");
}

/* A logical as a deck writes it. */
static const char *deck_bool(int b) { return b ? ".true." : ".false."; }

/* What the rotary architectures share: the rope base (config.json's name for it: base_key) and the attention's
 * biases. */
static void check_rotary(const cfg_model *f, const cfg_model *m, const char *base_key, const char *path,
                         err_list *errs) {
  char hint[160];
  if (fabs(f->rotary_emb_base - m->rotary_emb_base) > 1e-9 * f->rotary_emb_base)
    HF_MISMATCH("rotary_emb_base", base_key, f->rotary_emb_base, m->rotary_emb_base, "%g");
  if (f->attention_bias != m->attention_bias)
    HF_MISMATCH("attention_bias", "attention_bias", deck_bool(f->attention_bias), deck_bool(m->attention_bias), "%s");
}

/* GPT-NeoX's: the rotary embedding, the residual, the attention's biases. */
static void check_neox(const cfg_model *f, const cfg_model *m, const char *path, err_list *errs) {
  char hint[160];
  if (cfg_model_arch_of(f) != CFG_ARCH_GPT_NEOX || cfg_model_arch_of(m) != CFG_ARCH_GPT_NEOX) return;
  if (m->n_embd % m->n_head == 0 && cfg_rotary_dims(f) != cfg_rotary_dims(m))
    HF_MISMATCH("rotary_pct", "rotary_pct (partial_rotary_factor)", f->rotary_pct, m->rotary_pct, "%g");
  check_rotary(f, m, "rotary_emb_base (rope_theta)", path, errs);
  if (f->use_parallel_residual != m->use_parallel_residual)
    HF_MISMATCH("use_parallel_residual", "use_parallel_residual", deck_bool(f->use_parallel_residual),
                deck_bool(m->use_parallel_residual), "%s");
}

/* Llama's: the key/value heads, the rope base and scaling, the biases. */
static void check_llama(const cfg_model *f, const cfg_model *m, const char *path, err_list *errs) {
  char hint[160];
  if (cfg_model_arch_of(f) != CFG_ARCH_LLAMA || cfg_model_arch_of(m) != CFG_ARCH_LLAMA) return;
  if (cfg_kv_heads(f) != cfg_kv_heads(m)) HF_MISMATCH("n_kv_head", "num_key_value_heads", cfg_kv_heads(f), cfg_kv_heads(m), "%ld");
  check_rotary(f, m, "rope_theta", path, errs);
  if (f->mlp_bias != m->mlp_bias) HF_MISMATCH("mlp_bias", "mlp_bias", deck_bool(f->mlp_bias), deck_bool(m->mlp_bias), "%s");
  const int fs = cfg_model_rope_scaling_of(f) == CFG_ROPE_LLAMA3, ds = cfg_model_rope_scaling_of(m) == CFG_ROPE_LLAMA3;
  if (fs != ds) HF_MISMATCH("rope_scaling", "the rope scaling", fs ? "llama3" : "none", ds ? "llama3" : "none", "'%s'");
  if (!fs || !ds) return;
  static const char *const hf[4] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  const double fv[4] = {f->rope_factor, f->rope_low_freq_factor, f->rope_high_freq_factor, (double)f->rope_original_positions};
  const double dv[4] = {m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor, (double)m->rope_original_positions};
  static const char *const deck[4] = {"rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                                      "rope_original_positions"};
  for (int k = 0; k < 4; k++)
    if (fabs(fv[k] - dv[k]) > 1e-9 * fabs(fv[k])) {
      util_snprintf(hint, sizeof hint, "set &model %s = %g to match the Hugging Face model", deck[k], fv[k]);
      err_add(errs, path, 0, 0, hint, "the rope scaling's %s = %g in config.json, but &model %s = %g in the deck", hf[k],
              fv[k], deck[k], dv[k]);
    }
}

int hf_check_config(const char *dir, const cfg_model *m, err_list *errs) {
  long before = err_count(errs);
  cfg_model f;
  cfg_model_defaults(&f);
  if (hf_config_to_model(dir, &f, errs) != 0) return (int)added_since(errs, before);
  char path[UTIL_PATH_MAX], hint[160];
  util_snprintf(path, sizeof path, "%s/config.json", dir);
  check_common(&f, m, path, errs);
  check_neox(&f, m, path, errs);
  check_llama(&f, m, path, errs);
  int any_local = 0;
  for (int l = 0; l < f.n_layer; l++) {
    const char *fk = layer_kind(&f, l), *dk = cfg_model_arch_of(m) != CFG_ARCH_GPT_NEO ? "global" : layer_kind(m, l);
    any_local |= strcmp(fk, "local") == 0;
    if (l < m->n_layer && strcmp(fk, dk) != 0) {
      util_snprintf(hint, sizeof hint, "set &model attention_types to the config's pattern ('%s'%s)", f.attention_types.v[0],
                    f.attention_types.n > 1 ? ", ..." : "");
      err_add(errs, path, 0, 0, hint, "layer %d is %s in config.json's attention_types, but %s by the deck's &model "
              "attention_types", l, fk, dk);
      break;
    }
  }
  if (any_local && f.window_size != m->window_size)
    HF_MISMATCH("window_size", "window_size", f.window_size, m->window_size, "%ld");
  return (int)added_since(errs, before);
}
#undef HF_MISMATCH

/* ---- weights: the safetensors files of a directory ----------------------------------------------- */

typedef struct {
  safetensors_file *f;
  int nf;
} hf_weights;

static void close_weights(hf_weights *w) {
  for (int i = 0; i < w->nf; i++) safetensors_close(&w->f[i]);
  free(w->f);
  w->f = NULL;
  w->nf = 0;
}

/* Open the shards an index names; every tensor must be in the shard the index gives for it, and
 * every tensor of a shard in the index. */
static int open_index(const char *dir, const char *path, hf_weights *w, err_list *errs) {
  json_t *idx = load_json(path, "safetensors index", HF_HINT_SAVE, errs), *map = json_object_get(idx, "weight_map");
  if (!json_is_object(map)) {
    if (idx) err_add(errs, path, 0, 0, HF_HINT_SAVE, "not a safetensors index: no \"weight_map\" object");
    json_decref(idx);
    return -1;
  }
  w->f = util_calloc(json_object_size(map) + 1, sizeof *w->f, "shards");
  const char *name;
  json_t *file;
  int rc = 0;
  json_object_foreach(map, name, file) {
    const char *fn = json_string_value(file);
    if (!fn || !*fn || strchr(fn, '/')) {
      err_add(errs, path, 0, 0, HF_HINT_SAVE, "tensor %s: the weight map must give a file name of this directory", name);
      rc = -1;
      break;
    }
    char shard[UTIL_PATH_MAX];
    util_snprintf(shard, sizeof shard, "%s/%s", dir, fn);
    int k = 0;
    while (k < w->nf && strcmp(w->f[k].path, shard) != 0) k++;
    if (k == w->nf && (rc = safetensors_open(&w->f[w->nf], shard, errs)) != 0) break;
    if (k == w->nf) w->nf++;
    if (!safetensors_find(&w->f[k], name)) {
      err_add(errs, path, 0, 0, HF_HINT_SAVE, "tensor %s: the index places it in %s, which does not hold it", name, fn);
      rc = -1;
    }
  }
  for (int k = 0; k < w->nf && rc == 0; k++)
    for (int i = 0; i < w->f[k].n; i++) {
      const char *fn = json_string_value(json_object_get(map, w->f[k].t[i].name));
      if (!fn || strcmp(strrchr(w->f[k].path, '/') + 1, fn) != 0)
        err_add(errs, w->f[k].path, 0, 0, HF_HINT_SAVE, "tensor %s is not in the index's weight map for this file",
                w->f[k].t[i].name), rc = -1;
    }
  json_decref(idx);
  return rc;
}

/* dir/model.safetensors, or the shards of dir/model.safetensors.index.json. */
static int open_weights(const char *dir, hf_weights *w, err_list *errs) {
  memset(w, 0, sizeof *w);
  char one[UTIL_PATH_MAX], index[UTIL_PATH_MAX], bin[UTIL_PATH_MAX];
  util_snprintf(one, sizeof one, "%s/model.safetensors", dir);
  util_snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  util_snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
  int rc;
  if (access(one, F_OK) == 0) {
    w->f = util_calloc(1, sizeof *w->f, "weights");
    rc = safetensors_open(&w->f[0], one, errs);
    w->nf = rc == 0;
  } else if (access(index, F_OK) == 0) {
    rc = open_index(dir, index, w, errs);
  } else {
    int pt = access(bin, F_OK) == 0 || access(strcat(bin, ".index.json"), F_OK) == 0;
    err_add(errs, dir, 0, 0, "convert it with transformers: AutoModelForCausalLM.from_pretrained(dir)"
            ".save_pretrained(out, safe_serialization=True)",
            "%s: greenlm reads safetensors weights only (model.safetensors or model.safetensors.index.json)",
            pt ? "only PyTorch pickle weights (pytorch_model.bin)" : "no model weights");
    rc = -1;
  }
  if (rc != 0) close_weights(w);
  return rc;
}

static const char *strip_prefix(const char *name) {
  return strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
}

/* GPT-NeoX's head is embed_out in published models, lm_head as transformers 5 saves it. */
#define HF_NEOX_HEAD "embed_out.weight"
#define HF_NEOX_HEAD_NEW "lm_head.weight"

/* The file tensor of a greenlm name, with or without "transformer." (GPT-NeoX's head under either name); *fi: its
 * file. */
static const safetensors_tensor *find_weight(const hf_weights *w, const char *name, int *fi) {
  for (*fi = 0; *fi < w->nf; (*fi)++) {
    const safetensors_tensor *t = safetensors_find(&w->f[*fi], name);
    if (!t) t = safetensors_find(&w->f[*fi], strip_prefix(name));
    if (!t && strcmp(name, HF_NEOX_HEAD) == 0) t = safetensors_find(&w->f[*fi], HF_NEOX_HEAD_NEW);
    if (t) return t;
  }
  return NULL;
}

static int ends_with(const char *s, const char *sfx) {
  size_t n = strlen(s), k = strlen(sfx);
  return n > k && strcmp(s + n - k, sfx) == 0;
}

/* The attention-mask and rotary-frequency buffers some GPT-2, GPT-Neo and GPT-NeoX checkpoints carry. */
static int is_buffer(const char *name) {
  static const char *sfx[] = {".attn.bias", ".attn.masked_bias", ".attn.attention.bias", ".attn.attention.masked_bias"};
  static const char *neox[] = {".attention.bias", ".attention.masked_bias", ".attention.rotary_emb.inv_freq"};
  for (int i = 0; i < 4; i++)
    if (ends_with(name, sfx[i]) && strncmp(name, "h.", 2) == 0) return 1;
  for (int i = 0; i < 3; i++)
    if (ends_with(name, neox[i]) && strncmp(name, "gpt_neox.layers.", 16) == 0) return 1;
  return ends_with(name, ".self_attn.rotary_emb.inv_freq") && strncmp(name, "model.layers.", 13) == 0; /* Llama's */
}

/* GPT-NeoX's query_key_value: Hugging Face's rows are (head, q|k|v, head size), greenlm's (q|k|v, head, head size). */
static int is_neox_qkv(const gpt_shape *s, const char *name) {
  return s->arch == GPT_ARCH_NEOX &&
         (ends_with(name, "attention.query_key_value.weight") || ends_with(name, "attention.query_key_value.bias"));
}

/* dst (3C, cols) in greenlm's row order from src in Hugging Face's (to_hf: the other way). */
static void regroup_qkv(float *dst, const float *src, int H, int hs, size_t cols, int to_hf) {
  for (int h = 0; h < H; h++)
    for (int p = 0; p < 3; p++)
      for (int j = 0; j < hs; j++) {
        size_t hf = ((size_t)h * 3 + p) * hs + j, ours = ((size_t)p * H + h) * hs + j;
        memcpy(dst + (to_hf ? hf : ours) * cols, src + (to_hf ? ours : hf) * cols, cols * sizeof(float));
      }
}

/* The name a file tensor has among greenlm's: without "transformer.", GPT-NeoX's lm_head as embed_out. */
static const char *canonical(const gpt_shape *s, const char *name) {
  if (s->arch == GPT_ARCH_NEOX && strcmp(name, HF_NEOX_HEAD_NEW) == 0) return HF_NEOX_HEAD;
  return strip_prefix(name);
}

/* A copy of the tied embedding the files may carry as the head: lm_head (embed_out for GPT-NeoX). */
static int is_tied_copy(const gpt_shape *s, const char *name) {
  return s->tied && (strcmp(name, "lm_head.weight") == 0 || (s->arch == GPT_ARCH_NEOX && strcmp(name, HF_NEOX_HEAD) == 0));
}

/* GPT-2's Conv1D weights, stored (in, out) by Hugging Face. */
static int is_conv1d(const gpt_shape *s, const char *name) {
  static const char *sfx[] = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"};
  size_t n = strlen(name);
  for (int i = 0; i < 4 && s->arch == GPT_ARCH_GPT2; i++)
    if (n > strlen(sfx[i]) && strcmp(name + n - strlen(sfx[i]), sfx[i]) == 0) return 1;
  return 0;
}

/* Every tensor of the files must be a parameter of the whole model (once), a buffer, or a tied head's copy. */
static int check_extra(const hf_weights *w, const gpt_shape *s, err_list *errs) {
  int nw, rc = 0;
  gpt_tensor *all = gpt_list_tensors(s, gpt_whole(s), &nw);
  int *seen = util_calloc((size_t)nw + 1, sizeof *seen, "tensor marks");
  for (int k = 0; k < w->nf; k++)
    for (int i = 0; i < w->f[k].n; i++) {
      const char *name = canonical(s, w->f[k].t[i].name);
      if (is_buffer(name) || is_tied_copy(s, name)) continue;
      int j = 0;
      while (j < nw && strcmp(strip_prefix(all[j].name), name) != 0) j++;
      if (j == nw)
        err_add(errs, w->f[k].path, 0, 0, "the weights belong to another architecture or a larger model than the deck's &model",
                "unexpected tensor %s: not a parameter of this %s model (%d layers)", w->f[k].t[i].name,
                s->arch == GPT_ARCH_GPT2   ? "GPT-2"
                : s->arch == GPT_ARCH_NEOX ? "GPT-NeoX"
                : s->arch == GPT_ARCH_LLAMA ? "Llama"
                                            : "GPT-Neo",
                s->L), rc = -1;
      else if (seen[j]++)
        err_add(errs, w->f[k].path, 0, 0, HF_HINT_SAVE, "tensor %s appears more than once (with and without the "
                "\"transformer.\" prefix, or in two shards)", w->f[k].t[i].name), rc = -1;
    }
  free(seen);
  free(all);
  return rc;
}

/* A file tensor against the greenlm tensor it must fill: dtype and shape. */
static int check_tensor(const safetensors_file *f, const safetensors_tensor *ft, const gpt_shape *s, const gpt_tensor *t,
                        err_list *errs) {
  int64_t want[2] = {t->grows, t->gcols}; /* the whole tensor's shape, whatever part this rank holds */
  int nd = t->gcols == 1 ? 1 : 2;
  if (is_conv1d(s, t->name)) want[0] = t->gcols, want[1] = t->grows; /* (in, out) */
  if (ft->dtype == SAFETENSORS_OTHER) {
    err_add(errs, f->path, 0, 0, "convert the weights to float32, bfloat16 or float16 (model.to(torch.float32)) and save again",
            "tensor %s: dtype %s is not supported (greenlm reads F32, BF16 and F16)", ft->name, ft->dtype_name);
    return -1;
  }
  if (ft->ndim == nd && ft->shape[0] == want[0] && (nd == 1 || ft->shape[1] == want[1])) return 0;
  char got[128] = "[", exp[64];
  for (int d = 0; d < ft->ndim; d++)
    util_snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)ft->shape[d]);
  strcat(got, "]");
  if (nd == 1) util_snprintf(exp, sizeof exp, "[%lld]", (long long)want[0]);
  else util_snprintf(exp, sizeof exp, "[%lld, %lld]", (long long)want[0], (long long)want[1]);
  err_add(errs, f->path, 0, 0, "the deck's &model does not describe this model: compare it with config.json",
          "tensor %s has shape %s, but the deck's model expects %s", ft->name, got, exp);
  return -1;
}

/* The head, when the files have it for a tied model, must equal the file's token embedding. */
static int check_lm_head(hf_weights *w, const gpt_shape *s, const safetensors_tensor *wte, int wfi, err_list *errs) {
  int fi;
  const safetensors_tensor *h = find_weight(w, s->arch == GPT_ARCH_NEOX ? HF_NEOX_HEAD : "lm_head.weight", &fi);
  if (!h) return 0;
  if (h->dtype == SAFETENSORS_OTHER || h->numel != wte->numel) {
    err_add(errs, w->f[fi].path, 0, 0, "a tied head, when the files hold it, is a copy of the token embedding",
            "tensor %s: %s, unlike %s's", h->name, h->dtype == SAFETENSORS_OTHER ? "an unsupported dtype" : "another size",
            wte->name);
    return -1;
  }
  float *a = util_malloc(2 * wte->numel * sizeof(float) + 1, "lm_head"), *b = a + wte->numel;
  int rc = safetensors_read(&w->f[fi], h, a, errs) | safetensors_read(&w->f[wfi], wte, b, errs);
  if (rc == 0 && memcmp(a, b, wte->numel * sizeof(float)) != 0) {
    err_add(errs, w->f[fi].path, 0, 0, "the deck ties the head to the token embedding (&model head); a model with its "
            "own head needs &model head = 'untied'", "tensor %s differs from %s", h->name, wte->name);
    rc = -1;
  }
  free(a);
  return rc;
}

/* Tensor t's part (the whole, or a tensor rank's shard) into dst: the whole tensor is read into tmp (2 x
 * its elements: GPT-2's Conv1D weights are transposed, GPT-NeoX's q, k and v regrouped into the second half),
 * then the part's runs copied. */
static int read_tensor(safetensors_file *f, const safetensors_tensor *ft, const gpt_shape *s, const gpt_tensor *t, float *dst,
                       float *tmp, err_list *errs) {
  const int conv = is_conv1d(s, t->name), qkv = is_neox_qkv(s, t->name);
  if (!conv && !qkv && t->split == GPT_SPLIT_NONE) return safetensors_read(f, ft, dst, errs);
  if (safetensors_read(f, ft, tmp, errs) != 0) return -1;
  const size_t R = (size_t)t->grows, C = (size_t)t->gcols;
  float *whole = conv || qkv ? tmp + R * C : tmp;
  if (conv)
    for (size_t r = 0; r < R; r++) /* whole (rows=out, cols=in) <- tmp (in, out) */
      for (size_t c = 0; c < C; c++) whole[r * C + c] = tmp[c * R + r];
  if (qkv) regroup_qkv(whole, tmp, s->H, s->C / s->H, C, 0);
  for (size_t e = 0, run; e < t->numel; e += run) {
    size_t g = gpt_tensor_global(t, e, &run);
    memcpy(dst + e, whole + g, run * sizeof(float));
  }
  return 0;
}

int hf_read_params(const char *dir, const gpt_shape *s, const gpt_tensor *t, int nt, float *params, err_list *errs) {
  long before = err_count(errs);
  hf_weights w;
  if (open_weights(dir, &w, errs) != 0) return (int)added_since(errs, before);
  const safetensors_tensor **ft = util_calloc((size_t)nt + 1, sizeof *ft, "tensor map");
  int *fi = util_calloc((size_t)nt + 1, sizeof *fi, "tensor map");
  size_t most = 0;
  check_extra(&w, s, errs);
  for (int i = 0; i < nt; i++) {
    ft[i] = find_weight(&w, t[i].name, &fi[i]);
    if (!ft[i])
      err_add(errs, w.nf == 1 ? w.f[0].path : dir, 0, 0, "the weights belong to another architecture or a smaller model "
              "than the deck's &model", "missing tensor %s (or %s)", t[i].name, strip_prefix(t[i].name));
    else if (check_tensor(&w.f[fi[i]], ft[i], s, &t[i], errs) == 0 && t[i].tied)
      check_lm_head(&w, s, ft[i], fi[i], errs);
    if (2 * (size_t)t[i].grows * (size_t)t[i].gcols > most) most = 2 * (size_t)t[i].grows * (size_t)t[i].gcols;
  }
  float *tmp = util_malloc(most * sizeof(float) + 1, "tensor");
  for (int i = 0; i < nt && added_since(errs, before) == 0; i++) {
    read_tensor(&w.f[fi[i]], ft[i], s, &t[i], params + t[i].offset, tmp, errs);
    progress_mark(); /* a tensor imported (the watchdog's progress) */
  }
  free(tmp), free(ft), free(fi);
  close_weights(&w);
  return (int)added_since(errs, before);
}

/* ---- export --------------------------------------------------------------------------------------- */

static int write_json(const char *dir, const char *name, json_t *j, err_list *errs) {
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/%s", dir, name);
  util_atomic_file af;
  int rc = util_atomic_open(&af, path);
  if (rc == 0) {
    rc = json_dumpf(j, af.fp, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) == 0 &&
         fputc('\n', af.fp) != EOF ? 0 : -1;
    if (rc == 0) rc = util_atomic_close(&af);
    else util_atomic_abort(&af);
  }
  if (rc != 0) err_add(errs, path, 0, 0, "check the free space and permissions of the directory", "cannot write: %s", strerror(errno));
  json_decref(j);
  return rc;
}

/* The layer kinds of s as Hugging Face's attention_types: [[[kinds of one period], repeats]]. */
static json_t *attention_types_json(const gpt_shape *s) {
  int p = 1;
  while (p < s->L) {
    int ok = s->L % p == 0;
    for (int l = p; l < s->L && ok; l++) ok = (s->window[l] > 0) == (s->window[l % p] > 0);
    if (ok) break;
    p++;
  }
  json_t *kinds = json_array();
  for (int l = 0; l < p; l++) json_array_append_new(kinds, json_string(s->window[l] ? "local" : "global"));
  return json_pack("[[o, i]]", kinds, s->L / p);
}

static json_t *token_id(int eot) { return eot >= 0 ? json_integer(eot) : json_null(); }

/* The shape keys GPT-NeoX's and Llama's config.json share (the class, the model type, the sizes). */
static json_t *rotary_config_json(const gpt_shape *s, const char *cls, const char *type) {
  json_t *c = json_object();
  json_object_set_new(c, "architectures", json_pack("[s]", cls));
  json_object_set_new(c, "model_type", json_string(type));
  json_object_set_new(c, "vocab_size", json_integer(s->V));
  json_object_set_new(c, "max_position_embeddings", json_integer(s->maxT));
  json_object_set_new(c, "hidden_size", json_integer(s->C));
  json_object_set_new(c, "num_hidden_layers", json_integer(s->L));
  json_object_set_new(c, "num_attention_heads", json_integer(s->H));
  json_object_set_new(c, "intermediate_size", json_integer(s->F));
  return c;
}

/* The keys every exported config.json ends with: init, token ids, the head's tying, the dtype. */
static void common_tail_json(json_t *c, const gpt_shape *s, const cfg_model *m, int eot, const char *dtype) {
  json_object_set_new(c, "initializer_range", json_real(m->init_std));
  json_object_set_new(c, "bos_token_id", token_id(eot));
  json_object_set_new(c, "eos_token_id", token_id(eot));
  json_object_set_new(c, "tie_word_embeddings", json_boolean(s->tied));
  json_object_set_new(c, "use_cache", json_true());
  json_object_set_new(c, "torch_dtype", json_string(dtype));
}

/* config.json of a GPTNeoXForCausalLM: the rotary embedding in the keys published models have (rotary_pct,
 * rotary_emb_base), which every transformers version reads. */
static json_t *neox_config_json(const gpt_shape *s, const cfg_model *m, int eot, const char *dtype) {
  json_t *c = rotary_config_json(s, "GPTNeoXForCausalLM", "gpt_neox");
  json_object_set_new(c, "hidden_act", json_string(s->act == BACKEND_GELU_ERF ? "gelu" : "gelu_new"));
  json_object_set_new(c, "rotary_pct", json_real(m->rotary_pct));
  json_object_set_new(c, "rotary_emb_base", json_real(m->rotary_emb_base));
  json_object_set_new(c, "use_parallel_residual", json_boolean(s->parallel));
  json_object_set_new(c, "attention_bias", json_boolean(s->qkv_bias));
  json_object_set_new(c, "attention_dropout", json_real(0.0));
  json_object_set_new(c, "hidden_dropout", json_real(0.0));
  json_object_set_new(c, "layer_norm_eps", json_real(m->layer_norm_epsilon));
  common_tail_json(c, s, m, eot, dtype);
  return c;
}

/* config.json of a LlamaForCausalLM: the rope base as rope_theta, which every transformers version reads. */
static json_t *llama_config_json(const gpt_shape *s, const cfg_model *m, int eot, const char *dtype) {
  json_t *c = rotary_config_json(s, "LlamaForCausalLM", "llama");
  json_object_set_new(c, "num_key_value_heads", json_integer(s->Hkv));
  json_object_set_new(c, "head_dim", json_integer(s->C / s->H));
  json_object_set_new(c, "hidden_act", json_string("silu"));
  json_object_set_new(c, "rms_norm_eps", json_real(m->layer_norm_epsilon));
  json_object_set_new(c, "rope_theta", json_real(m->rotary_emb_base));
  if (cfg_model_rope_scaling_of(m) == CFG_ROPE_LLAMA3) /* the form transformers 4.43 and later read */
    json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor",
                                                     m->rope_factor, "low_freq_factor", m->rope_low_freq_factor,
                                                     "high_freq_factor", m->rope_high_freq_factor,
                                                     "original_max_position_embeddings",
                                                     (json_int_t)m->rope_original_positions));
  json_object_set_new(c, "attention_bias", json_boolean(s->qkv_bias));
  json_object_set_new(c, "mlp_bias", json_boolean(!s->mlp_unbiased));
  json_object_set_new(c, "attention_dropout", json_real(0.0));
  common_tail_json(c, s, m, eot, dtype);
  return c;
}

/* config.json of a GPTNeoForCausalLM, GPT2LMHeadModel, GPTNeoXForCausalLM or LlamaForCausalLM. */
static json_t *config_json(const gpt_shape *s, const cfg_model *m, int eot, safetensors_dtype d) {
  static const char *torch_dtype[] = {"float32", "bfloat16", "float16"};
  if (s->arch == GPT_ARCH_NEOX) return neox_config_json(s, m, eot, torch_dtype[d]);
  if (s->arch == GPT_ARCH_LLAMA) return llama_config_json(s, m, eot, torch_dtype[d]);
  int neo = s->arch == GPT_ARCH_NEO, window = (int)m->window_size;
  for (int l = 0; l < s->L; l++)
    if (s->window[l]) window = s->window[l];
  json_t *c = json_object(), *inner = s->F == 4 * s->C ? json_null() : json_integer(s->F);
  json_object_set_new(c, "architectures", json_pack("[s]", neo ? "GPTNeoForCausalLM" : "GPT2LMHeadModel"));
  json_object_set_new(c, "model_type", json_string(neo ? "gpt_neo" : "gpt2"));
  json_object_set_new(c, "vocab_size", json_integer(s->V));
  json_object_set_new(c, neo ? "max_position_embeddings" : "n_positions", json_integer(s->maxT));
  json_object_set_new(c, neo ? "hidden_size" : "n_embd", json_integer(s->C));
  json_object_set_new(c, neo ? "num_layers" : "n_layer", json_integer(s->L));
  json_object_set_new(c, neo ? "num_heads" : "n_head", json_integer(s->H));
  json_object_set_new(c, neo ? "intermediate_size" : "n_inner", inner);
  if (neo) {
    json_object_set_new(c, "attention_types", attention_types_json(s));
    json_object_set_new(c, "window_size", json_integer(window));
  } else {
    json_object_set_new(c, "scale_attn_weights", json_true());
    json_object_set_new(c, "scale_attn_by_inverse_layer_idx", json_false());
    json_object_set_new(c, "reorder_and_upcast_attn", json_false());
  }
  json_object_set_new(c, "activation_function", json_string(s->act == BACKEND_GELU_ERF ? "gelu" : "gelu_new"));
  json_object_set_new(c, "layer_norm_epsilon", json_real(m->layer_norm_epsilon));
  static const char *drop[2][3] = {{"embd_pdrop", "attn_pdrop", "resid_pdrop"}, {"embed_dropout", "attention_dropout", "resid_dropout"}};
  for (int i = 0; i < 3; i++) json_object_set_new(c, drop[neo][i], json_real(0.0));
  common_tail_json(c, s, m, eot, torch_dtype[d]);
  return c;
}

/* generation_config.json from &sample. */
static json_t *generation_json(const cfg_sample *smp, int eot) {
  json_t *g = json_object();
  json_object_set_new(g, "bos_token_id", token_id(eot));
  json_object_set_new(g, "eos_token_id", token_id(eot));
  json_object_set_new(g, "do_sample", json_boolean(smp->temperature > 0));
  if (smp->temperature > 0) json_object_set_new(g, "temperature", json_real(smp->temperature));
  json_object_set_new(g, "top_k", json_integer(smp->top_k));
  json_object_set_new(g, "top_p", json_real(smp->top_p));
  json_object_set_new(g, "repetition_penalty", json_real(smp->repetition_penalty));
  json_object_set_new(g, "max_new_tokens", json_integer(smp->n_tokens));
  return g;
}

/* Token id's string in GPT-2's byte alphabet (UTF-8) into buf. */
static const char *token_string(const tok_tokenizer *t, int id, char *buf, int len) {
  tok_bytes_to_chars(t->bytes + t->off[id], (int)(t->off[id + 1] - t->off[id]), buf, len);
  return buf;
}

/* merges.txt: "#version: 0.2", then one merge "left right" per line in rank order. */
static int write_merges(const char *dir, const tok_tokenizer *t, err_list *errs) {
  char path[UTIL_PATH_MAX], a[4 * TOK_MAX_BYTES + 1], b[4 * TOK_MAX_BYTES + 1];
  util_snprintf(path, sizeof path, "%s/merges.txt", dir);
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) {
    err_add(errs, path, 0, 0, NULL, "cannot create: %s", strerror(errno));
    return -1;
  }
  uint32_t *pairs = tok_merge_list(t);
  fputs("#version: 0.2\n", af.fp);
  for (int r = 0; r < t->nmerges; r++)
    fprintf(af.fp, "%s %s\n", token_string(t, (int)pairs[2 * r], a, sizeof a), token_string(t, (int)pairs[2 * r + 1], b, sizeof b));
  free(pairs);
  if (util_atomic_close(&af) != 0) {
    err_add(errs, path, 0, 0, "check the free space of the file system", "cannot write: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* A tokenizer read from a tokenizer.json: that file again, as it was read (its hash checked). */
static int write_tokjson(const char *dir, const tok_tokenizer *t, err_list *errs) {
  static const char hint[] = "export while the tokenizer's files stay as they are";
  json_error_t je;
  size_t len;
  char *text = util_read_file(t->json_path, TOK_MAX_FILE, &len, "tokenizer", hint, errs);
  json_t *j = text ? json_loadb(text, len, 0, &je) : NULL;
  int read = text != NULL;
  free(text);
  if (!j) {
    if (read) err_add(errs, t->json_path, je.line, je.column, hint, "cannot read it again: %s", je.text);
    return -1;
  }
  char path[UTIL_PATH_MAX];
  util_snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  tok_tokenizer again;
  if (write_json(dir, "tokenizer.json", j, errs) != 0 || tokjson_load(&again, path, errs) != 0) return -1;
  int same = again.hash == t->hash;
  tok_free(&again);
  if (!same) err_add(errs, t->json_path, 0, 0, hint, "changed since it was read");
  return same ? 0 : -1;
}

/* The tokenizer's own files: tokenizer.json when it was read from one; vocab.json and merges.txt when
 * they say all of it (GPT-2's pattern, no normalizer, no added tokens matched in text). */
static int write_tokenizer_files(const char *dir, const tok_tokenizer *t, err_list *errs) {
  if (t->json_path && write_tokjson(dir, t, errs) != 0) return -1;
  if (!tok_is_gpt2(t)) return 0;
  char buf[4 * TOK_MAX_BYTES + 1];
  json_t *vocab = json_object();
  for (int i = 0; i < t->vocab_size; i++) json_object_set_new(vocab, token_string(t, i, buf, sizeof buf), json_integer(i));
  int rc = write_json(dir, "vocab.json", vocab, errs);
  return rc == 0 ? write_merges(dir, t, errs) : rc;
}

/* The tokenizer's files, tokenizer_config.json and special_tokens_map.json of &tokenizer. */
static int write_tokenizer(const char *dir, const tok_tokenizer *t, const gpt_shape *s, err_list *errs) {
  char eot[TOK_MAX_BYTES + 1] = "";
  if (t->eot >= 0) util_snprintf(eot, sizeof eot, "%.*s", (int)(t->off[t->eot + 1] - t->off[t->eot]), t->bytes + t->off[t->eot]);
  int rc = write_tokenizer_files(dir, t, errs);
  json_t *special = json_object(), *cfg = json_object();
  json_object_set_new(cfg, "tokenizer_class", json_string(tok_is_gpt2(t) ? "GPT2Tokenizer" : "PreTrainedTokenizerFast"));
  json_object_set_new(cfg, "model_max_length", json_integer(s->maxT));
  json_object_set_new(cfg, "add_prefix_space", json_false());
  json_object_set_new(cfg, "add_bos_token", json_false());
  json_object_set_new(cfg, "errors", json_string("replace"));
  json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
  static const char *roles[] = {"bos_token", "eos_token", "unk_token"};
  for (int i = 0; i < 3; i++) {
    json_object_set_new(cfg, roles[i], t->eot >= 0 ? json_string(eot) : json_null());
    if (t->eot >= 0) json_object_set_new(special, roles[i], json_string(eot));
  }
  if (t->eot >= 0) {
    char id[16];
    util_snprintf(id, sizeof id, "%d", t->eot);
    json_object_set_new(cfg, "added_tokens_decoder",
                        json_pack("{s:{s:s, s:b, s:b, s:b, s:b, s:b}}", id, "content", eot, "lstrip", 0,
                                  "normalized", 1, "rstrip", 0, "single_word", 0, "special", 1));
  }
  if (rc == 0) rc = write_json(dir, "tokenizer_config.json", cfg, errs);
  else json_decref(cfg);
  if (rc == 0) rc = write_json(dir, "special_tokens_map.json", special, errs);
  else json_decref(special);
  return rc;
}

/* The whole model's tensors as Hugging Face stores them (Conv1D weights transposed, GPT-NeoX's q, k and v
 * regrouped per head into copies). */
static int write_weights(const char *dir, const gpt_shape *s, const float *params, safetensors_dtype d, double max_bytes,
                         err_list *errs) {
  int n;
  gpt_tensor *t = gpt_list_tensors(s, gpt_whole(s), &n);
  safetensors_out *out = util_calloc((size_t)n + 1, sizeof *out, "tensors");
  float **copies = util_calloc((size_t)n + 1, sizeof *copies, "tensors");
  for (int i = 0; i < n; i++) {
    const float *src = params + t[i].offset;
    out[i].name = t[i].name;
    out[i].ndim = t[i].cols == 1 ? 1 : 2;
    out[i].shape[0] = t[i].rows, out[i].shape[1] = t[i].cols;
    out[i].data = src;
    if (is_conv1d(s, t[i].name)) { /* (out, in) -> (in, out) */
      float *c = copies[i] = util_malloc(t[i].numel * sizeof(float), "transposed weight");
      for (int r = 0; r < t[i].rows; r++)
        for (int k = 0; k < t[i].cols; k++) c[(size_t)k * t[i].rows + r] = src[(size_t)r * t[i].cols + k];
      out[i].shape[0] = t[i].cols, out[i].shape[1] = t[i].rows;
      out[i].data = c;
    } else if (is_neox_qkv(s, t[i].name)) { /* q, k, v rows per head */
      regroup_qkv(copies[i] = util_malloc(t[i].numel * sizeof(float), "regrouped q, k, v"), src, s->H, s->C / s->H,
                  (size_t)t[i].cols, 1);
      out[i].data = copies[i];
    }
  }
  int rc = safetensors_write_model(dir, out, n, d, max_bytes, NULL, errs);
  for (int i = 0; i < n; i++) free(copies[i]);
  free(copies), free(out), free(t);
  return rc;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* Remove a directory tree that this module created or was told to replace. */
static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* 1: dir exists and holds something; 0: absent or empty; -1: exists but is not a directory. */
static int dir_state(const char *dir) {
  struct stat st;
  if (stat(dir, &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return -1;
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  if (d) closedir(d);
  return n > 0;
}

/* Everything of the directory, written into tmp. */
static int write_all(const char *tmp, const gpt_shape *s, const float *params, const cfg_model *m, const tok_tokenizer *t,
                     const cfg_sample *smp, safetensors_dtype d, double shard_mb, err_list *errs) {
  if (write_json(tmp, "config.json", config_json(s, m, t->eot, d), errs) != 0) return -1;
  if (write_json(tmp, "generation_config.json", generation_json(smp, t->eot), errs) != 0) return -1;
  if (write_tokenizer(tmp, t, s, errs) != 0) return -1;
  return write_weights(tmp, s, params, d, shard_mb * 1e6, errs);
}

/* Put the complete tmp in place of dir (an old dir is moved aside first and removed last). */
static int replace_dir(const char *tmp, const char *dir, err_list *errs) {
  char old[UTIL_PATH_MAX];
  util_snprintf(old, sizeof old, "%s.old-%s", dir, strrchr(tmp, '-') + 1);
  int had = access(dir, F_OK) == 0;
  if (had && rename(dir, old) != 0) {
    err_add(errs, dir, 0, 0, NULL, "cannot move the old directory aside to %s: %s", old, strerror(errno));
    return -1;
  }
  if (util_commit(tmp, dir) != 0) {
    err_add(errs, dir, 0, 0, NULL, "cannot rename %s to it: %s", tmp, strerror(errno));
    if (had) rename(old, dir);
    return -1;
  }
  if (had) remove_tree(old);
  return 0;
}

int hf_export(const char *dir, const gpt_shape *s, const float *params, const cfg_model *m, const cfg_tokenizer *tk,
              const cfg_sample *smp, const char *dtype, double shard_mb, int overwrite, err_list *errs) {
  long before = err_count(errs);
  safetensors_dtype d;
  int state = dir_state(dir);
  if (safetensors_dtype_parse(dtype, &d) != 0)
    err_add(errs, NULL, 0, 0, "&export dtype is one of fp32, bf16, fp16", "unknown export dtype '%s'", dtype);
  if (state < 0)
    err_add(errs, dir, 0, 0, "choose another &export dir", "exists and is not a directory: the export writes a directory");
  else if (state > 0 && !overwrite)
    err_add(errs, dir, 0, 0, "choose another &export dir, remove this one, or allow overwriting",
            "the export directory exists and is not empty");
  tok_tokenizer t;
  if (added_since(errs, before) || tok_open(&t, cfg_tokenizer_kind_of(tk), tk->dir, errs) != 0) return (int)added_since(errs, before);
  if (t.vocab_size > s->V)
    err_add(errs, tk->dir, 0, 0, "set &model vocab_size to at least the tokenizer's vocabulary",
            "the tokenizer has %d tokens, more than the model's vocabulary of %d", t.vocab_size, s->V);
  char tmp[UTIL_PATH_MAX];
  util_snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", dir);
  if (added_since(errs, before) == 0 && (util_mkdir_parent(dir) != 0 || !mkdtemp(tmp)))
    err_add(errs, tmp, 0, 0, "check that the parent directory is writable", "cannot create the export directory: %s",
            strerror(errno));
  else if (added_since(errs, before) == 0) {
    chmod(tmp, 0755);
    if (write_all(tmp, s, params, m, &t, smp, d, shard_mb, errs) != 0 || replace_dir(tmp, dir, errs) != 0) remove_tree(tmp);
  }
  tok_free(&t);
  return (int)added_since(errs, before);
}

int hf_load_model(const char *dir, const cfg_model *mc, gpt_model *m, err_list *errs) {
  const backend *be = m->be;
  int n = hf_check_config(dir, mc, errs);
  if (n) return n;
  float *host = be->caps.host_memory ? m->params : util_malloc(m->nparams * sizeof(float), "parameter copy");
  n = hf_read_params(dir, &m->s, m->tensors, m->ntensors, host, errs);
  if (!n && host != m->params) be->to_device(be, m->params, host, m->nparams * sizeof(float));
  if (host != m->params) free(host);
  if (!n) gpt_params_changed(m, 0, m->nparams);
  return n;
}
