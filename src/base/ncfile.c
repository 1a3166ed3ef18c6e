/* ncfile: PnetCDF opens with a message for every way the file can be wrong. */
#include "base/ncfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pnetcdf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"

/* What the first bytes say the file is: 0 classic/64-bit/CDF-5 NetCDF, 1 NetCDF-4 (HDF5), 2 other. */
static int kind_of(const unsigned char *b, size_t n) {
  static const unsigned char hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n >= 4 && b[0] == 'C' && b[1] == 'D' && b[2] == 'F' && (b[3] == 1 || b[3] == 2 || b[3] == 5)) return 0;
  if (n >= 8 && memcmp(b, hdf5, 8) == 0) return 1;
  return 2;
}

/* The checks that need no PnetCDF; rank 0 makes them. Returns 0 or -1 after adding an error. */
static int check_file(const char *path, const char *what, const char *hint, off_t *size, err_list *errs) {
  struct stat st;
  if (stat(path, &st) != 0) {
    err_add(errs, path, 0, 0, hint, "cannot open the %s: %s", what, strerror(errno));
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    err_add(errs, path, 0, 0, hint, "a directory, not a %s file", what);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    err_add(errs, path, 0, 0, hint, "not a regular file (a %s is a NetCDF file)", what);
    return -1;
  }
  if (st.st_size == 0) {
    err_add(errs, path, 0, 0, hint, "an empty file, not a %s", what);
    return -1;
  }
  unsigned char magic[8] = {0};
  int fd = open(path, O_RDONLY);
  ssize_t got = fd >= 0 ? read(fd, magic, sizeof magic) : -1;
  if (fd >= 0) close(fd);
  if (got < 0) {
    err_add(errs, path, 0, 0, hint, "cannot read the %s: %s", what, strerror(errno));
    return -1;
  }
  int k = kind_of(magic, (size_t)got);
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

/* Every variable of a fixed-size (non-record) file must end within it. */
static int check_length(int nc, const char *path, const char *what, const char *hint, off_t size, err_list *errs) {
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
