/* test_topo: GPUs to ranks by PCI locality (topo_assign_devices), and the fallback when hwloc
 * knows no locality (topo_choose_device with bus ids that do not exist: rank mod devices). */
#include <mpi.h>

#include "testing.h"
#include "parallel/topo.h"
#include "base/util.h"

/* near: one string per rank, one character per device: '1' near, '0' far, '?' unknown */
static void expect(const char *what, int nranks, int ndev, const char *const *rows, const int *want) {
  signed char near[64];
  int dev[16];
  for (int r = 0; r < nranks; r++)
    for (int d = 0; d < ndev; d++) near[r * ndev + d] = rows[r][d] == '1' ? 1 : rows[r][d] == '0' ? 0 : -1;
  topo_assign_devices(nranks, ndev, near, dev);
  for (int r = 0; r < nranks; r++) T_CHECK(dev[r] == want[r], "%s: rank %d got GPU %d, expected %d", what, r, dev[r], want[r]);
}

int main(int argc, char **argv) {
  util_mpi_init(&argc, &argv);
  /* two sockets, GPUs 0-1 on the first, 2-3 on the second; 8 ranks, 4 per socket */
  const char *two[] = {"1100", "1100", "1100", "1100", "0011", "0011", "0011", "0011"};
  expect("two sockets", 8, 4, two, (const int[]){0, 1, 0, 1, 2, 3, 2, 3});
  /* the same with the GPUs listed the other way round */
  const char *swapped[] = {"0011", "0011", "0011", "0011", "1100", "1100", "1100", "1100"};
  expect("swapped", 8, 4, swapped, (const int[]){2, 3, 2, 3, 0, 1, 0, 1});
  /* nothing known: rank mod devices, as before locality */
  const char *unknown[] = {"???", "???", "???", "???", "???"};
  expect("unknown", 5, 3, unknown, (const int[]){0, 1, 2, 0, 1});
  /* every rank near GPU 0 only: near does not pile them up, the GPUs are shared evenly */
  const char *crowd[] = {"10", "10", "10", "10"};
  expect("crowded", 4, 2, crowd, (const int[]){0, 0, 1, 1});
  /* 6 GPUs over 3 sockets (a POWER9-style node), 6 ranks in socket order */
  const char *six[] = {"110000", "110000", "001100", "001100", "000011", "000011"};
  expect("six", 6, 6, six, (const int[]){0, 1, 2, 3, 4, 5});

  /* bus ids hwloc cannot find: the fallback, and it says so */
  char *bus[3] = {"0000:ff:1f.5", "0000:ff:1f.6", "0000:ff:1f.7"}, how[320];
  int d = topo_choose_device(MPI_COMM_SELF, 0, 3, bus, how, sizeof how);
  T_CHECK(d == 0, "one rank, unknown locality: GPU %d, expected 0", d);
  T_CHECK(strstr(how, "node rank mod 3") != NULL, "fallback not described: %s", how);
  int rc = t_done("test_topo");
  MPI_Finalize();
  return rc;
}
