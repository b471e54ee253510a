#include "bench/gemm/gemm_bench.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "bench/common/host_gemm_report.h"
#include "bench/common/stats.h"
#include "kernels/host/parallel.h"
#include "kernels/ops.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "runtime/thread.h"

#if defined(MESHRT_WITH_CUDA)
#include "bench/gemm/cuda_baseline.h"
#endif

namespace meshrt {

namespace {

using bench::Clock;
using bench::fmt;
using bench::median;
using json = nlohmann::json;

struct GemmShape {
  std::string name;
  int64_t m, n, k;
};

// Ends OpenBLAS's worker threads, which would spin for about 2^28 cycles after the peer's call
// (bench::wait_for_idle_threads would then wait that long). blas_thread_shutdown_ is exported by
// OpenBLAS's pthread builds (its fork handler calls it); its next multi-threaded call, or
// openblas_set_num_threads, starts them again, so it comes after the switch to one thread. Builds
// without it (OpenMP) keep their threads, and the wait covers them.
void stop_openblas_threads() {
  using Shutdown = int (*)();
  static const auto shutdown =
      reinterpret_cast<Shutdown>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
  if (shutdown) shutdown();
}

// Milliseconds of one fn() run on every rank at once (each rank on its own thread for several
// ranks); fn(rank) enqueues and synchronises.
double time_ranks_once(int ranks, const std::function<void(int)>& fn) {
  const auto t0 = Clock::now();
  if (ranks == 1) {
    fn(0);
  } else {
    std::vector<std::thread> th = start_threads(ranks, fn, "the ranks of the benchmark",
                                                "lower --devices or raise ulimit -u / ulimit -v");
    for (auto& t : th) t.join();
  }
  return bench::ms_since(t0, Clock::now());
}

// Median milliseconds between stream events around fn() (which enqueues on s).
double time_stream(Stream& s, int warmup, int repeats, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  s.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    Event a = s.record_timed();
    fn();
    Event b = s.record_timed();
    b.synchronize();
    ms.push_back(b.elapsed_ms(a));
  }
  return median(ms);
}

std::string ratio_str(double r) { return fmt("%.2f", r) + "x"; }

Tensor random_tensor(Context& ctx, const Shape& s, DType dt, uint64_t id) {
  Tensor t = ctx.empty(s, dt);
  PhiloxInit init;
  init.seed = 1234;
  init.id = id;
  init.a = -1.f;
  init.b = 1.f;
  t.init_philox_(init, ctx.compute_stream());
  return t;
}

std::vector<GemmShape> gemm_shapes(const GemmBenchOptions& o, int64_t tokens, int64_t hidden) {
  if (o.m || o.n || o.k) return {{"custom", o.m, o.n, o.k}};  // checked by run_gemm_bench
  return {{"square", 1024, 1024, 1024},
          {"qkv", tokens, 3 * hidden, hidden},
          {"attn-out", tokens, hidden, hidden},
          {"fc1", tokens, 4 * hidden, hidden},
          {"fc2", tokens, hidden, 4 * hidden}};
}

struct Bench {
  const GemmBenchOptions& o;
  std::ostream& out;
  DType dt;
  std::vector<Device> devs;
  bool cuda = false;
  int ranks = 1;
  int64_t tokens = 0, hidden = 0;
  json report;
  // The fastest GEMM of the table above, per rank (attention is reported against it); 0 without.
  double best_gemm_rate_per_rank = 0.0;

