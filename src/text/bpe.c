/* bpe: distributed byte-level BPE training. */
#include "text/bpe.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/corpus.h"
#include "text/tok.h"
#include "base/util.h"

int bpe_byte_rank(int b) {
  /* GPT-2 lists the bytes that stand for themselves first, in byte order, then the others */
  int c = tok_byte_to_char(b);
  if (c < 256) {
    int r = 0;
    for (int x = 0; x < b; x++)
      if (tok_byte_to_char(x) < 256) r++;
    return r;
  }
  return 188 + (c - 256);
}

/* ---- growable buffers --------------------------------------------------------------------------- */

typedef struct {
  char *p;
  size_t n, cap;
} bytebuf;

static void buf_put(bytebuf *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    while (b->n + n > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
    b->p = util_realloc(b->p, b->cap, "BPE buffer");
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

typedef struct {
  int32_t *v;
  int n, cap;
} ivec;

static void ivec_push(ivec *l, int32_t x) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 4;
    l->v = util_realloc(l->v, (size_t)l->cap * sizeof *l->v, "BPE list");
  }
  l->v[l->n++] = x;
}

/* Exchange per-destination byte buffers; returns the concatenation of what this rank receives. */
static bytebuf exchange(bytebuf *out, MPI_Comm comm) {
  int P;
  MPI_Comm_size(comm, &P);
  int *sc = util_calloc((size_t)P, sizeof(int), "exchange"), *rc = util_calloc((size_t)P, sizeof(int), "exchange");
  int *sd = util_calloc((size_t)P, sizeof(int), "exchange"), *rd = util_calloc((size_t)P, sizeof(int), "exchange");
  bytebuf all = {0}, in = {0};
  for (int r = 0; r < P; r++) {
    UTIL_CHECK(out[r].n < (size_t)1 << 30 && all.n + out[r].n <= INT_MAX, "train the vocabulary on more ranks or a smaller corpus",
               "BPE exchange of %zu bytes (after %zu to lower ranks) exceeds the 1 GiB per message and 2 GiB per rank limits",
               out[r].n, all.n);
    sc[r] = (int)out[r].n;
    sd[r] = (int)all.n;
    if (out[r].n) buf_put(&all, out[r].p, out[r].n);
    out[r].n = 0;
  }
  MPI_Alltoall(sc, 1, MPI_INT, rc, 1, MPI_INT, comm);
  size_t total = 0;
  for (int r = 0; r < P; r++) {
    UTIL_CHECK(total + (size_t)rc[r] <= INT_MAX, "train the vocabulary on more ranks or a smaller corpus",
               "BPE exchange: %zu bytes received by one rank exceed MPI's 2 GiB per call", total + (size_t)rc[r]);
    rd[r] = (int)total;
    total += (size_t)rc[r];
  }
  in.cap = total ? total : 1;
  in.p = util_malloc(in.cap, "exchange");
  in.n = total;
  MPI_Alltoallv(all.p, sc, sd, MPI_BYTE, in.p, rc, rd, MPI_BYTE, comm);
  free(all.p);
  free(sc), free(rc), free(sd), free(rd);
  return in;
}

/* ---- the trainer's state ------------------------------------------------------------------------ */

typedef struct {
  int32_t *sym;
  int n;
  int64_t count;
} bpe_word;

typedef struct {
  int64_t count;
  uint64_t pair;
} bpe_cand;

typedef struct {
  MPI_Comm comm;
  int rank, P;
  bpe_word *w; /* the words this rank owns */
  size_t nw;
  hmap_u64 where; /* pair -> index into wl: the owned words that (may) contain it */
  ivec *wl;
  size_t nwl, capwl;
  hmap_u64 delta;  /* pair -> pending count change (int64) from this rank's words */
  hmap_u64 gcount; /* owner side: pair -> global count */
  bpe_cand *heap;  /* owner side: max-heap of (count, pair), entries may be stale */
  size_t nh, caph;
  bytebuf *out;    /* per-destination send buffers */
} bpe_state;

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
static int owner_of(const bpe_state *s, uint64_t pair) { return (int)(hmap_mix64(pair) % (uint64_t)s->P); }

/* Better candidate: more occurrences, then the smaller left id, then the smaller right id. */
static int cand_better(bpe_cand x, bpe_cand y) { return x.count > y.count || (x.count == y.count && x.pair < y.pair); }

