#include <catch2/catch.hpp>

#include "dist/device_mesh.h"
#include "dist/placement.h"
#include "runtime/error.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using meshrt::test::run_ranks;

TEST_CASE("mesh specs parse and bad ones say what to change", "[mesh][unit]") {
  auto d = parse_mesh_spec("dp=2,tp=4", 8);
  REQUIRE(d.size() == 2);
  REQUIRE(d[1].name == "tp");
  REQUIRE(d[1].size == 4);
  REQUIRE_THROWS_WITH(parse_mesh_spec("dp=2,tp=4", 6),
                      Catch::Contains("has 8 ranks but the world has 6"));
  REQUIRE_THROWS_WITH(parse_mesh_spec("dp=2,dp=2"), Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(parse_mesh_spec("tp"), Catch::Contains("has no '='"));
  REQUIRE_THROWS_WITH(parse_mesh_spec("tp=0"), Catch::Contains("not an integer >= 1"));
  REQUIRE_THROWS_WITH(parse_mesh_spec("TP=2"), Catch::Contains("lower-case"));
  REQUIRE_THROWS_WITH(parse_mesh_spec(""), Catch::Contains("empty"));
}

TEST_CASE("a 2x4 mesh: row-major coordinates, groups along each dim", "[mesh][multirank]") {
  run_ranks(8, [](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=2,tp=4");
    RANK_REQUIRE(mesh.coord("dp") == r / 4);
    RANK_REQUIRE(mesh.coord("tp") == r % 4);
    RANK_REQUIRE(mesh.rank_of(mesh.coords()) == r);
    RANK_REQUIRE(mesh.group("tp").size() == 4);
    RANK_REQUIRE(mesh.group("dp").size() == 2);
    RANK_REQUIRE(mesh.group("tp").rank() == r % 4);
    RANK_REQUIRE(mesh.size("pp") == 1);
    RANK_REQUIRE_THROWS_WITH(mesh.group("pp"), Catch::Contains("has no dim 'pp'"));
    // Sum of world ranks along tp: the tp group of rank r is 4*(r/4) .. 4*(r/4)+3.
    Tensor t = ctx.empty({3}, DType::f32);
    t.fill_(r, ctx.compute_stream());
    Stream& s = ctx.compute_stream();
    s.wait(mesh.group("tp").all_reduce(t, ReduceOp::Sum, s));
    Tensor u = ctx.empty({1}, DType::i64);
    u.fill_(r, s);
    s.wait(mesh.group("dp").all_reduce(u, ReduceOp::Sum, s));
    s.synchronize();
    int base = 4 * (r / 4);
    RANK_REQUIRE(t.item(2) == 4 * base + 6);
    RANK_REQUIRE(u.item(0) == (r % 4) * 2 + 4);
  });
}

TEST_CASE("distribute then full_tensor gives back the full tensor", "[mesh][multirank]") {
  run_ranks(4, [](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=2,tp=2");
    Stream& s = ctx.compute_stream();
    Tensor full = ctx.empty({4, 6, 2}, DType::f32);
    full.init_philox_({3, 9}, s);
    using P = Placement;
    for (auto pl : std::vector<std::vector<P>>{{P::shard(0), P::shard(1)},
                                               {P::replicate(), P::shard(-1)},
                                               {P::shard(0), P::shard(0)},
                                               {P::partial(), P::replicate()}}) {
      Tensor local = distribute(full, mesh, pl, s);
      Tensor back = full_tensor(local, mesh, pl, s);
      s.synchronize();
      RANK_REQUIRE(back.to_vector() == full.to_vector());
    }
    Shape l, off;
    shard_extent({4, 6, 2}, mesh, {P::shard(0), P::shard(1)}, &l, &off);
    RANK_REQUIRE(l == Shape({2, 3, 2}));
    RANK_REQUIRE(off == Shape({2 * (r / 2), 3 * (r % 2), 0}));
    RANK_REQUIRE_THROWS_WITH(
        distribute(full, mesh, {P::shard(2), P::shard(2)}, s),
        Catch::Contains("cannot shard dim 2 of size 1") && Catch::Contains("not divisible"));
  });
}
