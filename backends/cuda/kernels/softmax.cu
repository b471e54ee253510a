// CUDA row softmax (online: one pass for max and sum) and vocab-parallel cross-entropy pieces.
#include "backends/cuda/kernels/common.cuh"

namespace meshrt::kernels::cuda {

namespace {

template <class T>
__global__ void softmax_fwd_kernel(const T* x, T* y, int64_t n, float scale) {
  __shared__ float smem[64];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  kmath::SoftmaxState st;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    kmath::softmax_add(st, scale * load_f32(xr, j));
  st = block_softmax_merge(st, smem);
  const float inv = 1.0f / st.l;
  T* yr = y + r * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    store_f32(yr, j, kmath::exp_diff(scale * load_f32(xr, j), st.m) * inv);
}

template <class T>
__global__ void softmax_bwd_kernel(const T* __restrict__ y, const T* dy, T* dx, int64_t n,
                                   float scale) {
  __shared__ float smem[32];
  const int64_t r = blockIdx.x;
  const T* yr = y + r * n;
  const T* dyr = dy + r * n;
  float d = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) d += load_f32(yr, j) * load_f32(dyr, j);
  d = block_sum(d, smem);
  T* dxr = dx + r * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    store_f32(dxr, j, scale * load_f32(yr, j) * (load_f32(dyr, j) - d));
}

template <class T>
__global__ void row_max_kernel(const T* __restrict__ x, float* __restrict__ out, int64_t n) {
  __shared__ float smem[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float m = -kmath::kInf;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, load_f32(xr, j));
  m = block_max(m, smem);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <class T>
__global__ void row_sumexp_kernel(const T* __restrict__ x, const float* __restrict__ row_max,
                                  float* __restrict__ out, int64_t n) {
  __shared__ float smem[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  const float m = row_max[blockIdx.x];
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += kmath::exp_diff(load_f32(xr, j), m);
  s = block_sum(s, smem);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

template <class T, class I>
__global__ void target_logit_kernel(const T* __restrict__ logits, const I* __restrict__ targets,
                                    float* __restrict__ out, int64_t rows, int64_t n,
                                    int64_t vocab_offset, int64_t ignore_index) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    const int64_t local = t - vocab_offset;
    out[r] = (t != ignore_index && local >= 0 && local < n) ? load_f32(logits + r * n, local) : 0.f;
  }
}

template <class I>
__global__ void xent_loss_kernel(const float* __restrict__ row_max,
                                 const float* __restrict__ sumexp, const float* __restrict__ tl,
                                 const I* __restrict__ targets, float* __restrict__ loss,
                                 int64_t rows, int64_t ignore_index) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool ignored = static_cast<int64_t>(targets[r]) == ignore_index;
    loss[r] = ignored ? 0.f : logf(sumexp[r]) + row_max[r] - tl[r];
  }
}

template <class T, class I>
__global__ void xent_grad_kernel(const T* logits, const float* __restrict__ row_max,
                                 const float* __restrict__ sumexp, const I* __restrict__ targets,
                                 T* dlogits, int64_t n, int64_t vocab_offset, float grad_scale,
                                 int64_t ignore_index) {
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[r]);
  const T* lr = logits + r * n;
  T* dr = dlogits + r * n;
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) store_f32(dr, j, 0.f);
    return;
  }
  const float m = row_max[r];
  const float c = grad_scale / sumexp[r];
  const int64_t local = t - vocab_offset;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = c * kmath::exp_diff(load_f32(lr, j), m);
    if (j == local) v -= grad_scale;
    store_f32(dr, j, v);
  }
}

}  // namespace

void softmax_rows_fwd(Context& ctx, Stream& s, const Tensor& x, const Tensor& y, float scale) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(x), rows = row_count(x);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_fwd_kernel<T><<<static_cast<unsigned>(rows), row_threads(n), 0, native(s)>>>(
        x.data<T>(), y.data<T>(), n, scale);
  });
  MESHRT_CUDA_CHECK_LAUNCH("softmax_fwd<" << dtype_name(x.dtype()) << ">");
}

void softmax_rows_bwd(Context& ctx, Stream& s, const Tensor& y, const Tensor& dy, const Tensor& dx,
                      float scale) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(y), rows = row_count(y);
  dispatch_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softmax_bwd_kernel<T><<<static_cast<unsigned>(rows), row_threads(n), 0, native(s)>>>(
        y.data<T>(), dy.data<T>(), dx.data<T>(), n, scale);
  });
  MESHRT_CUDA_CHECK_LAUNCH("softmax_bwd<" << dtype_name(y.dtype()) << ">");
}

void xent_row_max(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(logits), rows = row_count(logits);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    row_max_kernel<T><<<static_cast<unsigned>(rows), row_threads(n), 0, native(s)>>>(
        logits.data<T>(), row_max.data<float>(), n);
  });
  MESHRT_CUDA_CHECK_LAUNCH("xent_row_max");
}

void xent_row_sumexp(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max,
                     const Tensor& sumexp) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(logits), rows = row_count(logits);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    row_sumexp_kernel<T><<<static_cast<unsigned>(rows), row_threads(n), 0, native(s)>>>(
        logits.data<T>(), row_max.data<float>(), sumexp.data<float>(), n);
  });
  MESHRT_CUDA_CHECK_LAUNCH("xent_row_sumexp");
}

void xent_target_logit(Context& ctx, Stream& s, const Tensor& logits, const Tensor& targets,
                       const Tensor& target_logit, int64_t vocab_offset, int64_t ignore_index) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(logits), rows = row_count(logits);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(targets.dtype(), [&](auto itag) {
      using I = decltype(itag);
      target_logit_kernel<T, I><<<grid_for(rows), kThreads, 0, native(s)>>>(
          logits.data<T>(), targets.data<I>(), target_logit.data<float>(), rows, n, vocab_offset,
          ignore_index);
    });
  });
  MESHRT_CUDA_CHECK_LAUNCH("xent_target_logit");
}

void xent_loss(Context& ctx, Stream& s, const Tensor& row_max, const Tensor& sumexp,
               const Tensor& target_logit, const Tensor& targets, const Tensor& loss,
               int64_t ignore_index) {
  DeviceGuard g(s.device().index);
  const int64_t rows = row_max.numel();
  dispatch_index(targets.dtype(), [&](auto itag) {
    using I = decltype(itag);
    xent_loss_kernel<I><<<grid_for(rows), kThreads, 0, native(s)>>>(
        row_max.data<float>(), sumexp.data<float>(), target_logit.data<float>(), targets.data<I>(),
        loss.data<float>(), rows, ignore_index);
  });
  MESHRT_CUDA_CHECK_LAUNCH("xent_loss");
}

void xent_grad(Context& ctx, Stream& s, const Tensor& logits, const Tensor& row_max,
               const Tensor& sumexp, const Tensor& targets, const Tensor& dlogits,
               int64_t vocab_offset, float grad_scale, int64_t ignore_index) {
  DeviceGuard g(s.device().index);
  const int64_t n = row_len(logits), rows = row_count(logits);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(targets.dtype(), [&](auto itag) {
      using I = decltype(itag);
      xent_grad_kernel<T, I><<<static_cast<unsigned>(rows), row_threads(n), 0, native(s)>>>(
          logits.data<T>(), row_max.data<float>(), sumexp.data<float>(), targets.data<I>(),
          dlogits.data<T>(), n, vocab_offset, grad_scale, ignore_index);
    });
  });
  MESHRT_CUDA_CHECK_LAUNCH("xent_grad");
}

}  // namespace meshrt::kernels::cuda
