// Context parallelism's core (dist/context_parallel.h): the causal load-balance layout, and cp
// attention (ring and all-gather) on thread ranks against attention over the whole sequence.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "dist/context_parallel.h"
#include "kernels/ops.h"
#include "runtime/error.h"
#include "tests/mesh/harness.h"
#include "train/token_data.h"

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

// Rank r's q, k, v and dout shards (`sh`, cut from the whole-sequence `in`) and its outputs.
struct RankTensors {
  std::vector<Tensor> sh;
  Tensor out, lse, dq, dk, dv;
};
RankTensors rank_tensors(Context& ctx, const Problem& p, const CpLayout& l, int r,
                         const std::vector<Vals>& in) {
  const Shape local{p.b, p.h, l.local_seq(), p.d};
  RankTensors t;
  for (const Vals& x : in) {
    Tensor shard = ctx.empty(local, DType::f32);
    cp_shard(l, r, host_tensor(ctx, p.full(), x), 2, shard, ctx.compute_stream());
    t.sh.push_back(shard);
  }
  t.out = ctx.empty(local, DType::f32);
  t.lse = ctx.empty({p.b, p.h, l.local_seq()}, DType::f32);
  t.dq = ctx.empty(local, DType::f32);
  t.dk = ctx.empty(local, DType::f32);
  t.dv = ctx.empty(local, DType::f32);
  return t;
}
// Rank r's out, lse, dq, dk and dv (in its local order) against its rows of the whole-sequence
// reference `ref` (the same five), within 1e-5 relative.
void require_rank_rows(Context& ctx, const Problem& p, const CpLayout& l, int r,
                       const std::vector<Vals>& ref, const std::vector<const Tensor*>& got) {
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (size_t i = 0; i < got.size(); ++i) {
    const Vals g = values(ctx, *got[i]);
    const int64_t d = i == 1 ? 1 : p.d;
    Vals want;
    for (int64_t bh = 0; bh < p.b * p.h; ++bh)
      for (int64_t j = 0; j < l.local_seq(); ++j)
        for (int64_t e = 0; e < d; ++e)
          want.push_back(ref[i][static_cast<size_t>((bh * p.seq + l.global_pos(r, j)) * d + e)]);
    const double err = rel(g, want);
    std::lock_guard<std::mutex> lk(meshrt::test::catch_mutex());
    INFO("rank " << r << " " << names[i] << " relative error " << err);
    REQUIRE(err < 1e-5);
  }
}

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
  REQUIRE(l.chunks(0) == std::vector<int64_t>{0, 5});
  REQUIRE(l.chunks(2) == std::vector<int64_t>{2, 3});
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
    RankTensors t = rank_tensors(ctx, p, l, r, in);
    std::vector<Tensor>& sh = t.sh;
    Tensor &out = t.out, &lse = t.lse, &dq = t.dq, &dk = t.dk, &dv = t.dv;
    cp_attention_fwd(comm, ctx, how, sh[0], sh[1], sh[2], out, lse, scale, causal);
    cp_attention_bwd(comm, ctx, how, sh[0], sh[1], sh[2], out, sh[3], lse, dq, dk, dv, scale,
                     causal);
    require_rank_rows(ctx, p, l, r, ref, {&out, &lse, &dq, &dk, &dv});
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

// ---- packed documents ---------------------------------------------------------------------------

