#include "bench/block/block_bench.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "bench/block/flops.h"
#include "bench/block/trace.h"
#include "collectives/bootstrap.h"
#include "kernels/ops.h"
#include "mesh/blocks.h"
#include "mesh/data_parallel.h"
#include "mesh/dump.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace meshrt {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// Linear-interpolated percentile (q in [0, 1]) of unsorted values.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}
double median(const std::vector<double>& v) { return percentile(v, 0.5); }

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return fmt(i == 0 ? "%.0f" : "%.1f", b) + " " + u[i];
}

std::string human_flops(double f) {
  if (f >= 1e12) return fmt("%.2f", f / 1e12) + " TFLOP";
  if (f >= 1e9) return fmt("%.2f", f / 1e9) + " GFLOP";
  return fmt("%.2f", f / 1e6) + " MFLOP";
}

// Checks up front that `path` can be written, so a typo does not cost a whole run.
void check_writable(const std::string& path, const char* flag) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  MESHRT_CHECK(fs::is_directory(dir, ec), flag << " " << path << ": directory " << dir.string()
                                               << " does not exist; create it or choose another "
                                                  "path");
  MESHRT_CHECK(!fs::is_directory(p, ec),
               flag << " " << path << " is a directory; give a file name");
  MESHRT_CHECK(access(dir.c_str(), W_OK) == 0,
               flag << " " << path << ": directory " << dir.string() << " is not writable");
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

// Devices: what was asked, else what this machine has.
std::unique_ptr<Launch> launch_for(const BlockBenchOptions& o, std::string* devices) {
  LaunchOptions lo;
  std::string why;
  const bool have_cuda = cuda_available(&why);
  MESHRT_CHECK(
      o.devices.rfind("cuda", 0) != 0 || have_cuda,
      "--devices " << o.devices << ": CUDA is unavailable (" << why << "); use --devices cpu:N");
  lo.devices = o.devices.empty() ? (have_cuda ? "cuda:all" : "cpu") : o.devices;
  std::unique_ptr<Launch> l = bootstrap(lo);
  if (o.devices.empty() && l->kind() == LaunchKind::Threads && !have_cuda) {
    // Host ranks as threads: one per core up to 8 (a power of two, so tp divides the defaults).
    const unsigned hc = std::max(1u, std::thread::hardware_concurrency());
    lo.devices = "cpu:" + std::to_string(std::bit_floor(std::min(hc, 8u)));
    l = bootstrap(lo);
  }
  *devices = lo.devices;
  return l;
}

// Everything decided before the ranks start.
struct Plan {
  BenchBlockKind kind = BenchBlockKind::Transformer;
  std::unique_ptr<Launch> launch;
  std::string devices;
  bool cuda = false;
  int world = 1, dp = 1, tp = 1;
  std::string mesh;
  bool sp = false;
  bool sp_requested = false;
  Overlap overlap = Overlap::Async;
  BlockConfig cfg;
  int64_t batch = 1, seq = 1;
  int layers = 1, steps = 1, warmup = 0;
  LayerFlops flops;  // per layer, global batch
  double step_flops = 0;
};

