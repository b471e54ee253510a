// The blocks' description (model/block_desc.h) against the executors: the GEMMs model/blocks.cpp
// and model/linear.cpp really issue (seen through the profiler range ops::gemm opens) are the
// description's, and its FLOP counts are its GEMMs'.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "model/block_desc.h"
#include "model/blocks.h"
#include "runtime/error.h"
#include "runtime/ranges.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using meshrt::test::run_ranks;

namespace {

std::string desc_gemm_name(const GemmShape& g) {
  return "gemm " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
}

// The GEMMs of one piece's forward and backward on a rank, from the description, sorted.
std::vector<std::string> desc_piece_gemms(PieceKind piece, const BlockConfig& cfg, int64_t tokens,
                                          int tp, bool sp, Overlap ov) {
  std::vector<std::string> out;
  for (const LinearDesc& l : piece_linears(piece, cfg.hidden, cfg.ffn)) {
    const LinearGemms g = linear_gemms(l, tokens, tp);
    const LinearGemms shard = linear_gemms(l, tokens / tp, tp);
    if (sp && ov == Overlap::Chunked) {
      // tp chunks of the sequence, each as tp GEMMs of tokens / tp^2 rows.
      const std::string chunk = desc_gemm_name(linear_gemms(l, tokens / (tp * tp), tp).fwd);
      for (int i = 0; i < tp * tp; ++i) out.push_back(chunk);
    } else if (sp && ov == Overlap::Async) {
      // One sequence shard at a time: colwise over the gathered input, the own shard first;
      // rowwise the output rows each rank owns, the other ranks' first.
      for (int i = 0; i < tp; ++i) out.push_back(desc_gemm_name(shard.fwd));
    } else {
      out.push_back(desc_gemm_name(g.fwd));
    }
    if (sp && ov != Overlap::None && !l.colwise()) {
      // A rowwise dgrad over the gathered dy, likewise one sequence shard at a time.
      for (int i = 0; i < tp; ++i) out.push_back(desc_gemm_name(shard.dgrad));
    } else {
      out.push_back(desc_gemm_name(g.dgrad));
    }
    out.push_back(desc_gemm_name(g.wgrad));
    if (g.has_bias_gemm && cfg.bias) out.push_back(desc_gemm_name(g.bias));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One forward + backward of the piece on tp thread ranks; the GEMMs rank 0 issued, sorted.
std::vector<std::string> observed_piece_gemms(PieceKind piece, const BlockConfig& cfg, int64_t seq,
                                              int64_t batch, int tp, const TpOptions& opt) {
  std::mutex mu;
  std::thread::id rank0;
  std::vector<std::string> seen;
  ranges::ObserverGuard guard([&](bool push, const std::string& name, uint64_t) {
    if (!push || name.rfind("gemm ", 0) != 0) return;
    std::lock_guard<std::mutex> lk(mu);
    if (std::this_thread::get_id() == rank0) seen.push_back(name);
  });
  run_ranks(tp, [&](int r, Communicator& world, Context& ctx) {
    if (r == 0) {
      std::lock_guard<std::mutex> lk(mu);
      rank0 = std::this_thread::get_id();
    }
    DeviceMesh mesh(ctx, world, "tp=" + std::to_string(tp));
    CommScheduler sched(mesh, kTpDim, opt.overlap);
    const bool sp = opt.sequence_parallel && tp > 1;
    Stream& s = ctx.compute_stream();
    Tensor x = ctx.empty({sp ? seq / tp : seq, batch, cfg.hidden}, cfg.dtype);
    x.init_philox_({5, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
    std::unique_ptr<Block> b;
    if (piece == PieceKind::Attention)
      b = std::make_unique<AttentionBlock>(mesh, sched, opt, cfg, "b", 0);
    else
      b = std::make_unique<MlpBlock>(mesh, sched, opt, cfg, "b", 0);
    Tensor out = b->forward(x);
    b->backward(out);
    ctx.synchronize();
  });
  std::sort(seen.begin(), seen.end());
  return seen;
}

}  // namespace

TEST_CASE("block description: the executors issue exactly the described GEMMs", "[multirank]") {
  const int64_t seq = 16, batch = 2;
  BlockConfig cfg;
  cfg.hidden = 32;
  cfg.ffn = 48;  // 48 / 2: even; the uneven case below
  cfg.heads = 4;
  cfg.dtype = DType::f32;
  struct Case {
    int tp;
    bool sp;
    Overlap ov;
  };
  for (const Case& c : {Case{1, false, Overlap::Async}, Case{2, false, Overlap::Async},
                        Case{2, true, Overlap::Async}, Case{2, true, Overlap::Chunked},
                        Case{2, true, Overlap::None}}) {
    for (PieceKind piece : {PieceKind::Attention, PieceKind::Mlp}) {
      for (bool bias : {true, false}) {
        cfg.bias = bias;
        INFO("tp " << c.tp << " sp " << c.sp << " overlap " << overlap_name(c.ov) << " piece "
                   << (piece == PieceKind::Attention ? "attn" : "mlp") << " bias " << bias);
        const TpOptions opt{c.sp, c.ov};
        const auto want = desc_piece_gemms(piece, cfg, seq * batch, c.tp, c.sp, c.ov);
        CHECK(!want.empty());
        CHECK(observed_piece_gemms(piece, cfg, seq, batch, c.tp, opt) == want);
      }
    }
  }
  // An ffn that tp does not divide: rank 0 holds the larger shard.
  cfg.ffn = 50;
  cfg.bias = true;
  const auto want = desc_piece_gemms(PieceKind::Mlp, cfg, seq * batch, 4, false, Overlap::Async);
  // fc1 forward and weight gradient, fc2 input gradient: 13 = ceil(50 / 4) columns.
  CHECK(std::count(want.begin(), want.end(), "gemm 32x13x32") == 3);
  CHECK(observed_piece_gemms(PieceKind::Mlp, cfg, seq, batch, 4, {false, Overlap::Async}) == want);
}

TEST_CASE("block description: pieces, names, parameters and FLOPs", "[multirank]") {
  CHECK(layer_pieces(LayerKind::Transformer) ==
        std::vector<PieceKind>{PieceKind::Attention, PieceKind::Mlp});
  CHECK(layer_pieces(LayerKind::Mlp) == std::vector<PieceKind>{PieceKind::Mlp});
  CHECK(layer_pieces(LayerKind::Attention) == std::vector<PieceKind>{PieceKind::Attention});
  for (LayerKind k : {LayerKind::Transformer, LayerKind::Mlp, LayerKind::Attention})
    CHECK(parse_layer_kind(layer_kind_name(k)) == k);
  CHECK(parse_layer_kind("transformer") == LayerKind::Transformer);
  CHECK(parse_layer_kind("attention") == LayerKind::Attention);
  REQUIRE_THROWS_WITH(
      parse_layer_kind("moe"),
      Catch::StartsWith("unknown block kind 'moe': use block (attention + MLP), mlp or attn"));
  for (Overlap o : {Overlap::None, Overlap::Async, Overlap::Chunked})
    CHECK(parse_overlap(overlap_name(o)) == o);
  REQUIRE_THROWS_WITH(
      parse_overlap("eager"),
      Catch::StartsWith("unknown overlap mode 'eager': use none, async or chunked"));

  // Parameters in forward order: norm gain, bias, then weight and bias of each linear.
  CHECK(piece_param_counts(PieceKind::Attention, 8, 20, 2) ==
        std::vector<int64_t>{8, 8, 8 * 12, 12, 4 * 8, 8});
  CHECK(piece_param_counts(PieceKind::Mlp, 8, 21, 2) ==
        std::vector<int64_t>{8, 8, 8 * 11, 11, 11 * 8, 8});

  // layer_flops is the linears' forward GEMMs at tp = 1 plus the attention core.
  for (LayerKind k : {LayerKind::Transformer, LayerKind::Mlp, LayerKind::Attention}) {
    const int64_t B = 3, s = 40, h = 96, f = 200;
    double gemms = 0, core = 0;
    for (PieceKind p : layer_pieces(k)) {
      for (const LinearDesc& l : piece_linears(p, h, f))
        gemms += linear_gemms(l, B * s, 1).fwd.flops();
      if (p == PieceKind::Attention) core = attention_core_flops(B, s, h);
    }
    INFO(layer_kind_name(k));
    const LayerFlops lf = layer_flops(k, B, s, h, f, false);
    CHECK(lf.qkv + lf.proj + lf.mlp == gemms);
    CHECK(lf.attn == core);
    CHECK(layer_flops(k, B, s, h, f, true).attn == core / 2);
  }
}

TEST_CASE("block description: parameter shards lie where the executors put them", "[multirank]") {
  // tp = 3: ffn 20 splits unevenly (7, 7, 6); attention's 3 heads one per rank.
  BlockConfig cfg;
  cfg.hidden = 12;
  cfg.heads = 3;
  cfg.ffn = 20;
  const int tp = 3;
  int checked = 0;
  run_ranks(tp, [&](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "tp=3");
    CommScheduler sched(mesh, kTpDim, Overlap::Async);
    for (PieceKind piece : {PieceKind::Attention, PieceKind::Mlp}) {
      std::unique_ptr<Block> b;
      if (piece == PieceKind::Attention)
        b = std::make_unique<AttentionBlock>(mesh, sched, TpOptions{}, cfg, "b", 0);
      else
        b = std::make_unique<MlpBlock>(mesh, sched, TpOptions{}, cfg, "b", 0);
      const std::vector<Param*> ps = b->params();
      std::lock_guard<std::mutex> lk(meshrt::test::catch_mutex());
      REQUIRE(ps.size() == 6);
      for (int i = 0; i < 6; ++i) {
        const Param& p = *ps[static_cast<size_t>(i)];
        const ParamShard want = piece_param_shard(piece, cfg.hidden, cfg.ffn, i, tp, r);
        INFO(p.name << " on tp rank " << r);
        REQUIRE(p.placements.size() == 1);
        CHECK(p.placements[0].is_shard() == want.split);
        const size_t dim = want.split ? static_cast<size_t>(p.placements[0].dim) : 0;
        CHECK(p.offsets[dim] == (want.split ? want.offset : 0));
        CHECK(p.value.size(static_cast<int>(dim)) == want.size);
        ++checked;
      }
    }
  });
  CHECK(checked == 3 * 2 * 6);
  // Uneven: fc1's columns on the last rank, fc2's rows likewise.
  CHECK(piece_param_shard(PieceKind::Mlp, 12, 20, 2, 3, 2).offset == 14);
  CHECK(piece_param_shard(PieceKind::Mlp, 12, 20, 4, 3, 2).size == 6);
  REQUIRE_THROWS_WITH(piece_param_shard(PieceKind::Mlp, 12, 20, 6, 3, 0),
                      Catch::StartsWith("piece_param_shard: parameter 6 of 6"));
}