static void heap_push(bpe_state *s, bpe_cand c) {
  if (s->nh == s->caph) {
    s->caph = s->caph ? 2 * s->caph : 1024;
    s->heap = util_realloc(s->heap, s->caph * sizeof *s->heap, "BPE heap");
  }
  size_t i = s->nh++;
  while (i > 0 && cand_better(c, s->heap[(i - 1) / 2])) {
    s->heap[i] = s->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  s->heap[i] = c;
}

static void heap_pop(bpe_state *s) {
  bpe_cand last = s->heap[--s->nh];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= s->nh) break;
    if (c + 1 < s->nh && cand_better(s->heap[c + 1], s->heap[c])) c++;
    if (!cand_better(s->heap[c], last)) break;
    s->heap[i] = s->heap[c];
    i = c;
  }
  s->heap[i] = last;
}

static void add_delta(bpe_state *s, uint64_t pair, int64_t d) {
  uint64_t *v = hmap_u64_put(&s->delta, pair, 0, NULL);
  *v = (uint64_t)((int64_t)*v + d);
}

static void note_word(bpe_state *s, uint64_t pair, int32_t word) {
  int added;
  uint64_t *slot = hmap_u64_put(&s->where, pair, s->nwl, &added);
  if (added) {
    if (s->nwl == s->capwl) {
      s->capwl = s->capwl ? 2 * s->capwl : 1024;
      s->wl = util_realloc(s->wl, s->capwl * sizeof *s->wl, "BPE lists");
    }
    memset(&s->wl[s->nwl++], 0, sizeof(ivec));
  }
  ivec *l = &s->wl[*slot];
  if (l->n == 0 || l->v[l->n - 1] != word) ivec_push(l, word);
}

/* Send the pending deltas to the pairs' owners, who update the global counts and their heaps. */
static void flush_deltas(bpe_state *s) {
  for (size_t i = 0; i < s->delta.cap; i++) {
    uint64_t k = s->delta.keys[i];
    if (k == HMAP_EMPTY || s->delta.vals[i] == 0) continue;
    int64_t d = (int64_t)s->delta.vals[i];
    bytebuf *b = &s->out[owner_of(s, k)];
    buf_put(b, &k, sizeof k);
    buf_put(b, &d, sizeof d);
  }
  hmap_u64_clear(&s->delta);
  bytebuf in = exchange(s->out, s->comm);
  for (size_t o = 0; o + 16 <= in.n; o += 16) {
    uint64_t k;
    int64_t d;
    memcpy(&k, in.p + o, 8);
    memcpy(&d, in.p + o + 8, 8);
    uint64_t *c = hmap_u64_put(&s->gcount, k, 0, NULL);
    *c = (uint64_t)((int64_t)*c + d);
    if ((int64_t)*c > 0) heap_push(s, (bpe_cand){(int64_t)*c, k});
  }
  free(in.p);
}

/* Replace every (a, b) in word wi by id m, recording pair-count changes and new pair locations. */
static void merge_word(bpe_state *s, int32_t wi, int32_t a, int32_t b, int32_t m) {
  bpe_word *w = &s->w[wi];
  int found = 0;
  for (int i = 0; i + 1 < w->n; i++)
    if (w->sym[i] == a && w->sym[i + 1] == b) found = 1;
  if (!found) return;
  for (int i = 0; i + 1 < w->n; i++) add_delta(s, pair_key(w->sym[i], w->sym[i + 1]), -w->count);
  int k = 0;
  for (int i = 0; i < w->n; i++) {
    if (i + 1 < w->n && w->sym[i] == a && w->sym[i + 1] == b) {
      w->sym[k++] = m;
      i++;
    } else {
      w->sym[k++] = w->sym[i];
    }
  }
  w->n = k;
  for (int i = 0; i + 1 < w->n; i++) {
    uint64_t p = pair_key(w->sym[i], w->sym[i + 1]);
    add_delta(s, p, w->count);
    if (w->sym[i] == m || w->sym[i + 1] == m) note_word(s, p, wi);
  }
}

