// CUDA LayerNorm / RMSNorm: one block per row (Welford statistics merged across the block),
// parameter gradients as two-stage column reductions.
#include "backends/cuda/kernels/common.cuh"
#include "kernels/norm_ops.h"

namespace meshrt::kernels::cuda {

namespace {

template <class T, bool kRms>
__global__ void norm_fwd_kernel(const T* x, const T* __restrict__ gamma, const T* __restrict__ beta,
                                T* y, float* __restrict__ mean, float* __restrict__ rstd, int64_t n,
                                float eps) {
  __shared__ float smem[96];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  T* yr = y + r * n;
  float mu = 0.f, rs;
  if constexpr (kRms) {
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float v = load_f32(xr, j);
      ss += v * v;
    }
    ss = block_sum(ss, smem);
    rs = rsqrtf(ss / static_cast<float>(n) + eps);
  } else {
    kmath::Welford w;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) kmath::welford_add(w, load_f32(xr, j));
    w = block_welford(w, smem);
    mu = w.mean;
    rs = rsqrtf(kmath::welford_var(w) + eps);
  }
  if (threadIdx.x == 0) {
    if (mean) mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = (load_f32(xr, j) - mu) * rs * load_f32(gamma, j);
    if (beta) v += load_f32(beta, j);
    store_f32(yr, j, v);
  }
}

template <class T, bool kRms>
__global__ void norm_bwd_dx_kernel(const T* dy, const T* __restrict__ x,
                                   const T* __restrict__ gamma, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, T* dx, int64_t n) {
  __shared__ float smem[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  const T* dyr = dy + r * n;
  const float mu = kRms ? 0.f : mean[r];
  const float rs = rstd[r];
  float a = 0.f, b = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = load_f32(dyr, j) * load_f32(gamma, j);
    float xh = (load_f32(xr, j) - mu) * rs;
    a += g;
    b += g * xh;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  a = kRms ? 0.f : block_sum(a, smem) * inv_n;
  b = block_sum(b, smem) * inv_n;
  T* dxr = dx + r * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = load_f32(dyr, j) * load_f32(gamma, j);
    float xh = (load_f32(xr, j) - mu) * rs;
    store_f32(dxr, j, rs * (g - a - xh * b));
  }
}

// Per-chunk column sums of dy * xhat (dgamma) and dy (dbeta).
template <class T, bool kRms>
__global__ void norm_bwd_params_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                       const float* __restrict__ mean,
                                       const float* __restrict__ rstd, int64_t rows, int64_t n,
                                       int64_t per, float* __restrict__ part_g,
                                       float* __restrict__ part_b) {
  __shared__ float tile[kColRowsY][kColTile + 1];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * per;
  const int64_t r1 = r0 + per < rows ? r0 + per : rows;
  float ag = 0.f, ab = 0.f;
  if (col < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRowsY) {
      const float mu = kRms ? 0.f : mean[r];
      const float d = load_f32(dy, r * n + col);
      ag += d * (load_f32(x, r * n + col) - mu) * rstd[r];
      ab += d;
    }
  }
  if (part_g) col_tile_store(ag, tile, part_g, n, col);
  if (part_b) col_tile_store(ab, tile, part_b, n, col);
}

}  // namespace

// LayerNorm and RMSNorm share one pass; rms drops the mean (and beta).
void norm_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& gamma, const Tensor& beta,
              const Tensor& y, const Tensor& mean, const Tensor& rstd, float eps, bool rms) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(x), rows = row_count(x);
  const int threads = row_threads(n);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pb = beta.defined() ? beta.data<T>() : nullptr;
    float* pm = mean.defined() ? mean.data<float>() : nullptr;
    if (rms) {
      norm_fwd_kernel<T, true><<<static_cast<unsigned>(rows), threads, 0, native(s)>>>(
          x.data<T>(), gamma.data<T>(), pb, y.data<T>(), pm, rstd.data<float>(), n, eps);
    } else {
      norm_fwd_kernel<T, false><<<static_cast<unsigned>(rows), threads, 0, native(s)>>>(
          x.data<T>(), gamma.data<T>(), pb, y.data<T>(), pm, rstd.data<float>(), n, eps);
    }
  });
  MESHRT_CUDA_CHECK_LAUNCH((rms ? "rmsnorm_fwd<" : "layernorm_fwd<")
                           << dtype_name(x.dtype()) << ">");
}

void norm_bwd(Context& ctx, Stream& s, const Tensor& dy, const Tensor& x, const Tensor& gamma,
              const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
              const Tensor& dbeta, bool rms, bool accumulate) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(x), rows = row_count(x);
  const cudaStream_t st = native(s);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const float* pm = mean.defined() ? mean.data<float>() : nullptr;
    // Parameter gradients first: dx may alias dy.
    if (dgamma.defined() || dbeta.defined()) {
      ColPlan plan(rows);
      const size_t bytes = static_cast<size_t>(plan.chunks * n) * sizeof(float);
      Scratch pg(ctx, s, dgamma.defined() ? bytes : 0), pb(ctx, s, dbeta.defined() ? bytes : 0);
      if (rows > 0) {
        auto kernel = rms ? norm_bwd_params_kernel<T, true> : norm_bwd_params_kernel<T, false>;
        kernel<<<plan.grid(n), ColPlan::block(), 0, st>>>(dy.data<T>(), x.data<T>(), pm,
                                                          rstd.data<float>(), rows, n, plan.per,
                                                          pg.as<float>(), pb.as<float>());
        MESHRT_CUDA_CHECK_LAUNCH("norm_bwd_params<" << dtype_name(x.dtype()) << ">");
      }
      if (dgamma.defined())
        col_finalize(pg.as<float>(), plan.chunks, n, dgamma.data<T>(), accumulate, st);
      if (dbeta.defined())
        col_finalize(pb.as<float>(), plan.chunks, n, dbeta.data<T>(), accumulate, st);
    }
    if (rows > 0) {
      auto kernel = rms ? norm_bwd_dx_kernel<T, true> : norm_bwd_dx_kernel<T, false>;
      kernel<<<static_cast<unsigned>(rows), row_threads(n), 0, st>>>(
          dy.data<T>(), x.data<T>(), gamma.data<T>(), pm, rstd.data<float>(), dx.data<T>(), n);
      MESHRT_CUDA_CHECK_LAUNCH("norm_bwd_dx<" << dtype_name(x.dtype()) << ">");
    }
  });
}

MESHRT_NORM_OPS

}  // namespace meshrt::kernels::cuda
