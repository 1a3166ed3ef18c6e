/* safetensors: reading and writing Hugging Face's safetensors files, and sharded sets of them.
 *
 * A file is an 8-byte little-endian header length n, n bytes of JSON
 *   {"__metadata__": {"format": "pt"}, "name": {"dtype": "F32", "shape": [r, c],
 *    "data_offsets": [begin, end]}, ...}
 * padded with spaces, then the data area: each tensor's elements, row-major and little-endian, at
 * [begin, end) of the data area. The reader validates the header strictly (length within the
 * file, valid JSON, known dtypes, offsets that tile the data area exactly, end - begin = numel x
 * element size) before any tensor is read, and converts F32, BF16 and F16 to fp32 (a tensor with a
 * NaN or an infinity is refused: weights are finite); the other safetensors dtypes are known (so
 * their offsets are checked) but not read. Only a regular file is opened (a directory or a FIFO is
 * named as such). The writer writes fp32 data as F32, BF16 or F16 (rounded to nearest even) with
 * the header Hugging Face writes, through a temporary file renamed at the end. */
#ifndef GREENLM_SAFETENSORS_H
#define GREENLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

/* The element types greenlm reads and writes; SAFETENSORS_OTHER: a known safetensors dtype
 * (I64, F64, BOOL, ...) that greenlm does not convert. */
typedef enum { SAFETENSORS_F32, SAFETENSORS_BF16, SAFETENSORS_F16, SAFETENSORS_OTHER } safetensors_dtype;

enum { SAFETENSORS_MAX_DIMS = 8, SAFETENSORS_NAME_LEN = 256 };

typedef struct {
  char name[SAFETENSORS_NAME_LEN];
  char dtype_name[16];  /* as the header spells it: "F32", "I64", ... */
  safetensors_dtype dtype;
  int elem_size;        /* bytes per element */
  int ndim;
  int64_t shape[SAFETENSORS_MAX_DIMS];
  uint64_t numel;
  uint64_t begin, end;  /* byte range within the data area */
} safetensors_tensor;

typedef struct {
  char path[4096];
  FILE *fp;
  uint64_t file_size, data_start; /* data area: [data_start, file_size) */
  safetensors_tensor *t;          /* in header order */
  int n;
} safetensors_file;

/* Open path and validate its header. Returns 0, or -1 after adding errors at the file naming the
 * tensor and what is wrong (nothing to close then). */
int safetensors_open(safetensors_file *f, const char *path, err_list *errs);
void safetensors_close(safetensors_file *f);
/* The tensor of that name, or NULL. */
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);
/* Read a tensor's numel elements into out as fp32 (out: numel floats). Returns 0, or -1 after
 * adding an error (unsupported dtype, a short read, a NaN or an infinity: named by its index). */
int safetensors_read(safetensors_file *f, const safetensors_tensor *t, float *out, err_list *errs);

/* "fp32" | "bf16" | "fp16" (deck spelling) or "F32" | "BF16" | "F16" (file spelling) -> dtype;
 * -1 for anything else. */
int safetensors_dtype_parse(const char *name, safetensors_dtype *d);
/* The file spelling: "F32", "BF16", "F16". */
const char *safetensors_dtype_name(safetensors_dtype d);
/* Bytes per element of F32 / BF16 / F16. */
int safetensors_dtype_size(safetensors_dtype d);

/* fp32 <-> 16-bit conversions (round to nearest even; NaN stays NaN, overflow goes to infinity). */
uint16_t safetensors_f32_to_bf16(float x);
uint16_t safetensors_f32_to_f16(float x);
float safetensors_bf16_to_f32(uint16_t h);
float safetensors_f16_to_f32(uint16_t h);

/* One tensor to write: its name, shape and fp32 data (row-major, numel = product of shape). */
typedef struct {
  const char *name;
  int ndim;
  int64_t shape[SAFETENSORS_MAX_DIMS];
  const float *data;
} safetensors_out;

/* Bytes a tensor takes in a file of dtype d. */
uint64_t safetensors_out_bytes(const safetensors_out *t, safetensors_dtype d);
/* Write the n tensors, in this order, to path (via path.tmp, renamed when complete), with
 * {"format": "pt"} metadata. Returns 0, or -1 after adding an error (nothing left behind); a value
 * beyond d's range (above 65504 in fp16), which would be written as an infinity, is one. */
int safetensors_write(const char *path, const safetensors_out *t, int n, safetensors_dtype d, err_list *errs);
/* Write a model's tensors into directory dir as Hugging Face does: dir/model.safetensors when
 * their data take at most max_bytes, else dir/model-0000i-of-0000k.safetensors files of at most
 * max_bytes each (a single larger tensor gets a file of its own) plus
 * dir/model.safetensors.index.json {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
 * *nfiles (may be NULL): safetensors files written. Returns 0, or -1 after adding an error; files
 * completed before the error stay, so write into a fresh directory (hf_export writes into a
 * temporary one and renames it when everything is there). */
int safetensors_write_model(const char *dir, const safetensors_out *t, int n, safetensors_dtype d, double max_bytes,
                            int *nfiles, err_list *errs);

#endif