  void gemm_section(std::vector<std::unique_ptr<Context>>& ctxs);
  void elementwise_section(Context& ctx);
  void attention_section(Context& ctx);
};

void Bench::gemm_section(std::vector<std::unique_ptr<Context>>& ctxs) {
  const char* unit = cuda ? "TFLOP/s" : "GFLOP/s";
  const double scale = cuda ? 1e-12 : 1e-9;
  const char* base = cuda ? "cublas" : "blas";
  out << "GEMM " << dtype_name(dt) << (o.trans_b ? " (B transposed)" : "") << ", " << ranks
      << (ranks == 1 ? " rank" : " ranks at once") << ", median of " << o.repeats << " runs\n";
  out << "  " << std::left << std::setw(10) << "shape" << std::right << std::setw(7) << "m"
      << std::setw(7) << "n" << std::setw(7) << "k" << std::setw(16)
      << (std::string("meshrt ") + unit) << std::setw(16) << (std::string(base) + " " + unit)
      << "   ratio\n";
  json rows = json::array();
  for (const GemmShape& sh : gemm_shapes(o, tokens, hidden)) {
    const double flops =
        2.0 * static_cast<double>(sh.m) * static_cast<double>(sh.n) * static_cast<double>(sh.k);
    // meshrt: every rank runs the same GEMM on its own tensors at the same time.
    std::vector<Tensor> A, B, C;
    for (int r = 0; r < ranks; ++r) {
      Context& c = *ctxs[static_cast<size_t>(r)];
      A.push_back(random_tensor(c, {sh.m, sh.k}, dt, 1));
      B.push_back(random_tensor(c, o.trans_b ? Shape{sh.n, sh.k} : Shape{sh.k, sh.n}, dt, 2));
      C.push_back(c.empty({sh.m, sh.n}, dt));
      c.synchronize();
    }
    double ms_meshrt = 0.0, ms_base = 0.0;
    if (cuda) {
      Context& c = *ctxs[0];
      ms_meshrt = time_stream(c.compute_stream(), o.warmup, o.repeats, [&] {
        ops::gemm(c, c.compute_stream(), A[0], false, B[0], o.trans_b, C[0]);
      });
#if defined(MESHRT_WITH_CUDA)
      ms_base = bench::cublas_gemm_ms(devs[0].index, sh.m, sh.n, sh.k, o.trans_b, dt, o.warmup,
                                      o.repeats);
#endif
    } else {
      // Raw OpenBLAS on f32 copies of the same shape, with its own threading over all cores.
      const int cores = kernels::host::usable_cores();
      std::vector<float> a(static_cast<size_t>(sh.m * sh.k)), b(static_cast<size_t>(sh.k * sh.n)),
          cc(static_cast<size_t>(sh.m * sh.n));
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      for (auto& v : a) v = dist(rng);
      for (auto& v : b) v = dist(rng);
      auto run_meshrt = [&](int r) {
        Context& c = *ctxs[static_cast<size_t>(r)];
        ops::gemm(c, c.compute_stream(), A[static_cast<size_t>(r)], false,
                  B[static_cast<size_t>(r)], o.trans_b, C[static_cast<size_t>(r)]);
        c.compute_stream().synchronize();
      };
      auto run_blas = [&](int) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, o.trans_b ? CblasTrans : CblasNoTrans,
                    static_cast<blasint>(sh.m), static_cast<blasint>(sh.n),
                    static_cast<blasint>(sh.k), 1.f, a.data(), static_cast<blasint>(sh.k), b.data(),
                    static_cast<blasint>(o.trans_b ? sh.k : sh.n), 0.f, cc.data(),
                    static_cast<blasint>(sh.n));
      };
      // Alternate the two, one run each per round, so both see the same machine load; each
      // starts once the other's threads are idle (OpenBLAS's spin for about 2^28 cycles after a
      // multi-threaded call: they took a core from meshrt's next run, and a random shape per run
      // measured at 0.5x).
      std::vector<double> tm, tb;
      stop_openblas_threads();  // those OpenBLAS started when it loaded
      bench::wait_for_idle_threads(1000);
      for (int i = 0; i < o.warmup + o.repeats; ++i) {
        double t1 = time_ranks_once(ranks, run_meshrt);
        bench::wait_for_idle_threads(1000);
        openblas_set_num_threads(cores);
        double t2 = time_ranks_once(1, run_blas);
        openblas_set_num_threads(1);  // meshrt's policy (kernels/host/parallel.h)
        stop_openblas_threads();
        bench::wait_for_idle_threads(1000);
        if (i >= o.warmup) {
          tm.push_back(t1);
          tb.push_back(t2);
        }
      }
      ms_meshrt = median(tm);
      ms_base = median(tb);
    }
    const double r_meshrt = ranks * flops / (ms_meshrt * 1e-3) * scale;
    const double r_base = flops / (ms_base * 1e-3) * scale;
    const double ratio = r_meshrt / r_base;
    best_gemm_rate_per_rank = std::max(best_gemm_rate_per_rank, r_meshrt / ranks);
    out << "  " << std::left << std::setw(10) << sh.name << std::right << std::setw(7) << sh.m
        << std::setw(7) << sh.n << std::setw(7) << sh.k << std::setw(16) << fmt("%.2f", r_meshrt)
        << std::setw(16) << fmt("%.2f", r_base) << "   vs " << base << " " << ratio_str(ratio)
        << "\n";
    rows.push_back({{"shape", sh.name},
                    {"m", sh.m},
                    {"n", sh.n},
                    {"k", sh.k},
                    {"meshrt_ms", ms_meshrt},
                    {std::string(base) + "_ms", ms_base},
                    {std::string("meshrt_") + (cuda ? "tflops" : "gflops"), r_meshrt},
                    {std::string(base) + (cuda ? "_tflops" : "_gflops"), r_base},
                    {"ratio", ratio}});
  }
  report["gemm"] = rows;
  out << "\n";
}

