/* safetensors: Hugging Face's safetensors files, validated strictly, read into and written from fp32. */
#include "io/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian data in place: a big-endian host needs byte swaps"
#endif

/* The safetensors library refuses headers larger than this; so do we. */
#define ST_MAX_HEADER (100u << 20)
#define ST_HINT_OPEN "give the path of a safetensors file (save_pretrained(safe_serialization=True) writes them)"
#define ST_HINT_FILE "the file is damaged or not a safetensors file: write it again (save_pretrained(safe_serialization=True))"

/* ---- dtypes ------------------------------------------------------------------------------------ */

static const struct {
  const char *name;
  int size;
  safetensors_dtype dtype;
} ST_DTYPES[] = {
    {"F32", 4, SAFETENSORS_F32},     {"BF16", 2, SAFETENSORS_BF16},   {"F16", 2, SAFETENSORS_F16},
    {"F64", 8, SAFETENSORS_OTHER},   {"I64", 8, SAFETENSORS_OTHER},   {"I32", 4, SAFETENSORS_OTHER},
    {"I16", 2, SAFETENSORS_OTHER},   {"I8", 1, SAFETENSORS_OTHER},    {"U64", 8, SAFETENSORS_OTHER},
    {"U32", 4, SAFETENSORS_OTHER},   {"U16", 2, SAFETENSORS_OTHER},   {"U8", 1, SAFETENSORS_OTHER},
    {"BOOL", 1, SAFETENSORS_OTHER},  {"F8_E4M3", 1, SAFETENSORS_OTHER}, {"F8_E5M2", 1, SAFETENSORS_OTHER},
};
enum { ST_NDTYPES = sizeof ST_DTYPES / sizeof ST_DTYPES[0] };

int safetensors_dtype_parse(const char *name, safetensors_dtype *d) {
  static const char *deck[] = {"fp32", "bf16", "fp16"};
  for (int i = 0; i < 3; i++)
    if (strcmp(name, deck[i]) == 0 || strcmp(name, ST_DTYPES[i].name) == 0) {
      *d = ST_DTYPES[i].dtype;
      return 0;
    }
  return -1;
}

const char *safetensors_dtype_name(safetensors_dtype d) { return d <= SAFETENSORS_F16 ? ST_DTYPES[d].name : "?"; }
int safetensors_dtype_size(safetensors_dtype d) { return d <= SAFETENSORS_F16 ? ST_DTYPES[d].size : 0; }

uint16_t safetensors_f32_to_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40); /* NaN stays a (quiet) NaN */
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

uint16_t safetensors_f32_to_f16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  uint32_t a = b & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0)); /* inf, NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
  if (a < 0x38800000u) {                                   /* below 2^-14: a subnormal half, or zero */
    int e = (int)(a >> 23);
    if (e < 102) return sign; /* below 2^-25: rounds to zero */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = (uint32_t)(126 - e);
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t h = (a >> 13) - (112u << 10), rem = a & 0x1fffu; /* rebias the exponent: 127 -> 15 */
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float safetensors_bf16_to_f32(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float x;
  memcpy(&x, &b, 4);
  return x;
}

float safetensors_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, b;
  if (e == 0) {
    float v = ldexpf((float)m, -24); /* zero or subnormal */
    return sign ? -v : v;
  }
  b = sign | (e == 0x1f ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
  float x;
  memcpy(&x, &b, 4);
  return x;
}

/* ---- reading: the header ----------------------------------------------------------------------- */

