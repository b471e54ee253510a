// Host LayerNorm and RMSNorm, forward and backward (rows over the last dim).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "kernels/host/reduce.h"
#include "kernels/math.h"
#include "kernels/norm_ops.h"
#include "runtime/dtype_dispatch.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

namespace {
constexpr int64_t kGrain = 1 << 14;

// Fixed row chunks, independent of the thread count, so parameter gradients reduce in the same
// order whatever the pool size.
struct RowChunks {
  int64_t per = 1, count = 0;
  RowChunks(int64_t rows, int64_t len) {
    per = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, len));
    count = (rows + per - 1) / per;
    if (count > 64) {
      per = (rows + 63) / 64;
      count = (rows + per - 1) / per;
    }
  }
};

// Row as f32: the row itself for f32 storage, else converted into scratch `slot`.
template <class T>
inline const float* row_f32(const T* p, int64_t n, int slot) {
  if constexpr (sizeof(T) == 4) {
    return p;
  } else {
    float* b = scratch_f32(slot, static_cast<size_t>(n));
    load_row(p, b, n);
    return b;
  }
}

// Sums over chunks of partial[c * n + j] into out (optionally adding out's old contents).
template <class T>
void reduce_partials(ThreadPool* tp, const float* part, int64_t chunks, int64_t n, T* out,
                     bool accumulate) {
  tp->parallel_for(n, 1024, [=](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      float s = accumulate ? load_f32(out, j) : 0.f;
      for (int64_t c = 0; c < chunks; ++c) s += part[c * n + j];
      store_f32(out, j, s);
    }
  });
}
}  // namespace

// LayerNorm and RMSNorm share one pass; rms drops the mean (and beta).
void norm_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& gamma, const Tensor& beta,
              const Tensor& y, const Tensor& mean, const Tensor& rstd, float eps, bool rms) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, x = x.stream_ref(s), gamma = gamma.stream_ref(s), beta = beta.stream_ref(s),
             y = y.stream_ref(s), mean = mean.stream_ref(s), rstd = rstd.stream_ref(s), eps, rms] {
    const int64_t n = row_len(x), rows = row_count(x);
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      const T* pg = gamma.data<T>();
      const T* pb = beta.defined() ? beta.data<T>() : nullptr;
      T* py = y.data<T>();
      float* pm = mean.defined() ? mean.data<float>() : nullptr;
      float* pr = rstd.data<float>();
      const float inv_n = 1.0f / static_cast<float>(n);
      tp->parallel_for(rows, std::max<int64_t>(1, kGrain / n), [=](int64_t r0, int64_t r1) {
        float* g = scratch_f32(1, static_cast<size_t>(n));
        float* b = scratch_f32(2, static_cast<size_t>(n));
        load_row(pg, g, n);
        if (pb) {
          load_row(pb, b, n);
        } else {
          std::fill(b, b + n, 0.f);
        }
        float* out = scratch_f32(3, static_cast<size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = row_f32(px + r * n, n, 0);
          float mu = rms ? 0.f : sum_f32(xr, n) * inv_n;
          float var = sum_sq_dev_f32(xr, mu, n) * inv_n;  // rms: mean of squares
          float rs = 1.0f / std::sqrt(var + eps);
          if (pm) pm[r] = mu;
          pr[r] = rs;
          if constexpr (sizeof(T) == 4) {
            float* yr = py + r * n;
            for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs * g[j] + b[j];
          } else {
            for (int64_t j = 0; j < n; ++j) out[j] = (xr[j] - mu) * rs * g[j] + b[j];
            store_row(py + r * n, out, n);
          }
        }
      });
    });
  });
}

void norm_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x, const Tensor& gamma,
              const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
              const Tensor& dbeta, bool rms, bool accumulate) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, dy = dy.stream_ref(s), x = x.stream_ref(s), gamma = gamma.stream_ref(s),
             mean = mean.stream_ref(s), rstd = rstd.stream_ref(s), dx = dx.stream_ref(s),
             dgamma = dgamma.stream_ref(s), dbeta = dbeta.stream_ref(s), rms, accumulate] {
    const int64_t n = row_len(x), rows = row_count(x);
    RowChunks rc(rows, n);
    const bool want_dg = dgamma.defined(), want_db = dbeta.defined();
    std::vector<float> part_g(want_dg ? static_cast<size_t>(rc.count * n) : 0, 0.f);
    std::vector<float> part_b(want_db ? static_cast<size_t>(rc.count * n) : 0, 0.f);
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      const T* pdy = dy.data<T>();
      const T* pg = gamma.data<T>();
      T* pdx = dx.data<T>();
      const float* pm = mean.defined() ? mean.data<float>() : nullptr;
      const float* pr = rstd.data<float>();
      float* partg = part_g.data();
      float* partb = part_b.data();
      const float inv_n = 1.0f / static_cast<float>(n);
      const int64_t per = rc.per;
      tp->run(rc.count, [=](int64_t c) {
        float* g = scratch_f32(2, static_cast<size_t>(n));
        load_row(pg, g, n);
        float* xhat = scratch_f32(3, static_cast<size_t>(n));
        float* dyg = scratch_f32(4, static_cast<size_t>(n));
        float* out = scratch_f32(5, static_cast<size_t>(n));
        float* accg = want_dg ? partg + c * n : nullptr;
        float* accb = want_db ? partb + c * n : nullptr;
        int64_t r1 = std::min(rows, (c + 1) * per);
        for (int64_t r = c * per; r < r1; ++r) {
          const float* xr = row_f32(px + r * n, n, 0);
          const float* dyr = row_f32(pdy + r * n, n, 1);
          float mu = pm ? pm[r] : 0.f;
          float rs = pr[r];
          for (int64_t j = 0; j < n; ++j) {
            xhat[j] = (xr[j] - mu) * rs;
            dyg[j] = dyr[j] * g[j];
          }
          float mean_dyg = rms ? 0.f : sum_f32(dyg, n) * inv_n;
          float mean_dyg_xhat = dot_f32(dyg, xhat, n) * inv_n;
          // Parameter gradients first: dx may alias dy.
          if (accg) {
            for (int64_t j = 0; j < n; ++j) accg[j] += dyr[j] * xhat[j];
          }
          if (accb) {
            for (int64_t j = 0; j < n; ++j) accb[j] += dyr[j];
          }
          for (int64_t j = 0; j < n; ++j) {
            out[j] = rs * (dyg[j] - mean_dyg - xhat[j] * mean_dyg_xhat);
          }
          store_row(pdx + r * n, out, n);
        }
      });
      if (want_dg) reduce_partials(tp, partg, rc.count, n, dgamma.data<T>(), accumulate);
      if (want_db) reduce_partials(tp, partb, rc.count, n, dbeta.data<T>(), accumulate);
    });
  });
}

MESHRT_NORM_OPS

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