void Bench::elementwise_section(Context& ctx) {
  Stream& s = ctx.compute_stream();
  const int64_t n = tokens * hidden;
  const double es = static_cast<double>(dtype_size(dt));
  const double tensor_bytes = static_cast<double>(n) * es;
  Tensor x = random_tensor(ctx, {tokens, hidden}, dt, 11);
  Tensor y = random_tensor(ctx, {tokens, hidden}, dt, 12);
  Tensor z = ctx.empty({tokens, hidden}, dt);
  Tensor g = random_tensor(ctx, {hidden}, dt, 13);
  Tensor b = random_tensor(ctx, {hidden}, dt, 14);
  Tensor dg = ctx.empty({hidden}, dt), db = ctx.empty({hidden}, dt);
  Tensor mean = ctx.empty({tokens}, DType::f32), rstd = ctx.empty({tokens}, DType::f32);
  Tensor rms_rstd = ctx.empty({tokens}, DType::f32);
  Tensor m1 = random_tensor(ctx, {tokens, hidden}, DType::f32, 15);
  Tensor m2 = random_tensor(ctx, {tokens, hidden}, DType::f32, 16);
  ops::scale(ctx, s, m2, m2, 0.f);  // second moments start at 0 (sqrt of a non-negative)
  ops::AdamWConfig adamw;
  // Token ids: a permutation of the table's rows (made on the host, copied to the device).
  Tensor ids = ctx.empty({tokens}, DType::i64);
  {
    std::vector<int64_t> h(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i) h[static_cast<size_t>(i)] = (i * 7919) % tokens;
    ids.copy_(Tensor::from_host_data(h.data(), {tokens}, DType::i64), s);
    s.synchronize();
  }
  ctx.synchronize();

  // The yardstick: a copy of one tensor (bytes moved = read + write).
  double copy_ms;
  if (cuda) {
#if defined(MESHRT_WITH_CUDA)
    copy_ms = bench::device_copy_ms(devs[0].index, static_cast<size_t>(tensor_bytes), o.warmup,
                                    o.repeats);
#else
    copy_ms = 0;
#endif
  } else {
    // memcpy split over the same pool the ops use, so both sides get the same threads.
    kernels::host::ThreadPool* tp = &kernels::host::pool(ctx);
    const char* src = static_cast<const char*>(x.data_ptr());
    char* dst = static_cast<char*>(z.data_ptr());
    const int64_t bytes = static_cast<int64_t>(tensor_bytes);
    copy_ms = time_stream(s, o.warmup, o.repeats, [&] {
      s.enqueue([tp, src, dst, bytes] {
        tp->parallel_for(bytes, int64_t{1} << 20, [=](int64_t lo, int64_t hi) {
          std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo));
        });
      });
    });
  }
  const double copy_gbs = 2 * tensor_bytes / (copy_ms * 1e-3) * 1e-9;

  struct Row {
    std::string name;
    double bytes;
    std::function<void()> run;
  };
  const double stats = static_cast<double>(tokens) * 8;
  std::vector<Row> rows_def = {
      {"add (residual)", 3 * tensor_bytes, [&] { ops::add(ctx, s, x, y, z); }},
      {"bias_gelu_fwd", 2 * tensor_bytes, [&] { ops::bias_gelu_fwd(ctx, s, x, &b, z); }},
      {"bias_gelu_bwd", 3 * tensor_bytes, [&] { ops::bias_gelu_bwd(ctx, s, y, x, &b, z, &db); }},
      {"layernorm_fwd", 2 * tensor_bytes + stats,
       [&] { ops::layernorm_fwd(ctx, s, x, g, &b, z, mean, rstd); }},
      {"layernorm_bwd", 3 * tensor_bytes + stats,
       [&] { ops::layernorm_bwd(ctx, s, y, x, g, mean, rstd, z, &dg, &db); }},
      {"softmax_rows_fwd", 2 * tensor_bytes, [&] { ops::softmax_rows_fwd(ctx, s, x, z); }},
      {"dropout_fwd", 2 * tensor_bytes, [&] { ops::dropout_fwd(ctx, s, x, z, 0.1f, 1, 2); }},
      {"scale", 2 * tensor_bytes, [&] { ops::scale(ctx, s, x, z, 0.5f); }},
      {"gelu_fwd", 2 * tensor_bytes, [&] { ops::bias_gelu_fwd(ctx, s, x, nullptr, z); }},
      {"gelu_bwd", 3 * tensor_bytes,
       [&] { ops::bias_gelu_bwd(ctx, s, y, x, nullptr, z, nullptr); }},
      {"rmsnorm_fwd", 2 * tensor_bytes + stats / 2,
       [&] { ops::rmsnorm_fwd(ctx, s, x, g, z, rms_rstd); }},
      {"rmsnorm_bwd", 3 * tensor_bytes + stats / 2,
       [&] { ops::rmsnorm_bwd(ctx, s, y, x, g, rms_rstd, z, &dg); }},
      {"softmax_rows_bwd", 3 * tensor_bytes, [&] { ops::softmax_rows_bwd(ctx, s, x, y, z); }},
      // Every row of a [tokens, hidden] table gathered once: one table read, one output write.
      {"embedding_fwd", 2 * tensor_bytes + static_cast<double>(tokens) * 8,
       [&] { ops::embedding_fwd(ctx, s, ids, x, z); }},
      // param read + write, grad read, f32 moments read + write.
      {"adamw", 3 * tensor_bytes + 16.0 * static_cast<double>(n),
       [&] {
         ops::adamw_update(ctx, s, std::span<const Tensor>(&z, 1), std::span<const Tensor>(&y, 1),
                           std::span<const Tensor>(&m1, 1), std::span<const Tensor>(&m2, 1), adamw);
       }},
  };
  // layernorm_bwd and rmsnorm_bwd read the statistics of a forward pass.
  ops::layernorm_fwd(ctx, s, x, g, &b, z, mean, rstd);
  ops::rmsnorm_fwd(ctx, s, x, g, z, rms_rstd);
  out << "Elementwise " << dtype_name(dt) << " [" << tokens << ", " << hidden << "] ("
      << fmt("%.1f", tensor_bytes / (1 << 20)) << " MiB per tensor), median of " << o.repeats
      << " runs\n";
  out << "  " << std::left << std::setw(18) << "op" << std::right << std::setw(12) << "MB moved"
      << std::setw(10) << "GB/s"
      << "   vs " << (cuda ? "device copy" : "memcpy") << "\n";
  out << "  " << std::left << std::setw(18) << (cuda ? "device copy" : "memcpy") << std::right
      << std::setw(12) << fmt("%.1f", 2 * tensor_bytes * 1e-6) << std::setw(10)
      << fmt("%.2f", copy_gbs) << "   1.00x\n";
  json rows = json::array();
  rows.push_back({{"op", cuda ? "device_copy" : "memcpy"},
                  {"bytes", 2 * tensor_bytes},
                  {"ms", copy_ms},
                  {"gbs", copy_gbs}});
  for (const Row& r : rows_def) {
    double ms = time_stream(s, o.warmup, o.repeats, r.run);
    double gbs = r.bytes / (ms * 1e-3) * 1e-9;
    out << "  " << std::left << std::setw(18) << r.name << std::right << std::setw(12)
        << fmt("%.1f", r.bytes * 1e-6) << std::setw(10) << fmt("%.2f", gbs) << "   "
        << ratio_str(gbs / copy_gbs) << "\n";
    rows.push_back({{"op", r.name},
                    {"bytes", r.bytes},
                    {"ms", ms},
                    {"gbs", gbs},
                    {"vs_copy", gbs / copy_gbs}});
  }
  report["elementwise"] = rows;
  out << "\n";
}

