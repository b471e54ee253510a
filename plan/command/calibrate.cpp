// `meshrt plan --calibrate`: this machine, measured, as a cluster file.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "bench/block/plan.h"
#include "bench/collective/collective_bench.h"
#include "bench/common/stats.h"
#include "dist/device_mesh.h"
#include "dist/parallel.h"
#include "kernels/ops.h"
#include "model/block_desc.h"
#include "plan/command/plan_command.h"
#include "runtime/error.h"

namespace meshrt {

namespace {

using bench::Clock;
using bench::ms_since;
using plan::ClusterSpec;
using plan::ModelSpec;

struct Measured {
  std::vector<std::pair<double, double>> gemm;      // (flops, FLOP/s)
  double attn_fwd = 0, attn_bwd = 0;                // model FLOP/s (causal at half)
  double mem_bw = 0;                                // bytes/s
  double gemm_alone = 0, coll_alone = 0, both = 0;  // seconds
};

// Median of `reps` runs of fn after one warm-up, every rank at once (they share the machine as
// the benchmark's ranks do). The median, not the fastest: the planner predicts a typical step, and
// on a shared machine the fastest run is the one that found the cores idle.
template <class F>
double typical(Communicator& world, Stream& cs, int reps, F&& fn) {
  world.barrier(cs);
  fn();
  cs.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    world.barrier(cs);
    cs.synchronize();
    const auto t0 = Clock::now();
    fn();
    cs.synchronize();
    t.push_back(ms_since(t0, Clock::now()) * 1e-3);
  }
  return bench::median(t);
}

// The block's GEMM shapes on a rank (model/block_desc.h: each piece's linears, forward and weight
// gradient; the input gradient has the forward's FLOPs) at tp 1 and `world`, micro-batches 1 and
// 4, measured in rounds (each shape a few times per round) so that a change of the machine's load
// during the calibration moves every shape alike; per shape the median over all rounds, as
// (FLOPs, FLOP/s).
std::vector<std::pair<double, double>> measure_gemms(const ModelSpec& m, Context& ctx,
                                                     Communicator& world, DType dt) {
  Stream& cs = ctx.compute_stream();
  const int W = world.size();
  std::vector<GemmShape> shapes;
  auto add = [&](const GemmShape& g) {
    if (std::find(shapes.begin(), shapes.end(), g) == shapes.end()) shapes.push_back(g);
  };
  std::vector<LinearDesc> linears;
  for (PieceKind p : layer_pieces(LayerKind::Transformer))
    for (const LinearDesc& l : piece_linears(p, m.hidden, m.ffn)) linears.push_back(l);
  for (int tp : {1, W}) {
    for (int64_t mb : {int64_t{1}, int64_t{4}}) {
      for (const LinearDesc& l : linears) add(linear_gemms(l, mb * m.seq, tp).fwd);
      for (const LinearDesc& l : linears) add(linear_gemms(l, mb * m.seq, tp).wgrad);
    }
    if (W == 1) break;
  }
  std::vector<std::vector<double>> times(shapes.size());
  constexpr int kRounds = 3, kPerRound = 3;
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < shapes.size(); ++i) {
      // One shape's operands at a time (the caching allocator keeps them cheap to remake).
      const GemmShape& g = shapes[i];
      Tensor a = ctx.empty({g.m, g.k}, dt), b = ctx.empty({g.k, g.n}, dt),
             c = ctx.empty({g.m, g.n}, dt);
      a.fill_(0.5, cs);
      b.fill_(0.25, cs);
      // Each sample after its own untimed run, as the validated calibrations were taken (one
      // warm-up per round gave small GEMMs 12-15% lower rates in one comparison, and a 9.8%
      // median error where this gave 3.2%).
      for (int rep = 0; rep < kPerRound; ++rep)
        times[i].push_back(
            typical(world, cs, 1, [&] { ops::gemm(ctx, cs, a, false, b, false, c); }));
    }
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < shapes.size(); ++i)
    out.push_back({shapes[i].flops(), shapes[i].flops() / bench::median(times[i])});
  return out;
}

