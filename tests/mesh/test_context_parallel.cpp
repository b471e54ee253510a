// Context parallelism's core (dist/context_parallel.h): the causal load-balance layout, and cp
// attention (ring and all-gather) on thread ranks against attention over the whole sequence.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "dist/context_parallel.h"
#include "kernels/ops.h"
#include "runtime/error.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using meshrt::test::run_ranks;

namespace {

using Vals = std::vector<float>;

Vals random_vals(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  Vals v(n);
  for (auto& x : v) x = u(g);
  return v;
}

Tensor host_tensor(Context& ctx, const Shape& shape, const Vals& v) {
  Tensor t = ctx.empty(shape, DType::f32);
  ctx.synchronize();
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Vals values(Context& ctx, const Tensor& t) {
  ctx.synchronize();
  const float* p = t.data<float>();
  return Vals(p, p + t.numel());
}

// max |got - ref| / max |ref|.
double rel(const Vals& got, const Vals& ref) {
  double md = 0, mr = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::abs(static_cast<double>(got[i]) - ref[i]));
    mr = std::max(mr, std::abs(static_cast<double>(ref[i])));
  }
  return md / mr;
}

struct Problem {
  int64_t b = 1, h = 2, seq = 0, d = 3;
  Shape full() const { return {b, h, seq, d}; }
};

// Whole-sequence attention: out, lse, dq, dk, dv.
std::vector<Vals> reference(const Problem& p, const std::vector<Vals>& qkvg, float scale,
                            bool causal) {
  Context ctx(Device::cpu(), ContextOptions{});
  Stream& s = ctx.compute_stream();
  const Shape f = p.full();
  Tensor q = host_tensor(ctx, f, qkvg[0]), k = host_tensor(ctx, f, qkvg[1]),
         v = host_tensor(ctx, f, qkvg[2]), g = host_tensor(ctx, f, qkvg[3]);
  Tensor out = ctx.empty(f, DType::f32), lse = ctx.empty({p.b, p.h, p.seq}, DType::f32);
  Tensor dq = ctx.empty(f, DType::f32), dk = ctx.empty(f, DType::f32),
         dv = ctx.empty(f, DType::f32);
  ops::attention_fwd(ctx, s, q, k, v, out, lse, scale, causal);
  ops::attention_bwd(ctx, s, q, k, v, out, g, lse, dq, dk, dv, scale, causal);
  return {values(ctx, out), values(ctx, lse), values(ctx, dq), values(ctx, dk), values(ctx, dv)};
}

}  // namespace

TEST_CASE("cp layout: rank i holds chunks i and 2cp-1-i", "[cp]") {
  const CpLayout l = CpLayout::make(24, 3);
  REQUIRE(l.chunk() == 4);
  REQUIRE(l.local_seq() == 8);
  REQUIRE(l.chunks(0) == std::array<int64_t, 2>{0, 5});
  REQUIRE(l.chunks(2) == std::array<int64_t, 2>{2, 3});
  REQUIRE(l.global_pos(1, 0) == 4);
  REQUIRE(l.global_pos(1, 3) == 7);
  REQUIRE(l.global_pos(1, 4) == 16);
  REQUIRE(l.global_pos(1, 7) == 19);
  REQUIRE_THROWS_WITH(CpLayout::make(10, 2),
                      Catch::Contains("sequence length 10 is not divisible by 2 x cp = 4 (cp=2)") &&
                          Catch::Contains("rank i holds chunks i and 2cp-1-i"));
  REQUIRE_THROWS_WITH(CpLayout::make(8, 0), Catch::Contains("cp=0 must be >= 1"));
  REQUIRE_THROWS_WITH(parse_cp_comm("p2p"),
                      Catch::Contains("cp exchange 'p2p' must be ring or allgather"));
  REQUIRE(parse_cp_comm(cp_comm_name(CpComm::AllGather)) == CpComm::AllGather);
}