static int json_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/* One header entry {"dtype", "shape", "data_offsets"} into t. Returns 0, or -1 after an error. */
static int parse_entry(const safetensors_file *f, const char *name, json_t *v, safetensors_tensor *t, err_list *errs) {
  memset(t, 0, sizeof *t);
  if (strlen(name) >= sizeof t->name) {
    err_add(errs, f->path, 0, 0, ST_HINT_FILE, "a tensor name of %zu bytes, longer than %d", strlen(name), SAFETENSORS_NAME_LEN - 1);
    return -1;
  }
  util_strlcpy(t->name, name, sizeof t->name);
  json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
  if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2 ||
      json_object_size(v) != 3) {
    err_add(errs, f->path, 0, 0, ST_HINT_FILE,
            "tensor %s: a header entry is {\"dtype\": string, \"shape\": [...], \"data_offsets\": [begin, end]}", name);
    return -1;
  }
  int k = 0;
  while (k < ST_NDTYPES && strcmp(ST_DTYPES[k].name, json_string_value(dt)) != 0) k++;
  if (k == ST_NDTYPES) {
    err_add(errs, f->path, 0, 0, "safetensors dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2",
            "tensor %s: unknown dtype \"%s\"", name, json_string_value(dt));
    return -1;
  }
  util_strlcpy(t->dtype_name, ST_DTYPES[k].name, sizeof t->dtype_name);
  t->dtype = ST_DTYPES[k].dtype;
  t->elem_size = ST_DTYPES[k].size;
  t->ndim = (int)json_array_size(sh);
  t->numel = 1;
  int bad = t->ndim > SAFETENSORS_MAX_DIMS;
  for (int d = 0; d < t->ndim && !bad; d++) {
    uint64_t len = 0;
    bad = json_u64(json_array_get(sh, (size_t)d), &len) != 0 || (len && t->numel > (UINT64_C(1) << 50) / len);
    t->shape[d] = (int64_t)len;
    t->numel *= len;
  }
  if (bad || json_u64(json_array_get(off, 0), &t->begin) || json_u64(json_array_get(off, 1), &t->end) || t->end < t->begin) {
    err_add(errs, f->path, 0, 0, ST_HINT_FILE,
            "tensor %s: the shape must be at most %d sizes >= 0 and data_offsets two integers 0 <= begin <= end",
            name, SAFETENSORS_MAX_DIMS);
    return -1;
  }
  if (t->end - t->begin != t->numel * (uint64_t)t->elem_size) {
    err_add(errs, f->path, 0, 0, ST_HINT_FILE,
            "tensor %s: data_offsets [%llu, %llu] hold %llu bytes, but %llu elements of %s take %llu", name,
            (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
            (unsigned long long)t->numel, t->dtype_name, (unsigned long long)(t->numel * (uint64_t)t->elem_size));
    return -1;
  }
  return 0;
}

static int by_begin(const void *a, const void *b) {
  const safetensors_tensor *x = *(const safetensors_tensor *const *)a, *y = *(const safetensors_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile the data area [0, size) exactly: no overlap, no hole, nothing past the end. */
static int check_tiling(const safetensors_file *f, err_list *errs) {
  const safetensors_tensor **s = util_malloc(((size_t)f->n + 1) * sizeof *s, "safetensors order");
  for (int i = 0; i < f->n; i++) s[i] = &f->t[i];
  qsort(s, (size_t)f->n, sizeof *s, by_begin);
  uint64_t size = f->file_size - f->data_start, at = 0;
  int rc = 0;
  for (int i = 0; i < f->n && rc == 0; i++) {
    if (s[i]->end > size)
      err_add(errs, f->path, 0, 0, ST_HINT_FILE, "tensor %s: data_offsets [%llu, %llu] reach past the data area (%llu bytes): "
              "the file is truncated or the header lies", s[i]->name, (unsigned long long)s[i]->begin,
              (unsigned long long)s[i]->end, (unsigned long long)size), rc = -1;
    else if (s[i]->begin < at)
      err_add(errs, f->path, 0, 0, ST_HINT_FILE, "tensor %s: data_offsets [%llu, %llu] overlap tensor %s's, which end at %llu",
              s[i]->name, (unsigned long long)s[i]->begin, (unsigned long long)s[i]->end, s[i - 1]->name,
              (unsigned long long)at), rc = -1;
    else if (s[i]->begin > at)
      err_add(errs, f->path, 0, 0, ST_HINT_FILE, "tensor %s: data_offsets [%llu, %llu] leave bytes [%llu, %llu) of the data "
              "area to no tensor", s[i]->name, (unsigned long long)s[i]->begin, (unsigned long long)s[i]->end,
              (unsigned long long)at, (unsigned long long)s[i]->begin), rc = -1;
    at = s[i]->end;
  }
  if (rc == 0 && at != size)
    err_add(errs, f->path, 0, 0, ST_HINT_FILE, "the tensors end at byte %llu of a data area of %llu bytes: bytes no tensor holds",
            (unsigned long long)at, (unsigned long long)size), rc = -1;
  free(s);
  return rc;
}

/* The JSON header (already in memory) into f->t. */
static int parse_header(safetensors_file *f, const char *text, size_t len, err_list *errs) {
  json_error_t je;
  json_t *h = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!h || !json_is_object(h)) {
    err_add(errs, f->path, 0, 0, ST_HINT_FILE, "the header is not a JSON object%s%s", h ? "" : ": ", h ? "" : je.text);
    json_decref(h);
    return -1;
  }
  f->t = util_calloc(json_object_size(h) + 1, sizeof *f->t, "safetensors header");
  const char *key;
  json_t *v;
  int rc = 0;
  json_object_foreach(h, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      const char *mk;
      json_t *mv;
      json_object_foreach(v, mk, mv) if (!json_is_string(mv)) rc = -1;
      if (!json_is_object(v) || rc != 0)
        err_add(errs, f->path, 0, 0, ST_HINT_FILE, "__metadata__ must map strings to strings"), rc = -1;
    } else if (parse_entry(f, key, v, &f->t[f->n], errs) == 0) {
      f->n++;
    } else {
      rc = -1;
    }
    if (rc != 0) break;
  }
  json_decref(h);
  return rc == 0 ? check_tiling(f, errs) : -1;
}

