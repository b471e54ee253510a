// meshrt_comm_init_mpi under mpirun (no Catch2: each rank prints its verdict). Checks that
// creating a communicator before meshrt_init is refused, then the world from NULL and from
// &MPI_COMM_WORLD, an all-reduce and an all-gather, a split, and meshrt_comm_init_env.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "meshrt/meshrt.h"

namespace {

int g_rank = -1;
int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("CAPI MPI FAIL rank %d: %s (last error: %s)\n", g_rank, what.c_str(),
                meshrt_last_error());
    ++failures;
  }
}

}  // namespace

int main() {
  meshrt_comm_t comm = nullptr;
  meshrt_status_t st = meshrt_comm_init_mpi(&comm, nullptr, nullptr);
  expect(st == MESHRT_ERROR_INVALID_USAGE &&
             std::strstr(meshrt_last_error(), "meshrt_init(MESHRT_API_VERSION)") != nullptr,
         "init_mpi before meshrt_init is refused");
  expect(meshrt_init(MESHRT_API_VERSION) == MESHRT_SUCCESS, "meshrt_init");
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.timeout_s = 60;
  expect(meshrt_comm_init_mpi(&comm, nullptr, &cfg) == MESHRT_SUCCESS, "init_mpi(NULL)");
  int rank = -1, size = 0;
  meshrt_comm_rank(comm, &rank);
  meshrt_comm_size(comm, &size);
  g_rank = rank;
  int mpi_rank = -1, mpi_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  expect(rank == mpi_rank && size == mpi_size, "rank and size are MPI's");

  std::vector<float> x(8, static_cast<float>(rank + 1));
  int64_t shape[1] = {8};
  DLTensor dl{};
  dl.data = x.data();
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.dtype = {kDLFloat, 32, 1};
  dl.shape = shape;
  meshrt_tensor_t t = nullptr;
  expect(meshrt_tensor_from_dltensor(&dl, &t) == MESHRT_SUCCESS, "wrap x");
  meshrt_event_t e = nullptr;
  expect(meshrt_all_reduce(comm, t, t, MESHRT_SUM, nullptr, &e) == MESHRT_SUCCESS, "all_reduce");
  expect(meshrt_event_synchronize(e) == MESHRT_SUCCESS, "all_reduce done");
  meshrt_event_destroy(e);
  expect(x[7] == static_cast<float>(size * (size + 1) / 2), "all_reduce sum");

  std::vector<int64_t> g(static_cast<size_t>(size) * 2, -1);
  int64_t one[1] = {2}, gshape[1] = {2 * size};
  int64_t mine[2] = {rank * 10, rank * 10 + 1};
  DLTensor a = dl, b = dl;
  a.data = mine;
  a.dtype = {kDLInt, 64, 1};
  a.shape = one;
  b.data = g.data();
  b.dtype = {kDLInt, 64, 1};
  b.shape = gshape;
  meshrt_tensor_t ta = nullptr, tb = nullptr;
  meshrt_tensor_from_dltensor(&a, &ta);
  meshrt_tensor_from_dltensor(&b, &tb);
  expect(meshrt_all_gather(comm, ta, tb, nullptr, nullptr) == MESHRT_SUCCESS, "all_gather");
  meshrt_stream_t def = nullptr;
  meshrt_comm_default_stream(comm, &def);
  expect(meshrt_stream_synchronize(def) == MESHRT_SUCCESS, "all_gather done");
  for (int r = 0; r < size; ++r) expect(g[2 * r + 1] == r * 10 + 1, "all_gather block");

  meshrt_comm_t half = nullptr;
  expect(meshrt_comm_split(comm, rank % 2, rank, &half) == MESHRT_SUCCESS, "split");
  int hs = 0;
  meshrt_comm_size(half, &hs);
  expect(hs == (size + 1 - rank % 2) / 2, "split size");
  meshrt_comm_destroy(half);

  // A second world, from a pointer to MPI_COMM_WORLD.
  MPI_Comm world = MPI_COMM_WORLD;
  meshrt_comm_t again = nullptr;
  expect(meshrt_comm_init_mpi(&again, &world, &cfg) == MESHRT_SUCCESS, "init_mpi(&world)");
  meshrt_comm_destroy(again);
  // And a third from the launcher's variables (meshrt_comm_init_env: mpirun's are MPI's).
  expect(meshrt_comm_init_env(&again, &cfg) == MESHRT_SUCCESS, "init_env under mpirun");
  int env_rank = -1, env_size = 0;
  meshrt_comm_rank(again, &env_rank);
  meshrt_comm_size(again, &env_size);
  expect(env_rank == mpi_rank && env_size == mpi_size, "init_env's rank and size are MPI's");
  meshrt_comm_destroy(again);

  meshrt_tensor_destroy(t);
  meshrt_tensor_destroy(ta);
  meshrt_tensor_destroy(tb);
  meshrt_comm_destroy(comm);
  std::printf("CAPI MPI %s rank %d of %d\n", failures ? "FAIL" : "OK", rank, size);
  return failures ? 1 : 0;
}
