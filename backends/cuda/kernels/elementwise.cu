// CUDA elementwise ops: add / scale, sum of squares, cast, fill, bias + GeLU (with dbias),
// Philox dropout.
#include "backends/cuda/kernels/common.cuh"

namespace meshrt::kernels::cuda {

namespace {

#define MESHRT_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void axpby_kernel(const T* a, const T* b, T* o, int64_t n, float alpha, float beta) {
  if (beta == 0.f) {
    MESHRT_GRID_STRIDE(i, n) { store_f32(o, i, alpha * load_f32(a, i)); }
  } else {
    MESHRT_GRID_STRIDE(i, n) { store_f32(o, i, alpha * load_f32(a, i) + beta * load_f32(b, i)); }
  }
}

// out[0] += sum of x^2: per-thread grid-stride partials, one block sum, one atomic add per block.
template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, float* out) {
  __shared__ float smem[32];
  float acc = 0.f;
  MESHRT_GRID_STRIDE(i, n) {
    const float v = load_f32(x, i);
    acc += v * v;
  }
  acc = block_sum(acc, smem);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

template <ops::GeluKind K>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (K == ops::GeluKind::Tanh) {
    return kmath::gelu_tanh(x);
  } else {
    return kmath::gelu_erf(x);
  }
}
template <ops::GeluKind K>
__device__ __forceinline__ float gelu_grad(float x) {
  if constexpr (K == ops::GeluKind::Tanh) {
    return kmath::gelu_tanh_grad(x);
  } else {
    return kmath::gelu_erf_grad(x);
  }
}

template <class T, ops::GeluKind K>
__global__ void gelu_fwd_kernel(const T* x, const T* __restrict__ bias, T* y, int64_t total,
                                int64_t n) {
  MESHRT_GRID_STRIDE(i, total) {
    float b = bias ? load_f32(bias, i % n) : 0.f;
    store_f32(y, i, gelu<K>(load_f32(x, i) + b));
  }
}

template <class T, ops::GeluKind K>
__global__ void gelu_bwd_kernel(const T* dy, const T* x, const T* __restrict__ bias, T* dx,
                                int64_t total, int64_t n) {
  MESHRT_GRID_STRIDE(i, total) {
    float b = bias ? load_f32(bias, i % n) : 0.f;
    store_f32(dx, i, load_f32(dy, i) * gelu_grad<K>(load_f32(x, i) + b));
  }
}

// dx and the per-chunk column sums of dx (from f32 values, before rounding) in one pass.
template <class T, ops::GeluKind K>
__global__ void gelu_bwd_dbias_kernel(const T* dy, const T* x, const T* __restrict__ bias, T* dx,
                                      int64_t rows, int64_t n, int64_t per,
                                      float* __restrict__ part) {
  __shared__ float tile[kColRowsY][kColTile + 1];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * per;
  const int64_t r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0.f;
  if (col < n) {
    const float b = bias ? load_f32(bias, col) : 0.f;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRowsY) {
      int64_t i = r * n + col;
      float g = load_f32(dy, i) * gelu_grad<K>(load_f32(x, i) + b);
      store_f32(dx, i, g);
      acc += g;
    }
  }
  col_tile_store(acc, tile, part, n, col);
}

// One Philox draw per thread covers four consecutive global indices.
template <class T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, float p, float inv, uint64_t seed,
                               uint64_t offset, uint64_t base) {
  const uint64_t g0 = base >> 2;
  const uint64_t groups = ((base + static_cast<uint64_t>(n) - 1) >> 2) - g0 + 1;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < groups;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t g = g0 + t;
    Philox4 r = philox_draw(seed, offset, g);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t gi = 4 * g + static_cast<uint64_t>(w);
      if (gi < base || gi >= base + static_cast<uint64_t>(n)) continue;
      const int64_t i = static_cast<int64_t>(gi - base);
      store_f32(y, i, kmath::dropout_keep_word(r.v[w], p) ? load_f32(x, i) * inv : 0.f);
    }
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

void add(Context& ctx, Stream& s, const Tensor& a, const Tensor& b, const Tensor& out, float alpha,
         float beta) {
  DeviceGuard g(s.device().index);
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    axpby_kernel<T><<<grid_for(n), kThreads, 0, native(s)>>>(a.data<T>(), b.data<T>(),
                                                             out.data<T>(), n, alpha, beta);
  });
  MESHRT_CUDA_CHECK_LAUNCH("axpby<" << dtype_name(out.dtype()) << ">");
}

