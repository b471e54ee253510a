// CUDA vocab-parallel embedding lookup and scatter-add backward (f32 atomics).
#include "backends/cuda/kernels/common.cuh"

namespace meshrt::kernels::cuda {

namespace {

template <class T, class I>
__global__ void embedding_fwd_kernel(const I* __restrict__ ids, const T* __restrict__ w,
                                     T* __restrict__ out, int64_t tokens, int64_t v, int64_t d,
                                     int64_t vocab_offset) {
  const int64_t total = tokens * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, j = i - t * d;
    const int64_t row = static_cast<int64_t>(ids[t]) - vocab_offset;
    if (row >= 0 && row < v) {
      out[i] = w[row * d + j];
    } else {
      store_f32(out, i, 0.f);
    }
  }
}

// acc[row, j] += dout[t, j] for tokens in the shard (acc is f32: dweight itself or scratch).
template <class T, class I>
__global__ void embedding_scatter_kernel(const I* __restrict__ ids, const T* __restrict__ dout,
                                         float* __restrict__ acc, int64_t tokens, int64_t v,
                                         int64_t d, int64_t vocab_offset) {
  const int64_t total = tokens * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, j = i - t * d;
    const int64_t row = static_cast<int64_t>(ids[t]) - vocab_offset;
    if (row >= 0 && row < v) atomicAdd(acc + row * d + j, load_f32(dout, i));
  }
}

// dweight = (accumulate ? dweight : 0) + acc, for 16-bit dweight.
template <class T>
__global__ void add_f32_into_kernel(const float* __restrict__ acc, T* __restrict__ dw, int64_t n,
                                    bool accumulate) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store_f32(dw, i, (accumulate ? load_f32(dw, i) : 0.f) + acc[i]);
  }
}

}  // namespace

void embedding_fwd(Context& ctx, Stream& s, const Tensor& ids, const Tensor& weight,
                   const Tensor& out, int64_t vocab_offset) {
  DeviceGuard g(s.device().index);
  const int64_t tokens = ids.numel(), v = weight.size(0), d = weight.size(1);
  dispatch_float(weight.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(ids.dtype(), [&](auto itag) {
      using I = decltype(itag);
      embedding_fwd_kernel<T, I><<<grid_for(tokens * d), kThreads, 0, native(s)>>>(
          ids.data<I>(), weight.data<T>(), out.data<T>(), tokens, v, d, vocab_offset);
    });
  });
  MESHRT_CUDA_CHECK_LAUNCH("embedding_fwd<" << dtype_name(weight.dtype()) << ">");
}

void embedding_bwd(Context& ctx, Stream& s, const Tensor& ids, const Tensor& dout,
                   const Tensor& dweight, int64_t vocab_offset, bool accumulate) {
  DeviceGuard g(s.device().index);
  const int64_t tokens = ids.numel(), v = dweight.size(0), d = dweight.size(1);
  const cudaStream_t st = native(s);
  const bool f32 = dweight.dtype() == DType::f32;
  // 16-bit weights accumulate in an f32 scratch (atomics on 16-bit values would round per add).
  Scratch scratch(ctx, s, f32 ? 0 : static_cast<size_t>(v * d) * sizeof(float));
  float* acc = f32 ? dweight.data<float>() : scratch.as<float>();
  if (!f32 || !accumulate) {
    MESHRT_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(v * d) * sizeof(float), st));
  }
  if (tokens > 0) {
    dispatch_float(dout.dtype(), [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(ids.dtype(), [&](auto itag) {
        using I = decltype(itag);
        embedding_scatter_kernel<T, I><<<grid_for(tokens * d), kThreads, 0, st>>>(
            ids.data<I>(), dout.data<T>(), acc, tokens, v, d, vocab_offset);
      });
    });
    MESHRT_CUDA_CHECK_LAUNCH("embedding_scatter<" << dtype_name(dout.dtype()) << ">");
  }
  if (!f32) {
    dispatch_float(dweight.dtype(), [&](auto tag) {
      using T = decltype(tag);
      add_f32_into_kernel<T>
          <<<grid_for(v * d), kThreads, 0, st>>>(acc, dweight.data<T>(), v * d, accumulate);
    });
    MESHRT_CUDA_CHECK_LAUNCH("embedding_bwd_store");
  }
}

}  // namespace meshrt::kernels::cuda