void Bench::attention_section(Context& ctx) {
  Stream& s = ctx.compute_stream();
  const int64_t B = o.attn_batch ? o.attn_batch : (cuda ? 4 : 1);
  const int64_t H = o.attn_heads ? o.attn_heads : (cuda ? 16 : 8);
  const int64_t S = o.attn_seq ? o.attn_seq : (cuda ? 2048 : 1024);
  const int64_t D = o.attn_head_dim;
  MESHRT_CHECK(B > 0 && H > 0 && S > 0 && D > 0, "gemm bench: attention dims must be > 0");
  Shape qs{B, H, S, D};
  Tensor q = random_tensor(ctx, qs, dt, 21), k = random_tensor(ctx, qs, dt, 22);
  Tensor v = random_tensor(ctx, qs, dt, 23), dout = random_tensor(ctx, qs, dt, 24);
  Tensor out_t = ctx.empty(qs, dt), lse = ctx.empty({B, H, S}, DType::f32);
  Tensor dq = ctx.empty(qs, dt), dk = ctx.empty(qs, dt), dv = ctx.empty(qs, dt);
  ctx.synchronize();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Causal: half of the 4 * B * H * S^2 * D multiply-add FLOPs of full attention; backward 2.5x.
  const double fwd_flops = 2.0 * static_cast<double>(B * H) * static_cast<double>(S) *
                           static_cast<double>(S) * static_cast<double>(D);
  const double unit = cuda ? 1e-12 : 1e-9;
  const char* u = cuda ? "TFLOP/s" : "GFLOP/s";
  out << "Causal attention " << dtype_name(dt) << " [" << B << ", " << H << ", " << S << ", " << D
      << "], median of " << o.repeats << " runs\n";
  // Against the fastest GEMM of the table above (per rank: attention runs on one rank's threads).
  const double peak = best_gemm_rate_per_rank;
  out << "  " << std::left << std::setw(11) << "kernel" << std::setw(10) << "pass" << std::right
      << std::setw(10) << "ms" << std::setw(12) << u << (peak > 0 ? "   vs best GEMM above" : "")
      << "\n";
  // CUDA: both kernels (ops.h, AttentionKernel), each forced through the process setting; the
  // host has one.
  struct Kernel {
    std::string name;
    ops::AttentionKernel setting;
  };
  std::vector<Kernel> kernels;
  if (cuda) {
    kernels = {{"flash", ops::AttentionKernel::Flash},
               {"reference", ops::AttentionKernel::Reference}};
  } else {
    kernels = {{"host", ops::attention_kernel()}};
  }
  const ops::AttentionKernel saved = ops::attention_kernel();
  json rows = json::array();
  json default_row;  // the figures of the kernel the op runs by default
  for (const Kernel& kn : kernels) {
    if (cuda && ops::cuda_attention_kernel(dt, D, kn.setting) != kn.setting) {
      out << "  " << std::left << std::setw(11) << kn.name << "not supported for " << dtype_name(dt)
          << ", head_dim " << D << " (bf16 / f16 with 64 or 128)\n"
          << std::right;
      continue;
    }
    ops::set_attention_kernel(kn.setting);
    const double fwd_ms = time_stream(s, o.warmup, o.repeats, [&] {
      ops::attention_fwd(ctx, s, q, k, v, out_t, lse, scale, true);
    });
    const double bwd_ms = time_stream(s, o.warmup, o.repeats, [&] {
      ops::attention_bwd(ctx, s, q, k, v, out_t, dout, lse, dq, dk, dv, scale, true);
    });
    const double f = fwd_flops / (fwd_ms * 1e-3) * unit;
    const double bw = 2.5 * fwd_flops / (bwd_ms * 1e-3) * unit;
    auto vs_gemm = [&](double rate) {
      return peak > 0 ? std::string("   ") + fmt("%.2f", rate / peak) + "x" : std::string();
    };
    out << "  " << std::left << std::setw(11) << kn.name << std::setw(10) << "forward" << std::right
        << std::setw(10) << fmt("%.3f", fwd_ms) << std::setw(12) << fmt("%.2f", f) << vs_gemm(f)
        << "\n";
    out << "  " << std::left << std::setw(11) << "" << std::setw(10) << "backward" << std::right
        << std::setw(10) << fmt("%.3f", bwd_ms) << std::setw(12) << fmt("%.2f", bw) << vs_gemm(bw)
        << "\n";
    json row = {{"kernel", kn.name},
                {"fwd_ms", fwd_ms},
                {"bwd_ms", bwd_ms},
                {"fwd_rate", f},
                {"bwd_rate", bw}};
    if (peak > 0) {
      row["fwd_vs_best_gemm"] = f / peak;
      row["bwd_vs_best_gemm"] = bw / peak;
    }
    if (!cuda || ops::cuda_attention_kernel(dt, D, saved) == kn.setting) default_row = row;
    rows.push_back(row);
  }
  ops::set_attention_kernel(saved);
  out << "\n";
  report["attention"] = {
      {"batch", B},      {"best_gemm_rate_per_rank", peak > 0 ? json(peak) : json(nullptr)},
      {"heads", H},      {"seq", S},
      {"head_dim", D},   {"unit", u},
      {"kernels", rows}, {"default", default_row}};
}

}  // namespace