namespace {

// Document ids [batch, seq] from each row's document lengths.
std::vector<int32_t> doc_ids(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int32_t> ids;
  for (const auto& row : lengths)
    for (size_t d = 0; d < row.size(); ++d) ids.insert(ids.end(), row[d], static_cast<int32_t>(d));
  return ids;
}

Tensor id_tensor(int64_t b, int64_t seq, const std::vector<int32_t>& ids) {
  return Tensor::from_host_data(ids.data(), {b, seq}, DType::i32);
}

// cp = 1: doc-masked attention over the whole sequence (one block at offset 0).
std::vector<Vals> doc_reference(const Problem& p, const std::vector<Vals>& qkvg,
                                const std::vector<int32_t>& ids, float scale, bool causal) {
  Context ctx(Device::cpu(), ContextOptions{});
  Stream& s = ctx.compute_stream();
  const Shape f = p.full();
  Tensor q = host_tensor(ctx, f, qkvg[0]), k = host_tensor(ctx, f, qkvg[1]),
         v = host_tensor(ctx, f, qkvg[2]), g = host_tensor(ctx, f, qkvg[3]);
  Tensor out = ctx.empty(f, DType::f32), lse = ctx.empty({p.b, p.h, p.seq}, DType::f32);
  Tensor dq = ctx.empty(f, DType::f32), dk = ctx.empty(f, DType::f32),
         dv = ctx.empty(f, DType::f32);
  Tensor d = id_tensor(p.b, p.seq, ids);
  ops::attention_block_fwd(ctx, s, q, k, v, out, lse, scale, causal, 0, 0, d, d);
  ops::attention_block_bwd(ctx, s, q, k, v, out, g, lse, dq, dk, dv, scale, causal, 0, 0, d, d);
  return {values(ctx, out), values(ctx, lse), values(ctx, dq), values(ctx, dk), values(ctx, dv)};
}

}  // namespace

TEST_CASE("doc-masked cp attention equals cp = 1's", "[cp][multirank][docmask]") {
  const int cp = GENERATE(1, 2, 4);
  const CpComm how = GENERATE(CpComm::Ring, CpComm::AllGather);
  const bool causal = GENERATE(true, false);
  const bool balanced = GENERATE(false, true);  // the standard pairing of chunks, or balanced's
  CAPTURE(cp, cp_comm_name(how), causal, balanced);
  Problem p;
  p.b = 2;
  p.seq = 40;  // chunks of 20, 10 or 5 tokens
  // Odd lengths, boundaries inside chunks (3, 14, 15, 17 at every cp), a 1-token document; at
  // cp = 4 some chunk pairs share no document (skipped).
  const std::vector<int32_t> ids = doc_ids({{3, 11, 1, 25}, {17, 23}});
  std::vector<int64_t> work = cp_chunk_work(p.seq, cp, {0, 3, 14, 15});
  const std::vector<int64_t> work1 = cp_chunk_work(p.seq, cp, {0, 17});
  for (size_t c = 0; c < work.size(); ++c) work[c] += work1[c];
  // At cp = 4 the balanced layout pairs chunks {0, 7}, {1, 5}, {2, 4}, {3, 6}.
  const CpLayout l = balanced ? CpLayout::balanced(p.seq, cp, work) : CpLayout::make(p.seq, cp);
  if (balanced && cp == 4) REQUIRE(l.chunks(1) == std::vector<int64_t>{1, 5});
  const float scale = 0.6f;
  const size_t n = static_cast<size_t>(p.full().numel());
  std::vector<Vals> in;
  for (uint32_t i = 0; i < 4; ++i) in.push_back(random_vals(n, 17 + i));
  const std::vector<Vals> ref = doc_reference(p, in, ids, scale, causal);
  run_ranks(cp, [&](int r, Communicator& comm, Context& ctx) {
    RankTensors t = rank_tensors(ctx, p, l, r, in);
    std::vector<Tensor>& sh = t.sh;
    Tensor &out = t.out, &lse = t.lse, &dq = t.dq, &dk = t.dk, &dv = t.dv;
    const Tensor d = id_tensor(p.b, p.seq, ids);
    cp_attention_fwd(comm, ctx, how, sh[0], sh[1], sh[2], out, lse, scale, causal, d, &l);
    cp_attention_bwd(comm, ctx, how, sh[0], sh[1], sh[2], out, sh[3], lse, dq, dk, dv, scale,
                     causal, d, &l);
    require_rank_rows(ctx, p, l, r, ref, {&out, &lse, &dq, &dk, &dv});
  });
}