Plan make_plan(const BlockBenchOptions& o) {
  Plan p;
  p.kind = parse_bench_block_kind(o.kind);
  p.overlap = parse_overlap(o.overlap);
  MESHRT_CHECK(o.sp >= -1 && o.sp <= 1, "sp must be -1 (auto), 0 or 1");
  MESHRT_CHECK(
      o.batch >= 0 && o.seq >= 0 && o.hidden >= 0 && o.ffn >= 0 && o.heads >= 0 && o.layers >= 0,
      "--batch, --seq, --hidden, --ffn, --heads and --layers must be positive");
  MESHRT_CHECK(o.steps >= 0, "--steps " << o.steps << " must be >= 1");
  MESHRT_CHECK(o.warmup >= -1, "--warmup " << o.warmup << " must be >= 0");
  MESHRT_CHECK(o.bucket_mb > 0, "--bucket-mb " << o.bucket_mb << " must be positive");
  MESHRT_CHECK(o.peak_tflops >= 0, "--peak-tflops " << o.peak_tflops << " must be >= 0");
  if (!o.dtype.empty()) {
    const DType dt = parse_dtype(o.dtype);
    MESHRT_CHECK(is_floating(dt), "--dtype " << o.dtype << ": use f32, bf16 or f16");
  }
  check_writable(o.json_path, "--json");
  check_writable(o.trace_path, "--trace");
  check_writable(o.dump_path, "--dump");

  p.launch = launch_for(o, &p.devices);
  p.world = p.launch->world_size();
  p.cuda = p.launch->local().front().device.is_cuda();

  // Sizes: what was asked, else a default that runs in seconds on this device.
  const bool c = p.cuda;
  p.cfg.dtype = !o.dtype.empty() ? parse_dtype(o.dtype) : (c ? DType::bf16 : DType::f32);
  p.cfg.hidden = o.hidden > 0 ? o.hidden : (c ? 4096 : 1024);
  p.cfg.heads = o.heads > 0 ? o.heads : (c ? 32 : 16);
  p.cfg.ffn = o.ffn > 0 ? o.ffn : 4 * p.cfg.hidden;
  p.cfg.seed = o.seed;
  p.batch = o.batch > 0 ? o.batch : (c ? 4 : 1);
  p.seq = o.seq > 0 ? o.seq : (c ? 2048 : 512);
  p.layers = o.layers > 0 ? o.layers : (c ? 2 : 1);
  p.steps = o.steps > 0 ? o.steps : (c ? 20 : 10);
  p.warmup = o.warmup >= 0 ? o.warmup : (c ? 5 : 2);

  // Mesh: dp and tp only; tp = world unless given.
  p.mesh = o.mesh.empty() ? "tp=" + std::to_string(p.world) : o.mesh;
  std::vector<MeshDim> dims = parse_mesh_spec(p.mesh, p.world);
  for (const MeshDim& d : dims) {
    MESHRT_CHECK(d.name == "dp" || d.name == "tp",
                 "--mesh " << p.mesh << ": dim '" << d.name
                           << "' is not one the block benchmark uses; name the dims dp and tp "
                              "(e.g. dp=2,tp=4)");
  }
  for (const MeshDim& d : dims) (d.name == "dp" ? p.dp : p.tp) = d.size;
  p.sp_requested = o.sp == 1 || (o.sp == -1 && p.tp > 1);
  p.sp = p.sp_requested && p.tp > 1;
  MESHRT_CHECK(!(p.overlap == Overlap::Chunked && p.tp > 1 && !p.sp),
               "--overlap chunked splits the sequence all-gather / reduce-scatter into pieces and "
               "needs sequence parallelism: add --sp or use --overlap async");
  if (p.sp) {
    const char* why_sp = o.sp == 1 ? "--sp" : "sequence parallel (on by default when tp > 1)";
    MESHRT_CHECK(p.seq % p.tp == 0, "--seq " << p.seq << " does not divide by tp=" << p.tp
                                             << " under " << why_sp
                                             << "; change --seq or pass --no-sp");
    MESHRT_CHECK(p.overlap != Overlap::Chunked || p.seq % (p.tp * p.tp) == 0,
                 "--overlap chunked needs --seq divisible by tp^2=" << p.tp * p.tp << "; --seq is "
                                                                    << p.seq
                                                                    << ": change --seq or use "
                                                                       "--overlap async");
  }
  TpOptions topt{p.sp, p.overlap};
  validate_block(p.cfg, p.tp, topt, p.seq);

  // Memory: refuse what cannot fit on the host instead of swapping or being killed.
  if (!p.cuda) {
    const double es = static_cast<double>(dtype_size(p.cfg.dtype));
    const double h = static_cast<double>(p.cfg.hidden), f = static_cast<double>(p.cfg.ffn);
    const double tok = static_cast<double>(p.batch) * static_cast<double>(p.seq);
    const double params = p.layers * (4 * h * h + 2 * h * f) / p.tp;
    const double acts = p.layers * tok * (12 * h / p.tp + 3 * f / p.tp + 6 * h);
    int local = static_cast<int>(p.launch->local().size());
    if (p.launch->kind() != LaunchKind::Threads) local = p.launch->local().front().local_size;
    const double need = (3 * params + 1.5 * acts) * es * local;
    const int64_t have = physical_memory_bytes();
    MESHRT_CHECK(have == 0 || need < 0.8 * static_cast<double>(have),
                 "this configuration needs about " << human_bytes(need) << " of host memory for "
                                                   << local << " rank(s) and the machine has "
                                                   << human_bytes(static_cast<double>(have))
                                                   << "; reduce --hidden, --ffn, --seq, --batch "
                                                      "or --layers");
  }
  p.flops = layer_flops(p.kind, p.batch * p.dp, p.seq, p.cfg.hidden, p.cfg.ffn, true);
  p.step_flops = step_flops(p.flops, p.layers, o.fwd_only);
  return p;
}

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
  kFields
};
enum Extra : int { kPeakBytes = 0, kReservedBytes, kCalibFlops, kMarkers, kDeviceIndex, kExtras };

int64_t ns(double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); }

// "L<l>", the prefix of layer l's trace slices and ranges. (Appending, not "L" + to_string: GCC
// 12 at -O3 warns falsely about that concatenation, -Wrestrict, GCC bug 105329.)
std::string layer_name(int l) {
  std::string s = "L";
  s += std::to_string(l);
  return s;
}

// One layer of the stack with trace slices around its pieces.
struct Layer {
  std::unique_ptr<Block> block;
  TransformerBlock* tb = nullptr;
};

