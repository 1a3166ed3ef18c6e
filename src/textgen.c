/* textgen: the 'sample' task and the generation after training. */
#include "textgen.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "infer.h"

/* ---- generating ---------------------------------------------------------------------------------- */

typedef struct {
  tok_tokenizer *tok;
  const char *stop;
  FILE *stream;
  char **text; /* (n) new text of each prompt so far */
  size_t *len;
} textgen_hook;

/* Each new token: its text appended (and streamed for prompt 0); 1 ends the sequence at the stop
 * string. */
static int on_token(void *ctx, int p, int32_t token) {
  textgen_hook *h = ctx;
  size_t at = h->len[p];
  h->len[p] += tok_decode(h->tok, &token, 1, h->text[p] + at);
  if (p == 0 && h->stream) fwrite(h->text[p] + at, 1, h->len[p] - at, h->stream), fflush(h->stream);
  size_t n = strlen(h->stop);
  return n > 0 && h->len[p] >= n && memcmp(h->text[p] + h->len[p] - n, h->stop, n) == 0;
}

void textgen_generate(gpt_model *m, tok_tokenizer *tok, const cfg_sample *c, uint64_t seed, const char *const *prompts,
                      int n, int first, FILE *stream, textgen_out *out, gen_timing *tm) {
  tok_ids *ids = util_calloc((size_t)n + 1, sizeof *ids, "prompts");
  const int32_t **pv = util_malloc(((size_t)n + 1) * sizeof *pv, "prompts");
  int *lens = util_malloc(((size_t)n + 1) * sizeof *lens, "prompts"), longest = 1;
  textgen_hook h = {tok, c->stop, stream, util_calloc((size_t)n + 1, sizeof(char *), "texts"),
                    util_calloc((size_t)n + 1, sizeof(size_t), "texts")};
  for (int p = 0; p < n; p++) {
    const char *s = prompts[p][0] ? prompts[p] : "\n";
    tok_encode(tok, s, strlen(s), 1, &ids[p]);
    pv[p] = ids[p].v, lens[p] = (int)ids[p].n;
    if (lens[p] > longest) longest = lens[p];
    h.text[p] = util_malloc((size_t)c->n_tokens * (size_t)tok->max_len + 1, "new text");
  }
  long want = (long)longest + c->n_tokens;
  int max_len = want < m->s.maxT ? (int)want : m->s.maxT;
  gen g;
  gen_open(&g, m, n, max_len < 2 ? 2 : max_len, c, seed, GEN_CACHE);
  gen_hooks hooks = {.on_token = on_token, .ctx = &h, .eot = c->stop_eot ? tok->eot : -1};
  gen_run(&g, pv, lens, n, first, (int)c->n_tokens, &hooks);
  for (int p = 0; p < n; p++) {
    const gen_seq *q = &g.seqs[p];
    out[p].text = util_malloc((size_t)q->len * (size_t)tok->max_len + 1, "text");
    out[p].text[tok_decode(tok, q->tokens, (size_t)q->len, out[p].text)] = '\0';
    out[p].n_new = q->n_new, out[p].end = q->end;
    tok_ids_free(&ids[p]);
    free(h.text[p]);
  }
  *tm = g.timing;
  gen_close(&g);
  free(ids), free(pv), free(lens), free(h.text), free(h.len);
}

void textgen_out_free(textgen_out *out, int n) {
  for (int p = 0; p < n; p++) free(out[p].text);
}

/* ---- the 'sample' task ----------------------------------------------------------------------------- */

/* Lines of text, in place, as prompts: "\n" in a line becomes a newline; empty lines are skipped.
 * v has room for a pointer per byte. Returns the count. */
static int split_lines(char *text, char **v) {
  int n = 0;
  char *w = text, *line = text;
  for (char *r = text;; r++) {
    if (*r == '\n' || *r == '\0') {
      int end = *r == '\0';
      *w++ = '\0';
      if (w - 1 > line) v[n++] = line;
      line = w;
      if (end) return n;
    } else if (r[0] == '\\' && r[1] == 'n') {
      *w++ = '\n', r++;
    } else {
      *w++ = *r;
    }
  }
}

/* The prompts: the lines of &sample prompt_file, or &sample prompt. Read on rank 0, the same list on
 * every rank. Returns the count, or -1 (every rank) after an error; *buf holds them, *v points
 * into it. */