int safetensors_open(safetensors_file *f, const char *path, err_list *errs) {
  memset(f, 0, sizeof *f);
  util_strlcpy(f->path, path, sizeof f->path);
  int fd = util_open_regular(path, "safetensors file", ST_HINT_OPEN, errs); /* a directory, a FIFO: named, never read */
  if (fd < 0) return -1;
  if (!(f->fp = fdopen(fd, "rb"))) {
    err_add(errs, path, 0, 0, NULL, "cannot open the safetensors file: %s", strerror(errno));
    close(fd);
    return -1;
  }
  unsigned char lenb[8];
  uint64_t n = 0;
  int rc = -1;
  char *text = NULL;
  if (fseeko(f->fp, 0, SEEK_END) == 0) f->file_size = (uint64_t)ftello(f->fp);
  rewind(f->fp);
  if (f->file_size < 8 || fread(lenb, 1, 8, f->fp) != 8) {
    err_add(errs, path, 0, 0, ST_HINT_FILE, "a file of %llu bytes: shorter than the 8-byte header length",
            (unsigned long long)f->file_size);
    goto out;
  }
  for (int i = 7; i >= 0; i--) n = n << 8 | lenb[i];
  if (n > f->file_size - 8 || n > ST_MAX_HEADER || n < 2) {
    err_add(errs, path, 0, 0, ST_HINT_FILE, "the header length %llu is %s (file of %llu bytes)", (unsigned long long)n,
            n < 2 ? "too small for a JSON object" : n > ST_MAX_HEADER ? "above the 100 MiB limit" : "larger than the file",
            (unsigned long long)f->file_size);
    goto out;
  }
  text = util_malloc((size_t)n, "safetensors header");
  if (fread(text, 1, (size_t)n, f->fp) != (size_t)n) {
    err_add(errs, path, 0, 0, ST_HINT_FILE, "cannot read the %llu-byte header: %s", (unsigned long long)n, strerror(errno));
    goto out;
  }
  f->data_start = 8 + n;
  rc = parse_header(f, text, (size_t)n, errs);
out:
  free(text);
  if (rc != 0) safetensors_close(f);
  return rc;
}

void safetensors_close(safetensors_file *f) {
  if (f->fp) fclose(f->fp);
  free(f->t);
  f->fp = NULL;
  f->t = NULL;
  f->n = 0;
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
  return NULL;
}

/* ---- reading: data ------------------------------------------------------------------------------ */

/* Element e of t as an index per dimension, "[r, c]", into buf. */
static const char *element_index(const safetensors_tensor *t, uint64_t e, char *buf, size_t len) {
  uint64_t idx[SAFETENSORS_MAX_DIMS];
  for (int d = t->ndim - 1; d >= 0; d--) { /* a tensor with an element has no dimension of size 0 */
    idx[d] = e % (uint64_t)t->shape[d];
    e /= (uint64_t)t->shape[d];
  }
  size_t o = (size_t)util_snprintf(buf, len, "[");
  for (int d = 0; d < t->ndim && o < len; d++)
    o += (size_t)util_snprintf(buf + o, len - o, "%s%llu", d ? ", " : "", (unsigned long long)idx[d]);
  if (o < len) util_snprintf(buf + o, len - o, "]");
  return buf;
}

/* A tensor whose values are not all finite is refused, naming its first NaN or infinity: weights
 * never hold one (a run that meets one stops), so the file is damaged. */