TEST_CASE("cp layout: shard, unshard and gather invert each other", "[cp][multirank]") {
  const int cp = 2;
  const CpLayout l = CpLayout::make(12, cp);
  Vals full(2 * 12 * 3);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  run_ranks(cp, [&](int r, Communicator& comm, Context& ctx) {
    Stream& s = ctx.compute_stream();
    Tensor f = host_tensor(ctx, {2, 12, 3}, full);
    Tensor shard = ctx.empty({2, 6, 3}, DType::f32);
    cp_shard(l, r, f, 1, shard, s);
    const Vals sv = values(ctx, shard);
    Tensor back = ctx.zeros({2, 12, 3}, DType::f32);
    cp_gather(comm, l, shard, 1, back, ctx, s);
    const Vals bv = values(ctx, back);
    std::lock_guard<std::mutex> lk(meshrt::test::catch_mutex());
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < 6; ++j)
        for (int64_t e = 0; e < 3; ++e)
          REQUIRE(sv[static_cast<size_t>((b * 6 + j) * 3 + e)] ==
                  full[static_cast<size_t>((b * 12 + l.global_pos(r, j)) * 3 + e)]);
    REQUIRE(bv == full);
    REQUIRE_THROWS_WITH(cp_shard(l, r, f, 0, shard, s),
                        Catch::Contains("must have 12 and the shard"));
  });
}

TEST_CASE("cp attention equals attention over the whole sequence", "[cp][multirank]") {
  const int cp = GENERATE(1, 2, 4);  // 1: no exchange at all
  const CpComm how = GENERATE(CpComm::Ring, CpComm::AllGather);
  const bool causal = GENERATE(true, false);
  CAPTURE(cp, cp_comm_name(how), causal);
  Problem p;
  p.seq = 2 * cp * 5;  // chunks of 5 tokens, head_dim 3
  const CpLayout l = CpLayout::make(p.seq, cp);
  const float scale = 0.6f;
  const size_t n = static_cast<size_t>(p.full().numel());
  std::vector<Vals> in;
  for (uint32_t i = 0; i < 4; ++i) in.push_back(random_vals(n, 7 + i));
  const std::vector<Vals> ref = reference(p, in, scale, causal);
  run_ranks(cp, [&](int r, Communicator& comm, Context& ctx) {
    Stream& s = ctx.compute_stream();
    const Shape local{p.b, p.h, l.local_seq(), p.d};
    std::vector<Tensor> sh;  // q, k, v, dout shards
    for (const Vals& x : in) {
      Tensor t = ctx.empty(local, DType::f32);
      cp_shard(l, r, host_tensor(ctx, p.full(), x), 2, t, s);
      sh.push_back(t);
    }
    Tensor out = ctx.empty(local, DType::f32),
           lse = ctx.empty({p.b, p.h, l.local_seq()}, DType::f32);
    Tensor dq = ctx.empty(local, DType::f32), dk = ctx.empty(local, DType::f32),
           dv = ctx.empty(local, DType::f32);
    cp_attention_fwd(comm, ctx, how, sh[0], sh[1], sh[2], out, lse, scale, causal);
    cp_attention_bwd(comm, ctx, how, sh[0], sh[1], sh[2], out, sh[3], lse, dq, dk, dv, scale,
                     causal);
    // This rank's rows of the reference, in its local order.
    const Tensor* got[] = {&out, &lse, &dq, &dk, &dv};
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) {
      const Vals g = values(ctx, *got[i]);
      const int64_t d = i == 1 ? 1 : p.d;
      Vals want;
      for (int64_t bh = 0; bh < p.b * p.h; ++bh)
        for (int64_t j = 0; j < l.local_seq(); ++j)
          for (int64_t e = 0; e < d; ++e)
            want.push_back(ref[static_cast<size_t>(i)]
                              [static_cast<size_t>((bh * p.seq + l.global_pos(r, j)) * d + e)]);
      const double err = rel(g, want);
      std::lock_guard<std::mutex> lk(meshrt::test::catch_mutex());
      INFO("rank " << r << " " << names[i] << " relative error " << err);
      REQUIRE(err < 1e-5);
    }
  });
}

TEST_CASE("cp attention refuses a shard of odd length", "[cp][multirank]") {
  run_ranks(2, [&](int, Communicator& comm, Context& ctx) {
    Tensor q = ctx.empty({1, 1, 3, 4}, DType::f32), lse = ctx.empty({1, 1, 3}, DType::f32);
    std::lock_guard<std::mutex> lk(meshrt::test::catch_mutex());
    REQUIRE_THROWS_WITH(
        cp_attention_fwd(comm, ctx, CpComm::Ring, q, q, q, q, lse, 1.f),
        Catch::Contains("cp_attention_fwd: q f32[1, 1, 3, 4]") && Catch::Contains("even length"));
  });
}
