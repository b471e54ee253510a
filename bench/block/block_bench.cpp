#include "bench/block/block_bench.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "bench/block/plan.h"
#include "bench/block/report.h"
#include "bench/block/trace.h"
#include "bench/common/stats.h"
#include "dist/context_parallel.h"
#include "dist/data_parallel.h"
#include "kernels/deterministic.h"
#include "kernels/ops.h"
#include "model/dump.h"
#include "model/model.h"
#include "model/stack.h"
#include "runtime/error.h"

namespace meshrt {

namespace {

using bench::Clock;
using bench::fmt;
using bench::ms_since;
using bench::thread_cpu_ms;

// Per-step figures of one rank, packed as int64 for the gather (times in ns).
enum Field : int {
  kStepNs = 0,
  kIssueCpuNs,
  kTpCommNs,
  kTpExposedNs,
  kTpBytes,
  kTpCount,
  kDpCommNs,
  kDpExposedNs,
  kDpBytes,
  kDpCount,
  kCpCommNs,
  kCpExposedNs,
  kCpBytes,
  kCpCount,
  kFields
};
enum Extra : int { kPeakBytes = 0, kReservedBytes, kCalibFlops, kMarkers, kDeviceIndex, kExtras };

int64_t ns(double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); }

void pack(const StepFigures& f, std::vector<int64_t>& out) {
  const int64_t v[kFields] = {
      ns(f.step_ms),    ns(f.issue_cpu_ms),  ns(f.tp.comm_ms),    ns(f.tp.exposed_ms), f.tp.bytes,
      f.tp.count,       ns(f.dp.comm_ms),    ns(f.dp.exposed_ms), f.dp.bytes,          f.dp.count,
      ns(f.cp.comm_ms), ns(f.cp.exposed_ms), f.cp.bytes,          f.cp.count};
  out.insert(out.end(), v, v + kFields);
}

// The gathered [world x (steps * kFields + kExtras)] figures, per rank.
std::vector<RankFigures> unpack(const std::vector<int64_t>& all, int world, int steps) {
  const size_t stride = static_cast<size_t>(steps * kFields + kExtras);
  std::vector<RankFigures> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const int64_t* v = all.data() + static_cast<size_t>(r) * stride;
    RankFigures& rf = out[static_cast<size_t>(r)];
    for (int s = 0; s < steps; ++s, v += kFields) {
      StepFigures f;
      f.step_ms = static_cast<double>(v[kStepNs]) * 1e-6;
      f.issue_cpu_ms = static_cast<double>(v[kIssueCpuNs]) * 1e-6;
      f.tp = {static_cast<double>(v[kTpCommNs]) * 1e-6, static_cast<double>(v[kTpExposedNs]) * 1e-6,
              v[kTpBytes], v[kTpCount]};
      f.dp = {static_cast<double>(v[kDpCommNs]) * 1e-6, static_cast<double>(v[kDpExposedNs]) * 1e-6,
              v[kDpBytes], v[kDpCount]};
      f.cp = {static_cast<double>(v[kCpCommNs]) * 1e-6, static_cast<double>(v[kCpExposedNs]) * 1e-6,
              v[kCpBytes], v[kCpCount]};
      rf.steps.push_back(f);
    }
    rf.peak_bytes = v[kPeakBytes];
    rf.reserved_bytes = v[kReservedBytes];
    rf.calib_flops = static_cast<double>(v[kCalibFlops]);
    rf.markers = v[kMarkers];
    rf.device_index = static_cast<int>(v[kDeviceIndex]);
  }
  return out;
}

// Gathers every rank's int64 vector (same length) to all ranks.
std::vector<int64_t> gather_i64(Context& ctx, Communicator& world, const std::vector<int64_t>& v) {
  Stream& cs = ctx.compute_stream();
  const int64_t n = static_cast<int64_t>(v.size());
  // A copy the queued copy_ owns: an all_gather that throws (a peer failed) unwinds past `v`
  // while the copy may still be queued.
  Tensor h = Tensor::from_host_data(v.data(), {n}, DType::i64);
  Tensor d = ctx.empty({n}, DType::i64);
  d.copy_(h, cs);
  Tensor all = ctx.empty({n * world.size()}, DType::i64);
  world.all_gather(d, all, cs);
  Tensor ah = all.to(ctx.host_allocator(), cs);
  cs.synchronize();
  const int64_t* p = ah.data<int64_t>();
  return std::vector<int64_t>(p, p + n * world.size());
}

