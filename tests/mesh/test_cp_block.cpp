// Context parallelism through the block (a cp mesh dim): each cp rank holds its CpLayout shard of
// the sequence through norms, MLP and residuals, the attention exchanges K/V over cp (ring and
// all-gather), and the gradients reduce over dp x cp. Outputs, input gradients and every weight
// gradient equal the same mesh without cp; bad layouts are refused naming the values.
#include <catch2/catch.hpp>

#include <map>
#include <mutex>

#include "dist/context_parallel.h"
#include "dist/data_parallel.h"
#include "model/blocks.h"
#include "runtime/error.h"
#include "tests/mesh/harness.h"

using namespace meshrt;
using meshrt::test::rel_err;
using meshrt::test::run_ranks;

namespace {

constexpr int64_t kSeq = 16, kBatch = 2;  // batch per dp replica

BlockConfig cp_config() {
  BlockConfig c;
  c.hidden = 32;
  c.ffn = 64;
  c.heads = 4;
  c.init_std = 0.2f;
  c.param_noise = 0.3f;
  c.seed = 5;
  return c;
}

using Result = std::map<std::string, std::vector<double>>;

// The rows of the global [seq, batch x dp, hidden] tensors this rank holds: its dp replica's
// batch, its cp shard of the sequence (chunks i and 2cp-1-i), its tp part of that under SP.
struct RankRows {
  CpLayout layout;
  int cp_rank = 0;
  int64_t lo = 0, rows = 0, batch0 = 0;
  // The global sequence position of local row i.
  int64_t pos(int64_t i) const { return layout.global_pos(cp_rank, lo + i); }
};

Tensor local_rows(Context& ctx, const RankRows& rr, const Tensor& full) {
  Stream& s = ctx.compute_stream();
  Tensor t = ctx.empty({rr.rows, kBatch, full.size(2)}, full.dtype());
  for (int64_t i = 0; i < rr.rows; ++i)
    t.select(0, i).copy_(full.select(0, rr.pos(i)).narrow(0, rr.batch0, kBatch), s);
  return t;
}

// The global tensor on every rank: each rank's rows (tp rank 0's when tp replicates them),
// summed over the world.
std::vector<double> gather_rows(Context& ctx, Communicator& world, const RankRows& rr,
                                const Tensor& local, int64_t global_batch, bool owner) {
  Stream& s = ctx.compute_stream();
  Tensor full = ctx.zeros({kSeq, global_batch, local.size(2)}, DType::f32);
  if (owner)
    for (int64_t i = 0; i < rr.rows; ++i)
      full.select(0, rr.pos(i)).narrow(0, rr.batch0, kBatch).copy_(local.select(0, i), s);
  world.all_reduce(full, ReduceOp::Sum, s);
  s.synchronize();
  return full.to_vector();
}

// One forward + backward of a transformer block on `spec` (dims dp, cp, tp), the gradients
// reduced by GradSync; everything gathered to global tensors (rank 0's).
Result run_cp_block(const std::string& spec, int world_size, CpComm how, bool sp) {
  Result res;
  std::mutex mu;
  run_ranks(world_size, [&](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, spec);
    const int dp = mesh.size(kDpDim), cp = mesh.size(kCpDim), tp = mesh.size(kTpDim);
    const TpOptions opt{sp && tp > 1, Overlap::Async};
    CommScheduler sched(mesh, kTpDim, opt.overlap);
    Stream& s = ctx.compute_stream();
    BlockConfig cfg = cp_config();
    cfg.cp_comm = how;
    validate_block(cfg, tp, opt, kSeq, true, {}, cp);
    TransformerBlock block(mesh, sched, opt, cfg, "b", 0);
    std::vector<Param*> params = block.params();
    GradSync sync(mesh, params, DpOptions{});

    const int64_t gb = kBatch * dp;
    Tensor x_full = ctx.empty({kSeq, gb, cfg.hidden}, DType::f32);
    x_full.init_philox_({77, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
    Tensor dout_full = ctx.empty({kSeq, gb, cfg.hidden}, DType::f32);
    dout_full.init_philox_({77, 2, PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
    RankRows rr{CpLayout::make(kSeq, cp), mesh.coord(kCpDim)};
    rr.rows = opt.sequence_parallel ? rr.layout.local_seq() / tp : rr.layout.local_seq();
    rr.lo = opt.sequence_parallel ? mesh.coord(kTpDim) * rr.rows : 0;
    rr.batch0 = mesh.coord(kDpDim) * kBatch;

    Tensor out = block.forward(local_rows(ctx, rr, x_full));
    Tensor dx = block.backward(local_rows(ctx, rr, dout_full));
    sync.mark_ready(params, &sched);
    sync.finish();
    sync.wait_all();
    const bool owner = opt.sequence_parallel || mesh.coord(kTpDim) == 0;
    Result mine;
    mine["out"] = gather_rows(ctx, world, rr, out, gb, owner);
    mine["dx"] = gather_rows(ctx, world, rr, dx, gb, owner);
    for (Param* p : params) {
      Tensor f = full_tensor(p->grad, mesh, p->placements, s);
      s.synchronize();
      mine["grad:" + p->name] = f.to_vector();
    }
    ctx.synchronize();
    std::lock_guard<std::mutex> lk(mu);
    if (r == 0) res = std::move(mine);
  });
  return res;
}

void compare(const Result& got, const Result& ref) {
  REQUIRE(got.size() == ref.size());
  for (const auto& [name, v] : ref) {
    INFO("tensor " << name);
    REQUIRE(got.count(name) == 1);
    const double e = rel_err(got.at(name), v);
    INFO("relative error " << e);
    CHECK(e <= 2e-5);  // f32 rounding: the cp attention merges partial softmaxes
  }
}

}  // namespace

TEST_CASE("a cp block equals the same mesh without cp (cp 2 and 4, ring and allgather)",
          "[cp][multirank]") {
  struct Layout {
    std::string cp_spec, ref_spec;
    int world, ref_world;
    bool sp;
  };
  const Layout layouts[] = {
      {"cp=2", "tp=1", 2, 1, false},      {"cp=4", "tp=1", 4, 1, false},
      {"cp=2,tp=2", "tp=2", 4, 2, true},   // heads over tp, SP inside the cp shard
      {"cp=2,tp=2", "tp=2", 4, 2, false},  // tp replicates the cp shard
      {"dp=2,cp=2", "dp=2", 4, 2, false},  // gradients summed over cp, averaged over dp
  };
  for (const Layout& l : layouts) {
    const Result ref = run_cp_block(l.ref_spec, l.ref_world, CpComm::Ring, l.sp);
    for (CpComm how : {CpComm::Ring, CpComm::AllGather}) {
      INFO(l.cp_spec << " (sp " << l.sp << ") against " << l.ref_spec << ", " << cp_comm_name(how));
      compare(run_cp_block(l.cp_spec, l.world, how, l.sp), ref);
    }
  }
}

TEST_CASE("ZeRO 2 at cp=2 shards the cp=1 gradient over dp x cp", "[cp][multirank]") {
  const Result ref = run_cp_block("tp=1", 1, CpComm::Ring, false);
  Result got;
  std::mutex mu;
  run_ranks(2, [&](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "cp=2");
    CommScheduler sched(mesh, kTpDim, Overlap::Async);
    Stream& s = ctx.compute_stream();
    TransformerBlock block(mesh, sched, TpOptions{}, cp_config(), "b", 0);
    std::vector<Param*> params = block.params();
    DpOptions o;
    o.zero = 2;
    GradSync sync(mesh, params, o);
    Tensor x_full = ctx.empty({kSeq, kBatch, 32}, DType::f32);
    x_full.init_philox_({77, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
    Tensor dout_full = ctx.empty({kSeq, kBatch, 32}, DType::f32);
    dout_full.init_philox_({77, 2, PhiloxInit::Dist::Normal, 0.f, 1.f}, s);
    RankRows rr{CpLayout::make(kSeq, 2), r};
    rr.rows = rr.layout.local_seq();
    block.forward(local_rows(ctx, rr, x_full));
    sync.prepare_grads(params);
    block.backward(local_rows(ctx, rr, dout_full));
    sync.mark_ready(params, &sched);
    sync.finish();
    sync.wait_all();
    Result mine;
    for (int b = 0; b < sync.num_buckets(); ++b) {
      // Each rank holds padded / 2 elements of the bucket: gathered, the whole reduced bucket.
      REQUIRE(sync.grad_shard(b).numel() * 2 == sync.padded_numel(b));
      Tensor all = ctx.empty({sync.padded_numel(b)}, DType::f32);
      mesh.group(kDpCpDim).all_gather(sync.grad_shard(b), all, s);
      s.synchronize();
      const std::vector<double> v = all.to_vector();
      for (int i = 0; i < static_cast<int>(sync.bucket(b).size()); ++i) {
        const Param* p = sync.bucket(b)[static_cast<size_t>(i)];
        const auto at = v.begin() + sync.bucket_offset(b, i);
        mine["grad:" + p->name] = std::vector<double>(at, at + p->full_shape.numel());
      }
    }
    ctx.synchronize();
    std::lock_guard<std::mutex> lk(mu);
    if (r == 0) got = std::move(mine);
  });
  Result ref_grads;
  for (const auto& [name, v] : ref)
    if (name.rfind("grad:", 0) == 0) ref_grads[name] = v;
  compare(got, ref_grads);
}

TEST_CASE("the mesh flattens dp x cp into the gradient group", "[cp][multirank]") {
  run_ranks(4, [&](int r, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "dp=2,cp=2");
    REQUIRE(mesh.grad_dim() == kDpCpDim);
    REQUIRE(mesh.size(kDpCpDim) == 4);
    REQUIRE(mesh.coord(kDpCpDim) == r);
    REQUIRE(mesh.group(kDpCpDim).size() == 4);
    DeviceMesh plain(ctx, world, "dp=2,tp=2");
    REQUIRE(plain.grad_dim() == kDpDim);
    REQUIRE(plain.size(kDpCpDim) == 2);
  });
}

TEST_CASE("cp layouts that cannot work are refused naming the values", "[cp][multirank]") {
  const BlockConfig c = cp_config();
  REQUIRE_THROWS_WITH(validate_block(c, 1, TpOptions{}, 18, true, {}, 4),
                      Catch::Contains("block: sequence 18 does not divide by 2 x cp = 8 (cp=4)") &&
                          Catch::Contains("change --seq or the mesh's cp"));
  // 20 tokens over cp=2: 10 per cp rank, which tp=4 does not divide under SP.
  REQUIRE_THROWS_WITH(
      validate_block(c, 4, TpOptions{true, Overlap::Async}, 20, true, {}, 2),
      Catch::Contains("sequence 10 (a cp rank's share of the sequence) does not divide by tp=4"));
  REQUIRE_NOTHROW(validate_block(c, 4, TpOptions{true, Overlap::Async}, 16, true, {}, 2));
  REQUIRE_THROWS_WITH(parse_cp_comm("tree"),
                      Catch::Contains("cp exchange 'tree' must be ring or allgather"));
  run_ranks(2, [&](int, Communicator& world, Context& ctx) {
    DeviceMesh mesh(ctx, world, "cp=2");
    Param p = make_param_const(
        mesh, "w", 1, {4}, placements_on(mesh, kCpDim, Placement::replicate()), DType::f32, 1.0);
    DpOptions o;
    o.deterministic = true;
    REQUIRE_THROWS_WITH(GradSync(mesh, {&p}, o),
                        Catch::Contains("--deterministic sums each sequence's gradient whole, and "
                                        "cp=2 splits the sequences over ranks"));
  });
}
