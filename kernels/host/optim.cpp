// Host multi-tensor AdamW and SGD-with-momentum updates.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "kernels/host/reduce.h"
#include "kernels/math.h"
#include "runtime/dtype_dispatch.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

namespace {
constexpr int64_t kChunk = 1 << 15;
constexpr int64_t kTile = 1024;  // elements per row view of a piece (reduce.h)

// Runs step(p_in, p_out, g, j0, len) on row views (reduce.h) of [begin, end) of p and g, kTile
// elements at a time, and writes p back.
template <class PT, class GT, class F>
void for_tiles(PT* p, const GT* g, int64_t begin, int64_t end, F&& step) {
  alignas(64) float pb[kTile], gb[kTile];
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t len = std::min(kTile, end - t0);
    const auto* pin = row_in(p + t0, pb, len);
    auto* pout = row_out(p + t0, pb);
    step(pin, pout, row_in(g + t0, gb, len), t0, len);
    row_commit(p + t0, pout, len);
  }
}

struct Piece {
  size_t tensor;
  int64_t begin, end;
};

// Splits every tensor into chunks so one pool run covers the whole group.
std::vector<Piece> pieces_of(const std::vector<Tensor>& params) {
  std::vector<Piece> out;
  for (size_t i = 0; i < params.size(); ++i) {
    int64_t n = params[i].numel();
    for (int64_t b = 0; b < n; b += kChunk) out.push_back({i, b, std::min(n, b + kChunk)});
  }
  return out;
}

// Calls f(P{}, G{}) for a (param, grad) dtype pair; grad is the param's dtype or f32.
template <class F>
void dispatch_pg(DType p, DType g, F&& f) {
  dispatch_float(p, [&](auto pt) {
    using P = decltype(pt);
    if (g == DType::f32) {
      f(pt, float{});
    } else {
      f(pt, P{});
    }
  });
}

// The f32 state tensors' pointers, taken once per update rather than once per tile.
std::vector<float*> f32_data(const std::vector<Tensor>& ts) {
  std::vector<float*> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(t.data<float>());
  return out;
}

// Runs step(i, p_in, p_out, g, j0, len) over every tile of every tensor i of P and G (for_tiles'
// row views), the pieces spread over the pool: the loop every multi-tensor update shares.
template <class F>
void for_param_tiles(ThreadPool* tp, const std::vector<Tensor>& P, const std::vector<Tensor>& G,
                     F&& step) {
  std::vector<Piece> pieces = pieces_of(P);
  tp->run(static_cast<int64_t>(pieces.size()), [&](int64_t t) {
    const Piece& pc = pieces[static_cast<size_t>(t)];
    const size_t i = pc.tensor;
    dispatch_pg(P[i].dtype(), G[i].dtype(), [&](auto ptag, auto gtag) {
      using PT = decltype(ptag);
      using GT = decltype(gtag);
      for_tiles(P[i].data<PT>(), G[i].data<GT>(), pc.begin, pc.end,
                [&](auto pin, auto pout, auto gin, int64_t j0, int64_t n) {
                  step(i, pin, pout, gin, j0, n);
                });
    });
  });
}
}  // namespace

void adamw_update(Context& ctx, Stream& s, std::span<const Tensor> params,
                  std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
                  std::span<const Tensor> exp_avg_sq, const ops::AdamWConfig& cfg) {
  ThreadPool* tp = &pool(ctx);
  kmath::AdamWScalars c;
  c.lr = cfg.lr;
  c.beta1 = cfg.beta1;
  c.beta2 = cfg.beta2;
  c.eps = cfg.eps;
  c.decay = 1.0f - cfg.lr * cfg.weight_decay;
  double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(cfg.step));
  double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(cfg.step));
  c.step_size = static_cast<float>(cfg.lr / bc1);
  c.bc2_sqrt_inv = static_cast<float>(1.0 / std::sqrt(bc2));
  c.grad_scale = cfg.grad_scale;
  std::vector<Tensor> P(params.begin(), params.end()), G(grads.begin(), grads.end()),
      M(exp_avg.begin(), exp_avg.end()), V(exp_avg_sq.begin(), exp_avg_sq.end());
  s.enqueue([tp, P, G, M, V, c] {
    const std::vector<float*> ms = f32_data(M), vs = f32_data(V);
    for_param_tiles(tp, P, G, [&](size_t i, auto pin, auto pout, auto gin, int64_t j0, int64_t n) {
      float* m = ms[i] + j0;
      float* v = vs[i] + j0;
      for (int64_t j = 0; j < n; ++j)
        store_f32(pout, j, kmath::adamw_step(load_f32(pin, j), load_f32(gin, j), m[j], v[j], c));
    });
  });
}

void sgd_momentum_update(Context& ctx, Stream& s, std::span<const Tensor> params,
                         std::span<const Tensor> grads, std::span<const Tensor> bufs,
                         const ops::SgdConfig& cfg) {
  ThreadPool* tp = &pool(ctx);
  kmath::SgdScalars c{cfg.lr,         cfg.momentum, cfg.dampening,   cfg.weight_decay,
                      cfg.grad_scale, cfg.nesterov, cfg.init_buffers};
  std::vector<Tensor> P(params.begin(), params.end()), G(grads.begin(), grads.end()),
      B(bufs.begin(), bufs.end());
  s.enqueue([tp, P, G, B, c] {
    const std::vector<float*> bs = f32_data(B);
    for_param_tiles(tp, P, G, [&](size_t i, auto pin, auto pout, auto gin, int64_t j0, int64_t n) {
      float* b = bs[i] + j0;
      for (int64_t j = 0; j < n; ++j)
        store_f32(pout, j, kmath::sgd_step(load_f32(pin, j), load_f32(gin, j), b[j], c));
    });
  });
}

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