static int check_finite(const safetensors_file *f, const safetensors_tensor *t, const float *x, err_list *errs) {
  uint64_t e = 0;
  while (e < t->numel && isfinite(x[e])) e++;
  if (e == t->numel) return 0;
  char at[160];
  err_add(errs, f->path, 0, 0, "the weights are damaged (or were saved from a diverged model): save or export them again",
          "tensor %s: element %llu %s is %s", t->name, (unsigned long long)e, element_index(t, e, at, sizeof at),
          isnan(x[e]) ? "NaN" : x[e] > 0 ? "+infinity" : "-infinity");
  return -1;
}

int safetensors_read(safetensors_file *f, const safetensors_tensor *t, float *out, err_list *errs) {
  if (t->dtype == SAFETENSORS_OTHER) {
    err_add(errs, f->path, 0, 0, "convert the weights to float32, bfloat16 or float16 before saving them",
            "tensor %s: dtype %s is not supported (greenlm reads F32, BF16 and F16)", t->name, t->dtype_name);
    return -1;
  }
  if (fseeko(f->fp, (off_t)(f->data_start + t->begin), SEEK_SET) != 0) goto short_read;
  if (t->dtype == SAFETENSORS_F32) {
    if (fread(out, 4, (size_t)t->numel, f->fp) != (size_t)t->numel) goto short_read;
    return check_finite(f, t, out, errs);
  }
  uint16_t buf[32768]; /* 16-bit elements, converted a chunk at a time */
  for (uint64_t i = 0; i < t->numel;) {
    size_t k = t->numel - i < 32768 ? (size_t)(t->numel - i) : 32768;
    if (fread(buf, 2, k, f->fp) != k) goto short_read;
    for (size_t j = 0; j < k; j++)
      out[i + j] = t->dtype == SAFETENSORS_BF16 ? safetensors_bf16_to_f32(buf[j]) : safetensors_f16_to_f32(buf[j]);
    i += k;
  }
  return check_finite(f, t, out, errs);
short_read:
  err_add(errs, f->path, 0, 0, ST_HINT_FILE, "tensor %s: cannot read its %llu bytes: %s", t->name,
          (unsigned long long)(t->end - t->begin), ferror(f->fp) ? strerror(errno) : "the file ended early");
  return -1;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static uint64_t out_numel(const safetensors_out *t) {
  uint64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
  return n;
}

uint64_t safetensors_out_bytes(const safetensors_out *t, safetensors_dtype d) {
  return out_numel(t) * (uint64_t)safetensors_dtype_size(d);
}

/* The header, padded with spaces to a multiple of 8 bytes; *len: its length. */
static char *build_header(const safetensors_out *t, int n, safetensors_dtype d, size_t *len) {
  json_t *h = json_object(), *meta = json_object();
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(h, "__metadata__", meta);
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    json_t *e = json_object(), *sh = json_array();
    for (int k = 0; k < t[i].ndim; k++) json_array_append_new(sh, json_integer((json_int_t)t[i].shape[k]));
    uint64_t bytes = safetensors_out_bytes(&t[i], d);
    json_object_set_new(e, "dtype", json_string(safetensors_dtype_name(d)));
    json_object_set_new(e, "shape", sh);
    json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)at, (json_int_t)(at + bytes)));
    json_object_set_new(h, t[i].name, e);
    at += bytes;
  }
  char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(h);
  size_t l = strlen(text), padded = (l + 7) / 8 * 8;
  char *out = util_malloc(padded, "safetensors header");
  memcpy(out, text, l);
  memset(out + l, ' ', padded - l);
  free(text);
  *len = padded;
  return out;
}

/* One tensor's data in dtype d, converted a chunk at a time. */
static int write_data(FILE *fp, const safetensors_out *t, safetensors_dtype d) {
  uint64_t n = out_numel(t);
  if (d == SAFETENSORS_F32) return fwrite(t->data, 4, (size_t)n, fp) == (size_t)n ? 0 : -1;
  uint16_t buf[32768];
  for (uint64_t i = 0; i < n;) {
    size_t k = n - i < 32768 ? (size_t)(n - i) : 32768;
    for (size_t j = 0; j < k; j++)
      buf[j] = d == SAFETENSORS_BF16 ? safetensors_f32_to_bf16(t->data[i + j]) : safetensors_f32_to_f16(t->data[i + j]);
    if (fwrite(buf, 2, k, fp) != k) return -1;
    i += k;
  }
  return 0;
}

/* Every finite value of the n tensors stays finite in dtype d (fp16 ends at 65504): a value that
 * would be written as an infinity is an error naming the tensor and the element. 0, or -1. */