void check_gemm_options(const GemmBenchOptions& o) {
  MESHRT_CHECK(o.warmup >= 0 && o.repeats >= 1,
               "gemm bench: --warmup must be >= 0 and --repeats >= 1 (got " << o.warmup << ", "
                                                                            << o.repeats << ")");
  MESHRT_CHECK(is_floating(parse_dtype(o.dtype)),
               "gemm bench: --dtype " << o.dtype << " must be f32, bf16 or f16");
  const std::vector<Device> devs = parse_devices(o.devices);
  MESHRT_CHECK(!devs.empty(), "gemm bench: --devices '" << o.devices << "' names no device");
  const bool cuda = devs[0].is_cuda();
  for (const Device& d : devs) {
    MESHRT_CHECK(d.is_cuda() == cuda,
                 "gemm bench: --devices '" << o.devices << "' mixes cpu and cuda");
  }
  if (cuda) {
    std::string why;
    MESHRT_CHECK(cuda_available(&why),
                 "gemm bench: --devices " << o.devices << " but CUDA is unusable: " << why);
  }
  // 0 stands for the device's default size.
  MESHRT_CHECK(o.tokens >= 0 && o.hidden >= 0, "gemm bench: --tokens and --hidden must be > 0");
  // Every flag is checked before any output, the custom shape too.
  MESHRT_CHECK(!(o.m || o.n || o.k) || (o.m > 0 && o.n > 0 && o.k > 0),
               "gemm bench: -m, -n and -k must all be > 0 (got " << o.m << ", " << o.n << ", "
                                                                 << o.k << ")");
  check_output_path(o.json_path, "--json");  // up front: not a directory found after the run
  // The largest GEMM's A, B and C on every rank, in the dtype and as the f32 copies the BLAS
  // comparison multiplies: refused before any output when the host cannot hold them.
  if (cuda) return;
  const double t = static_cast<double>(o.tokens ? o.tokens : 2048),
               h = static_cast<double>(o.hidden ? o.hidden : 768);
  double elems = t * h + h * 4 * h + t * 4 * h;  // fc1, the largest block shape
  if (o.m > 0) {
    const double m = static_cast<double>(o.m), n = static_cast<double>(o.n),
                 k = static_cast<double>(o.k);
    elems = std::max(elems, m * k + k * n + m * n);
  }
  const double need = elems * (dtype_size(parse_dtype(o.dtype)) + 4.0) * devs.size();
  const int64_t have = bench::physical_memory_bytes();
  MESHRT_CHECK(have == 0 || need < 0.8 * static_cast<double>(have),
               "gemm bench: the largest GEMM's operands need "
                   << bench::human_bytes(need) << " on " << devs.size()
                   << " rank(s) and this machine has "
                   << bench::human_bytes(static_cast<double>(have))
                   << " of memory; lower -m / -n / -k (or --tokens / --hidden)");
}

