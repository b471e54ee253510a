// Host embedding lookup (vocab-parallel) and its scatter-add backward.
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host/isa.h"
#include "kernels/host/parallel.h"
#include "runtime/dtype_dispatch.h"

namespace meshrt::kernels::host {
MESHRT_HOST_ISA_BEGIN

void embedding_fwd(Context& ctx, Stream& s, const Tensor& ids, const Tensor& weight,
                   const Tensor& out, int64_t vocab_offset) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, ids = ids.stream_ref(s), weight = weight.stream_ref(s), out = out.stream_ref(s),
             vocab_offset] {
    const int64_t tokens = ids.numel(), v = weight.size(0), d = weight.size(1);
    dispatch_float(weight.dtype(), [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(ids.dtype(), [&](auto itag) {
        using I = decltype(itag);
        const I* pi = ids.data<I>();
        const T* pw = weight.data<T>();
        T* po = out.data<T>();
        const T zero = [] {
          if constexpr (sizeof(T) == 2) {
            return T::from_float(0.f);
          } else {
            return T(0);
          }
        }();
        tp->parallel_for(tokens, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)),
                         [=](int64_t t0, int64_t t1) {
                           for (int64_t t = t0; t < t1; ++t) {
                             int64_t row = static_cast<int64_t>(pi[t]) - vocab_offset;
                             T* o = po + t * d;
                             if (row >= 0 && row < v) {
                               std::copy(pw + row * d, pw + (row + 1) * d, o);
                             } else {
                               std::fill(o, o + d, zero);
                             }
                           }
                         });
      });
    });
  });
}

void embedding_bwd(Context& ctx, Stream& s, const Tensor& ids, const Tensor& dout,
                   const Tensor& dweight, int64_t vocab_offset, bool accumulate) {
  ThreadPool* tp = &pool(ctx);
  s.enqueue([tp, ids = ids.stream_ref(s), dout = dout.stream_ref(s),
             dweight = dweight.stream_ref(s), vocab_offset, accumulate] {
    const int64_t tokens = ids.numel(), v = dweight.size(0), d = dweight.size(1);
    // Group the tokens of this shard by row (stable), then sum each row's tokens in f32 and
    // write it once: deterministic, exact-order f32 accumulation even for 16-bit dweight.
    std::vector<int64_t> order;
    std::vector<int64_t> rows;
    dispatch_index(ids.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const I* pi = ids.data<I>();
      order.reserve(static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t row = static_cast<int64_t>(pi[t]) - vocab_offset;
        if (row >= 0 && row < v) order.push_back(t);
      }
      std::stable_sort(order.begin(), order.end(),
                       [pi](int64_t a, int64_t b) { return pi[a] < pi[b]; });
      rows.reserve(order.size());
      for (int64_t t : order) rows.push_back(static_cast<int64_t>(pi[t]) - vocab_offset);
    });
    // Start of each group of equal rows.
    std::vector<int64_t> starts;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i == 0 || rows[i] != rows[i - 1]) starts.push_back(static_cast<int64_t>(i));
    }
    starts.push_back(static_cast<int64_t>(rows.size()));
    const int64_t groups = static_cast<int64_t>(starts.size()) - 1;
    dispatch_float(dweight.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pg = dout.data<T>();
      T* pw = dweight.data<T>();
      if (!accumulate) {
        const T zero = [] {
          if constexpr (sizeof(T) == 2) {
            return T::from_float(0.f);
          } else {
            return T(0);
          }
        }();
        tp->parallel_for(v * d, 1 << 15,
                         [=](int64_t lo, int64_t hi) { std::fill(pw + lo, pw + hi, zero); });
      }
      const int64_t* st = starts.data();
      const int64_t* rw = rows.data();
      const int64_t* od = order.data();
      tp->parallel_for(groups, std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)),
                       [=](int64_t g0, int64_t g1) {
                         float* acc = scratch_f32(0, static_cast<size_t>(d));
                         for (int64_t g = g0; g < g1; ++g) {
                           T* wr = pw + rw[st[g]] * d;
                           for (int64_t j = 0; j < d; ++j) acc[j] = load_f32(wr, j);
                           for (int64_t i = st[g]; i < st[g + 1]; ++i) {
                             const T* gr = pg + od[i] * d;
                             for (int64_t j = 0; j < d; ++j) acc[j] += load_f32(gr, j);
                           }
                           for (int64_t j = 0; j < d; ++j) store_f32(wr, j, acc[j]);
                         }
                       });
    });
  });
}

MESHRT_HOST_ISA_END
}  // namespace meshrt::kernels::host
