/* comm: MPI on backend memory.
 *
 * MPI may read and write backend memory directly when that memory is host memory (the CPU
 * backend) or when the backend says the MPI library moves its device memory itself
 * (backend.mpi_direct). Otherwise messages go through a staging buffer in pinned host memory.
 * The exchanges (grad.c, pipe.c) hand MPI the buffer these functions return:
 *
 *   send:      buf = comm_stage_send(&s, at, dev, n);   MPI reads buf
 *   receive:   buf = comm_stage_recv(&s, at, dev);      MPI writes buf;  comm_stage_done(&s, at, dev, n)
 *   in place:  buf = comm_stage_send(&s, at, dev, n);   MPI reduces buf; comm_stage_done(&s, at, dev, n)
 *
 * `at` and `n` count elements of the stage's size (fp32 gradients, activations in the storage
 * type); `at` is the offset of the message in the staging buffer: messages in flight at the same
 * time use disjoint ranges of it. */
#ifndef GREENLM_COMM_H
#define GREENLM_COMM_H

#include <mpi.h>
#include <stddef.h>

#include "model/backend.h"

/* Whether MPI can be given this backend's memory directly. */
int comm_direct(const backend *be);
/* "device-aware MPI on device buffers (...)" or "pinned host staging (...)": how messages travel, for the log. */
const char *comm_describe(const backend *be, char *buf, size_t len);

/* The MPI library in one line ("MPICH Version: 4.0.2 (the MPI 4.0 standard)"), for the run header. */
const char *comm_library(char *buf, size_t len);

typedef struct {
  const backend *be;
  int direct;    /* MPI uses backend memory itself */
  char *host;    /* pinned staging buffer, (cap) elements; NULL when direct or cap is 0 */
  size_t cap;
  size_t esize;  /* bytes of an element */
} comm_stage;

/* A stage for messages within [0, cap) elements of esize bytes; the staging buffer is allocated
 * only when needed. */
void comm_stage_init(comm_stage *s, const backend *be, size_t cap, size_t esize);
void comm_stage_free(comm_stage *s);
/* The buffer MPI reads n elements of dev from: dev itself (after the backend's pending work is
 * done), or the staging buffer at `at`, filled from dev. */
void *comm_stage_send(comm_stage *s, size_t at, const void *dev, size_t n);
/* The buffer MPI writes n elements destined for dev into: dev itself, or the staging buffer at `at`. */
void *comm_stage_recv(comm_stage *s, size_t at, void *dev);
/* After MPI has written the buffer: the n elements reach dev (a copy when staged). */
void comm_stage_done(comm_stage *s, size_t at, void *dev, size_t n);

/* MPI counts are ints: messages of n elements go in chunks of at most COMM_CHUNK elements, so
 * any n (a 20B model's 80 GB buffer, a tied embedding of 300M floats) travels. */
enum { COMM_CHUNK = 1 << 28 };
/* Elements in chunk i of a message of n: min(COMM_CHUNK, n - i * COMM_CHUNK). */
int comm_chunk(size_t n, size_t i);
/* In-place sum of n floats over comm (host memory or what comm_stage_send returned), chunk by chunk. */
void comm_allreduce_sum(float *buf, size_t n, MPI_Comm comm);
/* n floats to rank `dest` of comm, and their receipt: chunk by chunk, all with one tag. */
void comm_send_floats(const float *buf, size_t n, int dest, int tag, MPI_Comm comm);
void comm_recv_floats(float *buf, size_t n, int src, int tag, MPI_Comm comm);

#endif