static int read_prompts(const cfg_config *cfg, MPI_Comm comm, char **buf, char ***v, err_list *errs) {
  int rank;
  long len = 0;
  MPI_Comm_rank(comm, &rank);
  const cfg_sample *c = &cfg->sample;
  char *text = NULL;
  if (rank == 0 && c->prompt_file[0]) {
    size_t got = 0;
    int e0 = errs->n;
    text = util_read_file(c->prompt_file, (size_t)1 << 30, &got, "prompt", "give a text file of prompts, one per line", errs);
    if (!text) cfg_relocate(cfg, errs, e0, "sample", "prompt_file");
    len = text ? (long)got : -1;
  } else if (rank == 0) {
    text = util_strdup(c->prompt), len = (long)strlen(text);
  }
  MPI_Bcast(&len, 1, MPI_LONG, 0, comm);
  if (len < 0) return -1;
  if (rank != 0) text = util_malloc((size_t)len + 1, "prompts");
  MPI_Bcast(text, (int)len, MPI_CHAR, 0, comm);
  text[len] = '\0';
  *buf = text;
  *v = util_malloc(((size_t)len + 2) * sizeof(char *), "prompts");
  if (!c->prompt_file[0]) {
    (*v)[0] = text; /* the deck's prompt whole ("" starts from a newline) */
    return 1;
  }
  int n = split_lines(text, *v);
  if (n == 0 && rank == 0)
    cfg_error_at(cfg, errs, "sample", "prompt_file", "write one prompt per line", "%s holds no prompt", c->prompt_file);
  return n ? n : -1;
}

/* The first prompt of rank r's share of n: the shares differ by one at most, the first ranks take
 * the larger ones (one prompt on two ranks goes to rank 0, which streams it). */
static int share(int n, int size, int r) { return (int)(((long)n * r + size - 1) / size); }

/* Every rank's completions to rank 0, in prompt order: texts into all[lo..hi) of each rank. */
static void gather_outputs(MPI_Comm comm, int n, int lo, int hi, textgen_out *mine, textgen_out *all) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  for (int p = 0; p < n; p++) {
    int owner = 0;
    while (share(n, size, owner + 1) <= p) owner++;
    if (owner == 0 && rank == 0) {
      all[p] = mine[p - lo];
      continue;
    }
    if (rank == owner) {
      const textgen_out *o = &mine[p - lo];
      int meta[3] = {(int)strlen(o->text), o->n_new, (int)o->end};
      MPI_Send(meta, 3, MPI_INT, 0, p, comm);
      MPI_Send(o->text, meta[0], MPI_CHAR, 0, p, comm);
    } else if (rank == 0) {
      int meta[3];
      MPI_Recv(meta, 3, MPI_INT, owner, p, comm, MPI_STATUS_IGNORE);
      all[p].text = util_malloc((size_t)meta[0] + 1, "text");
      MPI_Recv(all[p].text, meta[0], MPI_CHAR, owner, p, comm, MPI_STATUS_IGNORE);
      all[p].text[meta[0]] = '\0';
      all[p].n_new = meta[1], all[p].end = (gen_end)meta[2];
    }
  }
  (void)hi;
}

/* sample.txt (the texts, separated by a line "==== prompt K ====" when there are several) and
 * samples.jsonl (prompt, text, new tokens, end) in the run directory. Rank 0. Returns 0 or -1 after
 * an error. */
static int write_outputs(const cfg_config *cfg, char **prompts, const textgen_out *all, int n, err_list *errs) {
  char path[CFG_STR_LEN + 32];
  util_atomic_file a, b;
  util_snprintf(path, sizeof path, "%s/sample.txt", cfg->job.run_dir);
  int bad = util_mkdir_p(cfg->job.run_dir) != 0 || util_atomic_open(&a, path) != 0;
  if (!bad) {
    for (int p = 0; p < n; p++) {
      if (n > 1) fprintf(a.fp, "==== prompt %d ====\n", p + 1);
      fprintf(a.fp, n > 1 ? "%s\n" : "%s", all[p].text);
    }
    bad = util_atomic_close(&a) != 0;
  }
  util_snprintf(path, sizeof path, "%s/samples.jsonl", cfg->job.run_dir);
  if (!bad && util_atomic_open(&b, path) == 0) {
    for (int p = 0; p < n; p++) {
      json_t *o = json_pack("{s:s, s:s, s:i, s:s}", "prompt", prompts[p], "text", all[p].text, "new_tokens", all[p].n_new,
                            "end", gen_end_name(all[p].end));
      char *line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
      if (line) fprintf(b.fp, "%s\n", line);
      free(line);
      json_decref(o);
    }
    bad = util_atomic_close(&b) != 0;
  } else {
    bad = 1;
  }
  if (bad) err_add(errs, cfg->job.run_dir, 0, 0, "check that the run directory can be written and the disk is not full",
                   "cannot write sample.txt or samples.jsonl");
  return bad ? -1 : 0;
}