// Gathers one string per rank.
std::vector<std::string> gather_strings(Context& ctx, Communicator& world, const std::string& s) {
  std::vector<int64_t> lens = gather_i64(ctx, world, {static_cast<int64_t>(s.size())});
  const int64_t mx = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  Stream& cs = ctx.compute_stream();
  std::string buf = s;
  buf.resize(static_cast<size_t>(mx), ' ');
  Tensor h = Tensor::from_host_data(buf.data(), {mx}, DType::u8);
  Tensor d = ctx.empty({mx}, DType::u8);
  d.copy_(h, cs);
  Tensor all = ctx.empty({mx * world.size()}, DType::u8);
  world.all_gather(d, all, cs);
  Tensor ah = all.to(ctx.host_allocator(), cs);
  cs.synchronize();
  const char* p = static_cast<const char*>(ah.data_ptr());
  std::vector<std::string> out;
  for (int r = 0; r < world.size(); ++r)
    out.emplace_back(p + r * mx, static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

// FLOP/s of an m x n x k GEMM in `dt` on this rank: the fastest of 5 runs after a warm-up run,
// with every rank running it at the same time, as the block's GEMMs do. The fastest, not the
// median: it estimates what the rank can reach, and a shared machine only makes runs slower.
double gemm_flops(Context& ctx, Communicator& world, DType dt, int64_t m, int64_t n, int64_t k) {
  Stream& cs = ctx.compute_stream();
  Tensor a = ctx.empty({m, k}, dt), b = ctx.empty({k, n}, dt), c = ctx.empty({m, n}, dt);
  a.init_philox_({7, 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, cs);
  b.init_philox_({7, 2, PhiloxInit::Dist::Normal, 0.f, 1.f}, cs);
  world.barrier(cs);
  ops::gemm(ctx, cs, a, false, b, false, c);
  cs.synchronize();
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    ops::gemm(ctx, cs, a, false, b, false, c);
    cs.synchronize();
    best = std::min(best, ms_since(t0, Clock::now()));
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
         (best * 1e-3);
}

// The calibration peak of a rank: the faster of a square GEMM (1024^3 on CPU, 8192^3 on CUDA)
// and the block's largest GEMM (fc1: tokens x hidden x ffn / tp).
double calibrate_flops(Context& ctx, Communicator& world, const BlockPlan& p) {
  const int64_t n = p.cuda ? 8192 : 1024;
  const double sq = gemm_flops(ctx, world, p.cfg.dtype, n, n, n);
  const double blk = gemm_flops(ctx, world, p.cfg.dtype, p.batch * p.seq,
                                shard_size(p.cfg.ffn, p.tp, 0), p.cfg.hidden);
  return std::max(sq, blk);
}

// An activation's placements: a batch shard over dp, a sequence shard over tp under SP; cp's
// activations are dumped from cp_full_sequence's tensors, whole along the sequence.
std::vector<Placement> activation_placements(const DeviceMesh& mesh, bool sp) {
  const bool cp = mesh.size(kCpDim) > 1;
  std::vector<Placement> pl;
  for (const MeshDim& d : mesh.dims()) {
    if (d.name == kDpDim)
      pl.push_back(Placement::shard(1));
    else
      pl.push_back(sp && !cp && d.name == kTpDim ? Placement::shard(0) : Placement::replicate());
  }
  return pl;
}

// A cp rank's activation [s_loc, batch, hidden] (its part of the rank's two chunks under SP) as
// the replica's whole sequence [seq, batch, hidden]: gathered over tp (SP), then over cp in
// CpLayout's order.
Tensor cp_full_sequence(const BlockPlan& p, const DeviceMesh& mesh, const Tensor& t) {
  Context& ctx = mesh.ctx();
  Stream& cs = ctx.compute_stream();
  Tensor shard = t.contiguous(cs);
  if (p.sp) {
    Tensor all = ctx.empty({p.tp * t.size(0), t.size(1), t.size(2)}, t.dtype());
    cs.wait(mesh.group(kTpDim).all_gather(shard, all, cs, {cs.record()}));
    shard = all;
  }
  Tensor full = ctx.empty({p.seq, t.size(1), t.size(2)}, t.dtype());
  cp_gather(mesh.group(kCpDim), CpLayout::make(p.seq, p.cp), shard, 0, full, ctx, cs);
  return full;
}

// This replica's batch slice (and sequence shard under SP) of one global input and output
// gradient, so a dump rebuilds the global tensors.
struct BlockInputs {
  Tensor x, dout;
};

BlockInputs block_inputs(Context& ctx, const DeviceMesh& mesh, const BlockPlan& p, uint64_t seed) {
  Stream& cs = ctx.compute_stream();
  // The rank's tokens: its cp shard (CpLayout: chunks i and 2cp-1-i), of which tp rank t holds
  // the t-th contiguous part under SP; rows [lo, lo + s_loc) of the cp shard.
  const CpLayout cl = CpLayout::make(p.seq, p.cp);
  const int64_t s_loc = p.sp ? cl.local_seq() / p.tp : cl.local_seq();
  const int64_t lo = p.sp ? mesh.coord(kTpDim) * s_loc : 0, n = cl.chunk();
  const Shape full{p.seq, p.batch * p.dp, p.cfg.hidden};
  BlockInputs in{ctx.empty({s_loc, p.batch, p.cfg.hidden}, p.cfg.dtype),
                 ctx.empty({s_loc, p.batch, p.cfg.hidden}, p.cfg.dtype)};
  const auto chunks = cl.chunks(mesh.coord(kCpDim));
  for (int64_t j = 0; j < 2; ++j) {  // the part of each chunk in [lo, lo + s_loc)
    const int64_t a = std::max(lo, j * n), b = std::min(lo + s_loc, (j + 1) * n);
    if (a >= b) continue;
    const Shape off{chunks[static_cast<size_t>(j)] * n + (a - j * n), mesh.coord(kDpDim) * p.batch,
                    0};
    in.x.narrow(0, a - lo, b - a)
        .init_philox_({seed, 1u << 20, PhiloxInit::Dist::Normal, 0.f, 1.f}, full, off, cs);
    in.dout.narrow(0, a - lo, b - a)
        .init_philox_({seed, (1u << 20) + 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, full, off, cs);
  }
  return in;
}

// The dp gradient sync's options of this run.
DpOptions dp_options(const BlockBenchOptions& o, const BlockPlan& p) {
  DpOptions dpo;
  dpo.bucket_mb = o.bucket_mb;
  dpo.overlap = p.overlap == Overlap::None ? Overlap::None : Overlap::Async;
  dpo.zero = o.zero;
  dpo.deterministic = o.deterministic;
  return dpo;
}

// The stack's parameters by piece (ZeRO 3's gather units).
std::vector<std::vector<Param*>> stack_pieces(const BlockStack& stack) {
  std::vector<std::vector<Param*>> out;
  for (const StackPiece& pc : stack.pieces()) out.push_back(pc.params);
  return out;
}

// --deterministic's forward and backward (docs/training.md): each grain (`grain` sequences) of the
// rank's batch alone, its gradients pushed into the fixed tree over the global grain index, then
// reduced over dp in fixed order (GradSync::push_grain, reduce_grains).
void deterministic_grains(Context& ctx, const BlockPlan& p, int64_t grain, BlockStack& stack,
                          GradSync& sync, const StackHooks& hooks, const BlockInputs& in,
                          Tensor* out, Tensor* dx) {
  Stream& cs = ctx.compute_stream();
  const int64_t n = p.batch / grain, first = sync.dp_rank() * n;
  sync.enable_sync(false);
  for (int64_t g = 0; g < n; ++g) {
    sync.zero_grad(/*first_write=*/true);
    *out = stack.forward(in.x.narrow(1, g * grain, grain).contiguous(cs), hooks);
    *dx = stack.backward(in.dout.narrow(1, g * grain, grain).contiguous(cs), hooks);
    sync.finish();
    sync.push_grain(first + g);
  }
  sync.reduce_grains(n * p.dp);
  sync.enable_sync(true);
}

// The block's activations and gradients after the last step, for --dump.
struct BlockTensors {
  const Tensor &x, &out, &dout, &dx;
};

// --dump: the input, output, their gradients and the parameters (with their gradients unless
// forward-only), as global tensors; returns the number of tensors written.
int dump_rank(const BlockPlan& p, const BlockBenchOptions& o, const DeviceMesh& mesh,
              const std::vector<Param*>& params, const BlockTensors& t) {
  const auto whole = [&](const Tensor& a) { return p.cp > 1 ? cp_full_sequence(p, mesh, a) : a; };
  const Tensor x = whole(t.x), out = whole(t.out), dout = whole(t.dout), dx = whole(t.dx);
  std::vector<DumpEntry> entries;
  const auto apl = activation_placements(mesh, p.sp);
  entries.push_back({"input", x, apl});
  entries.push_back({"output", out, apl});
  if (!o.fwd_only) {
    entries.push_back({"output.grad", dout, apl});
    entries.push_back({"input.grad", dx, apl});
    add_param_entries(params, entries);
  } else {
    for (Param* q : params) entries.push_back({q->name, q->value, q->placements});
  }
  std::map<std::string, std::string> md = block_metadata(p.cfg);
  md["meshrt.bench"] = std::string("bench ") + layer_kind_name(p.kind);
  md["meshrt.layers"] = std::to_string(p.layers);
  md["meshrt.sp"] = p.sp ? "1" : "0";
  md["meshrt.note"] =
      "input/output: [seq, batch, hidden] (global); grads after the last timed step, averaged "
      "over dp; output.grad is the gradient fed to backward";
  return dump_safetensors(o.dump_path, mesh, entries, md);
}

// What a step runs on: the stack, its gradient sync and the hooks around its pieces.
struct StepRunner {
  BlockStack& stack;
  GradSync& sync;
  const StackHooks& hooks;
};

// One step's work: zero_grad, forward, backward and the dp gradient sync (or --deterministic's
// sequence-by-sequence passes).
void step_work(const BlockPlan& p, const BlockBenchOptions& o, Context& ctx, TraceRecorder& rec,
               const StepRunner& r, const BlockInputs& in, Tensor* out, Tensor* dx) {
  Stream& cs = ctx.compute_stream();
  if (!o.fwd_only) {
    // A new step: no bucket counted or launched yet (else buckets would only launch at
    // finish() from the second step on), gradients zeroed.
    r.sync.set_active(0);
    const int h = rec.begin(cs, "zero_grad");
    r.sync.zero_grad(/*first_write=*/true);  // the stack's backward and finish() run before reads
    rec.end(h);
  }
  if (o.deterministic) {
    deterministic_grains(ctx, p, o.deterministic_grain, r.stack, r.sync, r.hooks, in, out, dx);
  } else {
    *out = r.stack.forward(in.x, r.hooks);
  }
  if (!o.fwd_only && !o.deterministic) {
    *dx = r.stack.backward(in.dout, r.hooks);
    r.sync.finish();
    const int h = rec.begin(cs, "dp.grad_wait");
    r.sync.wait_all();
    rec.end(h);
  }
}

struct RankOutput {
  std::vector<int64_t> all;  // world x (steps * kFields + kExtras)
  std::vector<std::string> traces;
  int dumped = 0;
};

// The benchmark on one rank: the mesh block stack, timed per step, with trace slices and
// profiler ranges attached through its hooks. Rank 0 gets everyone's figures back.
RankOutput run_rank(const BlockPlan& p, const BlockBenchOptions& o, const RankPlacement& rp,
                    Communicator& raw_world) {
  ContextOptions co;
  co.rank = rp.rank;
  co.world_size = rp.world_size;
  co.local_ranks = rp.local_size;
  Context ctx(rp.device, co);
  Stream& cs = ctx.compute_stream();
  TraceRecorder rec(rp.rank, cs);
  const bool tracing = !o.trace_path.empty();
  // Under cp the wrapper also times the cp group's sends and receives on their streams.
  StreamTimes cp_stream("/" + std::string(kCpDim));
  std::unique_ptr<TracingCommunicator> traced;
  if (tracing || p.cp > 1)
    traced =
        std::make_unique<TracingCommunicator>(raw_world, &rec, p.cp > 1 ? &cp_stream : nullptr);
  Communicator& world = traced ? *traced : raw_world;

  // Calibration GEMM before anything else is resident (all ranks at once).
  // It runs again after the timed steps and the faster of the two counts: on a shared machine
  // one measurement can land in a busy moment.
  double calib = 0;
  const bool calibrating = o.peak_tflops <= 0 && o.calibrate;
  if (calibrating) calib = calibrate_flops(ctx, raw_world, p);

  DeviceMesh mesh(ctx, world, p.mesh);
  const TpOptions topt{p.sp, p.overlap};
  CommScheduler tp(mesh, kTpDim, p.overlap);
  // The compute stream's waits for the cp attention's exchanges, timed as exposed.
  CommScheduler cp(mesh, kCpDim, Overlap::Async);
  CpWaitScope cp_waits([&cp](const Event& e) { cp.wait(e); });
  BlockStack stack(mesh, tp, topt, p.cfg, p.kind, p.layers);
  const std::vector<Param*> params = stack.params();
  if (o.deterministic) ops::set_deterministic_gemm(ctx, true);
  GradSync sync(mesh, params, dp_options(o, p), 1, stack_pieces(stack));
  sync.broadcast_params();  // a no-op at dp=1; identical init makes it a formality otherwise
  sync.shard_params();      // --zero 3: each rank keeps its shard

  const BlockInputs in = block_inputs(ctx, mesh, p, o.seed);
  const Tensor &x = in.x, &dout = in.dout;

  // A trace slice and profiler range (NVTX on CUDA) around each piece, with this rank's share of
  // its model FLOPs (backward: twice the forward's).
  const double w = static_cast<double>(p.world);
  const double f_attn = (p.flops.qkv + p.flops.attn + p.flops.proj) / w, f_mlp = p.flops.mlp / w;
  auto piece = [&](const std::string& name, double f) {
    return rec.begin(cs, name, "\"flops\":" + fmt("%.0f", f), static_cast<uint64_t>(f));
  };
  int open_piece = -1;
  StackHooks hooks;
  hooks.begin = [&](const StackPiece& pc, Pass pass) {
    const bool fwd = pass == Pass::Forward;
    open_piece =
        piece(pc.name + (fwd ? ".fwd" : ".bwd"), (fwd ? 1 : 2) * (pc.attention ? f_attn : f_mlp));
  };
  hooks.end = [&](const StackPiece&, Pass) { rec.end(open_piece); };
  hooks.grads_ready = [&](const StackPiece& pc) { sync.mark_ready(pc.params, &tp); };
  // --zero 2 and 3 (docs/zero.md): gradient buckets per piece, stage 3's gathers and frees.
  hooks = with_sync_hooks(&sync, stack, std::move(hooks));

  ctx.synchronize();
  raw_world.barrier(cs);
  cs.synchronize();
  ctx.allocator().reset_peak();
  const auto origin = Clock::now();
  const int total = p.warmup + p.steps;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(p.steps * kFields + kExtras));
  Tensor out, dx;
  for (int step = 0; step < total; ++step) {
    const bool timed = step >= p.warmup;
    ctx.synchronize();
    raw_world.barrier(cs);
    cs.synchronize();
    tp.reset_times();
    cp.reset_times();
    cp_stream.reset();
    sync.scheduler().reset_times();
    rec.set_enabled(tracing && timed);
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_ms();
    rec.begin_step(step - p.warmup, 1000.0 * ms_since(origin, t0));
    const int hs = piece("step " + std::to_string(step - p.warmup), p.step_flops / w);
    step_work(p, o, ctx, rec, {stack, sync, hooks}, in, &out, &dx);
    rec.end(hs);
    const double c1 = thread_cpu_ms();
    ctx.synchronize();
    const auto t1 = Clock::now();
    rec.end_step();
    if (!timed) continue;
    CommTimes cpt = cp_stream.times();
    cpt.exposed_ms = cp.times().exposed_ms;
    pack({ms_since(t0, t1), c1 - c0, tp.times(), sync.scheduler().times(), cpt}, mine);
  }
  rec.set_enabled(false);
  const AllocatorStats as = ctx.allocator().stats();
  if (calibrating) calib = std::max(calib, calibrate_flops(ctx, raw_world, p));
  const int64_t extras[kExtras] = {as.peak_allocated_bytes, as.reserved_bytes,
                                   static_cast<int64_t>(calib), rec.markers(), rp.device.index};
  mine.insert(mine.end(), extras, extras + kExtras);

  RankOutput ro;
  if (!o.dump_path.empty()) {
    sync.gather_all_params();  // --zero 3: the dump holds whole (tp-local) parameters
    ro.dumped = dump_rank(p, o, mesh, params, {x, out, dout, dx});
  }
  ro.all = gather_i64(ctx, raw_world, mine);
  if (tracing) ro.traces = gather_strings(ctx, raw_world, rec.serialize());
  ctx.synchronize();
  return ro;
}

}  // namespace

BlockBenchResult run_block_bench_result(const BlockBenchOptions& o, std::ostream& os) {
  BlockPlan p = make_block_plan(o);
  Launch& launch = *p.launch;
  RankOutput r0;
  std::mutex mu;
  const auto wall0 = Clock::now();
  launch.run([&](const RankPlacement& rp, Communicator& world) {
    RankOutput ro = run_rank(p, o, rp, world);
    if (rp.rank == 0) {
      std::lock_guard<std::mutex> lk(mu);
      r0 = std::move(ro);
    }
  });
  const double wall_s = ms_since(wall0, Clock::now()) / 1e3;
  if (launch.local().front().rank != 0) return BlockBenchResult{};
  return block_report(p, o, unpack(r0.all, p.world, p.steps), r0.traces, r0.dumped, wall_s, os);
}

std::string resolve_bench_devices(const BlockBenchOptions& opts, int* world_size) {
  std::string d;
  std::unique_ptr<Launch> l = launch_for(opts, &d);
  if (world_size) *world_size = l->world_size();
  return d;
}

int run_block_bench(const BlockBenchOptions& opts, std::ostream& out) {
  run_block_bench_result(opts, out);
  return 0;
}

}  // namespace meshrt
