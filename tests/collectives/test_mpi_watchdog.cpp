// MPI watchdog: the last rank never calls the second all_reduce; every other rank must raise
// CommError naming the op, group, sequence number and the missing rank within timeout + 5 s,
// and the same likely culprit.
// Prints "WATCHDOG OK" / "WATCHDOG FAIL" lines that ctest matches; the job then ends non-zero
// (MPI_Abort) because its communicators were aborted, which is the point.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "backends/mpi/mpi_comm.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

using namespace meshrt;

int main() {
  CommConfig cfg;
  cfg.timeout_s = 2;
  auto w = make_mpi_world_communicator(cfg);
  const int n = w->size(), r = w->rank();
  auto s = make_host_stream("comm");
  Tensor t = Tensor::empty(Shape{64}, DType::f32, make_host_caching_allocator());
  t.fill_(1.0, *s);
  w->all_reduce(t, ReduceOp::Sum, *s).synchronize();
  if (r == n - 1) {
    // Never calls; the others' MPI_Abort ends this process.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::printf("WATCHDOG FAIL rank %d: still alive after 30 s\n", r);
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    w->all_reduce(t, ReduceOp::Sum, *s).synchronize();
  } catch (const CommError& e) {
    msg = e.what();
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Global ranks, with what the missing rank was doing; every rank names the same culprit.
  const std::string missing =
      "rank " + std::to_string(n - 1) + " (not inside any collective) never arrived";
  const std::string culprit = "likely culprit: rank " + std::to_string(n - 1) + " (";
  bool ok = msg.find("all_reduce") != std::string::npos &&
            msg.find("'world'") != std::string::npos && msg.find("seq 2") != std::string::npos &&
            msg.find(missing) != std::string::npos && msg.find(culprit) != std::string::npos &&
            dt < cfg.timeout_s + 5;
  std::printf("WATCHDOG %s rank %d after %.2f s: %s\n", ok ? "OK" : "FAIL", r, dt, msg.c_str());
  std::fflush(stdout);
  // Let the other waiting ranks report before this one's exit aborts the job.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return ok ? 0 : 1;
}
