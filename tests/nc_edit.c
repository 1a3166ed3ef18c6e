/* nc_edit: change one value of a NetCDF file in place, the way a flipped bit or a stray write
 * would, for the fault tests (test_faults.sh).
 *
 *   nc_edit FILE att NAME int64|double|text VALUE   set global attribute NAME
 *   nc_edit FILE var NAME INDEX VALUE               set element INDEX of 1-D integer variable NAME
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
  if (!strcmp(type, "int64")) {
    long long v = strtoll(value, NULL, 10);
    rc = ncmpi_put_att_longlong(nc, NC_GLOBAL, name, NC_INT64, 1, &v);
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

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc < 6 || (strcmp(argv[2], "att") && strcmp(argv[2], "var")) || (!strcmp(argv[2], "att") && argc < 6))
    return fail("usage: nc_edit FILE att NAME TYPE VALUE | nc_edit FILE var NAME INDEX VALUE", 0);
  int nc, rc = ncmpi_open(MPI_COMM_WORLD, argv[1], NC_WRITE, MPI_INFO_NULL, &nc);
  if (rc != NC_NOERR) return fail(argv[1], rc);
  rc = !strcmp(argv[2], "att") ? set_att(nc, argv[3], argv[4], argv[5]) : set_var(nc, argv[3], argv[4], argv[5]);
  int rc2 = ncmpi_close(nc);
  if (rc != NC_NOERR || rc2 != NC_NOERR) return fail(argv[3], rc != NC_NOERR ? rc : rc2);
  MPI_Finalize();
  return 0;
}