// Attention on the block's shapes (tp = 1, micro-batch 1): model FLOP/s of the forward and the
// backward (causal at half).
std::pair<double, double> measure_attention(const ModelSpec& m, Context& ctx, Communicator& world,
                                            DType dt) {
  Stream& cs = ctx.compute_stream();
  const int64_t h = m.hidden, s = m.seq;
  const int64_t d = h / m.heads;
  const Shape sh{1, m.heads, s, d};
  Tensor q = ctx.empty(sh, dt), k = ctx.empty(sh, dt), v = ctx.empty(sh, dt),
         out = ctx.empty(sh, dt);
  Tensor lse = ctx.empty({1, m.heads, s}, DType::f32);
  Tensor dout = ctx.empty(sh, dt), dq = ctx.empty(sh, dt), dk = ctx.empty(sh, dt),
         dv = ctx.empty(sh, dt);
  for (Tensor* t : {&q, &k, &v, &dout})
    t->init_philox_({3, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, cs);
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const double fl = attention_core_flops(1, s, h) / 2;  // causal: counted at half
  const double tf =
      typical(world, cs, 5, [&] { ops::attention_fwd(ctx, cs, q, k, v, out, lse, scale); });
  const double tb = typical(world, cs, 5, [&] {
    ops::attention_bwd(ctx, cs, q, k, v, out, dout, lse, dq, dk, dv, scale);
  });
  return {fl / tf, 2 * fl / tb};
}

// Elementwise: the bytes/s of the non-GEMM kernels of one attention + MLP block, forward and
// backward, on one sequence (tp = 1), as model/blocks.cpp runs them: norms, bias + GeLU, residual
// adds and the head layout copies. The rate is the bytes the cost model charges for them
// (Block::ew: 38 activations of [seq, hidden] and 5 of [seq, ffn]) over their measured time, so
// kernels slower than their bytes (GeLU's exp, the norms' passes, strided copies) weigh as in a
// real step.
double measure_elementwise(const ModelSpec& m, Context& ctx, Communicator& world, DType dt) {
  Stream& cs = ctx.compute_stream();
  const int64_t h = m.hidden, f = m.ffn, s = m.seq;
  const int64_t H = m.heads, d = h / m.heads;
  Tensor x = ctx.empty({s, 1, h}, dt), ln = ctx.empty({s, 1, h}, dt), y = ctx.empty({s, 1, h}, dt);
  Tensor out = ctx.empty({s, 1, h}, dt), dx = ctx.empty({s, 1, h}, dt);
  Tensor mean = ctx.empty({s}, DType::f32), rstd = ctx.empty({s}, DType::f32);
  Tensor gamma = ctx.empty({h}, dt), beta = ctx.empty({h}, dt), dgamma = ctx.empty({h}, dt),
         dbeta = ctx.empty({h}, dt);
  Tensor h1 = ctx.empty({s, 1, f}, dt), g = ctx.empty({s, 1, f}, dt), dh = ctx.empty({s, 1, f}, dt);
  Tensor bias = ctx.empty({f}, dt), dbias = ctx.empty({f}, dt);
  Tensor qkv = ctx.empty({s, 1, H, 3, d}, dt), attn = ctx.empty({s, 1, H, d}, dt);
  Tensor q = ctx.empty({1, H, s, d}, dt), k = ctx.empty({1, H, s, d}, dt),
         v = ctx.empty({1, H, s, d}, dt), o = ctx.empty({1, H, s, d}, dt);
  for (Tensor* t : {&x, &y, &h1, &g, &qkv, &o})
    t->init_philox_({5, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, cs);
  for (Tensor* t : {&gamma, &bias}) t->fill_(1.0, cs);
  for (Tensor* t : {&beta, &dgamma, &dbeta, &dbias}) t->fill_(0.0, cs);
  auto bhsd = [](const Tensor& t) { return t.transpose(0, 1).transpose(1, 2); };
  const double t = typical(world, cs, 9, [&] {
    for (int piece = 0; piece < 2; ++piece) {  // forward: attention, MLP
      ops::layernorm_fwd(ctx, cs, x, gamma, &beta, ln, mean, rstd);
      if (piece == 0) {
        q.copy_(bhsd(qkv.select(3, 0)), cs);
        k.copy_(bhsd(qkv.select(3, 1)), cs);
        v.copy_(bhsd(qkv.select(3, 2)), cs);
        bhsd(attn).copy_(o, cs);
      } else {
        ops::bias_gelu_fwd(ctx, cs, h1, &bias, g);
      }
      ops::add(ctx, cs, x, y, out);
    }
    for (int piece = 1; piece >= 0; --piece) {  // backward: MLP, attention
      if (piece == 1) {
        ops::bias_gelu_bwd(ctx, cs, g, h1, &bias, dh, &dbias, ops::GeluKind::Tanh, true);
      } else {
        o.copy_(bhsd(attn), cs);
        bhsd(qkv.select(3, 0)).copy_(q, cs);
        bhsd(qkv.select(3, 1)).copy_(k, cs);
        bhsd(qkv.select(3, 2)).copy_(v, cs);
      }
      ops::layernorm_bwd(ctx, cs, y, x, gamma, mean, rstd, dx, &dgamma, &dbeta, true);
      ops::add(ctx, cs, dx, y, dx);
    }
  });
  const double es = static_cast<double>(dtype_size(dt));
  return (38.0 * static_cast<double>(s * h) + 5.0 * static_cast<double>(s * f)) * es / t;
}

// Overlap (more than one rank): an all-reduce of one micro-batch's activations on the tp stream
// during a GEMM, as the block's backward runs them, against each alone.
void measure_overlap(const ModelSpec& m, Context& ctx, Communicator& world, DType dt, Measured& r) {
  Stream& cs = ctx.compute_stream();
  const int W = world.size();
  const int64_t h = m.hidden, f = m.ffn, s = m.seq;
  DeviceMesh mesh(ctx, world, std::string(kTpDim) + "=" + std::to_string(W));
  CommScheduler sch(mesh, kTpDim, Overlap::Async);
  // Sizes where both take a comparable time on a host (a GEMM of half a sequence x hidden x
  // ffn, an all-reduce of 32 sequences' activations).
  const int64_t T = std::max<int64_t>(1, s / 2);
  Tensor x = ctx.empty({T, h}, dt), w = ctx.empty({h, f}, dt), y = ctx.empty({T, f}, dt);
  Tensor t = ctx.empty({32 * s, h}, dt);
  x.fill_(0.5, cs);
  w.fill_(0.25, cs);
  t.fill_(1.0, cs);
  r.gemm_alone = typical(world, cs, 11, [&] { ops::gemm(ctx, cs, x, false, w, false, y); });
  r.coll_alone = typical(world, cs, 11, [&] { sch.wait(sch.all_reduce(t, "calibrate")); });
  r.both = typical(world, cs, 11, [&] {
    Event e = sch.all_reduce(t, "calibrate");
    ops::gemm(ctx, cs, x, false, w, false, y);
    sch.wait(e);
  });
}

Measured measure_rank(const ModelSpec& m, const RankPlacement& rp, Communicator& world) {
  ContextOptions co;
  co.rank = rp.rank;
  co.world_size = rp.world_size;
  co.local_ranks = rp.local_size;
  Context ctx(rp.device, co);
  const DType dt = m.dtype;
  Measured r;
  r.gemm = measure_gemms(m, ctx, world, dt);
  std::tie(r.attn_fwd, r.attn_bwd) = measure_attention(m, ctx, world, dt);
  r.mem_bw = measure_elementwise(m, ctx, world, dt);
  if (world.size() > 1) measure_overlap(m, ctx, world, dt, r);
  ctx.synchronize();
  return r;
}

// Latency and bus bandwidth of one collective from `meshrt bench collective`'s engine at a few
// sizes: least squares of time = latency + bytes x factor / busbw.
plan::LinkSpec measure_collective(const std::string& op, const std::string& devices,
                                  const std::string& dtype, std::ostream& log) {
  CollBenchOptions o;
  o.op = op;
  o.devices = devices;
  o.dtype = dtype;
  o.min_bytes = 256 << 10;
  o.max_bytes = 16 << 20;
  o.step_factor = 4;
  o.warmup = 2;
  o.iters = 5;
  o.check = false;
  char tmpl[] = "/tmp/meshrt-calibrate-XXXXXX";
  const int fd = mkstemp(tmpl);
  MESHRT_CHECK(fd >= 0, "--calibrate: cannot create a temporary file in /tmp");
  close(fd);
  o.json_path = tmpl;
  std::ostringstream table;
  run_collective_bench(o, table);
  nlohmann::json j;
  {
    std::ifstream f(o.json_path);
    f >> j;
  }
  std::filesystem::remove(o.json_path);
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0, best_bw = 0;
  for (const auto& r : j.at("results")) {
    const auto& t = r.at("out_of_place");
    const double us = t.at("time_us_reported").get<double>();
    const double bus = t.at("busbw_gbps").get<double>();
    const double x = bus * 1e9 * us * 1e-6;  // bytes x factor
    sx += x;
    sy += us * 1e-6;
    sxx += x * x;
    sxy += x * us * 1e-6;
    n += 1;
    best_bw = std::max(best_bw, bus);
  }
  plan::LinkSpec l;
  const double den = n * sxx - sx * sx;
  const double slope = den > 0 ? (n * sxy - sx * sy) / den : 0;
  const double icpt = n > 0 ? (sy - slope * sx) / n : 0;
  if (slope > 0 && icpt >= 0) {
    l.busbw_gbps = 1.0 / slope / 1e9;
    l.latency_us = icpt * 1e6;
  } else {
    l.busbw_gbps = best_bw;
    l.latency_us = 0;
  }
  log << "  " << op << ": bus bandwidth " << bench::fmt("%.2f", l.busbw_gbps) << " GB/s, latency "
      << bench::fmt("%.0f", l.latency_us) << " us (" << n << " sizes, 256 KiB - 16 MiB)\n";
  return l;
}

}  // namespace

ClusterSpec calibrate_cluster(const ModelSpec& m, const std::string& devices, std::ostream& log) {
  BlockBenchOptions bo;
  bo.devices = devices;
  std::string used;
  std::unique_ptr<Launch> launch = launch_for(bo, &used);
  MESHRT_CHECK(launch->kind() == LaunchKind::Threads,
               "--calibrate runs ranks as threads of one process; run it without mpirun");
  const bool cuda = launch->local().front().device.is_cuda();
  log << "calibrating on " << used << " (" << launch->world_size() << " ranks), "
      << dtype_name(m.dtype) << ", shapes of hidden " << m.hidden << ", ffn " << m.ffn << ", seq "
      << m.seq << "\n";
  // A step runs at the pace of its slowest rank (ranks that share a host's cores are not equally
  // fast: `meshrt bench block` reports the skew), so each figure is the slowest rank's.
  std::mutex mu;
  std::vector<Measured> all;
  launch->run([&](const RankPlacement& rp, Communicator& world) {
    Measured r = measure_rank(m, rp, world);
    std::lock_guard<std::mutex> lk(mu);
    all.push_back(std::move(r));
  });
  MESHRT_CHECK(!all.empty(), "--calibrate: no rank reported its measurements");
  Measured slow = all.front();
  for (const Measured& r : all) {
    for (size_t i = 0; i < slow.gemm.size() && i < r.gemm.size(); ++i)
      slow.gemm[i].second = std::min(slow.gemm[i].second, r.gemm[i].second);
    slow.attn_fwd = std::min(slow.attn_fwd, r.attn_fwd);
    slow.attn_bwd = std::min(slow.attn_bwd, r.attn_bwd);
    slow.mem_bw = std::min(slow.mem_bw, r.mem_bw);
    slow.gemm_alone = std::max(slow.gemm_alone, r.gemm_alone);
    slow.coll_alone = std::max(slow.coll_alone, r.coll_alone);
    slow.both = std::max(slow.both, r.both);
  }
  const int W = launch->world_size();
  ClusterSpec c;
  c.name = "measured " + used;
  c.device = cuda ? "CUDA device" : "host CPU rank";
  c.devices_per_node = W;
  c.nodes = 1;
  double peak = 0;
  for (const auto& [fl, rate] : slow.gemm) peak = std::max(peak, rate);
  c.peaks[dtype_name(m.dtype)] = peak / 1e12;
  std::sort(slow.gemm.begin(), slow.gemm.end());
  for (const auto& [fl, rate] : slow.gemm) {
    // Equal FLOPs (different shapes): one point, their mean.
    if (!c.gemm_eff.empty() && fl <= c.gemm_eff.back().first * 1.01) {
      c.gemm_eff.back().second = 0.5 * (c.gemm_eff.back().second + rate / peak);
      continue;
    }
    c.gemm_eff.push_back({fl, rate / peak});
  }
  // A GEMM's efficiency does not fall with its size on an idle machine; on a shared one short
  // GEMMs look faster (they fit in a time slice). Pool adjacent violators: the non-decreasing
  // curve closest to the measurements (each point's weight: the GEMMs it averages).
  {
    struct Block {
      double sum, n;
      size_t last;
    };
    std::vector<Block> blocks;
    for (size_t i = 0; i < c.gemm_eff.size(); ++i) {
      blocks.push_back({c.gemm_eff[i].second, 1, i});
      while (blocks.size() > 1 && blocks[blocks.size() - 2].sum / blocks[blocks.size() - 2].n >
                                      blocks.back().sum / blocks.back().n) {
        Block b = blocks.back();
        blocks.pop_back();
        blocks.back().sum += b.sum;
        blocks.back().n += b.n;
        blocks.back().last = b.last;
      }
    }
    size_t i = 0;
    for (const Block& b : blocks)
      for (; i <= b.last; ++i) c.gemm_eff[i].second = b.sum / b.n;
  }
  c.attention_eff = slow.attn_fwd / peak;
  c.attention_bwd_efficiency = slow.attn_bwd / peak;
  c.mem_bw_gbps = slow.mem_bw / 1e9;
  c.overlap_eff = 1.0;
  if (W > 1 && slow.gemm_alone > 0 && slow.coll_alone > 0) {
    const double hidden = slow.gemm_alone + slow.coll_alone - slow.both;
    c.overlap_eff = std::clamp(hidden / std::min(slow.gemm_alone, slow.coll_alone), 0.0, 1.0);
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  c.memory_gib = cuda ? 0
                      : static_cast<double>(pages) * static_cast<double>(page) /
                            (1024.0 * 1024.0 * 1024.0) / W;
  log << "  GEMM peak " << bench::fmt("%.1f", peak / 1e9) << " GFLOP/s per rank ("
      << slow.gemm.size() << " shapes), attention fwd / bwd "
      << bench::fmt("%.0f", 100 * c.attention_eff) << "% / "
      << bench::fmt("%.0f", 100 * c.attention_bwd_efficiency) << "% of it, elementwise "
      << bench::fmt("%.2f", c.mem_bw_gbps) << " GB/s, overlap " << bench::fmt("%.2f", c.overlap_eff)
      << " (gemm " << bench::fmt("%.1f", slow.gemm_alone * 1e3) << " ms, all-reduce "
      << bench::fmt("%.1f", slow.coll_alone * 1e3) << " ms, both "
      << bench::fmt("%.1f", slow.both * 1e3) << " ms)\n";
  for (CommOp op : {CommOp::AllGather, CommOp::ReduceScatter, CommOp::AllReduce}) {
    const int i = plan::link_index(op);
    c.intra[i] = W > 1 ? measure_collective(comm_op_name(op), used, dtype_name(m.dtype), log)
                       : plan::LinkSpec{1, 0};
    c.inter[i] = c.intra[i];  // one machine: no inter-node link
  }
  c.sources = "meshrt plan --calibrate on this machine";
  return c;
}

}  // namespace meshrt
