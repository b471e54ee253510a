// f32 GEMM tiles through OpenBLAS or oneDNN, chosen per tile shape (see gemm_f32_path.h).
#include "kernels/host/gemm_f32_path.h"

#include <cblas.h>

#include <map>
#include <mutex>
#include <tuple>

#include "runtime/env.h"
#include "runtime/error.h"

namespace meshrt::kernels::host {

namespace {

// auto's table: tiles under this many multiply-adds (~0.1 ms at 40 GFLOP/s) stay on OpenBLAS,
// too small for the library to matter.
constexpr int64_t kMinOnednnFma = int64_t{1} << 22;

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

F32Path f32_path_for(const DnnlTile& t) {
  const Mode mode = f32_mode();
  // Small tiles: OpenBLAS, unrecorded (the common case takes no lock).
  if (mode == Mode::automatic && t.m * t.n * t.k < kMinOnednnFma) return F32Path::openblas;
  const F32Key key{t.m, t.n, t.k, t.trans_a, t.trans_b, static_cast<int>(mode)};
  F32Cache& cache = f32_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.by_key.find(key);
  if (it != cache.by_key.end()) return it->second.path;
  F32Choice c;
  if (mode == Mode::automatic) {
    c.path = f32_auto_path(t.m, t.n, t.k, dnnl_avx512());
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

F32Path f32_auto_path(int64_t m, int64_t n, int64_t k, bool onednn_avx512) {
  if (!onednn_avx512 || m * n * k < kMinOnednnFma) return F32Path::openblas;
  return F32Path::onednn;
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
  return "auto: " + blas + " or f32 matmul of " + dnnl_description() + ", by a fixed table: " +
         (dnnl_avx512() ? "oneDNN for tiles of at least " + std::to_string(kMinOnednnFma) +
                              " multiply-adds (AVX-512), OpenBLAS for smaller ones"
                        : "OpenBLAS for every tile (oneDNN runs without AVX-512 here)") +
         " (MESHRT_HOST_F32_GEMM=openblas|onednn forces one)";
}

}  // namespace meshrt::kernels::host
