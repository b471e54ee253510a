// f32 GEMM tiles through OpenBLAS or oneDNN, chosen per tile shape (see gemm_f32_path.h).
#include "kernels/host/gemm_f32_path.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>

#include "runtime/env.h"
#include "runtime/error.h"

namespace meshrt::kernels::host {

namespace {

// oneDNN is kept only when at least this much faster: near-ties stay on OpenBLAS, the path
// meshrt has always run, so noise does not flip shapes between runs.
constexpr double kOnednnMargin = 0.97;
// auto times tiles of at least this many multiply-adds (~0.1 ms at 40 GFLOP/s); smaller ones stay
// on OpenBLAS untimed: too short to time against the noise, too small to matter, and the same in
// every process (small test and training runs stay bit-reproducible across processes).
constexpr int64_t kMinTimedFma = int64_t{1} << 22;
// Scratch C of a timed tile: at most this many floats (64 MiB); taller tiles are timed on their
// first rows.
constexpr int64_t kMaxScratch = int64_t{1} << 24;

enum class Mode { automatic, openblas, onednn, bf16 };

Mode f32_mode() {
  const std::string v = env_choice("MESHRT_HOST_F32_GEMM");
  if (v == "openblas") return Mode::openblas;
  if (v == "onednn" || v == "bf16") {
    MESHRT_CHECK(dnnl_built(), "MESHRT_HOST_F32_GEMM="
                                   << v
                                   << ", but this build has no oneDNN: run tools/install-deps.sh "
                                      "and reconfigure, or use auto or openblas");
    return v == "bf16" ? Mode::bf16 : Mode::onednn;
  }
  return Mode::automatic;
}

// (m, n, k, trans_a, trans_b, mode): the shapes decided so far, and their first-use order.
using F32Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int>;
struct F32Cache {
  std::mutex mu;
  std::map<F32Key, F32Choice> by_key;
  std::vector<F32Key> order;
};
F32Cache& f32_cache() {
  static F32Cache c;
  return c;
}

double f32_run_us(const DnnlTile& t, F32Path p) {
  const auto t0 = std::chrono::steady_clock::now();
  f32_tile_on(t, p);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

double f32_median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Times both paths on t's A and B into a scratch C: one warm-up run each (oneDNN builds its
// primitive), then pairs in alternating order so both see the same machine load; short tiles
// repeat within a sample so each sample is ~50 us or more.
F32Choice f32_measure(const DnnlTile& t) {
  DnnlTile u = t;
  u.m = std::max<int64_t>(1, std::min(t.m, kMaxScratch / std::max<int64_t>(t.n, 1)));
  std::vector<float> scratch(static_cast<size_t>(u.m * u.n));
  u.c = scratch.data();
  u.ldc = u.n;
  u.alpha = 1.f;
  u.beta = 0.f;
  u.bias = nullptr;
  const double first = std::max(f32_run_us(u, F32Path::openblas), f32_run_us(u, F32Path::onednn));
  const int pairs = first > 20000 ? 1 : first > 4000 ? 3 : 5;
  const int reps = static_cast<int>(std::clamp(50.0 / std::max(first, 1e-3), 1.0, 64.0));
  std::vector<double> ob, dn;
  for (int i = 0; i < pairs; ++i) {
    for (int j = 0; j < 2; ++j) {
      const bool blas = (i + j) % 2 == 0;
      double us = 0.0;
      for (int r = 0; r < reps; ++r)
        us += f32_run_us(u, blas ? F32Path::openblas : F32Path::onednn);
      (blas ? ob : dn).push_back(us / reps);
    }
  }
  F32Choice c;
  c.openblas_us = f32_median(ob);
  c.onednn_us = f32_median(dn);
  c.path = c.onednn_us < kOnednnMargin * c.openblas_us ? F32Path::onednn : F32Path::openblas;
  return c;
}

F32Path f32_path_for(const DnnlTile& t) {
  Mode mode = f32_mode();
  if (mode == Mode::automatic && !dnnl_built()) return F32Path::openblas;
  if (mode == Mode::automatic && t.m * t.n * t.k < kMinTimedFma) return F32Path::openblas;
  const F32Key key{t.m, t.n, t.k, t.trans_a, t.trans_b, static_cast<int>(mode)};
  F32Cache& cache = f32_cache();
  // Held while a new shape is timed: the pool's other tiles of that shape wait for the answer
  // (and do not disturb the timing).
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.by_key.find(key);
  if (it != cache.by_key.end()) return it->second.path;
  F32Choice c;
  if (mode == Mode::automatic) {
    c = f32_measure(t);
  } else {
    c.forced = true;
    c.path = mode == Mode::onednn ? F32Path::onednn
             : mode == Mode::bf16 ? F32Path::onednn_bf16
                                  : F32Path::openblas;
  }
  c.m = t.m;
  c.n = t.n;
  c.k = t.k;
  c.trans_a = t.trans_a;
  c.trans_b = t.trans_b;
  cache.by_key.emplace(key, c);
  cache.order.push_back(key);
  return c.path;
}

}  // namespace

const char* f32_path_name(F32Path p) {
  switch (p) {
    case F32Path::onednn:
      return "onednn";
    case F32Path::onednn_bf16:
      return "onednn-bf16";
    case F32Path::openblas:
      break;
  }
  return "openblas";
}

void f32_tile_on(const DnnlTile& t, F32Path p) {
  MESHRT_CHECK(t.ab_f32 && t.bias == nullptr && t.k > 0,
               "internal: f32 tile with ab_f32=" << t.ab_f32 << " bias=" << (t.bias != nullptr)
                                                 << " k=" << t.k);
  if (p == F32Path::onednn && dnnl_tile(t)) return;
  if (p == F32Path::onednn_bf16) {
    DnnlTile u = t;
    u.bf16_math = true;
    if (dnnl_tile(u)) return;
  }
  cblas_sgemm(
      CblasRowMajor, t.trans_a ? CblasTrans : CblasNoTrans, t.trans_b ? CblasTrans : CblasNoTrans,
      static_cast<blasint>(t.m), static_cast<blasint>(t.n), static_cast<blasint>(t.k), t.alpha,
      static_cast<const float*>(t.a), static_cast<blasint>(t.lda), static_cast<const float*>(t.b),
      static_cast<blasint>(t.ldb), t.beta, static_cast<float*>(t.c), static_cast<blasint>(t.ldc));
}

void f32_tile(const DnnlTile& t) { f32_tile_on(t, f32_path_for(t)); }

bool f32_bf16_math() { return f32_mode() == Mode::bf16; }

bool f32_bf16_products() { return f32_bf16_math() && !dnnl_f32_bf16_impl().empty(); }

std::vector<F32Choice> f32_choices() {
  F32Cache& cache = f32_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  std::vector<F32Choice> out;
  out.reserve(cache.order.size());
  for (const F32Key& k : cache.order) out.push_back(cache.by_key.at(k));
  return out;
}

std::string host_gemm_f32_info() {
  const std::string blas = std::string("OpenBLAS (") + openblas_get_config() + ")";
  switch (f32_mode()) {
    case Mode::openblas:
      return blas + " for every shape (MESHRT_HOST_F32_GEMM=openblas)";
    case Mode::onednn:
      return "f32 matmul of " + dnnl_description() +
             " for every shape (MESHRT_HOST_F32_GEMM=onednn)";
    case Mode::bf16:
      return "f32 matmul of " + dnnl_description() + " for every shape, " +
             (dnnl_f32_bf16_impl().empty()
                  ? "products in f32: oneDNN has no bf16-product f32 matmul for this CPU"
                  : "products in bf16 where oneDNN's " + dnnl_f32_bf16_impl() +
                        " takes the tile (f32 in, out and sums)") +
             " (MESHRT_HOST_F32_GEMM=bf16)";
    case Mode::automatic:
      break;
  }
  if (!dnnl_built()) return blas + " (auto, built without oneDNN: install libdnnl-dev)";
  return "auto: " + blas + " or f32 matmul of " + dnnl_description() +
         ", the faster per tile shape, timed at its first use (tiles under " +
         std::to_string(kMinTimedFma) +
         " multiply-adds: OpenBLAS; MESHRT_HOST_F32_GEMM=openblas|onednn forces one)";
}

}  // namespace meshrt::kernels::host