/* Send each counted piece to its owner; owners sum the counts and build their word list. */
static void distribute_words(bpe_state *s, const hmap_str *words) {
  for (size_t i = 0; i < words->n; i++) {
    size_t len;
    const char *k = hmap_str_key(words, i, &len);
    uint32_t l32 = (uint32_t)len;
    int64_t c = words->val[i];
    bytebuf *b = &s->out[util_hash64(k, len, 0) % (uint64_t)s->P];
    buf_put(b, &l32, 4);
    buf_put(b, &c, 8);
    buf_put(b, k, len);
  }
  bytebuf in = exchange(s->out, s->comm);
  hmap_str mine;
  hmap_str_init(&mine, 1024);
  for (size_t o = 0; o < in.n;) {
    uint32_t l32;
    int64_t c;
    memcpy(&l32, in.p + o, 4);
    memcpy(&c, in.p + o + 4, 8);
    *hmap_str_put(&mine, in.p + o + 12, l32, 0, NULL) += c;
    o += 12 + l32;
  }
  free(in.p);
  s->nw = mine.n;
  s->w = util_calloc(s->nw ? s->nw : 1, sizeof *s->w, "BPE words");
  for (size_t i = 0; i < mine.n; i++) {
    size_t len;
    const unsigned char *k = (const unsigned char *)hmap_str_key(&mine, i, &len);
    bpe_word *w = &s->w[i];
    w->n = (int)len;
    w->count = mine.val[i];
    w->sym = util_malloc(len * sizeof(int32_t), "BPE word");
    for (size_t j = 0; j < len; j++) w->sym[j] = bpe_byte_rank(k[j]);
    for (size_t j = 0; j + 1 < len; j++) {
      uint64_t p = pair_key(w->sym[j], w->sym[j + 1]);
      add_delta(s, p, w->count);
      note_word(s, p, (int32_t)i);
    }
  }
  hmap_str_free(&mine);
}

/* ---- output ------------------------------------------------------------------------------------- */

/* encoder.json's text: token strings -> ids, <|endoftext|> last. free() it. */
static char *encoder_text(char **tok, const int *tlen, int ntok, size_t *len) {
  char chars[4 * TOK_MAX_BYTES + 1];
  json_t *enc = json_object();
  for (int i = 0; i < ntok; i++) {
    tok_bytes_to_chars(tok[i], tlen[i], chars, sizeof chars);
    json_object_set_new(enc, i == ntok - 1 ? "<|endoftext|>" : chars, json_integer(i));
  }
  char *text = json_dumps(enc, JSON_COMPACT | JSON_ENSURE_ASCII);
  json_decref(enc);
  UTIL_CHECK(text != NULL, NULL, "out of memory writing encoder.json");
  *len = strlen(text);
  return text;
}

/* vocab.bpe's text: the version line, then one merge "left right" per line. */
static bytebuf merges_text(char **tok, const int *tlen, const int32_t (*mg)[2], long nm) {
  bytebuf b = {0};
  char line[2 * (4 * TOK_MAX_BYTES + 1) + 2];
  buf_put(&b, "#version: 0.2\n", 14);
  for (long r = 0; r < nm; r++) {
    int o = tok_bytes_to_chars(tok[mg[r][0]], tlen[mg[r][0]], line, 4 * TOK_MAX_BYTES + 1);
    line[o++] = ' ';
    o += tok_bytes_to_chars(tok[mg[r][1]], tlen[mg[r][1]], line + o, 4 * TOK_MAX_BYTES + 1);
    line[o++] = '\n';
    buf_put(&b, line, (size_t)o);
  }
  return b;
}

/* n bytes of data into path, synced. 0, or -1 with errno. */
static int write_synced(const char *path, const char *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return -1;
  int rc = fwrite(data, 1, n, fp) == n && fflush(fp) == 0 && fsync(fileno(fp)) == 0 ? 0 : -1, e = errno;
  if (fclose(fp) != 0 && rc == 0) return -1;
  errno = e;
  return rc;
}

/* The manifest (tok.h) of the pair, crash-safely. 0, or -1 with errno. */
static int write_manifest(const char *dir, const char *enc, size_t el, const char *voc, size_t vl) {
  char path[UTIL_PATH_MAX], text[512];
  util_snprintf(path, sizeof path, "%s/%s", dir, TOK_MANIFEST);
  tok_manifest_text(enc, el, voc, vl, text, sizeof text);
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) return -1;
  fputs(text, af.fp);
  return util_atomic_close(&af);
}

