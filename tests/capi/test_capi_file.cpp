// meshrt_comm_init_file: processes meeting through a directory. Two forked processes rendezvous
// (CPU processes then get UNSUPPORTED from every CPU backend, with the reason); one of two never
// arrives (TIMEOUT naming it); a world of one works end to end.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "capi_test_util.h"

using namespace capi_test;

namespace {

std::string fresh_dir(const char* tag) {
  auto d = std::filesystem::temp_directory_path() /
           (std::string("meshrt-capi-") + tag + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// Runs body in a child process; returns its exit code (the child never returns to Catch).
int in_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    int rc = 100;
    try {
      rc = body();
    } catch (...) {
      rc = 101;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200;
}

// What a rank expects from a 2-process CPU file world: the rendezvous completes (the check runs
// after both processes exchanged their configs), then no CPU backend serves processes.
int two_process_rank(const std::string& dir, int rank) {
  init_api();
  meshrt_comm_config_t cfg = test_config(30);
  cfg.init_timeout_s = 20;
  meshrt_comm_t comm = nullptr;
  const meshrt_status_t st = meshrt_comm_init_file(&comm, dir.c_str(), 2, rank, &cfg);
  const std::string msg = meshrt_last_error();
  std::printf("rank %d: %s: %s\n", rank, meshrt_status_string(st), msg.c_str());
  if (st != MESHRT_ERROR_UNSUPPORTED) return 1;
  if (msg.find("mpirun") == std::string::npos) return 2;
  return 0;
}

}  // namespace

TEST_CASE("capi: file rendezvous of 2 processes meets, then CPU processes are unsupported",
          "[capi][file]") {
  const std::string dir = fresh_dir("two");
  int rc1 = -1;
  std::thread other([&] { rc1 = in_child([&] { return two_process_rank(dir, 1); }); });
  const int rc0 = in_child([&] { return two_process_rank(dir, 0); });
  other.join();
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
  require_status(meshrt_comm_init_file(&comm, dir.c_str(), 2, 0, &cfg), MESHRT_ERROR_TIMEOUT,
                 {"rank 1", "never wrote"});
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
