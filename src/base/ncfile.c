/* ncfile: PnetCDF opens with a message for every way the file can be wrong. */
#include "base/ncfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pnetcdf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"

/* Headers are read whole up to this size (greenlm's files have headers of kilobytes). */
enum { NCFILE_MAX_HEADER = 16 << 20 };

/* What the first bytes say the file is: 0 classic/64-bit/CDF-5 NetCDF, 1 NetCDF-4 (HDF5), 2 other. */
static int kind_of(const unsigned char *b, size_t n) {
  static const unsigned char hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n >= 4 && b[0] == 'C' && b[1] == 'D' && b[2] == 'F' && (b[3] == 1 || b[3] == 2 || b[3] == 5)) return 0;
  if (n >= 8 && memcmp(b, hdf5, 8) == 0) return 1;
  return 2;
}

/* ---- the header, walked before PnetCDF reads it -------------------------------------------------- */

/* A CDF-1/2/5 header (the NetCDF classic format specification) in memory: every count and length
 * it declares must fit in the bytes that follow, so that no reader allocates what the file cannot
 * hold. */
typedef struct {
  const unsigned char *p, *end;
  int v5;     /* CDF-5: 8-byte counts */
  int off8;   /* CDF-2 and CDF-5: 8-byte variable offsets */
  const char *why;
} hdr_walk;

static unsigned long long hdr_uint(hdr_walk *h, int bytes) {
  if (h->why) return 0;
  if (h->end - h->p < bytes) {
    h->why = "the header ends early";
    return 0;
  }
  unsigned long long v = 0;
  for (int i = 0; i < bytes; i++) v = v << 8 | h->p[i];
  h->p += bytes;
  return v;
}

/* A count of items of at least `least` bytes each that must fit in what is left. */
static unsigned long long hdr_count(hdr_walk *h, unsigned long long least) {
  unsigned long long n = hdr_uint(h, h->v5 ? 8 : 4);
  if (!h->why && (n > (unsigned long long)(h->end - h->p) / (least ? least : 1))) h->why = "a count larger than the file";
  return h->why ? 0 : n;
}

static void hdr_skip(hdr_walk *h, unsigned long long n) {
  n = (n + 3) / 4 * 4; /* padded to 4 bytes */
  if (!h->why && n > (unsigned long long)(h->end - h->p)) h->why = "a name or value longer than the file";
  if (!h->why) h->p += n;
}

static int hdr_type_size(unsigned long long t) {
  static const int size[] = {0, 1, 1, 2, 4, 4, 8, 1, 2, 4, 8, 8}; /* NC_BYTE .. NC_UINT64 */
  return t < sizeof size / sizeof size[0] ? size[t] : 0;
}

/* A list header: ABSENT (0, 0) or tag, count; returns the count. */
static unsigned long long hdr_list(hdr_walk *h, unsigned long long tag, unsigned long long least) {
  unsigned long long t = hdr_uint(h, 4);
  if (t == 0) {
    if (hdr_uint(h, h->v5 ? 8 : 4) != 0 && !h->why) h->why = "a malformed empty list";
    return 0;
  }
  if (t != tag && !h->why) h->why = "an unknown list tag";
  return hdr_count(h, least);
}

static void hdr_atts(hdr_walk *h) {
  unsigned long long n = hdr_list(h, 0x0C, 12);
  for (unsigned long long i = 0; i < n && !h->why; i++) {
    hdr_skip(h, hdr_count(h, 1));                   /* name */
    int size = hdr_type_size(hdr_uint(h, 4));
    if (!size && !h->why) h->why = "an attribute of an unknown type";
    hdr_skip(h, hdr_count(h, (unsigned long long)size) * (unsigned long long)size);
  }
}

/* Returns NULL when the header is well formed within the n bytes, else what is wrong. */
static const char *walk_header(const unsigned char *b, size_t n) {
  hdr_walk h = {b + 4, b + n, b[3] == 5, b[3] != 1, NULL};
  hdr_uint(&h, h.v5 ? 8 : 4);                        /* numrecs */
  unsigned long long ndims = hdr_list(&h, 0x0A, 8);
  for (unsigned long long i = 0; i < ndims && !h.why; i++) {
    hdr_skip(&h, hdr_count(&h, 1));
    hdr_uint(&h, h.v5 ? 8 : 4);
  }
  hdr_atts(&h);
  unsigned long long nvars = hdr_list(&h, 0x0B, 16);
  for (unsigned long long i = 0; i < nvars && !h.why; i++) {
    hdr_skip(&h, hdr_count(&h, 1));
    unsigned long long nd = hdr_count(&h, h.v5 ? 8 : 4);
    for (unsigned long long d = 0; d < nd && !h.why; d++)
      if (hdr_uint(&h, h.v5 ? 8 : 4) >= ndims && !h.why) h.why = "a variable of an undefined dimension";
    hdr_atts(&h);
    if (!hdr_type_size(hdr_uint(&h, 4)) && !h.why) h.why = "a variable of an unknown type";
    hdr_uint(&h, h.v5 ? 8 : 4);                      /* vsize */
    hdr_uint(&h, h.off8 ? 8 : 4);                    /* begin */
  }
  return h.why;
}

