// meshrt_comm_init_file: processes meeting through a directory. Two forked CPU processes
// rendezvous and run an all-reduce on the shm backend (also with an MPI launcher's variables
// set); one of two never arrives (TIMEOUT naming it); a world of one works end to end.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <filesystem>

#include "capi_test_util.h"
#include "tests/common/net.h"

using namespace capi_test;
using meshrt::test::unused_port;

namespace {

// A rank of a 2-process CPU file world: the shm backend serves it (also under an MPI launcher's
// variables, issue 25 item 12: OMPI_COMM_WORLD_SIZE=2 used to make it refuse, saying that no MPI
// launcher started the process); an all-reduce sums both ranks.
int two_process_rank(const std::string& dir, int rank, bool under_mpirun, int port = 0) {
  if (under_mpirun) setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  init_api();
  meshrt_comm_config_t cfg = test_config(30);
  cfg.init_timeout_s = 20;
  meshrt_comm_t comm = nullptr;
  const meshrt_status_t st = port > 0
                                 ? meshrt_comm_init_tcp(&comm, "127.0.0.1", port, 2, rank, &cfg)
                                 : meshrt_comm_init_file(&comm, dir.c_str(), 2, rank, &cfg);
  std::printf("rank %d: %s: %s\n", rank, meshrt_status_string(st), meshrt_last_error());
  if (st != MESHRT_SUCCESS) return 1;
  Buf t(dl_dtype(kDLFloat, 32), 3);
  for (int i = 0; i < 3; ++i) t.set(i, rank + 1 + 10 * i);
  meshrt_event_t e = nullptr;
  if (meshrt_all_reduce(comm, t.handle(), t.handle(), MESHRT_SUM, nullptr, &e) != MESHRT_SUCCESS ||
      meshrt_event_synchronize(e) != MESHRT_SUCCESS || meshrt_event_destroy(e) != MESHRT_SUCCESS) {
    std::printf("rank %d: all_reduce: %s\n", rank, meshrt_last_error());
    return 2;
  }
  for (int i = 0; i < 3; ++i) {
    if (t.get(i) != 3.0 + 20 * i) return 3;
  }
  return meshrt_comm_destroy(comm) == MESHRT_SUCCESS ? 0 : 4;
}

}  // namespace

TEST_CASE("capi: file rendezvous of 2 CPU processes runs collectives on the shm backend",
          "[capi][file]") {
  for (bool under_mpirun : {false, true}) {
    const std::string dir = fresh_dir(under_mpirun ? "two-mpi" : "two");
    const auto [rc0, rc1] =
        run_two_ranks([&](int rank) { return two_process_rank(dir, rank, under_mpirun); });
    INFO("under mpirun's variables: " << under_mpirun);
    CHECK(rc0 == 0);
    CHECK(rc1 == 0);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("capi: TCP rendezvous of 2 CPU processes on 127.0.0.1 runs collectives on shm",
          "[capi][file]") {
  const int port = unused_port();
  REQUIRE(port > 0);
  const auto [rc0, rc1] =
      run_two_ranks([&](int rank) { return two_process_rank("", rank, false, port); });
  CHECK(rc0 == 0);
  CHECK(rc1 == 0);
  // Alone, rank 0 times out naming the rank that never connected; bad arguments are refused.
  init_api();
  meshrt_comm_config_t cfg = test_config(30);
  cfg.init_timeout_s = 0.5;
  meshrt_comm_t comm = nullptr;
  require_status(meshrt_comm_init_tcp(&comm, "127.0.0.1", unused_port(), 2, 0, &cfg),
                 MESHRT_ERROR_TIMEOUT,
                 {"rank 1 never connected",
                  " s (is every rank started with the same host, port and nranks?)"});
  CHECK(std::string(meshrt_last_error()).find("MASTER_") == std::string::npos);
  CHECK(comm == nullptr);
  require_status(meshrt_comm_init_tcp(&comm, "127.0.0.1", 0, 2, 0, &cfg),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"port is 0"});
  require_status(meshrt_comm_init_tcp(&comm, nullptr, 29500, 2, 0, &cfg),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"host is NULL"});
}

TEST_CASE("capi: a backend refusing a file world names the C API's calls, not flags",
          "[capi][file]") {
  const std::string dir = fresh_dir("host");
  const auto [rc0, rc1] = run_two_ranks([&](int rank) {
    init_api();
    meshrt_comm_config_t cfg = test_config(30);
    cfg.init_timeout_s = 20;
    cfg.backend = "host";
    meshrt_comm_t comm = nullptr;
    const meshrt_status_t st = meshrt_comm_init_file(&comm, dir.c_str(), 2, rank, &cfg);
    const std::string r = std::to_string(rank);
    const std::string want =
        "meshrt_comm_init_file: meshrt_comm_config.backend host cannot run rank " + r +
        " of 2 as env-processes on cpu: it runs ranks as threads of one process, but this "
        "process is rank " +
        r +
        " of 2 as env-processes on cpu: launch them with mpirun / srun "
        "(mpi backend), or run them as threads with meshrt_comm_init_all or "
        "meshrt_comm_init_rank (2 ranks as threads)";
    std::printf("rank %d: %s: %s\n", rank, meshrt_status_string(st), meshrt_last_error());
    return st == MESHRT_ERROR_UNSUPPORTED && want == meshrt_last_error() && comm == nullptr ? 0 : 1;
  });
  CHECK(rc0 == 0);
  CHECK(rc1 == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("capi: file rendezvous where a process never arrives times out naming it",
          "[capi][file]") {
  init_api();
  const std::string dir = fresh_dir("late");
  meshrt_comm_config_t cfg = test_config(30);
  cfg.init_timeout_s = 0.5;
  meshrt_comm_t comm = nullptr;
  require_status(
      meshrt_comm_init_file(&comm, dir.c_str(), 2, 0, &cfg), MESHRT_ERROR_TIMEOUT,
      {"rank 1", "never wrote", " s (is every rank started with the same nranks and dir?)"});
  CHECK(std::string(meshrt_last_error()).find("WORLD_SIZE") == std::string::npos);
  CHECK(comm == nullptr);
  require_status(meshrt_comm_init_file(&comm, (dir + "/missing").c_str(), 2, 0, &cfg),
                 MESHRT_ERROR_INVALID_ARGUMENT, {"is not a directory"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("capi: a file world of one process runs collectives", "[capi][file]") {
  init_api();
  const std::string dir = fresh_dir("one");
  meshrt_comm_t comm = nullptr;
  const meshrt_comm_config_t cfg = test_config(30);
  CAPI_REQUIRE_OK(meshrt_comm_init_file(&comm, dir.c_str(), 1, 0, &cfg));
  Buf t(dl_dtype(kDLFloat, 32), 3);
  t.set(0, 7);
  meshrt_event_t e = nullptr;
  CAPI_REQUIRE_OK(meshrt_all_reduce(comm, t.handle(), t.handle(), MESHRT_SUM, nullptr, &e));
  CAPI_REQUIRE_OK(meshrt_event_synchronize(e));
  CAPI_REQUIRE_OK(meshrt_event_destroy(e));
  CHECK(t.get(0) == 7.0);
  CAPI_REQUIRE_OK(meshrt_comm_destroy(comm));
  std::filesystem::remove_all(dir);
}