// Gathers every rank's int64 vector (same length) to all ranks.
std::vector<int64_t> gather_i64(Context& ctx, Communicator& world, const std::vector<int64_t>& v) {
  Stream& cs = ctx.compute_stream();
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<int64_t> buf = v;
  Tensor h = Tensor::from_blob(buf.data(), {n}, DType::i64, Device::cpu());
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
  Tensor h = Tensor::from_blob(buf.data(), {mx}, DType::u8, Device::cpu());
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
double calibrate_flops(Context& ctx, Communicator& world, const Plan& p) {
  const int64_t n = p.cuda ? 8192 : 1024;
  const double sq = gemm_flops(ctx, world, p.cfg.dtype, n, n, n);
  const double blk =
      gemm_flops(ctx, world, p.cfg.dtype, p.batch * p.seq, p.cfg.ffn / p.tp, p.cfg.hidden);
  return std::max(sq, blk);
}

// The GPU model name of cuda:<index> from the backend's version string ("; cuda:0 NAME (sm_").
std::string cuda_device_name(int index) {
  const DeviceBackend* be = cuda_backend();
  if (!be) return "";
  const std::string v = be->versions();
  const std::string key = "cuda:" + std::to_string(index) + " ";
  size_t p = v.find(key);
  if (p == std::string::npos) return "";
  p += key.size();
  size_t e = v.find(" (sm_", p);
  return v.substr(p, e == std::string::npos ? std::string::npos : e - p);
}

std::vector<Placement> activation_placements(const DeviceMesh& mesh, bool sp) {
  std::vector<Placement> pl;
  for (const MeshDim& d : mesh.dims())
    pl.push_back(d.name == "dp" ? Placement::shard(1)
                                : (sp ? Placement::shard(0) : Placement::replicate()));
  return pl;
}

struct RankOutput {
  std::vector<int64_t> all;  // world x (steps * kFields + kExtras)
  std::vector<std::string> traces;
  int dumped = 0;
};

// The benchmark on one rank. Rank 0 gets everyone's figures back.
RankOutput run_rank(const Plan& p, const BlockBenchOptions& o, const RankPlacement& rp,
                    Communicator& raw_world) {
  ContextOptions co;
  co.rank = rp.rank;
  co.world_size = rp.world_size;
  co.local_ranks = rp.local_size;
  Context ctx(rp.device, co);
  Stream& cs = ctx.compute_stream();
  TraceRecorder rec(rp.rank, cs);
  const bool tracing = !o.trace_path.empty();
  std::unique_ptr<TracingCommunicator> traced;
  if (tracing) traced = std::make_unique<TracingCommunicator>(raw_world, &rec);
  Communicator& world = tracing ? *traced : raw_world;

  // Calibration GEMM before anything else is resident (all ranks at once).
  // It runs again after the timed steps and the faster of the two counts: on a shared machine
  // one measurement can land in a busy moment.
  double calib = 0;
  const bool calibrating = o.peak_tflops <= 0 && o.calibrate;
  if (calibrating) calib = calibrate_flops(ctx, raw_world, p);

  DeviceMesh mesh(ctx, world, p.mesh);
  TpOptions topt{p.sp, p.overlap};
  CommScheduler tp(mesh, "tp", p.overlap);
  std::vector<Layer> layers;
  std::vector<Param*> params;
  for (int l = 0; l < p.layers; ++l) {
    Layer L;
    const std::string name = "layers." + std::to_string(l);
    const uint64_t id = kBlockIdStride * static_cast<uint64_t>(l + 1);
    switch (p.kind) {
      case BenchBlockKind::Transformer: {
        auto b = std::make_unique<TransformerBlock>(mesh, tp, topt, p.cfg, name, id);
        L.tb = b.get();
        L.block = std::move(b);
        break;
      }
      case BenchBlockKind::Mlp:
        L.block = std::make_unique<MlpBlock>(mesh, tp, topt, p.cfg, name + ".mlp", id);
        break;
      case BenchBlockKind::Attention:
        L.block = std::make_unique<AttentionBlock>(mesh, tp, topt, p.cfg, name + ".attn", id);
        break;
    }
    L.block->collect(params);
    layers.push_back(std::move(L));
  }
  DpOptions dpo;
  dpo.bucket_mb = o.bucket_mb;
  dpo.overlap = p.overlap == Overlap::None ? Overlap::None : Overlap::Async;
  GradSync sync(mesh, params, dpo);
  sync.broadcast_params();  // a no-op at dp=1; identical init makes it a formality otherwise

  // This replica's batch slice (and sequence shard under SP) of one global input and output
  // gradient, so a dump rebuilds the global tensors.
  const int64_t s_loc = p.sp ? p.seq / p.tp : p.seq;
  const Shape full{p.seq, p.batch * p.dp, p.cfg.hidden};
  const Shape off{p.sp ? mesh.coord("tp") * s_loc : 0, mesh.coord("dp") * p.batch, 0};
  Tensor x = ctx.empty({s_loc, p.batch, p.cfg.hidden}, p.cfg.dtype);
  Tensor dout = ctx.empty({s_loc, p.batch, p.cfg.hidden}, p.cfg.dtype);
  x.init_philox_({o.seed, 1u << 20, PhiloxInit::Dist::Normal, 0.f, 1.f}, full, off, cs);
  dout.init_philox_({o.seed, (1u << 20) + 1, PhiloxInit::Dist::Normal, 0.f, 1.f}, full, off, cs);

  // Trace slice arguments: this rank's share of the model FLOPs of each piece.
  const double w = static_cast<double>(p.world);
  const double f_attn = (p.flops.qkv + p.flops.attn + p.flops.proj) / w, f_mlp = p.flops.mlp / w;
  // A trace slice and profiler range (NVTX on CUDA) around a piece, with its FLOPs.
  auto piece = [&](const std::string& name, double f) {
    return rec.begin(cs, name, "\"flops\":" + fmt("%.0f", f), static_cast<uint64_t>(f));
  };

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
    sync.scheduler().reset_times();
    rec.set_enabled(tracing && timed);
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_ms();
    rec.begin_step(step - p.warmup, 1000.0 * ms_since(origin, t0));
    const int hs = piece("step " + std::to_string(step - p.warmup), p.step_flops / w);
    if (!o.fwd_only) {
      // A new step: no bucket counted or launched yet (else buckets would only launch at
      // finish() from the second step on), gradients zeroed.
      sync.set_active(0);
      const int h = rec.begin(cs, "zero_grad");
      sync.zero_grad();
      rec.end(h);
    }
    Tensor hcur = x;
    for (int l = 0; l < p.layers; ++l) {
      Layer& L = layers[static_cast<size_t>(l)];
      const std::string pre = layer_name(l);
      if (L.tb) {
        int h = piece(pre + ".attn.fwd", f_attn);
        hcur = L.tb->attn.forward(hcur);
        rec.end(h);
        h = piece(pre + ".mlp.fwd", f_mlp);
        hcur = L.tb->mlp.forward(hcur);
        rec.end(h);
      } else {
        const bool mlp = p.kind == BenchBlockKind::Mlp;
        const int h = piece(pre + (mlp ? ".mlp.fwd" : ".attn.fwd"), mlp ? f_mlp : f_attn);
        hcur = L.block->forward(hcur);
        rec.end(h);
      }
    }
    out = hcur;
    if (!o.fwd_only) {
      Tensor d = dout;
      for (int l = p.layers - 1; l >= 0; --l) {
        Layer& L = layers[static_cast<size_t>(l)];
        const std::string pre = layer_name(l);
        if (L.tb) {
          int h = piece(pre + ".mlp.bwd", 2 * f_mlp);
          d = L.tb->mlp.backward(d);
          rec.end(h);
          sync.mark_ready(L.tb->mlp.params());
          h = piece(pre + ".attn.bwd", 2 * f_attn);
          d = L.tb->attn.backward(d);
          rec.end(h);
          sync.mark_ready(L.tb->attn.params());
        } else {
          const bool mlp = p.kind == BenchBlockKind::Mlp;
          const int h = piece(pre + (mlp ? ".mlp.bwd" : ".attn.bwd"), 2 * (mlp ? f_mlp : f_attn));
          d = L.block->backward(d);
          rec.end(h);
          sync.mark_ready(L.block->params());
        }
      }
      dx = d;
      sync.finish();
      const int h = rec.begin(cs, "dp.grad_wait");
      sync.wait_all();
      rec.end(h);
    }
    rec.end(hs);
    const double c1 = thread_cpu_ms();
    ctx.synchronize();
    const auto t1 = Clock::now();
    rec.end_step();
    if (!timed) continue;
    const CommTimes tt = tp.times(), dt = sync.scheduler().times();
    const int64_t f[kFields] = {ns(ms_since(t0, t1)),
                                ns(c1 - c0),
                                ns(tt.comm_ms),
                                ns(tt.exposed_ms),
                                tt.bytes,
                                tt.count,
                                ns(dt.comm_ms),
                                ns(dt.exposed_ms),
                                dt.bytes,
                                dt.count};
    mine.insert(mine.end(), f, f + kFields);
  }
  rec.set_enabled(false);
  const AllocatorStats as = ctx.allocator().stats();
  if (calibrating) calib = std::max(calib, calibrate_flops(ctx, raw_world, p));
  const int64_t extras[kExtras] = {as.peak_allocated_bytes, as.reserved_bytes,
                                   static_cast<int64_t>(calib), rec.markers(), rp.device.index};
  mine.insert(mine.end(), extras, extras + kExtras);

  RankOutput ro;
  if (!o.dump_path.empty()) {
    std::vector<DumpEntry> entries;
    const auto apl = activation_placements(mesh, p.sp);
    entries.push_back({"input", x, apl});
    entries.push_back({"output", out, apl});
    if (!o.fwd_only) {
      entries.push_back({"output.grad", dout, apl});
      entries.push_back({"input.grad", dx, apl});
      add_param_entries(mesh, params, entries);
    } else {
      for (Param* q : params) entries.push_back({q->name, q->value, q->placements(mesh)});
    }
    std::map<std::string, std::string> md;
    md["meshrt.bench"] = std::string("bench ") + bench_block_kind_name(p.kind);
    md["meshrt.sp"] = p.sp ? "1" : "0";
    md["meshrt.note"] =
        "input/output: [seq, batch, hidden] (global); grads after the last timed step, averaged "
        "over dp; output.grad is the gradient fed to backward";
    ro.dumped = dump_safetensors(o.dump_path, mesh, entries, md);
  }
  ro.all = gather_i64(ctx, raw_world, mine);
  if (tracing) ro.traces = gather_strings(ctx, raw_world, rec.serialize());
  ctx.synchronize();
  return ro;
}

}  // namespace

