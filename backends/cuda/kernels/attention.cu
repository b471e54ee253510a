// CUDA attention op entry points: validate the CUDA limits, pick the kernel
// (ops::cuda_attention_kernel: flash on tensor cores where supported, else the reference), and
// launch it. The kernels themselves compile per dtype (attention_reference_*.cu,
// flash_attention_*.cu) so the build runs them in parallel.
#include <type_traits>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/common.cuh"

namespace meshrt::kernels::cuda {

namespace {

// D_i = dO_i . O_i, one warp per row (grid-stride over rows): the softmax-backward correction
// both backward paths read.
template <class T>
__global__ void attn_bwd_dot_kernel(const T* __restrict__ o, const T* __restrict__ dout,
                                    float* __restrict__ dvec, int64_t rows, int d) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; row < rows;
       row += warps) {
    float s = 0.f;
    for (int c = lane; c < d; c += 32) s += load_f32(o, row * d + c) * load_f32(dout, row * d + c);
    s = warp_sum(s);
    if (lane == 0) dvec[row] = s;
  }
}

AttnArgs args_of(const Tensor& q, const Tensor& k, float scale, bool causal) {
  AttnArgs a{q.size(0) * q.size(1),       q.size(2), k.size(2),
             static_cast<int>(q.size(3)), scale,     causal};
  MESHRT_CHECK(a.d <= 256, "op attention: head_dim " << a.d << " > 256 is not supported on CUDA (q "
                                                     << q.str() << ")");
  MESHRT_CHECK(a.bh <= 65535, "op attention: batch * heads = "
                                  << a.bh << " exceeds 65535 on CUDA (q " << q.str() << ")");
  return a;
}

// The flash kernels read 16-byte vectors: besides dtype and head_dim (the chosen kernel), every
// tensor must start 16-byte aligned (true for allocator storage; a view may not be).
bool use_flash(const Tensor& q, std::initializer_list<const Tensor*> all) {
  if (ops::cuda_attention_kernel(q.dtype(), q.size(3)) != ops::AttentionKernel::Flash) return false;
  for (const Tensor* t : all) {
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  }
  return true;
}

}  // namespace

void attention_fwd(Context&, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, float scale, bool causal) {
  DeviceGuard g(s.device().index);
  const AttnArgs a = args_of(q, k, scale, causal);
  if (a.sq == 0) return;
  const bool flash = use_flash(q, {&q, &k, &v, &out});
  dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      if (flash) {
        flash_attention_fwd<T>(a, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                               lse.data<float>(), native(s));
        return;
      }
    }
    reference_attention_fwd<T>(a, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                               lse.data<float>(), native(s));
  });
}

void attention_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv, float scale, bool causal) {
  DeviceGuard g(s.device().index);
  const AttnArgs a = args_of(q, k, scale, causal);
  const cudaStream_t st = native(s);
  if (a.sq == 0) {
    // No queries: the keys and values get no gradient (nothing to clear when there are no keys
    // either: an empty tensor may have no storage, and a null pointer is not passed to CUDA).
    if (dk.nbytes() > 0) MESHRT_CUDA_CHECK(cudaMemsetAsync(dk.data_ptr(), 0, dk.nbytes(), st));
    if (dv.nbytes() > 0) MESHRT_CUDA_CHECK(cudaMemsetAsync(dv.data_ptr(), 0, dv.nbytes(), st));
    return;
  }
  const bool flash = use_flash(q, {&q, &k, &v, &dout, &dq, &dk, &dv});
  Scratch dvec(ctx, s, static_cast<size_t>(a.bh * a.sq) * sizeof(float));
  dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t rows = a.bh * a.sq;
    attn_bwd_dot_kernel<T><<<grid_for(rows * 32), kThreads, 0, st>>>(out.data<T>(), dout.data<T>(),
                                                                     dvec.as<float>(), rows, a.d);
    MESHRT_CUDA_CHECK_LAUNCH("attention_bwd_dot");
    if constexpr (!std::is_same_v<T, float>) {
      if (flash) {
        flash_attention_bwd<T>(a, q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(),
                               lse.data<float>(), dvec.as<float>(), dq.data<T>(), dk.data<T>(),
                               dv.data<T>(), st);
        return;
      }
    }
    reference_attention_bwd<T>(a, q.data<T>(), k.data<T>(), v.data<T>(), dout.data<T>(),
                               lse.data<float>(), dvec.as<float>(), dq.data<T>(), dk.data<T>(),
                               dv.data<T>(), st);
  });
}

}  // namespace meshrt::kernels::cuda