TEST_CASE("cp attention over 4 chunks per rank equals cp = 1's", "[cp][multirank][docmask]") {
  const int cp = GENERATE(2, 3);
  const CpComm how = GENERATE(CpComm::Ring, CpComm::AllGather);
  const bool masked = GENERATE(false, true);
  const bool balanced = GENERATE(false, true);
  CAPTURE(cp, cp_comm_name(how), masked, balanced);
  Problem p;
  p.b = 2;
  p.seq = 48;  // 4 x cp chunks of 6 or 4 tokens
  const std::vector<int32_t> ids =
      masked ? doc_ids({{3, 11, 1, 33}, {17, 31}}) : std::vector<int32_t>(96, 0);
  std::vector<int64_t> work = cp_chunk_work(p.seq, cp, {0, 3, 14, 15}, 4);
  const std::vector<int64_t> work1 = cp_chunk_work(p.seq, cp, {0, 17}, 4);
  for (size_t c = 0; c < work.size(); ++c) work[c] += work1[c];
  const CpLayout l =
      balanced ? CpLayout::balanced(p.seq, cp, work, 4) : CpLayout::make(p.seq, cp, 4);
  if (!balanced && cp == 2) REQUIRE(l.chunks(1) == std::vector<int64_t>{1, 2, 5, 6});
  const float scale = 0.6f;
  const size_t n = static_cast<size_t>(p.full().numel());
  std::vector<Vals> in;
  for (uint32_t i = 0; i < 4; ++i) in.push_back(random_vals(n, 29 + i));
  const std::vector<Vals> ref = doc_reference(p, in, ids, scale, true);
  run_ranks(cp, [&](int r, Communicator& comm, Context& ctx) {
    RankTensors t = rank_tensors(ctx, p, l, r, in);
    std::vector<Tensor>& sh = t.sh;
    const Tensor d = masked ? id_tensor(p.b, p.seq, ids) : Tensor();
    cp_attention_fwd(comm, ctx, how, sh[0], sh[1], sh[2], t.out, t.lse, scale, true, d, &l);
    cp_attention_bwd(comm, ctx, how, sh[0], sh[1], sh[2], t.out, sh[3], t.lse, t.dq, t.dk, t.dv,
                     scale, true, d, &l);
    require_rank_rows(ctx, p, l, r, ref, {&t.out, &t.lse, &t.dq, &t.dk, &t.dv});
  });
}

TEST_CASE("cp layouts of 4 chunks per rank: the zigzag per run, and LPT balance", "[cp]") {
  const CpLayout l = CpLayout::make(24, 3, 4);
  REQUIRE(l.chunk() == 2);
  REQUIRE(l.num_chunks() == 12);
  REQUIRE(l.chunks(0) == std::vector<int64_t>{0, 5, 6, 11});
  REQUIRE(l.chunks(2) == std::vector<int64_t>{2, 3, 8, 9});
  REQUIRE(l.global_pos(1, 5) == 15);  // rank 1: chunks {1, 4, 7, 10}; local 5 is chunk 7, token 1
  REQUIRE_THROWS_WITH(CpLayout::make(24, 3, 3), Catch::Contains("3 chunks per rank: it must be an "
                                                                "even number >= 2"));
  REQUIRE_THROWS_WITH(CpLayout::make(20, 3, 4),
                      Catch::Contains("sequence length 20 is not divisible by 4 x cp = 12 (cp=3)"));
  // One document of 16 tokens, cp 2, 4 chunks per rank (of 2 tokens): works 3 7 11 ... 31. The
  // standard zigzag gives {0, 3, 4, 7} 3+15+19+31 = 68 and {1, 2, 5, 6} 7+11+23+27 = 68.
  const std::vector<int64_t> one = cp_chunk_work(16, 2, {0}, 4);
  REQUIRE(one == std::vector<int64_t>{3, 7, 11, 15, 19, 23, 27, 31});
  REQUIRE(cp_rank_work(CpLayout::make(16, 2, 4), one) == std::vector<int64_t>{68, 68});
  // Heavy chunks 1 and 2, both on rank 1 in the zigzag ({0, 3, 4, 7} 4, {1, 2, 5, 6} 20): LPT
  // puts a 9 on each rank, 12 and 12.
  const std::vector<int64_t> mid{1, 9, 9, 1, 1, 1, 1, 1};
  REQUIRE(cp_rank_work(CpLayout::make(16, 2, 4), mid) == std::vector<int64_t>{4, 20});
  const CpLayout b = CpLayout::balanced(16, 2, mid, 4);
  REQUIRE(cp_rank_work(b, mid) == std::vector<int64_t>{12, 12});
  REQUIRE(b.chunks(0) == std::vector<int64_t>{0, 1, 4, 6});
  REQUIRE(b.chunks(1) == std::vector<int64_t>{2, 3, 5, 7});
  // Where LPT is no better than the zigzag (one document), the zigzag stays.
  REQUIRE(CpLayout::balanced(16, 2, one, 4).assign.empty());
  REQUIRE_THROWS_WITH(CpLayout::balanced(16, 2, one, 2),
                      Catch::Contains("8 chunk works for cp=2 and 2 chunks per rank"));
}

