// --deterministic (issue 55, docs/training.md#deterministic-training): the same losses, gradient
// norms, parameters and optimizer state, bit for bit, on every dp size, micro-batching, bucket
// size, overlap and ZeRO stage; resumed on another dp; and a control showing that without the
// flag the layouts do differ (so the comparisons can fail). The larger cases are not tagged
// [multirank], so the stream-jitter rerun (tests/mesh/CMakeLists.txt) runs only the smaller ones
// (the fixed-order sum over 1 to 4 ranks with ZeRO 1 and 2, small buckets, tp=2).
#include <unistd.h>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "collectives/fixed_order.h"
#include "kernels/deterministic.h"
#include "kernels/ops.h"
#include "tests/mesh/harness.h"
#include "train/train.h"
#include "train/train_deterministic.h"
#include "train/train_guard.h"

using namespace meshrt;
namespace fs = std::filesystem;

namespace {

// What a run is compared on: rank 0's loss and gradient norm at every step and the digest of the
// parameters and moments (train_state_digest) at steps 1, 5 and 20.
struct Bits {
  std::vector<double> loss, norm;
  std::vector<uint64_t> digest;
  bool operator==(const Bits&) const = default;
};

TrainConfig det_cfg(const std::string& mesh) {
  TrainConfig c;
  c.model.block.hidden = 16;
  c.model.block.ffn = 40;
  c.model.block.heads = 2;
  c.model.block.init_std = 0.1f;
  c.model.block.seed = 3;
  c.model.layers = 1;
  c.model.vocab = 40;
  c.mesh = mesh;
  c.batch = 12;  // divides by dp 1, 2, 3 and 4
  c.seq = 8;
  c.steps = 20;
  c.optim.lr = 1e-2f;
  c.optim.measure_grad_norm = true;
  c.deterministic = true;
  c.digest_steps = {1, 5, 20};
  return c;
}

Bits run(int world, const TrainConfig& cfg) {
  Bits out;
  std::mutex mu;
  test::run_ranks(world, [&](int r, Communicator& w, Context& ctx) {
    auto st = train(cfg, ctx, w, nullptr);
    if (r != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    for (const StepStats& s : st) {
      out.loss.push_back(s.loss);
      out.norm.push_back(s.grad_norm);
      if (s.state_digest != 0) out.digest.push_back(s.state_digest);
    }
  });
  return out;
}

struct Layout {
  const char* name;
  int world;
  std::string mesh;
  int micro = 1;
  double bucket_mb = 25.0;
  int zero = 0;
  Overlap overlap = Overlap::Async;
  float clip = 0.f;
};

TrainConfig cfg_of(const Layout& l) {
  TrainConfig c = det_cfg(l.mesh);
  c.micro_batches = l.micro;
  c.dp.bucket_mb = l.bucket_mb;
  c.dp.zero = l.zero;
  c.dp.overlap = l.overlap;
  c.optim.clip_norm = l.clip;
  return c;
}

std::string scratch(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("meshrt_det_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace

TEST_CASE("fixed-order nodes: the maximal aligned subtrees of a leaf range",
          "[deterministic][unit]") {
  using N = FixedOrderNode;
  CHECK(fixed_order_nodes(0, 8) == std::vector<N>{{3, 0}});
  CHECK(fixed_order_nodes(0, 6) == std::vector<N>{{2, 0}, {1, 2}});
  CHECK(fixed_order_nodes(4, 8) == std::vector<N>{{2, 1}});
  // dp = 3 over 12 grains: [4, 8) is one node, [8, 12) one, but dp = 4 over 12 splits [3, 6).
  CHECK(fixed_order_nodes(3, 6) == std::vector<N>{{0, 3}, {1, 2}});
  CHECK(fixed_order_nodes(2, 7) == std::vector<N>{{1, 1}, {1, 2}, {0, 6}});
  CHECK(fixed_order_nodes(5, 5).empty());
  CHECK_THROWS_WITH(fixed_order_nodes(3, 2), Catch::Contains("is not a range"));
}

TEST_CASE("deterministic training: every layout gives dp=1's bits at every step",
          "[deterministic][train]") {
  const Bits ref = run(1, det_cfg("dp=1"));
  REQUIRE(ref.loss.size() == 20);
  REQUIRE(ref.digest.size() == 3);
  const Layout layouts[] = {
      {"dp=2", 2, "dp=2"},
      {"dp=3", 3, "dp=3"},
      {"dp=4", 4, "dp=4"},
      {"dp=1, 3 micro-batches", 1, "dp=1", 3},
      {"dp=2, 2 micro-batches, 1 KiB buckets", 2, "dp=2", 2, 0.001},
      {"dp=4, no overlap, 2 KiB buckets", 4, "dp=4", 1, 0.002, 0, Overlap::None},
      {"dp=2, zero 1", 2, "dp=2", 1, 25.0, 1},
      {"dp=4, zero 2, 3 micro-batches", 4, "dp=4", 3, 25.0, 2},
      {"dp=3, zero 3", 3, "dp=3", 1, 25.0, 3},
      {"dp=2, zero 3, 1 KiB buckets", 2, "dp=2", 2, 0.001, 3},
  };
  for (const Layout& l : layouts) {
    INFO(l.name);
    CHECK(run(l.world, cfg_of(l)) == ref);
  }
  // The same run again.
  CHECK(run(2, det_cfg("dp=2")) == ref);
}

TEST_CASE("deterministic training: clipping by the global norm gives the same bits",
          "[deterministic][train]") {
  Layout base{"dp=1, clip", 1, "dp=1"};
  base.clip = 0.5f;
  const Bits ref = run(1, cfg_of(base));
  Layout zero2{"dp=4, zero 2, clip", 4, "dp=4", 1, 25.0, 2};
  zero2.clip = 0.5f;
  Layout zero3{"dp=3, zero 3, clip", 3, "dp=3", 2, 0.001, 3};
  zero3.clip = 0.5f;
  for (const Layout& l : {zero2, zero3}) {
    INFO(l.name);
    CHECK(run(l.world, cfg_of(l)) == ref);
  }
  // The clip acted: without it the run differs.
  CHECK(!(run(1, det_cfg("dp=1")) == ref));
}

TEST_CASE("deterministic training at a fixed tp: the dp layout does not change the bits",
          "[deterministic][train][multirank]") {
  const Bits ref = run(2, det_cfg("tp=2"));
  Layout l{"dp=2,tp=2, zero 1", 4, "dp=2,tp=2", 2, 0.001, 1};
  CHECK(run(4, cfg_of(l)) == ref);
}

TEST_CASE("deterministic training: resuming on another dp continues on the same bits",
          "[deterministic][train][checkpoint]") {
  TrainConfig full = det_cfg("dp=4");
  full.steps = 8;
  full.digest_steps = {8};
  const Bits straight = run(4, full);
  const std::string root = scratch("resume");
  TrainConfig first = full;
  first.steps = 4;
  first.dp.zero = 2;
  first.digest_steps = {};
  first.checkpoint.save = root;
  run(4, first);
  for (int dp : {1, 2}) {
    INFO("resumed on dp=" << dp);
    TrainConfig r = full;
    r.mesh = "dp=" + std::to_string(dp);
    r.checkpoint.resume = root;
    const Bits got = run(dp, r);
    REQUIRE(got.loss.size() == 4);
    CHECK(got.digest == straight.digest);
    CHECK(std::vector<double>(straight.loss.begin() + 4, straight.loss.end()) == got.loss);
  }
  // The checkpoint records the grain: another grain, or no --deterministic, would continue on
  // other bits and is refused.
  TrainConfig other = full;
  other.mesh = "dp=1";
  other.checkpoint.resume = root;
  other.deterministic_grain = 2;
  CHECK_THROWS_WITH(run(1, other), Catch::Contains("was saved with deterministic=grain 1 but this "
                                                   "run has deterministic=grain 2"));
  other.deterministic = false;
  other.deterministic_grain = 1;
  CHECK_THROWS_WITH(run(1, other), Catch::Contains("was saved with deterministic=grain 1 but this "
                                                   "run has deterministic=off"));
  fs::remove_all(root);
}

TEST_CASE("without --deterministic the layouts differ (the control of the tests above)",
          "[deterministic][train]") {
  auto plain = [](const std::string& mesh, int micro) {
    TrainConfig c = det_cfg(mesh);
    c.deterministic = false;
    c.micro_batches = micro;
    return c;
  };
  const Bits ref = run(1, plain("dp=1", 1));
  const Bits dp4 = run(4, plain("dp=4", 1));
  const Bits micro = run(1, plain("dp=1", 3));
  // Rounding only: close, but not the same bits.
  CHECK(!(dp4 == ref && micro == ref));
  CHECK(std::abs(dp4.loss.back() - ref.loss.back()) < 1e-4);
}

namespace {
// C = A B (m x k times k x n) on a context whose pool has cores / local_ranks threads; the bytes
// of C. 512 x 128 x 64 (2^22 multiply-adds): 2 row panels on a 2-thread pool, 1 on a 1-thread
// pool, 1 pinned (kDeterministicGemmMinFma = 2^24); 512 x 128 x 512: 2 and 1, pinned 2 on both.
std::vector<float> gemm_on(int local_ranks, bool pinned, int64_t n = 64) {
  ContextOptions o;
  o.local_ranks = local_ranks;
  Context ctx(Device::cpu(0), o);
  if (pinned) ops::set_deterministic_gemm(ctx, true);
  Stream& s = ctx.compute_stream();
  Tensor a = ctx.empty({512, 128}, DType::f32), b = ctx.empty({128, n}, DType::f32),
         c = ctx.empty({512, n}, DType::f32);
  a.init_philox_(PhiloxInit{7, 0, PhiloxInit::Dist::Normal, 0.f, 1.f}, a.shape(), {0, 0}, s);
  b.init_philox_(PhiloxInit{7, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, b.shape(), {0, 0}, s);
  ops::gemm(ctx, s, a, false, b, false, c);
  Tensor h = c.to(ctx.host_allocator(), s);
  s.synchronize();
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

int pool_threads() {
  Context ctx(Device::cpu(0), ContextOptions{});
  return ops::host_threads(ctx);
}
}  // namespace

TEST_CASE("deterministic GEMM panels do not depend on the host thread count",
          "[deterministic][unit]") {
  for (int64_t n : {64, 512}) {
    INFO("n = " << n);
    const std::vector<float> two = gemm_on(1, true, n), one = gemm_on(2, true, n);
    CHECK(std::memcmp(two.data(), one.data(), two.size() * sizeof(float)) == 0);
  }
  // The control, where the kernels round by panel rows (OpenBLAS's Haswell kernels; ctest runs
  // this case again under OPENBLAS_CORETYPE=Haswell) and the machine has 2 cores for 2 panels:
  // unpinned, the thread count shows.
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  if (core != nullptr && std::string(core) == "Haswell" && pool_threads() >= 2) {
    const std::vector<float> u2 = gemm_on(1, false), u1 = gemm_on(2, false);
    CHECK(std::memcmp(u2.data(), u1.data(), u2.size() * sizeof(float)) != 0);
  }
}

TEST_CASE("the memory estimate counts the deterministic grains' partial sums",
          "[deterministic][unit]") {
  TrainConfig c = det_cfg("dp=2");  // 12 sequences over dp=2: 6 grains per rank
  c.deterministic = false;
  const TrainMemory off = estimate_train_memory(c, 2);
  c.deterministic = true;
  const TrainMemory on = estimate_train_memory(c, 2);
  // 2 ceil(log2 6) + 2 = 8 whole-gradient nodes on the stack, and the all-to-all's send and
  // receive slots (8 each) of the one bucket the model fills.
  CHECK(on.grads == Approx(off.grads * (1 + 8 + 16)).epsilon(1e-9));
  CHECK(on.weights == off.weights);
  CHECK(on.optimizer == off.optimizer);
  // A pass holds one grain's activations, not the rank's 6 sequences.
  CHECK(on.activations == Approx(off.activations / 6).epsilon(1e-9));
}

TEST_CASE("the default grain: at most 256 tokens, allowing every dp of 1 to 4 the batch allows",
          "[deterministic][unit]") {
  CHECK(default_deterministic_grain(8, 64) == 2);    // train's defaults: dp 1, 2, 4
  CHECK(default_deterministic_grain(12, 8) == 1);    // dp 1, 2, 3, 4
  CHECK(default_deterministic_grain(16, 64) == 4);   // 256 tokens
  CHECK(default_deterministic_grain(24, 32) == 2);   // 24 / lcm(1, 2, 3, 4)
  CHECK(default_deterministic_grain(8, 256) == 1);   // one sequence is 256 tokens already
  CHECK(default_deterministic_grain(8, 1024) == 1);  // longer: still 1
}

TEST_CASE("deterministic training with 2-sequence grains: every layout the grain allows agrees",
          "[deterministic][train][multirank]") {
  auto grain2 = [](const Layout& l) {
    TrainConfig c = cfg_of(l);
    c.deterministic_grain = 2;
    return c;
  };
  const Bits ref = run(1, grain2({"dp=1", 1, "dp=1"}));
  CHECK(run(2, grain2({"dp=2, zero 2", 2, "dp=2", 1, 25.0, 2})) == ref);
  CHECK(run(3, grain2({"dp=3, 1 KiB buckets", 3, "dp=3", 2, 0.001})) == ref);
  // dp=4 holds 3 sequences per rank: not a whole number of grains.
  CHECK_THROWS_WITH(run(4, grain2({"dp=4", 4, "dp=4"})),
                    Catch::Contains("--deterministic-grain 2 does not divide the 3 sequences"));
}
