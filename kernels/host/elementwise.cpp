// Host elementwise ops: add / scale, sum of squares, cast, fill, bias + GeLU, dropout.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "kernels/host/reduce.h"
#include "kernels/math.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/host_copy.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

namespace {
constexpr int64_t kGrain = 1 << 15;  // elements per parallel chunk
constexpr int64_t kTile = 1024;      // elements per row view of a chunk (reduce.h)

// Rows per chunk so that a chunk holds about kGrain elements.
int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, row_len));
}
}  // namespace

void add(Context& ctx, Stream& s, const Tensor& a, const Tensor& b, const Tensor& out, float alpha,
         float beta) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, a = a.stream_ref(s), b = b.stream_ref(s), out = out.stream_ref(s), alpha, beta] {
    dispatch_float(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* po = out.data<T>();
      tp->parallel_for(out.numel(), kGrain, [=](int64_t lo, int64_t hi) {
        alignas(64) float ta[kTile], tb[kTile], to[kTile];
        for (int64_t t0 = lo; t0 < hi; t0 += kTile) {
          const int64_t len = std::min(kTile, hi - t0);
          const auto* x = row_in(pa + t0, ta, len);
          auto* y = row_out(po + t0, to);
          if (beta == 0.f) {
            for (int64_t i = 0; i < len; ++i) store_f32(y, i, alpha * load_f32(x, i));
          } else {
            const auto* z = row_in(pb + t0, tb, len);
            if (alpha == 1.f && beta == 1.f) {
              for (int64_t i = 0; i < len; ++i) store_f32(y, i, load_f32(x, i) + load_f32(z, i));
            } else {
              for (int64_t i = 0; i < len; ++i)
                store_f32(y, i, alpha * load_f32(x, i) + beta * load_f32(z, i));
            }
          }
          row_commit(po + t0, y, len);
        }
      });
    });
  });
}

void scale(Context& ctx, Stream& s, const Tensor& x, const Tensor& out, float alpha) {
  add(ctx, s, x, x, out, alpha, 0.f);
}

void sum_squares(Context& ctx, Stream& s, const Tensor& x, const Tensor& out) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, x = x.stream_ref(s), out = out.stream_ref(s)] {
    const int64_t n = x.numel(), chunks = (n + kGrain - 1) / kGrain;
    // One f64 partial per fixed chunk, summed in chunk order: the result does not depend on the
    // number of threads.
    std::vector<double> part(static_cast<size_t>(chunks));
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      tp->run(chunks, [&](int64_t c) {
        const int64_t lo = c * kGrain, len = std::min(kGrain, n - lo);
        if constexpr (std::is_same_v<T, float>) {
          part[static_cast<size_t>(c)] = dot_f32(px + lo, px + lo, len);
        } else {
          float buf[kGrain];
          load_row(px + lo, buf, len);
          part[static_cast<size_t>(c)] = dot_f32(buf, buf, len);
        }
      });
    });
    double total = 0;
    for (double p : part) total += p;
    float* po = out.data<float>();
    po[0] = static_cast<float>(po[0] + total);
  });
}

namespace {
// A contiguous [lo, hi) element range of `t` as a 1-d descriptor.
TensorDesc range_desc(const Tensor& t, int64_t lo, int64_t hi) {
  TensorDesc d;
  d.ptr = static_cast<char*>(t.data_ptr()) + lo * static_cast<int64_t>(dtype_size(t.dtype()));
  d.dtype = t.dtype();
  d.ndim = 1;
  d.shape[0] = hi - lo;
  d.strides[0] = 1;
  return d;
}
}  // namespace

// cast and fill are the runtime's host copy and fill (one implementation per device family),
// split across the rank's threads when both sides are contiguous.
void cast(Context& ctx, Stream& s, const Tensor& x, const Tensor& out) {
  if (!x.is_contiguous() || !out.is_contiguous()) {
    out.copy_(x, s);
    return;
  }
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, x = x.stream_ref(s), out = out.stream_ref(s)] {
    tp->parallel_for(out.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      host_copy_strided(range_desc(out, lo, hi), range_desc(x, lo, hi));
    });
  });
}

void fill(Context& ctx, Stream& s, const Tensor& out, double value) {
  ThreadPool* tp = &pool(ctx);  // ops::fill requires a contiguous out
  s.enqueue([tp, out = out.stream_ref(s), value] {
    tp->parallel_for(out.numel(), kGrain,
                     [&](int64_t lo, int64_t hi) { host_fill(range_desc(out, lo, hi), value); });
  });
}