TEST_CASE("doc-masked cp attention refuses bad document ids, naming them",
          "[cp][multirank][docmask]") {
  run_ranks(2, [&](int, Communicator& comm, Context& ctx) {
    Tensor q = ctx.zeros({1, 1, 4, 2}, DType::f32), lse = ctx.empty({1, 1, 4}, DType::f32);
    Tensor out = ctx.empty({1, 1, 4, 2}, DType::f32);
    const Tensor down = id_tensor(1, 8, {0, 0, 1, 1, 2, 1, 3, 3});
    const Tensor shortd = id_tensor(1, 7, {0, 0, 1, 1, 2, 2, 3});
    std::lock_guard<std::mutex> lk(meshrt::test::catch_mutex());
    REQUIRE_THROWS_WITH(
        cp_attention_fwd(comm, ctx, CpComm::Ring, q, q, q, out, lse, 1.f, true, down),
        Catch::Contains("cp_attention_fwd: doc_ids[0, 5] = 1 follows doc_ids[0, 4] = 2") &&
            Catch::Contains("non-decreasing"));
    REQUIRE_THROWS_WITH(cp_attention_bwd(comm, ctx, CpComm::AllGather, q, q, q, out, q, lse, q, q,
                                         q, 1.f, true, shortd),
                        Catch::Contains("cp_attention_bwd: doc_ids i32[1, 7]") &&
                            Catch::Contains("must be contiguous i32 [1, 8] on the host"));
    const CpLayout other = CpLayout::make(16, 2);
    REQUIRE_THROWS_WITH(
        cp_attention_fwd(comm, ctx, CpComm::Ring, q, q, q, out, lse, 1.f, true, {}, &other),
        Catch::Contains("cp_attention_fwd: the layout (sequence 16, cp=2) does not hold this "
                        "call's shards") &&
            Catch::Contains("4 tokens per rank"));
  });
}