/* dir/encoder.json and dir/vocab.bpe, written so that no reader takes a mixed pair: both are written
 * to .tmp files and synced, then the manifest listing the new pair replaces the old one, then each file
 * is renamed into place. From the manifest's replacement to the second rename a reader refuses the
 * directory (tok.h); before it the older pair is whole, after it the new one. */
static int write_files(const char *dir, char **tok, const int *tlen, int ntok, const int32_t (*mg)[2], long nm,
                       err_list *errs) {
  if (util_mkdir_p(dir) != 0) {
    err_add(errs, dir, 0, 0, "check that &tokenizer dir can be created", "cannot create the tokenizer directory: %s",
            strerror(errno));
    return -1;
  }
  size_t el;
  char *enc = encoder_text(tok, tlen, ntok, &el);
  bytebuf voc = merges_text(tok, tlen, mg, nm);
  char ep[UTIL_PATH_MAX], vp[UTIL_PATH_MAX], et[UTIL_PATH_MAX + 8], vt[UTIL_PATH_MAX + 8];
  util_snprintf(ep, sizeof ep, "%s/encoder.json", dir);
  util_snprintf(vp, sizeof vp, "%s/vocab.bpe", dir);
  util_snprintf(et, sizeof et, "%s.tmp", ep);
  util_snprintf(vt, sizeof vt, "%s.tmp", vp);
  int rc = write_synced(et, enc, el) || write_synced(vt, voc.p, voc.n) || write_manifest(dir, enc, el, voc.p, voc.n) ||
           util_commit(et, ep) || util_commit(vt, vp) ? -1 : 0;
  if (rc != 0) {
    int e = errno;
    remove(et), remove(vt);
    err_add(errs, dir, 0, 0, "check that &tokenizer dir is writable and the disk is not full",
            "cannot write the vocabulary (encoder.json, vocab.bpe, " TOK_MANIFEST "): %s", strerror(e));
  }
  free(enc), free(voc.p);
  return rc;
}

/* ---- training ----------------------------------------------------------------------------------- */

/* The vocabulary being learned: token bytes by id, ids by bytes, the merges in order. */
typedef struct {
  char **tok;
  int *tlen;
  int ntok;
  hmap_str ids;
  int32_t (*mg)[2];
  long nm;
} bpe_vocab;

static void vocab_init(bpe_vocab *v, int vocab_size) {
  v->ntok = 256; /* the 256 bytes in GPT-2's order, then merged tokens */
  v->tok = util_calloc((size_t)vocab_size, sizeof(char *), "BPE tokens");
  v->tlen = util_calloc((size_t)vocab_size, sizeof(int), "BPE tokens");
  hmap_str_init(&v->ids, (size_t)vocab_size);
  for (int b = 0; b < 256; b++) {
    int r = bpe_byte_rank(b);
    v->tok[r] = util_malloc(1, "token");
    v->tok[r][0] = (char)b;
    v->tlen[r] = 1;
  }
  for (int r = 0; r < 256; r++) *hmap_str_put(&v->ids, v->tok[r], 1, 0, NULL) = r;
  v->mg = util_malloc((size_t)vocab_size * sizeof *v->mg, "BPE merges");
  v->nm = 0;
}

static void vocab_free(bpe_vocab *v) {
  for (int i = 0; i < v->ntok; i++) free(v->tok[i]);
  free(v->tok), free(v->tlen), free(v->mg);
  hmap_str_free(&v->ids);
}

/* The globally best pair (highest count; ties to the smaller ids) whose token would have at most
 * TOK_MAX_BYTES bytes, agreed by all ranks; count 0 when none is left. */
static bpe_cand best_pair(bpe_state *s, const bpe_vocab *v) {
  bpe_cand mine = {0, 0};
  while (s->nh > 0) { /* this rank's best live pair */
    bpe_cand top = s->heap[0];
    uint64_t *c = hmap_u64_get(&s->gcount, top.pair);
    int fits = v->tlen[top.pair >> 32] + v->tlen[(uint32_t)top.pair] <= TOK_MAX_BYTES;
    if (c && (int64_t)*c == top.count && fits) {
      mine = top;
      break;
    }
    heap_pop(s);
  }
  bpe_cand *all = util_malloc((size_t)s->P * sizeof *all, "BPE candidates");
  MPI_Allgather(&mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, s->comm);
  bpe_cand best = all[0];
  for (int r = 1; r < s->P; r++)
    if (cand_better(all[r], best)) best = all[r];
  free(all);
  return best;
}