namespace {
template <ops::GeluKind K>
inline float gelu(float x) {
  if constexpr (K == ops::GeluKind::Tanh) {
    return kmath::gelu_tanh(x);
  } else {
    return kmath::gelu_erf(x);
  }
}
template <ops::GeluKind K>
inline float gelu_grad(float x) {
  if constexpr (K == ops::GeluKind::Tanh) {
    return kmath::gelu_tanh_grad(x);
  } else {
    return kmath::gelu_erf_grad(x);
  }
}

template <class F>
void dispatch_gelu(ops::GeluKind k, F&& f) {
  if (k == ops::GeluKind::Tanh) {
    f(std::integral_constant<ops::GeluKind, ops::GeluKind::Tanh>{});
  } else {
    f(std::integral_constant<ops::GeluKind, ops::GeluKind::Erf>{});
  }
}
}  // namespace

void bias_gelu_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& bias, const Tensor& y,
                   ops::GeluKind kind) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, x = x.stream_ref(s), bias = bias.stream_ref(s), y = y.stream_ref(s), kind] {
    const int64_t n = row_len(x), rows = row_count(x);
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      dispatch_gelu(kind, [&](auto kc) {
        constexpr ops::GeluKind K = decltype(kc)::value;
        const T* px = x.data<T>();
        const T* pb = bias.defined() ? bias.data<T>() : nullptr;
        T* py = y.data<T>();
        tp->parallel_for(rows, row_grain(n), [=](int64_t r0, int64_t r1) {
          float* bf = scratch_f32(0, static_cast<size_t>(n));
          if (pb) {
            load_row(pb, bf, n);
          } else {
            std::fill(bf, bf + n, 0.f);
          }
          float* rowbuf = scratch_f32(1, static_cast<size_t>(n));
          for (int64_t r = r0; r < r1; ++r) {
            const auto* xr = row_in(px + r * n, rowbuf, n);
            auto* yr = row_out(py + r * n, rowbuf);
            for (int64_t j = 0; j < n; ++j) store_f32(yr, j, gelu<K>(load_f32(xr, j) + bf[j]));
            row_commit(py + r * n, yr, n);
          }
        });
      });
    });
  });
}

void bias_gelu_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x, const Tensor& bias,
                   const Tensor& dx, const Tensor& dbias, ops::GeluKind kind, bool accumulate) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, dy = dy.stream_ref(s), x = x.stream_ref(s), bias = bias.stream_ref(s),
             dx = dx.stream_ref(s), dbias = dbias.stream_ref(s), kind, accumulate] {
    const int64_t n = row_len(x), rows = row_count(x);
    // Fixed row chunks (independent of the thread count) reduced in order: dbias is
    // deterministic whatever the pool size.
    int64_t rpc = row_grain(n);
    int64_t chunks = (rows + rpc - 1) / rpc;
    if (chunks > 64) {
      rpc = (rows + 63) / 64;
      chunks = (rows + rpc - 1) / rpc;
    }
    const bool want_db = dbias.defined();
    std::vector<float> partial(want_db ? static_cast<size_t>(chunks * n) : 0, 0.f);
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      dispatch_gelu(kind, [&](auto kc) {
        constexpr ops::GeluKind K = decltype(kc)::value;
        const T* px = x.data<T>();
        const T* pdy = dy.data<T>();
        const T* pb = bias.defined() ? bias.data<T>() : nullptr;
        T* pdx = dx.data<T>();
        float* part = partial.data();
        tp->run(chunks, [=](int64_t c) {
          float* bf = scratch_f32(0, static_cast<size_t>(n));
          if (pb) {
            load_row(pb, bf, n);
          } else {
            std::fill(bf, bf + n, 0.f);
          }
          float* acc = want_db ? part + c * n : nullptr;
          int64_t r1 = std::min(rows, (c + 1) * rpc);
          float* xbuf = scratch_f32(1, static_cast<size_t>(n));
          float* gbuf = scratch_f32(2, static_cast<size_t>(n));
          for (int64_t r = c * rpc; r < r1; ++r) {
            const auto* xr = row_in(px + r * n, xbuf, n);
            const auto* dyr = row_in(pdy + r * n, gbuf, n);
            auto* dxr = row_out(pdx + r * n, gbuf);
            if (acc) {
              for (int64_t j = 0; j < n; ++j) {
                float g = load_f32(dyr, j) * gelu_grad<K>(load_f32(xr, j) + bf[j]);
                store_f32(dxr, j, g);
                acc[j] += g;
              }
            } else {
              for (int64_t j = 0; j < n; ++j)
                store_f32(dxr, j, load_f32(dyr, j) * gelu_grad<K>(load_f32(xr, j) + bf[j]));
            }
            row_commit(pdx + r * n, dxr, n);
          }
        });
        if (want_db) {
          T* pdb = dbias.data<T>();
          tp->parallel_for(n, 1024, [=](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; ++j) {
              float sum = accumulate ? load_f32(pdb, j) : 0.f;
              for (int64_t c = 0; c < chunks; ++c) sum += part[c * n + j];
              store_f32(pdb, j, sum);
            }
          });
        }
      });
    });
  });
}

