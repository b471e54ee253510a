/* libmeshrt.so's MPI backend plugin seen by a C program (install_test.sh plugins): the world of
 * an MPI launch through meshrt_comm_init_mpi, then one all-reduce checked exactly. Prints
 * "MPI OK rank R of N" or, when the world cannot be made, "FAILED <status>: <last error>".
 * With the argument "mismatch" the ranks all-gather different counts instead (rank 0 four
 * elements, the others two): the plugin's MPI engine finds it and throws meshrt::CommError, which
 * the core (a different library) must catch by type and return as MESHRT_ERROR_COMM; prints
 * "MISMATCH OK rank R: <last error>" or "FAILED ...". */
#include <stdio.h>
#include <string.h>

#include "meshrt/meshrt.h"

/* The mismatch case: returns main's exit status. */
static int check_mismatch(meshrt_comm_t comm, int rank, int size) {
  float x[4] = {1, 2, 3, 4}, y[16];
  int64_t n = rank == 0 ? 4 : 2, m = n * size;
  DLTensor d, r;
  meshrt_tensor_t t = NULL, out = NULL;
  meshrt_event_t done = NULL;
  meshrt_status_t st;
  if (size < 2 || size > 4) {
    printf("FAILED: the mismatch case needs 2 to 4 ranks, not %d\n", size);
    return 1;
  }
  memset(&d, 0, sizeof(d));
  d.data = x;
  d.device.device_type = kDLCPU;
  d.ndim = 1;
  d.dtype.code = kDLFloat;
  d.dtype.bits = 32;
  d.dtype.lanes = 1;
  d.shape = &n;
  r = d;
  r.data = y;
  r.shape = &m;
  if (meshrt_tensor_from_dltensor(&d, &t) != MESHRT_SUCCESS ||
      meshrt_tensor_from_dltensor(&r, &out) != MESHRT_SUCCESS) {
    printf("FAILED tensors: %s\n", meshrt_last_error());
    return 1;
  }
  st = meshrt_all_gather(comm, t, out, NULL, &done);
  if (st == MESHRT_SUCCESS) st = meshrt_event_synchronize(done);
  if (st != MESHRT_ERROR_COMM || strstr(meshrt_last_error(), "collective mismatch") == NULL) {
    printf("FAILED: the mismatched all-gather returned %s (want %s): %s\n",
           meshrt_status_string(st), meshrt_status_string(MESHRT_ERROR_COMM),
           st == MESHRT_SUCCESS ? "" : meshrt_last_error());
    return 1;
  }
  printf("MISMATCH OK rank %d: %s\n", rank, meshrt_last_error());
  if (done) meshrt_event_destroy(done);
  meshrt_tensor_destroy(out);
  meshrt_tensor_destroy(t);
  meshrt_comm_destroy(comm);
  return 0;
}

int main(int argc, char** argv) {
  meshrt_comm_t comm = NULL;
  meshrt_tensor_t t = NULL;
  meshrt_event_t done = NULL;
  float x[4];
  int64_t n = 4;
  DLTensor d;
  int rank = -1, size = 0, i, bad = 0;
  meshrt_status_t st = meshrt_init(MESHRT_API_VERSION);
  if (st == MESHRT_SUCCESS) st = meshrt_comm_init_mpi(&comm, NULL, NULL);
  if (st != MESHRT_SUCCESS) {
    printf("FAILED %s: %s\n", meshrt_status_string(st), meshrt_last_error());
    return 1;
  }
  meshrt_comm_rank(comm, &rank);
  meshrt_comm_size(comm, &size);
  if (argc > 1 && strcmp(argv[1], "mismatch") == 0) return check_mismatch(comm, rank, size);
  for (i = 0; i < 4; ++i) x[i] = (float)(rank + i);
  memset(&d, 0, sizeof(d));
  d.data = x;
  d.device.device_type = kDLCPU;
  d.ndim = 1;
  d.dtype.code = kDLFloat;
  d.dtype.bits = 32;
  d.dtype.lanes = 1;
  d.shape = &n;
  if (meshrt_tensor_from_dltensor(&d, &t) != MESHRT_SUCCESS ||
      meshrt_all_reduce(comm, t, t, MESHRT_SUM, NULL, &done) != MESHRT_SUCCESS ||
      meshrt_event_synchronize(done) != MESHRT_SUCCESS) {
    printf("FAILED all-reduce: %s\n", meshrt_last_error());
    return 1;
  }
  for (i = 0; i < 4; ++i) { /* sum over ranks r of (r + i) */
    if (x[i] != (float)(size * (size - 1) / 2 + size * i)) bad++;
  }
  meshrt_event_destroy(done);
  meshrt_tensor_destroy(t);
  meshrt_comm_destroy(comm);
  if (bad) {
    printf("FAILED: %d wrong sums on rank %d\n", bad, rank);
    return 1;
  }
  printf("MPI OK rank %d of %d\n", rank, size);
  return 0;
}