/* Merge pair best everywhere it occurs (in the pieces this rank owns) into its token: a new one,
 * or the existing token with the same bytes. */
static void merge_pair(bpe_state *s, bpe_vocab *v, bpe_cand best) {
  if (owner_of(s, best.pair) == s->rank) heap_pop(s);
  int32_t a = (int32_t)(best.pair >> 32), b = (int32_t)(uint32_t)best.pair;
  int len = v->tlen[a] + v->tlen[b], added;
  char *bytes = util_malloc((size_t)len, "token");
  memcpy(bytes, v->tok[a], (size_t)v->tlen[a]);
  memcpy(bytes + v->tlen[a], v->tok[b], (size_t)v->tlen[b]);
  int64_t *id = hmap_str_put(&v->ids, bytes, (size_t)len, v->ntok, &added);
  if (added) {
    v->tok[v->ntok] = bytes;
    v->tlen[v->ntok++] = len;
  } else {
    free(bytes);
  }
  int32_t m = (int32_t)*id;
  v->mg[v->nm][0] = a, v->mg[v->nm][1] = b, v->nm++;
  uint64_t *slot = hmap_u64_get(&s->where, best.pair);
  if (slot) {
    ivec l = s->wl[*slot]; /* taken out: merge_word may grow s->wl */
    memset(&s->wl[*slot], 0, sizeof l);
    for (int k = 0; k < l.n; k++) merge_word(s, l.v[k], a, b, m);
    free(l.v);
  }
  flush_deltas(s);
}

static void state_free(bpe_state *s) {
  for (size_t i = 0; i < s->nw; i++) free(s->w[i].sym);
  for (size_t i = 0; i < s->nwl; i++) free(s->wl[i].v);
  for (int r = 0; r < s->P; r++) free(s->out[r].p);
  free(s->w), free(s->wl), free(s->heap), free(s->out);
  hmap_u64_free(&s->where);
  hmap_u64_free(&s->delta);
  hmap_u64_free(&s->gcount);
}

int bpe_train(const hmap_str *words, int vocab_size, MPI_Comm comm, const char *dir, bpe_stats *st, err_list *errs) {
  double t0 = util_now();
  bpe_state s;
  memset(&s, 0, sizeof s);
  s.comm = comm;
  MPI_Comm_rank(comm, &s.rank);
  MPI_Comm_size(comm, &s.P);
  s.out = util_calloc((size_t)s.P, sizeof *s.out, "BPE buffers");
  hmap_u64_init(&s.where, 1 << 12);
  hmap_u64_init(&s.delta, 1 << 12);
  hmap_u64_init(&s.gcount, 1 << 12);
  memset(st, 0, sizeof *st);
  long local[2] = {0, (long)words->n}, global[2];
  for (size_t i = 0; i < words->n; i++) local[0] += (long)words->val[i];
  distribute_words(&s, words);
  local[1] = (long)s.nw;
  MPI_Allreduce(local, global, 2, MPI_LONG, MPI_SUM, comm);
  st->words = global[0];
  st->unique = global[1];
  flush_deltas(&s);
  bpe_vocab v;
  vocab_init(&v, vocab_size);
  for (bpe_cand best; v.ntok < vocab_size - 1 && (best = best_pair(&s, &v)).count > 0;) merge_pair(&s, &v, best);
  st->merges = v.nm;
  st->tokens = v.ntok + 1;
  int rc = v.ntok < vocab_size - 1; /* too little text */
  v.tok[v.ntok] = util_strdup("<|endoftext|>"); /* last */
  v.tlen[v.ntok] = (int)strlen(v.tok[v.ntok]);
  v.ntok++;
  if (rc == 0) {
    if (s.rank == 0) rc = write_files(dir, v.tok, v.tlen, v.ntok, (const int32_t(*)[2])v.mg, v.nm, errs);
    MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  }
  vocab_free(&v);
  state_free(&s);
  st->seconds = util_now() - t0;
  return rc;
}