namespace {
// Philox4x32-10 draws for kDraws consecutive counters under one key and stream, with the counters
// laid out lane by lane so that the rounds vectorize (vpmuludq): the scalar philox_draw does one
// draw at a time and is the whole cost of dropout. words[4 * j + w] = philox_draw(seed, offset,
// index0 + j).v[w], bit for bit (checked against philox_draw in test_elementwise.cpp).
constexpr int kDraws = 16;
inline void philox_draws(uint64_t seed, uint64_t offset, uint64_t index0,
                         uint32_t* __restrict words) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // as philox4x32_10
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0[kDraws], c1[kDraws], c2[kDraws], c3[kDraws];
  for (int j = 0; j < kDraws; ++j) {
    const uint64_t idx = index0 + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(idx);
    c1[j] = static_cast<uint32_t>(idx >> 32);
    c2[j] = static_cast<uint32_t>(offset);
    c3[j] = static_cast<uint32_t>(offset >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    // Kept as a loop (not unrolled into scalar code) so that it vectorizes across the draws.
#pragma GCC unroll 1
    for (int j = 0; j < kDraws; ++j) {
      const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[j];
      const uint64_t p1 = static_cast<uint64_t>(kM1) * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c0[j] = n0;
      c1[j] = static_cast<uint32_t>(p1);
      c2[j] = n2;
      c3[j] = static_cast<uint32_t>(p0);
    }
    k0 += kW0;
    k1 += kW1;
  }
  for (int j = 0; j < kDraws; ++j) {
    words[4 * j] = c0[j];
    words[4 * j + 1] = c1[j];
    words[4 * j + 2] = c2[j];
    words[4 * j + 3] = c3[j];
  }
}
}  // namespace

void dropout_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& y, float p, uint64_t seed,
                 uint64_t offset, int64_t index_base) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, x = x.stream_ref(s), y = y.stream_ref(s), p, seed, offset, index_base] {
    const float inv = 1.0f / (1.0f - p);
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      T* py = y.data<T>();
      tp->parallel_for(x.numel(), kGrain, [=](int64_t lo, int64_t hi) {
        int64_t i = lo;
        uint64_t gi = static_cast<uint64_t>(index_base + lo);
        // One element of the mask from a draw's word.
        auto apply = [&](uint32_t word, int64_t k) {
          store_f32(py, k, kmath::dropout_keep_word(word, p) ? load_f32(px, k) * inv : 0.f);
        };
        // Head up to a draw boundary, then kDraws draws (4 * kDraws elements) at a time, then
        // the tail: draw by draw.
        while (i < hi && (gi & 3u) != 0) {
          Philox4 r = philox_draw(seed, offset, gi >> 2);
          for (unsigned w = static_cast<unsigned>(gi & 3u); w < 4u && i < hi; ++w, ++i, ++gi) {
            apply(r.v[w], i);
          }
        }
        alignas(64) uint32_t words[4 * kDraws];
        alignas(64) float xbuf[4 * kDraws];
        for (; i + 4 * kDraws <= hi; i += 4 * kDraws, gi += 4 * kDraws) {
          philox_draws(seed, offset, gi >> 2, words);
          const auto* xi = row_in(px + i, xbuf, 4 * kDraws);
          auto* yi = row_out(py + i, xbuf);
          for (int e = 0; e < 4 * kDraws; ++e) {
            // Load unconditionally, then select: a branch-free loop that vectorizes.
            const float v = load_f32(xi, e) * inv;
            store_f32(yi, e, kmath::dropout_keep_word(words[e], p) ? v : 0.f);
          }
          row_commit(py + i, yi, 4 * kDraws);
        }
        while (i < hi) {
          Philox4 r = philox_draw(seed, offset, gi >> 2);
          for (unsigned w = 0; w < 4u && i < hi; ++w, ++i, ++gi) apply(r.v[w], i);
        }
      });
    });
  });
}

// The mask is a function of (seed, offset, index): backward applies the forward's.
void dropout_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& dx, float p,
                 uint64_t seed, uint64_t offset, int64_t index_base) {
  dropout_fwd(ctx, s, dy, dx, p, seed, offset, index_base);
}

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