TEST_CASE("packed documents: causal work per chunk and rank, and the balanced pairing",
          "[cp][docmask]") {
  // seq 8, cp 2 (chunks of 2), documents [0, 5) and [5, 8): each row sees its position in its
  // document + 1 keys: 1 2 | 3 4 | 5 1 | 2 3.
  const std::vector<int64_t> w = cp_chunk_work(8, 2, {0, 5});
  REQUIRE(w == std::vector<int64_t>{3, 7, 6, 5});
  REQUIRE(cp_chunk_work(8, 2, {5}) == w);  // position 0 starts a document anyway
  const CpLayout standard = CpLayout::make(8, 2);
  REQUIRE(cp_rank_work(standard, w) == std::vector<int64_t>{8, 13});
  REQUIRE(cp_imbalance(cp_rank_work(standard, w)) == Approx(13.0 / 10.5));
  const CpLayout b = CpLayout::balanced(8, 2, w);
  REQUIRE(b.chunks(0) == std::vector<int64_t>{0, 1});
  REQUIRE(b.chunks(1) == std::vector<int64_t>{2, 3});
  REQUIRE(cp_rank_work(b, w) == std::vector<int64_t>{10, 11});
  REQUIRE(cp_imbalance(cp_rank_work(b, w)) == Approx(11.0 / 10.5));
  REQUIRE(b.global_pos(0, 2) == 2);  // rank 0's second chunk is chunk 1
  // One document: the causal work grows along the sequence and balanced is the standard pairing.
  const std::vector<int64_t> one = cp_chunk_work(16, 2, {0});
  REQUIRE(one == std::vector<int64_t>{10, 26, 42, 58});
  REQUIRE(CpLayout::balanced(16, 2, one).chunks(0) == standard.chunks(0));
  REQUIRE(cp_imbalance(cp_rank_work(standard, one)) == 1.0);
  REQUIRE(cp_imbalance({0, 0}) == 1.0);
  REQUIRE_THROWS_WITH(cp_chunk_work(8, 2, {0, 5, 5}),
                      Catch::Contains("document start 5 (entry 2) must be in [0, 8) and after "
                                      "the previous start 5"));
  REQUIRE_THROWS_WITH(cp_chunk_work(8, 2, {8}), Catch::Contains("document start 8 (entry 0)"));
  REQUIRE_THROWS_WITH(cp_chunk_work(10, 2, {0}), Catch::Contains("not divisible by 2 x cp = 4"));
  REQUIRE_THROWS_WITH(
      CpLayout::balanced(8, 2, {1, 2}),
      Catch::Contains("2 chunk works for cp=2 and 2 chunks per rank, which cut the sequence "
                      "into 4 chunks"));
}

// The figures of docs/training.md's packed-documents balance table (not run by ctest): the causal
// work per cp rank of real packed batches, MESHRT_TEST_CP_BALANCE_DATA a raw u16 token file whose
// documents end with token MESHRT_TEST_CP_BALANCE_EOT.
TEST_CASE("cp balance of real packed batches (report)", "[.][cp_balance]") {
  const char* path = std::getenv("MESHRT_TEST_CP_BALANCE_DATA");
  const char* eot_s = std::getenv("MESHRT_TEST_CP_BALANCE_EOT");
  INFO("set MESHRT_TEST_CP_BALANCE_DATA (and MESHRT_TEST_CP_BALANCE_EOT): docs/training.md");
  REQUIRE(path != nullptr);
  const auto file = TokenFile::open(path, TokenDType::U16);
  const int64_t eot = file->end_of_text(eot_s != nullptr ? std::atoll(eot_s) : -1);
  Context ctx(Device::cpu(), ContextOptions{});
  const int64_t batch = 8;
  std::printf("%8s %4s %6s %10s %10s %10s %10s\n", "seq", "cp", "docs", "standard", "2/rank",
              "4/rank", "8/rank");
  for (int64_t seq : {4096, 16384, 65536}) {
    Tensor ids, targets;  // [seq, batch] i64
    make_token_batch(ctx, *file, 1, kTrainTokenStream, 0, batch, seq, &ids, &targets);
    for (int cp : {2, 4, 8}) {
      // The balanced layout at 2, 4 and 8 chunks per rank (train --cp-chunks) against the
      // standard layout of 2.
      std::vector<std::shared_ptr<PackedDocs>> d;
      for (int parts : {2, 4, 8}) d.push_back(packed_documents(ctx, ids, eot, cp, parts));
      int64_t docs = 0;
      for (int64_t j = 0; j < batch; ++j) docs += d[0]->ids.data<int32_t>()[j * seq + seq - 1] + 1;
      std::printf("%8lld %4d %6lld %10.4f %10.4f %10.4f %10.4f\n", static_cast<long long>(seq), cp,
                  static_cast<long long>(docs), d[0]->standard_imbalance, d[0]->imbalance,
                  d[1]->imbalance, d[2]->imbalance);
      for (const auto& x : d) REQUIRE(x->imbalance <= x->standard_imbalance);
    }
  }
}