void scale(Context& ctx, Stream& s, const Tensor& x, const Tensor& out, float alpha) {
  add(ctx, s, x, x, out, alpha, 0.f);
}

void sum_squares(Context& ctx, Stream& s, const Tensor& x, const Tensor& out) {
  DeviceGuard g(s.device().index);
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    sum_squares_kernel<T>
        <<<grid_for(n), kThreads, 0, native(s)>>>(x.data<T>(), n, out.data<float>());
  });
  MESHRT_CUDA_CHECK_LAUNCH("sum_squares<" << dtype_name(x.dtype()) << ">");
}

// cast and fill are the runtime's strided copy and fill (one implementation per device family).
void cast(Context& ctx, Stream& s, const Tensor& x, const Tensor& out) { out.copy_(x, s); }

void fill(Context& ctx, Stream& s, const Tensor& out, double value) { out.fill_(value, s); }

void bias_gelu_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& bias, const Tensor& y,
                   ops::GeluKind kind) {
  DeviceGuard g(s.device().index);
  const int64_t total = x.numel(), n = row_len(x);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_gelu(kind, [&](auto kc) {
      constexpr ops::GeluKind K = decltype(kc)::value;
      gelu_fwd_kernel<T, K><<<grid_for(total), kThreads, 0, native(s)>>>(
          x.data<T>(), bias.defined() ? bias.data<T>() : nullptr, y.data<T>(), total, n);
    });
  });
  MESHRT_CUDA_CHECK_LAUNCH("bias_gelu_fwd<" << dtype_name(x.dtype()) << ", "
                                            << ops::gelu_kind_name(kind) << ">");
}

void bias_gelu_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x, const Tensor& bias,
                   const Tensor& dx, const Tensor& dbias, ops::GeluKind kind, bool accumulate) {
  DeviceGuard g(s.device().index);
  const int64_t total = x.numel(), n = row_len(x), rows = row_count(x);
  const cudaStream_t st = native(s);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_gelu(kind, [&](auto kc) {
      constexpr ops::GeluKind K = decltype(kc)::value;
      const T* pb = bias.defined() ? bias.data<T>() : nullptr;
      if (!dbias.defined()) {
        gelu_bwd_kernel<T, K><<<grid_for(total), kThreads, 0, st>>>(dy.data<T>(), x.data<T>(), pb,
                                                                    dx.data<T>(), total, n);
        MESHRT_CUDA_CHECK_LAUNCH("bias_gelu_bwd");
        return;
      }
      ColPlan plan(rows);
      Scratch part(ctx, s, static_cast<size_t>(plan.chunks * n) * sizeof(float));
      if (rows > 0) {
        gelu_bwd_dbias_kernel<T, K><<<plan.grid(n), ColPlan::block(), 0, st>>>(
            dy.data<T>(), x.data<T>(), pb, dx.data<T>(), rows, n, plan.per, part.as<float>());
        MESHRT_CUDA_CHECK_LAUNCH("bias_gelu_bwd_dbias");
      }
      col_finalize(part.as<float>(), plan.chunks, n, dbias.data<T>(), accumulate, st);
    });
  });
}

void dropout_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& y, float p, uint64_t seed,
                 uint64_t offset, int64_t index_base) {
  DeviceGuard g(s.device().index);
  const int64_t n = x.numel();
  const float inv = 1.0f / (1.0f - p);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<grid_for(n / 4 + 2), kThreads, 0, native(s)>>>(
        x.data<T>(), y.data<T>(), n, p, inv, seed, offset, static_cast<uint64_t>(index_base));
  });
  MESHRT_CUDA_CHECK_LAUNCH("dropout<" << dtype_name(x.dtype()) << ">");
}

// The mask is a function of (seed, offset, index): backward applies the forward's.
void dropout_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& dx, float p,
                 uint64_t seed, uint64_t offset, int64_t index_base) {
  dropout_fwd(ctx, s, dy, dx, p, seed, offset, index_base);
}

}  // namespace meshrt::kernels::cuda