/* Rank 0: the completions not streamed, the figures, the files. Returns 0 or -1 after an error. */
static int show_outputs(const cfg_config *cfg, char **prompts, textgen_out *all, int n, int size, double tokens, double wall,
                        const gen_timing *tm, err_list *errs) {
  for (int p = 1; p < n; p++) printf("== sample %d ==\n%s\n", p + 1, all[p].text);
  printf("sample: %.0f tokens in %.2f s (%.1f tokens/s over %d rank%s; rank 0: prefill %.2f s, decode %.1f tokens/s), "
         "sample 1 ended: %s\n", tokens, wall, tokens / wall, size, size == 1 ? "" : "s", tm->prefill_s, tm->decode_tps,
         gen_end_name(all[0].end));
  int rc = write_outputs(cfg, prompts, all, n, errs);
  if (rc == 0) printf("sample: texts in %s/sample.txt and samples.jsonl\n", cfg->job.run_dir);
  fflush(stdout);
  return rc;
}

int textgen_run(const cfg_config *cfg, const backend *be, MPI_Comm comm, err_list *errs) {
  infer_model im;
  char *buf = NULL, **prompts = NULL;
  int n = read_prompts(cfg, comm, &buf, &prompts, errs);
  if (n < 0 || infer_open(&im, cfg, be, comm, errs) || infer_load(&im, 0, 0, errs) || infer_meter(&im, errs)) {
    if (n >= 0) infer_close(&im);
    free(buf), free(prompts);
    return 1;
  }
  const cfg_sample *c = &cfg->sample;
  int lo = share(n, im.size, im.rank), hi = share(n, im.size, im.rank + 1), bad = 0, measured;
  if (im.rank == 0)
    printf("sample: %d prompt%s, up to %ld tokens each, temperature %g, top-k %ld, top-p %g, repetition penalty %g; the "
           "model from the %s\n== sample 1 ==\n%s", n, n == 1 ? "" : "s", c->n_tokens, c->temperature, c->top_k, c->top_p,
           c->repetition_penalty, im.source, prompts[0][0] ? prompts[0] : "\n"), fflush(stdout);
  textgen_out *mine = util_calloc((size_t)(hi - lo) + 1, sizeof *mine, "outputs"), *all = NULL;
  gen_timing tm = {0};
  double t0 = util_now(), tokens = 0, joules;
  if (hi > lo)
    textgen_generate(&im.model, &im.tok, c, (uint64_t)cfg->job.seed, (const char *const *)prompts + lo, hi - lo, lo,
                     im.rank == 0 ? stdout : NULL, mine, &tm);
  double wall = util_now() - t0;
  for (int p = 0; p < hi - lo; p++) tokens += mine[p].n_new;
  MPI_Allreduce(MPI_IN_PLACE, &tokens, 1, MPI_DOUBLE, MPI_SUM, comm);
  MPI_Allreduce(MPI_IN_PLACE, &wall, 1, MPI_DOUBLE, MPI_MAX, comm);
  if (im.rank == 0) all = util_calloc((size_t)n, sizeof *all, "outputs"), printf("\n");
  gather_outputs(comm, n, lo, hi, mine, all);
  if (im.rank == 0) bad = show_outputs(cfg, prompts, all, n, im.size, tokens, wall, &tm, errs) != 0;
  /* a new token: a forward pass of one row, a third of the training FLOPs per token (gpt.h) */
  infer_meter_report(&im, tokens, tokens * gpt_flops_per_token(&im.shape, im.shape.maxT) / 3, &joules, &measured);
  textgen_out_free(im.rank == 0 ? all : mine, im.rank == 0 ? n : hi - lo);
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  free(mine), free(all), free(buf), free(prompts);
  infer_close(&im);
  return bad;
}
