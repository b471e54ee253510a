// Parallel styles, placement changes and uneven shards: the pieces blocks are composed of.
#include <catch2/catch.hpp>

#include "dist/style.h"
#include "runtime/error.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using meshrt::test::run_ranks;

TEST_CASE("uneven shards give the first n % parts pieces one more element", "[mesh][unit]") {
  const std::vector<int64_t> len3{4, 3, 3}, off3{0, 4, 7};
  for (int i = 0; i < 3; ++i) {
    CHECK(shard_size(10, 3, i) == len3[static_cast<size_t>(i)]);
    CHECK(shard_offset(10, 3, i) == off3[static_cast<size_t>(i)]);
  }
  const std::vector<int64_t> len6{17, 17, 17, 17, 16, 16};
  int64_t at = 0;
  for (int i = 0; i < 6; ++i) {
    CHECK(shard_size(100, 6, i) == len6[static_cast<size_t>(i)]);
    CHECK(shard_offset(100, 6, i) == at);
    at += len6[static_cast<size_t>(i)];
  }
  CHECK(at == 100);
  CHECK(shard_size(12, 4, 3) == 3);  // even splits are unchanged
  CHECK(shard_offset(12, 4, 3) == 9);
}

TEST_CASE("each placement change has its conjugate for the gradient", "[mesh][unit]") {
  const Placement S0 = Placement::shard(0), R = Placement::replicate(), P = Placement::partial();
  // all-gather <-> reduce-scatter
  CHECK(Redistribution{S0, R}.grad().str() == "Partial(sum) -> Shard(0)");
  CHECK(Redistribution{P, S0}.grad().str() == "Shard(0) -> Replicate()");
  // all-reduce <-> identity
  CHECK(Redistribution{P, R}.grad().is_identity());
  CHECK(Redistribution{R, R}.grad().str() == "Partial(sum) -> Replicate()");
  CHECK(Redistribution{S0, R}.out_shape({4, 2, 8}, 3) == Shape({12, 2, 8}));
  CHECK(Redistribution{P, S0}.out_shape({12, 2, 8}, 3) == Shape({4, 2, 8}));
  CHECK(Placement::partial(ReduceOp::Max).str() == "Partial(max)");
}

TEST_CASE("styles declare the placements Megatron's layers take and give", "[mesh][unit]") {
  const Placement S0 = Placement::shard(0), R = Placement::replicate(), P = Placement::partial(),
                  Sl = Placement::shard(-1);
  for (bool sp : {false, true}) {
    INFO("sp=" << sp);
    const Placement act = sp ? S0 : R;
    ParallelStyle c = colwise_parallel(sp);
    CHECK(c.in() == Redistribution{act, R});
    CHECK(c.out().is_identity());
    CHECK(c.compute_output == Sl);
    CHECK(c.weight == Placement::shard(1));
    CHECK(c.bias == S0);
    ParallelStyle r = rowwise_parallel(sp);
    CHECK(r.input == Sl);
    CHECK(r.out() == Redistribution{P, act});
    CHECK(r.weight == S0);
    CHECK(r.bias == R);
    // A colwise layer's output is what a rowwise layer takes: nothing moves between them.
    CHECK(c.output == r.input);
    ParallelStyle n = sequence_parallel_norm(sp);
    CHECK(n.input == act);
    CHECK(n.output == act);
    CHECK(n.partial_param_grads == sp);
    CHECK(n.output == c.input);  // norm then colwise
    CHECK(r.output == n.input);  // rowwise then the next norm
    ParallelStyle e = vocab_parallel_embedding(sp);
    CHECK(e.out() == Redistribution{P, act});
    CHECK(e.weight == S0);
    CHECK(loss_parallel_head(sp).output == Sl);
  }
}

TEST_CASE("distribute and full_tensor round-trip uneven shards on 1-d and 2-d meshes",
          "[mesh][multirank][uneven]") {
  for (const char* spec : {"tp=3", "dp=2,tp=3"}) {
    INFO(spec);
    const int n = std::string(spec) == "tp=3" ? 3 : 6;
    run_ranks(n, [&](int r, Communicator& world, Context& ctx) {
      DeviceMesh mesh(ctx, world, spec);
      Stream& s = ctx.compute_stream();
      Tensor full = ctx.empty({11, 10}, DType::f32);
      full.init_philox_({5, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
      const std::vector<Placement> S0(static_cast<size_t>(mesh.ndim()), Placement::shard(0));
      const std::vector<Placement> last = placements_on(mesh, kTpDim, Placement::shard(1));
      for (const auto& pl : {S0, last}) {
        Tensor local = distribute(full, mesh, pl, s);
        Shape ls, off;
        shard_extent(full.shape(), mesh, pl, &ls, &off);
        Tensor back = full_tensor(local, mesh, pl, s);
        s.synchronize();
        RANK_REQUIRE(local.shape() == ls);
        RANK_REQUIRE(back.shape() == full.shape());
        RANK_REQUIRE(back.to_vector() == full.to_vector());
      }
      // Shard(0) over tp=3 of 11 rows: 4, 4, 3; nested under dp=2 (6 | 5 rows): 2, 2, 2 | 2, 2, 1.
      Shape ls;
      shard_extent(full.shape(), mesh, S0, &ls, nullptr);
      const int64_t want =
          n == 3 ? shard_size(11, 3, r) : shard_size(shard_size(11, 2, r / 3), 3, r % 3);
      RANK_REQUIRE(ls[0] == want);
      RANK_REQUIRE(ls[0] == (n == 3
                                 ? std::vector<int64_t>{4, 4, 3}[static_cast<size_t>(r)]
                                 : std::vector<int64_t>{2, 2, 2, 2, 2, 1}[static_cast<size_t>(r)]));
    });
  }
}

TEST_CASE("a parameter's layout follows its placement list, uneven included",
          "[mesh][multirank][uneven]") {
  run_ranks(3, [](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "tp=3");
    Stream& s = ctx.compute_stream();
    const PhiloxInit init{9, 0, PhiloxInit::Dist::Normal, 0.f, 1.f};
    Param w = make_param(mesh, "w", 7, {4, 10}, placements_on(mesh, kTpDim, Placement::shard(1)),
                         DType::f32, init);
    Param b = make_param_const(
        mesh, "b", 8, {10}, placements_on(mesh, kTpDim, Placement::replicate()), DType::f32, 1.0);
    // The full parameter, initialised by the same rule at tp=1, sliced like the shard.
    Tensor full = ctx.empty({4, 10}, DType::f32);
    PhiloxInit fi = init;
    fi.id = 7;
    full.init_philox_(fi, s);
    Tensor gathered = full_tensor(w.value, mesh, w.placements, s);
    s.synchronize();
    RANK_REQUIRE(w.value.shape() == Shape({4, shard_size(10, 3, r)}));
    RANK_REQUIRE(w.offsets == Shape({0, shard_offset(10, 3, r)}));
    RANK_REQUIRE(w.grad.shape() == w.value.shape());
    RANK_REQUIRE(w.sharded_on(mesh, kTpDim));
    RANK_REQUIRE(!w.sharded_on(mesh, kDpDim));
    RANK_REQUIRE(!b.sharded_on(mesh, kTpDim));
    RANK_REQUIRE(b.value.shape() == Shape({10}));
    RANK_REQUIRE(gathered.to_vector() == full.to_vector());
  });
}