int run_gemm_bench(const GemmBenchOptions& o, std::ostream& out) {
  check_gemm_options(o);
  Bench bench{o, out, parse_dtype(o.dtype), parse_devices(o.devices), false, 1, 0, 0, json()};
  bench.cuda = bench.devs[0].is_cuda();
  if (bench.cuda) bench.devs.resize(1);  // one GPU: the kernels are per device
  bench.ranks = static_cast<int>(bench.devs.size());
  bench.tokens = o.tokens ? o.tokens : (bench.cuda ? 8192 : 2048);
  bench.hidden = o.hidden ? o.hidden : (bench.cuda ? 4096 : 768);

  std::vector<std::unique_ptr<Context>> ctxs;
  for (int r = 0; r < bench.ranks; ++r) {
    ContextOptions co;
    co.rank = r;
    co.world_size = bench.ranks;
    co.local_ranks = bench.cuda ? 1 : bench.ranks;
    ctxs.push_back(std::make_unique<Context>(bench.devs[static_cast<size_t>(r)], co));
  }
  out << "meshrt gemm bench: " << o.devices << " (" << bench.ranks
      << (bench.ranks == 1 ? " rank" : " ranks") << ")";
  if (bench.cuda) {
#if defined(MESHRT_WITH_CUDA)
    out << ", " << bench::device_description(bench.devs[0].index);
#endif
  } else {
    out << ", " << kernels::host::usable_cores() << " cores, " << ops::host_threads(*ctxs[0])
        << " threads per rank, OpenBLAS " << openblas_get_config();
    std::string advice = kernels::host::blas_core_advice();
    if (!advice.empty()) out << "\nnote: " << advice;
  }
  out << "\n\n";
  bench.report["devices"] = o.devices;
  bench.report["dtype"] = dtype_name(bench.dt);
  bench.report["ranks"] = bench.ranks;
  if (o.gemm) bench.gemm_section(ctxs);
  if (o.elementwise) bench.elementwise_section(*ctxs[0]);
  if (o.attention) bench.attention_section(*ctxs[0]);
  if (!bench.cuda) {
    bench::print_host_f32_gemm(out);
    bench.report["host_f32_gemm"] = bench::host_f32_gemm_json();
  }
  if (!o.json_path.empty()) {
    write_output_file(o.json_path, bench.report.dump(2) + "\n", "--json");
  }
  return 0;
}

}  // namespace meshrt