BlockBenchResult run_block_bench_result(const BlockBenchOptions& o, std::ostream& os) {
  Plan p = make_plan(o);
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
  BlockBenchResult res;
  const bool here = launch.local().front().rank == 0;
  if (!here) return res;

  // ---- figures -------------------------------------------------------------------------------
  const int W = p.world, S = p.steps;
  const size_t stride = static_cast<size_t>(S * kFields + kExtras);
  auto at = [&](int rank, int step, int field) {
    return static_cast<double>(
        r0.all[static_cast<size_t>(rank) * stride + static_cast<size_t>(step * kFields + field)]);
  };
  auto extra = [&](int rank, int e) {
    return r0.all[static_cast<size_t>(rank) * stride + static_cast<size_t>(S * kFields + e)];
  };
  std::vector<double> step_ms(static_cast<size_t>(S)), issue_ms(static_cast<size_t>(S));
  // Per step: mean over ranks of the communication figures.
  std::vector<double> tpc(static_cast<size_t>(S)), tpe(static_cast<size_t>(S)),
      dpc(static_cast<size_t>(S)), dpe(static_cast<size_t>(S)), comp(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    double mx = 0, imx = 0;
    for (int r = 0; r < W; ++r) {
      mx = std::max(mx, at(r, s, kStepNs) * 1e-6);
      imx = std::max(imx, at(r, s, kIssueCpuNs) * 1e-6);
      tpc[static_cast<size_t>(s)] += at(r, s, kTpCommNs) * 1e-6 / W;
      tpe[static_cast<size_t>(s)] += at(r, s, kTpExposedNs) * 1e-6 / W;
      dpc[static_cast<size_t>(s)] += at(r, s, kDpCommNs) * 1e-6 / W;
      dpe[static_cast<size_t>(s)] += at(r, s, kDpExposedNs) * 1e-6 / W;
      comp[static_cast<size_t>(s)] +=
          (at(r, s, kStepNs) - at(r, s, kTpExposedNs) - at(r, s, kDpExposedNs)) * 1e-6 / W;
    }
    step_ms[static_cast<size_t>(s)] = mx;  // a step is done when its slowest rank is
    issue_ms[static_cast<size_t>(s)] = imx;
  }
  res.valid = true;
  res.mesh = p.mesh;
  res.dp = p.dp;
  res.tp = p.tp;
  res.world = W;
  res.sp = p.sp;
  res.batch = p.batch;
  res.seq = p.seq;
  res.hidden = p.cfg.hidden;
  res.dtype = dtype_name(p.cfg.dtype);
  res.step_ms = median(step_ms);
  res.step_p10_ms = percentile(step_ms, 0.1);
  res.step_p90_ms = percentile(step_ms, 0.9);
  const double tokens = static_cast<double>(p.batch * p.dp * p.seq);
  res.tokens_per_s = tokens / (res.step_ms * 1e-3);
  res.tflops = p.step_flops / (res.step_ms * 1e-3) / 1e12;
  res.tp_comm_ms = median(tpc);
  res.tp_exposed_ms = median(tpe);
  res.dp_comm_ms = median(dpc);
  res.dp_exposed_ms = median(dpe);
  res.compute_ms = median(comp);
  for (int r = 0; r < W; ++r) res.peak_bytes = std::max(res.peak_bytes, extra(r, kPeakBytes));
  res.overhead_fraction = median(issue_ms) / res.step_ms;

  // Peak for MFU: given, else the GPU table, else the calibration GEMM.
  std::string peak_src, gpu_name;
  if (o.peak_tflops > 0) {
    res.peak_tflops_per_rank = o.peak_tflops;
    res.peak_label = o.peak_label.empty() ? "given with --peak-tflops" : o.peak_label;
    peak_src = "given";
  } else {
    if (p.cuda) {
      gpu_name = cuda_device_name(static_cast<int>(extra(0, kDeviceIndex)));
      std::string matched;
      const double pk = gpu_peak_tflops(gpu_name, p.cfg.dtype, &matched);
      if (pk > 0) {
        res.peak_tflops_per_rank = pk;
        res.peak_label = gpu_name + " " + dtype_name(p.cfg.dtype) + " dense peak " +
                         fmt("%.1f", pk) + " TFLOP/s (datasheet)";
        peak_src = "gpu_table";
      }
    }
    if (peak_src.empty()) {
      double sum = 0;
      for (int r = 0; r < W; ++r) sum += static_cast<double>(extra(r, kCalibFlops));
      if (sum > 0) {
        res.peak_tflops_per_rank = sum / W / 1e12;
        const int n = p.cuda ? 8192 : 1024;
        res.peak_label = std::string("calibration GEMM (") + dtype_name(p.cfg.dtype) +
                         ", best of " + std::to_string(n) + "^3 and the block's fc1 shape " +
                         std::to_string(p.batch * p.seq) + "x" + std::to_string(p.cfg.ffn / p.tp) +
                         "x" + std::to_string(p.cfg.hidden) +
                         ", all ranks at once, fastest of 10 runs): " + fmt("%.1f", sum / W / 1e9) +
                         " GFLOP/s per rank" +
                         (p.cuda ? " (GPU not in the peak table)" : " (CPU: no datasheet peak)");
        peak_src = "calibration_gemm";
      }
    }
  }
  if (res.peak_tflops_per_rank > 0) res.mfu = res.tflops / (res.peak_tflops_per_rank * W);

  // Per-rank figures and skew.
  json ranks = json::array();
  std::vector<double> rank_step, rank_comp;
  for (int r = 0; r < W; ++r) {
    std::vector<double> st, cp, te, de;
    for (int s = 0; s < S; ++s) {
      st.push_back(at(r, s, kStepNs) * 1e-6);
      cp.push_back((at(r, s, kStepNs) - at(r, s, kTpExposedNs) - at(r, s, kDpExposedNs)) * 1e-6);
      te.push_back(at(r, s, kTpExposedNs) * 1e-6);
      de.push_back(at(r, s, kDpExposedNs) * 1e-6);
    }
    rank_step.push_back(median(st));
    rank_comp.push_back(median(cp));
    ranks.push_back({{"rank", r},
                     {"step_ms_median", median(st)},
                     {"compute_ms_median", median(cp)},
                     {"tp_exposed_ms_median", median(te)},
                     {"dp_exposed_ms_median", median(de)},
                     {"peak_allocated_bytes", extra(r, kPeakBytes)},
                     {"reserved_bytes", extra(r, kReservedBytes)},
                     {"calibration_gflops", static_cast<double>(extra(r, kCalibFlops)) / 1e9},
                     {"device_index", extra(r, kDeviceIndex)}});
  }
  const double slow = *std::max_element(rank_step.begin(), rank_step.end()),
               fast = *std::min_element(rank_step.begin(), rank_step.end());
  const double cslow = *std::max_element(rank_comp.begin(), rank_comp.end()),
               cfast = *std::min_element(rank_comp.begin(), rank_comp.end());
  const int slow_rank =
      static_cast<int>(std::max_element(rank_step.begin(), rank_step.end()) - rank_step.begin());
  const int fast_rank =
      static_cast<int>(std::min_element(rank_step.begin(), rank_step.end()) - rank_step.begin());
  const double markers_per_step = static_cast<double>(extra(0, kMarkers)) / S;

  // ---- JSON -----------------------------------------------------------------------------------
  auto comm_json = [&](const std::vector<double>& c, const std::vector<double>& e, int bytes_f,
                       int count_f, int size) {
    const double cm = median(c), em = median(e);
    return json{{"size", size},
                {"comm_ms_median", cm},
                {"exposed_ms_median", em},
                {"exposed_fraction", cm > 0 ? em / cm : 0.0},
                {"bytes_per_step_per_rank", at(0, 0, bytes_f)},
                {"collectives_per_step_per_rank", at(0, 0, count_f)},
                {"comm_ms", c},
                {"exposed_ms", e}};
  };
  json j;
  j["tool"] = std::string("meshrt bench ") + bench_block_kind_name(p.kind);
  j["command_line"] = o.command_line;
  j["versions"] = o.versions;
  j["config"] = {{"kind", bench_block_kind_name(p.kind)},
                 {"devices", p.devices},
                 {"launch", launch.describe()},
                 {"world_size", W},
                 {"device_type", p.cuda ? "cuda" : "cpu"},
                 {"gpu_name", gpu_name},
                 {"mesh", p.mesh},
                 {"dp", p.dp},
                 {"tp", p.tp},
                 {"sp", p.sp},
                 {"overlap", overlap_name(p.overlap)},
                 {"batch_per_replica", p.batch},
                 {"global_batch", p.batch * p.dp},
                 {"seq", p.seq},
                 {"hidden", p.cfg.hidden},
                 {"ffn", p.cfg.ffn},
                 {"heads", p.cfg.heads},
                 {"layers", p.layers},
                 {"dtype", dtype_name(p.cfg.dtype)},
                 {"steps", p.steps},
                 {"warmup", p.warmup},
                 {"fwd_only", o.fwd_only},
                 {"bucket_mb", o.bucket_mb},
                 {"seed", o.seed},
                 {"host_threads_per_rank",
                  p.cuda ? 0
                         : static_cast<int>(std::max(
                               1u, std::thread::hardware_concurrency() /
                                       static_cast<unsigned>(launch.local().front().local_size)))}};
  j["flops"] = {
      {"per_layer_forward",
       {{"qkv", p.flops.qkv},
        {"attention", p.flops.attn},
        {"attention_unmasked", p.flops.attn_full},
        {"out_proj", p.flops.proj},
        {"mlp", p.flops.mlp},
        {"total", p.flops.forward()}}},
      {"per_step", p.step_flops},
      {"backward_factor", o.fwd_only ? 0 : 2},
      {"causal_attention",
       "counted at half (2*B*s^2*h per layer): meshrt's fused attention skips key tiles "
       "above the diagonal"},
      {"convention",
       "matmul FLOPs only (2 per multiply-add); B = global batch; backward = 2 x forward"}};
  j["step_ms"] = {{"median", res.step_ms},
                  {"p10", res.step_p10_ms},
                  {"p90", res.step_p90_ms},
                  {"min", *std::min_element(step_ms.begin(), step_ms.end())},
                  {"max", *std::max_element(step_ms.begin(), step_ms.end())},
                  {"all", step_ms},
                  {"definition",
                   "per step, the slowest rank's wall time from a barrier to its "
                   "streams drained"}};
  j["tokens_per_step"] = tokens;
  j["tokens_per_s"] = res.tokens_per_s;
  j["tflops_model"] = res.tflops;
  j["tflops_per_rank"] = res.tflops / W;
  j["peak"] = {{"source", peak_src.empty() ? "none" : peak_src},
               {"tflops_per_rank", res.peak_tflops_per_rank},
               {"label", res.peak_label}};
  j["mfu"] = res.mfu >= 0 ? json(res.mfu) : json(nullptr);
  j["compute_ms_median"] = res.compute_ms;
  j["comm"] = {{"tp", comm_json(tpc, tpe, kTpBytes, kTpCount, p.tp)},
               {"dp", comm_json(dpc, dpe, kDpBytes, kDpCount, p.dp)}};
  j["memory"] = {{"peak_allocated_bytes_max", res.peak_bytes},
                 {"note",
                  "allocator peak over the timed steps (parameters, gradients, "
                  "activations, communication buffers)"}};
  j["skew"] = {{"slowest_rank", slow_rank},
               {"fastest_rank", fast_rank},
               {"step_ms_slowest", slow},
               {"step_ms_fastest", fast},
               {"step_skew_fraction", fast > 0 ? slow / fast - 1 : 0.0},
               {"compute_ms_slowest", cslow},
               {"compute_ms_fastest", cfast},
               {"compute_skew_fraction", cfast > 0 ? cslow / cfast - 1 : 0.0}};
  j["overhead"] = {{"issue_cpu_ms_median", median(issue_ms)},
                   {"fraction_of_step", res.overhead_fraction},
                   {"trace_markers_per_step", markers_per_step},
                   {"definition",
                    "CPU time of the issuing thread per step (mesh layer, scheduler, allocator, "
                    "enqueueing, benchmark timers and trace markers), slowest rank; target <= "
                    "3% of the step"}};
  j["ranks"] = ranks;
  j["wall_s"] = wall_s;
  res.json = j.dump(2);

  // ---- report ---------------------------------------------------------------------------------
  if (!o.quiet) {
    const char* kname = p.kind == BenchBlockKind::Transformer
                            ? "transformer block (attention + MLP)"
                        : p.kind == BenchBlockKind::Mlp ? "MLP block"
                                                        : "attention block";
    os << "meshrt bench " << bench_block_kind_name(p.kind) << ": " << kname << " x" << p.layers
       << ", hidden " << p.cfg.hidden << ", heads " << p.cfg.heads << ", ffn " << p.cfg.ffn
       << ", seq " << p.seq << ", batch " << p.batch << (p.dp > 1 ? " per dp replica" : "") << ", "
       << dtype_name(p.cfg.dtype) << "\n";
    os << "mesh " << p.mesh << " (sp " << (p.sp ? "on" : (p.tp == 1 ? "n/a at tp=1" : "off"))
       << ", overlap " << overlap_name(p.overlap) << (p.dp > 1 ? ", dp bucket " : "")
       << (p.dp > 1 ? fmt("%g", o.bucket_mb) + " MiB" : "") << ") on " << launch.describe()
       << ", devices " << p.devices << "\n";
    os << "warmup " << p.warmup << ", timed steps " << p.steps << ", "
       << (o.fwd_only ? "forward only" : "forward + backward") << "\n\n";
    auto row = [&](const std::string& k, const std::string& v) {
      os << "  " << k;
      for (size_t i = k.size(); i < 14; ++i) os << ' ';
      os << v << "\n";
    };
    row("step time", "median " + fmt("%.2f", res.step_ms) + " ms   p10 " +
                         fmt("%.2f", res.step_p10_ms) + "   p90 " + fmt("%.2f", res.step_p90_ms) +
                         "   (slowest rank per step)");
    row("tokens/s",
        fmt("%.0f", res.tokens_per_s) + "   (" + fmt("%.0f", tokens) + " tokens per step)");
    row("model FLOPs", human_flops(p.step_flops) + " per step = fwd " +
                           human_flops(p.flops.forward() * p.layers) +
                           (o.fwd_only ? "" : " + bwd 2x fwd") +
                           "; causal attention counted at half (the kernel skips masked tiles)");
    row("TFLOP/s",
        fmt("%.3f", res.tflops) + " model total, " + fmt("%.3f", res.tflops / W) + " per rank");
    if (res.mfu >= 0)
      row("MFU", fmt("%.1f", 100 * res.mfu) + "% of " + res.peak_label);
    else
      row("MFU", "n/a (no peak known: pass --peak-tflops)");
    row("compute", fmt("%.2f", res.compute_ms) +
                       " ms per step (step minus exposed communication, mean over ranks)");
    auto comm_row = [&](const char* dim, int size, double c, double e, int bf, int cf) {
      if (size == 1) {
        row(std::string("comm ") + dim, std::string("- (") + dim + "=1)");
        return;
      }
      row(std::string("comm ") + dim,
          fmt("%.2f", c) + " ms on the " + dim + " stream, " + fmt("%.2f", e) + " ms exposed (" +
              fmt("%.0f", c > 0 ? 100 * e / c : 0) + "%), " + fmt("%.0f", at(0, 0, cf)) +
              " collectives, " + human_bytes(at(0, 0, bf)) + " per rank per step");
    };
    comm_row("tp", p.tp, res.tp_comm_ms, res.tp_exposed_ms, kTpBytes, kTpCount);
    comm_row("dp", p.dp, res.dp_comm_ms, res.dp_exposed_ms, kDpBytes, kDpCount);
    row("memory", "peak " + human_bytes(static_cast<double>(res.peak_bytes)) +
                      " allocated per rank (max over ranks)");
    if (W > 1)
      row("skew", "slowest rank " + std::to_string(slow_rank) + " " + fmt("%.2f", slow) +
                      " ms vs fastest rank " + std::to_string(fast_rank) + " " + fmt("%.2f", fast) +
                      " ms (+" + fmt("%.1f", 100 * (slow / fast - 1)) + "%); compute " +
                      fmt("%.2f", cslow) + " vs " + fmt("%.2f", cfast) + " ms");
    row("overhead",
        fmt("%.2f", median(issue_ms)) + " ms CPU per step issuing work (" +
            fmt("%.2f", 100 * res.overhead_fraction) + "% of the step; target <= 3%)" +
            (o.trace_path.empty() ? ""
                                  : ", with " + fmt("%.0f", markers_per_step) + " trace markers"));
    os << std::flush;
  }

  // ---- files ----------------------------------------------------------------------------------
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    MESHRT_CHECK(f.good(), "--json: cannot write " << o.json_path);
    f << res.json << "\n";
    if (!o.quiet) os << "wrote " << o.json_path << "\n";
  }
  if (!o.trace_path.empty()) {
    std::ofstream f(o.trace_path);
    MESHRT_CHECK(f.good(), "--trace: cannot write " << o.trace_path);
    f << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << json(j["config"]).dump()
      << ",\n\"traceEvents\":[\n";
    bool first = true;
    for (const std::string& t : r0.traces) {
      if (t.empty()) continue;
      if (!first) f << ",\n";
      f << t;
      first = false;
    }
    f << "\n]}\n";
    if (!o.quiet)
      os << "wrote " << o.trace_path << " (" << fmt("%.0f", markers_per_step)
         << " markers per step on rank 0; open in ui.perfetto.dev or chrome://tracing)\n";
  }
  if (!o.dump_path.empty() && !o.quiet)
    os << "wrote " << o.dump_path << " (" << r0.dumped << " tensors)\n";
  return res;
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