static int check_fits(const char *path, const safetensors_out *t, int n, safetensors_dtype d, err_list *errs) {
  for (int i = 0; i < n && d != SAFETENSORS_F32; i++)
    for (uint64_t e = 0, numel = out_numel(&t[i]); e < numel; e++) {
      const float x = t[i].data[e];
      const float y = d == SAFETENSORS_BF16 ? safetensors_bf16_to_f32(safetensors_f32_to_bf16(x))
                                            : safetensors_f16_to_f32(safetensors_f32_to_f16(x));
      if (isfinite(x) && !isfinite(y)) {
        err_add(errs, path, 0, 0, "write the weights in bf16 or fp32 (&export dtype), whose range holds them",
                "tensor %s: element %llu = %g is beyond the range of %s: it would be written as an infinity", t[i].name,
                (unsigned long long)e, x, safetensors_dtype_name(d));
        return -1;
      }
    }
  return 0;
}

int safetensors_write(const char *path, const safetensors_out *t, int n, safetensors_dtype d, err_list *errs) {
  if (check_fits(path, t, n, d, errs) != 0) return -1;
  util_atomic_file af;
  if (util_atomic_open(&af, path) != 0) {
    err_add(errs, path, 0, 0, "check that the directory exists and is writable", "cannot create the safetensors file: %s",
            strerror(errno));
    return -1;
  }
  size_t hlen;
  char *header = build_header(t, n, d, &hlen);
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  int rc = fwrite(lenb, 1, 8, af.fp) == 8 && fwrite(header, 1, hlen, af.fp) == hlen ? 0 : -1;
  for (int i = 0; i < n && rc == 0; i++) rc = write_data(af.fp, &t[i], d);
  free(header);
  if (rc != 0) {
    int e = errno;
    util_atomic_abort(&af);
    errno = e;
  } else {
    rc = util_atomic_close(&af);
  }
  if (rc != 0)
    err_add(errs, path, 0, 0, "check the free space and quota of the file system", "cannot write the safetensors file: %s",
            strerror(errno));
  return rc;
}

/* model.safetensors.index.json for shards [first[k], first[k+1]) of t. */
static int write_index(const char *dir, const safetensors_out *t, const int *first, int nfiles, safetensors_dtype d,
                       err_list *errs) {
  json_t *map = json_object(), *meta = json_object();
  uint64_t total = 0;
  char file[64], path[UTIL_PATH_MAX];
  for (int k = 0; k < nfiles; k++) {
    util_snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, nfiles);
    for (int i = first[k]; i < first[k + 1]; i++) {
      json_object_set_new(map, t[i].name, json_string(file));
      total += safetensors_out_bytes(&t[i], d);
    }
  }
  json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
  json_t *idx = json_pack("{s:o, s:o}", "metadata", meta, "weight_map", map);
  util_snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  util_atomic_file af;
  int rc = util_atomic_open(&af, path);
  if (rc == 0) {
    rc = json_dumpf(idx, af.fp, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 && fputc('\n', af.fp) != EOF ? 0 : -1;
    if (rc == 0) rc = util_atomic_close(&af);
    else util_atomic_abort(&af);
  }
  if (rc != 0) err_add(errs, path, 0, 0, NULL, "cannot write the index of the shards: %s", strerror(errno));
  json_decref(idx);
  return rc;
}

int safetensors_write_model(const char *dir, const safetensors_out *t, int n, safetensors_dtype d, double max_bytes,
                            int *nfiles, err_list *errs) {
  /* shard k holds tensors [first[k], first[k+1]): a tensor starts a new shard when it would
   * take the current one past max_bytes (Hugging Face's rule) */
  int *first = util_malloc(((size_t)n + 2) * sizeof *first, "shards"), k = 0, rc = 0;
  double size = 0;
  first[0] = 0;
  for (int i = 0; i < n; i++) {
    double b = (double)safetensors_out_bytes(&t[i], d);
    if (i > first[k] && size + b > max_bytes) first[++k] = i, size = 0;
    size += b;
  }
  first[++k] = n;
  char file[64], path[UTIL_PATH_MAX];
  for (int s = 0; s < k && rc == 0; s++) {
    if (k == 1) util_snprintf(file, sizeof file, "model.safetensors");
    else util_snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, k);
    util_snprintf(path, sizeof path, "%s/%s", dir, file);
    rc = safetensors_write(path, t + first[s], first[s + 1] - first[s], d, errs);
  }
  if (rc == 0 && k > 1) rc = write_index(dir, t, first, k, d, errs);
  if (nfiles) *nfiles = k;
  free(first);
  return rc;
}
