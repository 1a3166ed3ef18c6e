/* nc_edit: change one value of a NetCDF file in place, the way a flipped bit or a stray write
 * would, for the fault tests (test_faults.sh).
 *
 *   nc_edit FILE att NAME int64|double|text VALUE   set global attribute NAME (int64: VALUE,VALUE,...
 *                                                   for several values)
 *   nc_edit FILE var NAME INDEX VALUE               set element INDEX of 1-D integer variable NAME
 *   nc_edit FILE float NAME INDEX VALUE             set element INDEX (row-major) of float variable NAME
 *                                                   ("nan", "inf" or a number) and keep its checkpoint
 *                                                   checksum true, as a file written so would have it
 *
 * Exits 0, or 1 with a message. */
#include <mpi.h>
#include <pnetcdf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, int rc) {
  fprintf(stderr, "nc_edit: %s: %s\n", what, rc ? ncmpi_strerror(rc) : "bad arguments");
  MPI_Finalize();
  return 1;
}

static int set_att(int nc, const char *name, const char *type, const char *value) {
  int rc = ncmpi_redef(nc);
  if (rc != NC_NOERR) return rc;
  if (!strcmp(type, "int64")) { /* one value, or several apart by commas */
    long long v[16];
    int n = 0;
    for (char *p = (char *)value; n < 16 && *p; n++) v[n] = strtoll(*p == ',' ? p + 1 : p, &p, 10);
    rc = ncmpi_put_att_longlong(nc, NC_GLOBAL, name, NC_INT64, n, v);
  } else if (!strcmp(type, "double")) {
    double v = strtod(value, NULL);
    rc = ncmpi_put_att_double(nc, NC_GLOBAL, name, NC_DOUBLE, 1, &v);
  } else {
    rc = ncmpi_put_att_text(nc, NC_GLOBAL, name, (MPI_Offset)strlen(value), value);
  }
  int rc2 = ncmpi_enddef(nc);
  return rc != NC_NOERR ? rc : rc2;
}

static int set_var(int nc, const char *name, const char *index, const char *value) {
  int var, rc = ncmpi_inq_varid(nc, name, &var);
  if (rc != NC_NOERR) return rc;
  MPI_Offset start = strtoll(index, NULL, 10), count = 1;
  long long v = strtoll(value, NULL, 10);
  return ncmpi_put_vara_longlong_all(nc, var, &start, &count, &v);
}

/* The checkpoint checksum's term of element i (src/io/ckpt.c, doc/formats.md): bits x (2 i + 1). */
static unsigned long long term(float x, unsigned long long i) {
  unsigned int bits;
  memcpy(&bits, &x, sizeof bits);
  return (unsigned long long)bits * (2 * i + 1);
}

static int set_float(int nc, const char *name, const char *index, const char *value) {
  int var, ndim, dims[2], rc = ncmpi_inq_varid(nc, name, &var);
  if (rc == NC_NOERR) rc = ncmpi_inq_varndims(nc, var, &ndim);
  if (rc == NC_NOERR && (ndim < 1 || ndim > 2)) return NC_EINVAL;
  if (rc == NC_NOERR) rc = ncmpi_inq_vardimid(nc, var, dims);
  MPI_Offset cols = 1, i = strtoll(index, NULL, 10), start[2], count[2] = {1, 1};
  if (rc == NC_NOERR && ndim == 2) rc = ncmpi_inq_dimlen(nc, dims[1], &cols);
  start[0] = ndim == 2 ? i / cols : i, start[1] = i % cols;
  float old, x = strtof(value, NULL);
  unsigned long long sum = 0;
  if (rc == NC_NOERR) rc = ncmpi_get_vara_float_all(nc, var, start, count, &old);
  if (rc == NC_NOERR) rc = ncmpi_put_vara_float_all(nc, var, start, count, &x);
  if (rc == NC_NOERR && ncmpi_get_att_ulonglong(nc, var, "checksum", &sum) == NC_NOERR) { /* a checkpoint's */
    sum += term(x, (unsigned long long)i) - term(old, (unsigned long long)i);
    rc = ncmpi_redef(nc);
    if (rc == NC_NOERR) rc = ncmpi_put_att_ulonglong(nc, var, "checksum", NC_UINT64, 1, &sum);
    int rc2 = ncmpi_enddef(nc);
    if (rc == NC_NOERR) rc = rc2;
  }
  return rc;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc < 6 || (strcmp(argv[2], "att") && strcmp(argv[2], "var") && strcmp(argv[2], "float")))
    return fail("usage: nc_edit FILE att NAME TYPE VALUE | nc_edit FILE var|float NAME INDEX VALUE", 0);
  int nc, rc = ncmpi_open(MPI_COMM_WORLD, argv[1], NC_WRITE, MPI_INFO_NULL, &nc);
  if (rc != NC_NOERR) return fail(argv[1], rc);
  rc = !strcmp(argv[2], "att")   ? set_att(nc, argv[3], argv[4], argv[5])
       : !strcmp(argv[2], "var") ? set_var(nc, argv[3], argv[4], argv[5])
                                 : set_float(nc, argv[3], argv[4], argv[5]);
  int rc2 = ncmpi_close(nc);
  if (rc != NC_NOERR || rc2 != NC_NOERR) return fail(argv[3], rc != NC_NOERR ? rc : rc2);
  MPI_Finalize();
  return 0;
}
