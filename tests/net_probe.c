/* net_probe [DONE]: times one MPI_Allreduce of 16 MiB across the ranks and prints the rate in Mbit/s of
 * what each rank sent (a ring all-reduce sends 2 (P-1)/P of the buffer), for test_netcluster.sh; with DONE,
 * rank 0 creates that file once every rank is done with the links (run/netcluster --done: MPI's teardown
 * over TCP can wait forever). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n = 4 << 20;
  float *x = calloc((size_t)n, sizeof *x);
  MPI_Allreduce(MPI_IN_PLACE, x, 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* connections set up */
  double t = MPI_Wtime();
  MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  t = MPI_Wtime() - t;
  if (rank == 0) printf("net_probe: %d ranks, %.1f Mbit/s sent per rank\n", size, 2.0 * (size - 1) / size * n * 32 / t / 1e6);
  free(x);
  MPI_Barrier(MPI_COMM_WORLD); /* every rank done with the links before the teardown */
  if (rank == 0 && argc > 1) {
    FILE *fp = fopen(argv[1], "w");
    if (fp) fclose(fp);
  }
  MPI_Finalize();
  return 0;
}