/* ---- the task ----------------------------------------------------------------------------------- */

typedef struct {
  tok_tokenizer *pre;
  hmap_str *words;
} count_ctx;

static void count_piece(const char *p, size_t n, void *ctx) { *hmap_str_put(((count_ctx *)ctx)->words, p, n, 0, NULL) += 1; }

static void count_doc(const char *text, size_t len, int begins, int ends, void *ctx) {
  (void)begins, (void)ends;
  count_ctx *c = ctx;
  tok_pieces(c->pre, text, len, count_piece, c);
}

/* Rank 0: read the files back (they must load as a tokenizer) and say what was learned. */
static int report_vocabulary(const cfg_tokenizer *tc, const corpus_set *cs, const bpe_stats *st, double t_count, int P,
                             err_list *errs) {
  tok_tokenizer t;
  if (tok_load_bpe(&t, tc->dir, errs) != 0) return -1;
  char b1[32];
  printf("tokenizer: %s of text, %ld pieces (%ld distinct), %ld merges in %.2f s (counting %.2f s) on %d rank%s\n",
         util_fmt_bytes((double)cs->total, b1, sizeof b1), st->words, st->unique, st->merges, st->seconds, t_count, P,
         P == 1 ? "" : "s");
  printf("tokenizer: wrote %s/encoder.json and %s/vocab.bpe: %d tokens, hash %s\n", tc->dir, tc->dir, t.vocab_size,
         t.hash_hex);
  fflush(stdout);
  tok_free(&t);
  return 0;
}

int bpe_run_task(const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  int rank, P;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  const cfg_tokenizer *tc = &cfg->tokenizer;
  int own = tc->corpus.n > 0; /* else &prepare input */
  corpus_set cs;
  if (corpus_open(&cs, cfg, own ? "tokenizer" : "prepare", own ? "corpus" : "input", own ? &tc->corpus : &cfg->prepare.input,
                  comm, errs))
    return 1;
  tok_tokenizer pre;
  UTIL_CHECK(tok_init_pretokenizer(&pre, errs) == 0, NULL, "%s", errs->n ? errs->v[errs->n - 1].msg : "PCRE2");
  hmap_str words;
  hmap_str_init(&words, 1 << 16);
  count_ctx c = {&pre, &words};
  double t0 = util_now();
  int rc = corpus_each(&cs, count_doc, &c, errs), any;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MIN, comm);
  double t_count = util_now() - t0;
  if (any == 0) corpus_report(&cs, comm, "tokenizer");
  bpe_stats st;
  if (any == 0) {
    int e0 = errs->n;
    rc = bpe_train(&words, (int)tc->vocab_size, comm, tc->dir, &st, errs);
    if (rc < 0) cfg_relocate(cfg, errs, e0, "tokenizer", "dir");
    if (rc > 0)
      cfg_error_at(cfg, errs, "tokenizer", "vocab_size", "learn from more text, or ask for a smaller vocab_size",
                   "the text supports only %d tokens (%ld merges): too little for vocab_size = %ld", st.tokens,
                   st.merges, tc->vocab_size);
    if (rank == 0 && rc == 0) rc = report_vocabulary(tc, &cs, &st, t_count, P, errs);
    MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  }
  hmap_str_free(&words);
  tok_free(&pre);
  corpus_close(&cs);
  return any != 0 || rc != 0;
}

int bpe_preflight(const cfg_config *cfg, MPI_Comm comm, err_list *errs) {
  int rank, bad = 0;
  MPI_Comm_rank(comm, &rank);
  const cfg_tokenizer *tc = &cfg->tokenizer;
  int own = tc->corpus.n > 0;
  static const char *const names[] = {"encoder.json", "vocab.bpe", TOK_MANIFEST};
  for (int i = 0; rank == 0 && i < 6 && !bad; i++) { /* each file, then its .tmp */
    char out[UTIL_PATH_MAX + 64];
    util_snprintf(out, sizeof out, "%s/%s%s", tc->dir, names[i % 3], i < 3 ? "" : ".tmp");
    bad = corpus_clash(cfg, own ? "tokenizer" : "prepare", own ? "corpus" : "input", own ? &tc->corpus : &cfg->prepare.input,
                       out, 0, "tokenizer", "dir", errs);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  return bad;
}
