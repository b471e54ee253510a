// NCCL communicator on real GPUs (ranks = threads, one per visible GPU). A case the machine cannot
// run (no usable GPU; one GPU for [multigpu]) prints why and exits with 77: ctest says Skipped.
// Avg results are compared the way NCCL computes them, within one ulp (nccl_avg.h).
#define CATCH_CONFIG_RUNNER
#include <cstdio>

#include "coll_matrix.h"
#include "coll_test_util.h"
#include "collectives/bootstrap.h"
#include "collectives/nccl_comm.h"
#include "nccl_avg.h"
#include "runtime/backend.h"
#include "tests/common/cuda_skip.h"

using namespace meshrt;
using namespace meshrt::test;

namespace {

int gpu_count() { return std::min(8, cuda_backend()->device_count(nullptr)); }

std::string gpu_spec(int n) { return "cuda:0-" + std::to_string(n - 1); }

}  // namespace

TEST_CASE("nccl: every op x dtype x in/out-of-place x sizes on all GPUs", "[cuda]") {
  const int n = gpu_count();
  LaunchOptions lo;
  lo.devices = gpu_spec(n);
  lo.config.timeout_s = 120;
  auto launch = bootstrap(lo);
  REQUIRE(launch->backend() == "nccl");
  Failures f;
  launch->run([&](const RankPlacement& p, Communicator& c) {
    const DeviceRuntime& be = backend_for(p.device);
    auto s = be.create_stream(p.device.index, "nccl-test");
    auto alloc = be.create_caching_allocator(p.device.index);
    run_matrix(c, *s, {0, 1, 37, 20001}, f, 3, alloc, check_nccl_avg);
  });
  INFO(f.str());
  CHECK(f.count() == 0);
}

TEST_CASE("nccl: split and concurrent collectives on two streams", "[cuda][multigpu]") {
  const int n = gpu_count();
  REQUIRE(n >= 2);  // main() skips this case with 77 on fewer GPUs
  LaunchOptions lo;
  lo.devices = gpu_spec(n);
  lo.config.timeout_s = 120;
  auto launch = bootstrap(lo);
  Failures f;
  launch->run([&](const RankPlacement& p, Communicator& w) {
    const DeviceRuntime& be = backend_for(p.device);
    auto sa = be.create_stream(p.device.index, "a");
    auto sb = be.create_stream(p.device.index, "b");
    auto alloc = be.create_caching_allocator(p.device.index);
    auto halves = w.split(p.rank % 2, p.rank);
    DeviceData da(*sa, alloc);
    Tensor a = da.make(4099, DType::f32);
    Tensor b = da.make(4099, DType::bf16);
    da.fill(a, 5, halves->rank());
    da.fill(b, 6, w.rank());
    Event ea = halves->all_reduce(a, ReduceOp::Sum, *sa);
    Event eb = w.all_reduce(b, ReduceOp::Max, *sb);
    ea.synchronize();
    eb.synchronize();
    check_values(f, "halves", da.host(a), 0, 4099, [&](int64_t i) {
      return reduced(DType::f32, ReduceOp::Sum, 5, halves->size(), i);
    });
    check_values(f, "world", da.host(b), 0, 4099,
                 [&](int64_t i) { return reduced(DType::bf16, ReduceOp::Max, 6, n, i); });
  });
  INFO(f.str());
  CHECK(f.count() == 0);
}

int main(int argc, char* argv[]) {
  if (cuda_available(nullptr))
    std::printf("NCCL %s, %d GPU(s)\n", nccl_version_string().c_str(), gpu_count());
  return run_catch_or_skip(argc, argv);
}
