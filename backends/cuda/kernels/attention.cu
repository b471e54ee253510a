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

// out / lse merged in place with a partial (attention_merge), one warp per row (grid-stride): every
// lane reads both lse values before lane 0 writes the merged one.
template <class T>
__global__ void attn_merge_kernel(T* __restrict__ out, float* __restrict__ lse,
                                  const T* __restrict__ pout, const float* __restrict__ plse,
                                  int64_t rows, int d) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; row < rows;
       row += warps) {
    const float la = lse[row], lb = plse[row];
    const float m = kmath::max_f(la, lb);
    const float wa = kmath::exp_diff(la, m), wb = kmath::exp_diff(lb, m);
    const float l = wa + wb;  // 0 only when both sides are empty
    const float inv = l > 0.f ? 1.0f / l : 0.f;
    for (int c = lane; c < d; c += 32) {
      const float o = load_f32(out, row * d + c) * wa + load_f32(pout, row * d + c) * wb;
      store_f32(out, row * d + c, o * inv);
    }
    __syncwarp();
    if (lane == 0) lse[row] = kmath::softmax_lse(kmath::SoftmaxState{m, l});
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

// A block of a sequence (ops.h attention_block_fwd): the offsets as one delta, the heads per
// batch row and the document ids (null without).
AttnArgs block_args_of(const Tensor& q, const Tensor& k, float scale, bool causal, int64_t q_offset,
                       int64_t kv_offset, const Tensor& q_doc, const Tensor& k_doc) {
  AttnArgs a = args_of(q, k, scale, causal);
  a.delta = q_offset - kv_offset;
  a.heads = q.size(1) > 0 ? q.size(1) : 1;
  if (q_doc.defined()) {
    a.q_doc = q_doc.data<int32_t>();
    a.k_doc = k_doc.data<int32_t>();
  }
  return a;
}

// The forward of a (whole or block) attention call: flash where supported, else the reference.
void run_fwd(Stream& s, const AttnArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& out, const Tensor& lse) {
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

// The backward of a (whole or block) attention call: D = rowsum(dO * O), then flash where
// supported, else the reference.
void run_bwd(Context& ctx, Stream& s, const AttnArgs& a, const Tensor& q, const Tensor& k,
             const Tensor& v, const Tensor& out, const Tensor& dout, const Tensor& lse,
             const Tensor& dq, const Tensor& dk, const Tensor& dv) {
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

}  // namespace

void attention_fwd(Context&, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, float scale, bool causal) {
  DeviceGuard g(s.device().index);
  run_fwd(s, args_of(q, k, scale, causal), q, k, v, out, lse);
}

void attention_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv, float scale, bool causal) {
  DeviceGuard g(s.device().index);
  run_bwd(ctx, s, args_of(q, k, scale, causal), q, k, v, out, dout, lse, dq, dk, dv);
}

// The block ops: the same kernels (and choice of kernel) with the offsets and document ids.
void attention_block_fwd(Context&, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, float scale, bool causal,
                         int64_t q_offset, int64_t kv_offset, const Tensor& q_doc,
                         const Tensor& k_doc) {
  DeviceGuard g(s.device().index);
  run_fwd(s, block_args_of(q, k, scale, causal, q_offset, kv_offset, q_doc, k_doc), q, k, v, out,
          lse);
}

void attention_block_bwd(Context& ctx, Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv, float scale, bool causal,
                         int64_t q_offset, int64_t kv_offset, const Tensor& q_doc,
                         const Tensor& k_doc) {
  DeviceGuard g(s.device().index);
  const AttnArgs a = block_args_of(q, k, scale, causal, q_offset, kv_offset, q_doc, k_doc);
  run_bwd(ctx, s, a, q, k, v, out, dout, lse, dq, dk, dv);
}

void attention_merge(Context&, Stream& s, const Tensor& out, const Tensor& lse,
                     const Tensor& part_out, const Tensor& part_lse) {
  DeviceGuard g(s.device().index);
  const int64_t d = out.size(out.ndim() - 1);
  const int64_t rows = lse.numel();
  if (rows == 0 || d == 0) return;
  const cudaStream_t st = native(s);
  dispatch_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    attn_merge_kernel<T><<<grid_for(rows * 32), kThreads, 0, st>>>(
        out.data<T>(), lse.data<float>(), part_out.data<T>(), part_lse.data<float>(), rows,
        static_cast<int>(d));
    MESHRT_CUDA_CHECK_LAUNCH("attention_merge<" << attn_dtype_name<T>() << ">");
  });
}

}  // namespace meshrt::kernels::cuda
