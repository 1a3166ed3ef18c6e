/* fuzz_text: the text input path of the 'tokenizer' and 'prepare' tasks (reader.c: plain, gzip and
 * zstd streams; corpus.c: JSON Lines records, document pieces, lines too long) on arbitrary files.
 *
 * The first byte chooses how the rest (the payload) is read:
 *   bits 0-1  the file: 0 the payload itself (which may be gzip or zstd data), 1 the payload gzipped,
 *             2 zstd-compressed, 3 gzipped in two members cut at the second byte's share of it
 *   bit 2     &prepare format = 'jsonl' (else 'text')
 *   bits 3-4  &prepare documents: file, line, blank_line, separator_line ('@@@')
 *   bit 5     &prepare bad_records = 'fatal' (else 'skip')
 *   bit 6     bytes that are not compressed data appended to a compressed file (trailing garbage)
 * &prepare buffer_mb is the smallest, so a line may have 1024 bytes.
 *
 * Properties: no crash; errors carry a file, a message and a hint; the pieces form documents (a piece
 * that does not begin a document follows one that did not end it, the last one ends its document);
 * no line longer than the limit is handed on; text read in 'file' documents is the payload without
 * its lines too long, exactly, through gzip of one or two members and zstd alike (so multi-member
 * gzip is read whole); trailing garbage is an error that says so; 'skip' fails only on damaged
 * files, 'fatal' whenever a record or line was bad. */
#include <zlib.h>
#include <zstd.h>

#include "deck/cfg.h"
#include "text/corpus.h"
#include "fuzz.h"

static cfg_config cfgs[64]; /* by the option bits 2-5 (and 0: the input's name) */
static char text_path[400], jsonl_path[400];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fuzz_setup(argc, argv, 1);
  static const char *const docs[] = {"file", "line", "blank_line", "separator_line"};
  snprintf(text_path, sizeof text_path, "%s/in.txt", fuzz_dir);
  snprintf(jsonl_path, sizeof jsonl_path, "%s/in.jsonl", fuzz_dir);
  for (int k = 0; k < 16; k++) {
    char deck[2048];
    snprintf(deck, sizeof deck,
             "&job task = 'prepare' /\n&prepare input = '%s', format = '%s', documents = '%s', separator = '@@@',\n"
             "  bad_records = '%s', buffer_mb = 0.001, train_out = '%s/train.nc', val_out = '%s/val.nc' /\n",
             k & 1 ? jsonl_path : text_path, k & 1 ? "jsonl" : "text", docs[(k >> 1) & 3], k & 8 ? "fatal" : "skip",
             fuzz_dir, fuzz_dir);
    err_list errs = {0};
    if (cfg_load(&cfgs[k], deck, strlen(deck), "fuzz.nml", NULL, 0, &errs) != 0) err_print(&errs, 5), abort();
    err_free(&errs);
  }
  return 0;
}

/* gzip (one member) of n bytes appended to out. */
static void gzip_member(const uint8_t *p, size_t n, uint8_t **out, size_t *len) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
  size_t cap = deflateBound(&z, (uLong)n) + 32;
  *out = realloc(*out, *len + cap);
  z.next_in = (Bytef *)p, z.avail_in = (uInt)n;
  z.next_out = *out + *len, z.avail_out = (uInt)cap;
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
  *len += cap - z.avail_out;
  deflateEnd(&z);
}

/* The file the options ask for, from the payload p (n bytes); its length in *len. free() it. */
static uint8_t *make_file(int opt, uint8_t cut, const uint8_t *p, size_t n, size_t *len) {
  uint8_t *f = NULL;
  *len = 0;
  int kind = opt & 3;
  if (kind == 0) {
    f = malloc(n + 1);
    memcpy(f, p, n);
    *len = n;
  } else if (kind == 2) {
    size_t cap = ZSTD_compressBound(n);
    f = malloc(cap + 16);
    *len = ZSTD_compress(f, cap, p, n, 1);
    if (ZSTD_isError(*len)) abort();
  } else {
    size_t m = kind == 3 ? n * cut / 255 : n;
    gzip_member(p, m, &f, len);
    if (kind == 3) gzip_member(p + m, n - m, &f, len);
  }
  if ((opt & 64) && kind != 0) { /* not a gzip member nor a zstd frame */
    f = realloc(f, *len + 5);
    memcpy(f + *len, "\0junk", 5);
    *len += 5;
  }
  return f;
}