/* The checks that need no PnetCDF; rank 0 makes them. Returns 0 or -1 after adding an error. */
static int check_file(const char *path, const char *what, const char *hint, off_t *size, err_list *errs) {
  struct stat st;
  if (util_check_regular(path, what, hint, errs) != 0) return -1;
  if (stat(path, &st) != 0) {
    err_add(errs, path, 0, 0, hint, "cannot open the %s: %s", what, strerror(errno));
    return -1;
  }
  if (st.st_size == 0) {
    err_add(errs, path, 0, 0, hint, "an empty file, not a %s", what);
    return -1;
  }
  size_t want = st.st_size < NCFILE_MAX_HEADER ? (size_t)st.st_size : NCFILE_MAX_HEADER;
  unsigned char *head = util_malloc(want, "file header");
  int fd = open(path, O_RDONLY);
  ssize_t got = fd >= 0 ? pread(fd, head, want, 0) : -1;
  if (fd >= 0) close(fd);
  if (got < 0) {
    err_add(errs, path, 0, 0, hint, "cannot read the %s: %s", what, strerror(errno));
    free(head);
    return -1;
  }
  int k = kind_of(head, (size_t)got);
  const char *why = k == 0 ? walk_header(head, (size_t)got) : NULL;
  free(head);
  if (why) {
    err_add(errs, path, 0, 0, hint, "damaged NetCDF header: %s%s", why,
            (size_t)got == NCFILE_MAX_HEADER ? " (or a header longer than 16 MiB)" : "");
    return -1;
  }
  if (k == 1) {
    err_add(errs, path, 0, 0, "greenlm reads the CDF-5 files PnetCDF writes; nccopy -k cdf5 converts a NetCDF-4 file",
            "a NetCDF-4 (HDF5) file, not a greenlm %s", what);
    return -1;
  }
  if (k == 2) {
    err_add(errs, path, 0, 0, hint, "not a NetCDF file (it does not start with 'CDF'), so not a greenlm %s", what);
    return -1;
  }
  *size = st.st_size;
  return 0;
}

/* Bytes of one value of a classic-model type; 0 for other types. */
static MPI_Offset type_size(nc_type t) {
  switch (t) {
  case NC_BYTE: case NC_CHAR: case NC_UBYTE: return 1;
  case NC_SHORT: case NC_USHORT: return 2;
  case NC_INT: case NC_UINT: case NC_FLOAT: return 4;
  case NC_DOUBLE: case NC_INT64: case NC_UINT64: return 8;
  default: return 0;
  }
}

MPI_Offset ncfile_extent(int nc) {
  int nvars = 0;
  ncmpi_inq_nvars(nc, &nvars);
  MPI_Offset need = 0;
  for (int v = 0; v < nvars; v++) {
    int ndims = 0, dims[16];
    nc_type type;
    MPI_Offset off = 0, n = 1, len, tsize = 0;
    if (ncmpi_inq_varndims(nc, v, &ndims) != NC_NOERR || ndims > 16 ||
        ncmpi_inq_var(nc, v, NULL, &type, &ndims, dims, NULL) != NC_NOERR || ncmpi_inq_varoffset(nc, v, &off) != NC_NOERR ||
        (tsize = type_size(type)) == 0)
      continue; /* greenlm's variables have 1 or 2 dimensions; the reader refuses others by name */
    for (int d = 0; d < ndims; d++)
      if (ncmpi_inq_dimlen(nc, dims[d], &len) == NC_NOERR && __builtin_mul_overflow(n, len, &n)) n = INT64_MAX;
    MPI_Offset end;
    if (__builtin_mul_overflow(n, tsize, &end) || __builtin_add_overflow(end, off, &end)) end = INT64_MAX;
    if (end > need) need = end;
  }
  return need;
}

/* Every variable of a fixed-size (non-record) file must end within it. */
static int check_length(int nc, const char *path, const char *what, const char *hint, off_t size, err_list *errs) {
  const MPI_Offset need = ncfile_extent(nc);
  if (need > size) {
    err_add(errs, path, 0, 0, hint, "truncated: the %s's header needs %lld bytes, the file has %lld", what,
            (long long)need, (long long)size);
    return -1;
  }
  return 0;
}

int ncfile_open(MPI_Comm comm, const char *path, MPI_Info info, const char *what, const char *hint, int *ncid,
                err_list *errs) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  long long size = 0;
  off_t sz = 0;
  int bad = rank == 0 && check_file(path, what, hint, &sz, errs) != 0;
  size = (long long)sz;
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  if (bad) return -1;
  MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm);
  int rc = ncmpi_open(comm, path, NC_NOWRITE, info, ncid);
  if (rc != NC_NOERR) {
    if (rank == 0) err_add(errs, path, 0, 0, hint, "cannot read the %s's header: %s", what, ncmpi_strerror(rc));
    return -1;
  }
  bad = rank == 0 && check_length(*ncid, path, what, hint, (off_t)size, errs) != 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
  if (bad) {
    ncmpi_close(*ncid);
    return -1;
  }
  return 0;
}

void ncfile_get_text(int ncid, int var, const char *name, char *buf, size_t len) {
  MPI_Offset n = 0;
  buf[0] = '\0';
  if (var < 0) var = NC_GLOBAL;
  if (ncmpi_inq_attlen(ncid, var, name, &n) != NC_NOERR || n < 0 || (size_t)n >= len) return;
  if (ncmpi_get_att_text(ncid, var, name, buf) != NC_NOERR) n = 0;
  buf[n] = '\0';
}

int ncfile_commit(MPI_Comm comm, int bad, const char *tmp, const char *path, const char *what, const char *hint,
                  err_list *errs) {
  int rank, any;
  MPI_Comm_rank(comm, &rank);
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (rank == 0) {
    if (!any && util_commit(tmp, path) != 0) {
      err_add(errs, path, 0, 0, hint, "cannot give the %s its name: %s", what, strerror(errno));
      any = 1;
    }
    if (any) remove(tmp);
  }
  MPI_Bcast(&any, 1, MPI_INT, 0, comm);
  return any;
}
