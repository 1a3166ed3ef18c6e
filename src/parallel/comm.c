/* comm: whether MPI may touch backend memory, and host staging where it may not. */
#include "parallel/comm.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int comm_direct(const backend *be) {
  const char *how;
  return be->mpi_direct(be, &how);
}

const char *comm_describe(const backend *be, char *buf, size_t len) {
  const char *how = "";
  if (be->caps.host_memory)
    util_snprintf(buf, len, "MPI on host memory");
  else if (be->mpi_direct(be, &how))
    util_snprintf(buf, len, "device-aware MPI on device buffers (%s)", how);
  else
    util_snprintf(buf, len, "pinned host staging (%s)", how);
  return buf;
}

const char *comm_library(char *buf, size_t len) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int n = 0, major = 0, minor = 0;
  MPI_Get_library_version(v, &n);
  MPI_Get_version(&major, &minor);
  /* its first line up to a comma ("MPICH Version:\t4.0.2", "Open MPI v4.1.4, package: ..."), blanks as spaces */
  v[strcspn(v, "\n,")] = '\0';
  for (char *c = v; *c; c++)
    if (*c == '\t' || *c == '\r') *c = ' ';
  util_snprintf(buf, len, "%s (the MPI %d.%d standard)", v[0] ? v : "an MPI library that does not name itself", major, minor);
  return buf;
}

void comm_stage_init(comm_stage *s, const backend *be, size_t cap, size_t esize) {
  memset(s, 0, sizeof *s);
  s->be = be;
  s->direct = comm_direct(be);
  s->cap = cap;
  s->esize = esize;
  if (!s->direct && cap) s->host = be->host_alloc(be, cap * esize);
}

void comm_stage_free(comm_stage *s) {
  if (s->host) s->be->host_free(s->be, s->host);
  memset(s, 0, sizeof *s);
}

void *comm_stage_send(comm_stage *s, size_t at, const void *dev, size_t n) {
  if (s->direct) {
    if (!s->be->caps.host_memory) s->be->sync(s->be); /* MPI must not read what a kernel is still writing */
    return (void *)dev;
  }
  UTIL_CHECK(at + n <= s->cap, NULL, "internal: staging [%zu, %zu) beyond %zu", at, at + n, s->cap);
  s->be->to_host(s->be, s->host + at * s->esize, dev, n * s->esize);
  return s->host + at * s->esize;
}

void *comm_stage_recv(comm_stage *s, size_t at, void *dev) {
  if (s->direct) return dev;
  UTIL_CHECK(at <= s->cap, NULL, "internal: staging at %zu beyond %zu", at, s->cap);
  return s->host + at * s->esize;
}

void comm_stage_done(comm_stage *s, size_t at, void *dev, size_t n) {
  if (s->direct) return;
  UTIL_CHECK(at + n <= s->cap, NULL, "internal: staging [%zu, %zu) beyond %zu", at, at + n, s->cap);
  s->be->to_device(s->be, dev, s->host + at * s->esize, n * s->esize);
}

int comm_chunk(size_t n, size_t i) {
  size_t at = i * COMM_CHUNK;
  return at >= n ? 0 : n - at < COMM_CHUNK ? (int)(n - at) : COMM_CHUNK;
}

void comm_allreduce_sum(float *buf, size_t n, MPI_Comm comm) {
  for (size_t i = 0; i * COMM_CHUNK < n; i++)
    MPI_Allreduce(MPI_IN_PLACE, buf + i * COMM_CHUNK, comm_chunk(n, i), MPI_FLOAT, MPI_SUM, comm);
}

void comm_send_floats(const float *buf, size_t n, int dest, int tag, MPI_Comm comm) {
  for (size_t i = 0; i * COMM_CHUNK < n; i++) MPI_Send(buf + i * COMM_CHUNK, comm_chunk(n, i), MPI_FLOAT, dest, tag, comm);
}

void comm_recv_floats(float *buf, size_t n, int src, int tag, MPI_Comm comm) {
  for (size_t i = 0; i * COMM_CHUNK < n; i++)
    MPI_Recv(buf + i * COMM_CHUNK, comm_chunk(n, i), MPI_FLOAT, src, tag, comm, MPI_STATUS_IGNORE);
}
