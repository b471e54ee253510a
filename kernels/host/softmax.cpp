// Host row softmax and the pieces of vocab-parallel cross-entropy.
#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "kernels/host/reduce.h"
#include "kernels/math.h"
#include "runtime/dtype_dispatch.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

namespace {
constexpr int64_t kGrain = 1 << 14;
int64_t rows_grain(int64_t n) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, n)); }
}  // namespace

void softmax_rows_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& y, float scale) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, x = x.stream_ref(s), y = y.stream_ref(s), scale] {
    const int64_t n = row_len(x), rows = row_count(x);
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      T* py = y.data<T>();
      tp->parallel_for(rows, rows_grain(n), [=](int64_t r0, int64_t r1) {
        float* z = scratch_f32(0, static_cast<size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          const auto* xr = row_in(px + r * n, z, n);
          for (int64_t j = 0; j < n; ++j) z[j] = scale * load_f32(xr, j);
          float m = max_f32(z, n);
          for (int64_t j = 0; j < n; ++j) z[j] = kmath::exp_diff(z[j], m);
          float inv = 1.0f / sum_f32(z, n);
          auto* yr = row_out(py + r * n, z);
          for (int64_t j = 0; j < n; ++j) store_f32(yr, j, z[j] * inv);
          row_commit(py + r * n, yr, n);
        }
      });
    });
  });
}

void softmax_rows_bwd(Context& ctx, Stream& s, const Tensor& y, const Tensor& dy, const Tensor& dx,
                      float scale) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, y = y.stream_ref(s), dy = dy.stream_ref(s), dx = dx.stream_ref(s), scale] {
    const int64_t n = row_len(y), rows = row_count(y);
    dispatch_float(y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* py = y.data<T>();
      const T* pdy = dy.data<T>();
      T* pdx = dx.data<T>();
      tp->parallel_for(rows, rows_grain(n), [=](int64_t r0, int64_t r1) {
        float* yb = scratch_f32(0, static_cast<size_t>(n));
        float* gb = scratch_f32(1, static_cast<size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          load_row(py + r * n, yb, n);
          load_row(pdy + r * n, gb, n);
          float d = dot_f32(yb, gb, n);
          for (int64_t j = 0; j < n; ++j) gb[j] = scale * yb[j] * (gb[j] - d);
          store_row(pdx + r * n, gb, n);
        }
      });
    });
  });
}

void xent_row_max(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, logits = logits.stream_ref(s), row_max = row_max.stream_ref(s)] {
    const int64_t n = row_len(logits), rows = row_count(logits);
    dispatch_float(logits.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pl = logits.data<T>();
      float* pm = row_max.data<float>();
      tp->parallel_for(rows, rows_grain(n), [=](int64_t r0, int64_t r1) {
        float* z = scratch_f32(0, static_cast<size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          load_row(pl + r * n, z, n);
          pm[r] = max_f32(z, n);
        }
      });
    });
  });
}

void xent_row_sumexp(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max,
                     const Tensor& sumexp) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, logits = logits.stream_ref(s), row_max = row_max.stream_ref(s),
             sumexp = sumexp.stream_ref(s)] {
    const int64_t n = row_len(logits), rows = row_count(logits);
    dispatch_float(logits.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pl = logits.data<T>();
      const float* pm = row_max.data<float>();
      float* ps = sumexp.data<float>();
      tp->parallel_for(rows, rows_grain(n), [=](int64_t r0, int64_t r1) {
        float* z = scratch_f32(0, static_cast<size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          const auto* lr = row_in(pl + r * n, z, n);
          float m = pm[r];
          for (int64_t j = 0; j < n; ++j) z[j] = kmath::exp_diff(load_f32(lr, j), m);
          ps[r] = sum_f32(z, n);
        }
      });
    });
  });
}

void xent_target_logit(Context& ctx, Stream& s, const Tensor& logits, const Tensor& targets,
                       const Tensor& target_logit, int64_t vocab_offset, int64_t ignore_index) {
  s.enqueue([logits = logits.stream_ref(s), targets = targets.stream_ref(s),
             target_logit = target_logit.stream_ref(s), vocab_offset, ignore_index] {
    const int64_t n = row_len(logits), rows = row_count(logits);
    dispatch_float(logits.dtype(), [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(targets.dtype(), [&](auto itag) {
        using I = decltype(itag);
        const T* pl = logits.data<T>();
        const I* pt = targets.data<I>();
        float* po = target_logit.data<float>();
        for (int64_t r = 0; r < rows; ++r) {
          int64_t t = static_cast<int64_t>(pt[r]);
          int64_t local = t - vocab_offset;
          bool here = t != ignore_index && local >= 0 && local < n;
          po[r] = here ? load_f32(pl + r * n, local) : 0.f;
        }
      });
    });
  });
}

void xent_loss(Context& ctx, Stream& s, const Tensor& row_max, const Tensor& sumexp,
               const Tensor& target_logit, const Tensor& targets, const Tensor& loss,
               int64_t ignore_index) {
  s.enqueue([row_max = row_max.stream_ref(s), sumexp = sumexp.stream_ref(s),
             target_logit = target_logit.stream_ref(s), targets = targets.stream_ref(s),
             loss = loss.stream_ref(s), ignore_index] {
    const int64_t rows = row_max.numel();
    dispatch_index(targets.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const float* pm = row_max.data<float>();
      const float* ps = sumexp.data<float>();
      const float* ptl = target_logit.data<float>();
      const I* pt = targets.data<I>();
      float* pl = loss.data<float>();
      for (int64_t r = 0; r < rows; ++r) {
        bool ignored = static_cast<int64_t>(pt[r]) == ignore_index;
        pl[r] = ignored ? 0.f : std::log(ps[r]) + pm[r] - ptl[r];
      }
    });
  });
}

void xent_grad(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max,
               const Tensor& sumexp, const Tensor& targets, const Tensor& dlogits,
               int64_t vocab_offset, float grad_scale, int64_t ignore_index) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue(
      [tp, logits, row_max, sumexp, targets, dlogits, vocab_offset, grad_scale, ignore_index] {
        const int64_t n = row_len(logits), rows = row_count(logits);
        dispatch_float(logits.dtype(), [&](auto tag) {
          using T = decltype(tag);
          dispatch_index(targets.dtype(), [&](auto itag) {
            using I = decltype(itag);
            const T* pl = logits.data<T>();
            const float* pm = row_max.data<float>();
            const float* ps = sumexp.data<float>();
            const I* pt = targets.data<I>();
            T* pd = dlogits.data<T>();
            tp->parallel_for(rows, rows_grain(n), [=](int64_t r0, int64_t r1) {
              float* z = scratch_f32(0, static_cast<size_t>(n));
              for (int64_t r = r0; r < r1; ++r) {
                int64_t t = static_cast<int64_t>(pt[r]);
                T* dr = pd + r * n;
                if (t == ignore_index) {
                  for (int64_t j = 0; j < n; ++j) store_f32(dr, j, 0.f);
                  continue;
                }
                const auto* lr = row_in(pl + r * n, z, n);
                float m = pm[r];
                float c = grad_scale / ps[r];
                for (int64_t j = 0; j < n; ++j) z[j] = c * kmath::exp_diff(load_f32(lr, j), m);
                int64_t local = t - vocab_offset;
                if (local >= 0 && local < n) z[local] -= grad_scale;
                store_row(dr, z, n);
              }
            });
          });
        });
      });
}

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