typedef struct {
  size_t max;        /* the longest line */
  int jsonl, open, pieces, bad_order, too_long;
  char *text;        /* the pieces, one after the other */
  size_t n, cap;
} collected;

static void on_piece(const char *text, size_t len, int begins, int ends, void *p) {
  collected *c = p;
  c->bad_order |= (c->pieces == 0 && !begins) || (!begins && !c->open) || (begins && c->open);
  c->open = !ends;
  c->pieces++;
  if (c->jsonl) c->too_long |= len > c->max || !begins || !ends;
  if (c->n + len > c->cap) c->text = realloc(c->text, c->cap = 2 * (c->n + len) + 64);
  memcpy(c->text + c->n, text, len);
  c->n += len;
}

/* The payload without its lines longer than max (each with its newline): what 'file' documents give. */
static size_t without_long_lines(const uint8_t *p, size_t n, size_t max, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    const uint8_t *nl = memchr(p + i, '\n', n - i);
    size_t e = nl ? (size_t)(nl - p) : n, next = nl ? e + 1 : n;
    if (e - i <= max) memcpy(out + o, p + i, next - i), o += next - i;
    i = next;
  }
  return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int opt = data[0], jsonl = (opt >> 2) & 1, fatal = (opt >> 5) & 1, docs = (opt >> 3) & 3;
  const uint8_t *payload = data + 2;
  size_t n = size - 2, flen;
  uint8_t *file = make_file(opt, data[1], payload, n, &flen);
  char path[400];
  fuzz_write(jsonl ? "in.jsonl" : "in.txt", file, flen, path, sizeof path);
  free(file);
  const cfg_config *cfg = &cfgs[jsonl | docs << 1 | fatal << 3];
  corpus_set cs;
  err_list errs = {0};
  collected got = {.jsonl = jsonl};
  int rc = -1, opened = n > 0 || (opt & 3) != 0; /* an empty file is refused at the deck key */
  if (corpus_open(&cs, cfg, "prepare", "input", &cfg->prepare.input, MPI_COMM_SELF, &errs) == 0) {
    got.max = cs.line_max;
    rc = corpus_each(&cs, on_piece, &got, &errs);
    FUZZ_ASSERT(cs.bad.n <= cs.records, "bad records are records");
    FUZZ_ASSERT(!fatal || rc != 0 || (cs.bad.n == 0 && cs.long_lines.n == 0), "'fatal' fails on a bad record or line");
    FUZZ_ASSERT(!got.bad_order && (rc != 0 || !got.open), "the pieces form documents");
    FUZZ_ASSERT(!got.too_long, "JSON Lines documents are whole and within the longest line");
    int magic = (n >= 2 && payload[0] == 0x1f && payload[1] == 0x8b) || (n >= 4 && !memcmp(payload, "\x28\xb5\x2f\xfd", 4));
    int plain_payload = (opt & 3) != 0 || !magic; /* the stream read is the payload */
    if (!fatal && !(opt & 64) && plain_payload) FUZZ_ASSERT(rc == 0, "'skip' reads a readable file to its end");
    if (rc == 0 && !jsonl && docs == 0 && plain_payload) {
      char *want = malloc(n + 1);
      size_t wn = without_long_lines(payload, n, cs.line_max, want);
      FUZZ_ASSERT(wn == got.n && (wn == 0 || memcmp(want, got.text, wn) == 0), "'file' documents are the text without its lines too long");
      free(want);
    }
    if ((opt & 64) && (opt & 3)) {
      FUZZ_ASSERT(rc != 0, "trailing garbage is an error");
      FUZZ_ASSERT(errs.n > 0 && strstr(errs.v[errs.n - 1].msg, "trailing garbage"), "trailing garbage is named");
    }
    corpus_close(&cs);
  } else {
    FUZZ_ASSERT(!opened, "a non-empty file is opened");
  }
  for (int i = 0; i < errs.n; i++)
    FUZZ_ASSERT(errs.v[i].file[0] && errs.v[i].msg[0] && errs.v[i].hint[0], "errors carry a file, a message and a hint");
  if (getenv("FUZZ_VERBOSE")) err_print(&errs, 10), printf("%s: rc %d, %d errors, %d pieces\n", __FILE__, rc, errs.n, got.pieces);
  free(got.text);
  err_free(&errs);
  return 0;
}
