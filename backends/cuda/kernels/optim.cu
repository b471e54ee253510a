// CUDA multi-tensor AdamW / SGD: one launch covers up to kMaxTensors tensors (pointers passed by
// value in the kernel arguments, each block working on one chunk of one tensor).
#include <vector>

#include "backends/cuda/kernels/common.cuh"

namespace meshrt::kernels::cuda {

namespace {

constexpr int kMaxTensors = 24;
constexpr int kMaxBlocks = 160;
constexpr int64_t kChunk = 16384;  // elements per block

// Kernel arguments (< 4 KiB): tensor pointers and, per block, which tensor and chunk.
struct MultiTensorArgs {
  void* p[kMaxTensors];
  const void* g[kMaxTensors];
  float* s1[kMaxTensors];
  float* s2[kMaxTensors];
  int64_t n[kMaxTensors];
  int block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

template <class P, class G>
__global__ void adamw_kernel(MultiTensorArgs a, kmath::AdamWScalars c) {
  const int t = a.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(a.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = begin + kChunk < a.n[t] ? begin + kChunk : a.n[t];
  P* p = static_cast<P*>(a.p[t]);
  const G* g = static_cast<const G*>(a.g[t]);
  float* m = a.s1[t];
  float* v = a.s2[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float mi = m[i], vi = v[i];
    float np = kmath::adamw_step(load_f32(p, i), load_f32(g, i), mi, vi, c);
    m[i] = mi;
    v[i] = vi;
    store_f32(p, i, np);
  }
}

template <class P, class G>
__global__ void sgd_kernel(MultiTensorArgs a, kmath::SgdScalars c) {
  const int t = a.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(a.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = begin + kChunk < a.n[t] ? begin + kChunk : a.n[t];
  P* p = static_cast<P*>(a.p[t]);
  const G* g = static_cast<const G*>(a.g[t]);
  float* b = a.s1[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float bi = b[i];
    float np = kmath::sgd_step(load_f32(p, i), load_f32(g, i), bi, c);
    b[i] = bi;
    store_f32(p, i, np);
  }
}

// Calls launch(args, blocks) for batches of tensors sharing (param dtype, grad dtype) = (pd, gd).
template <class Launch>
void for_batches(std::span<const Tensor> params, std::span<const Tensor> grads,
                 std::span<const Tensor> s1, const std::span<const Tensor>* s2, DType pd, DType gd,
                 Launch&& launch) {
  MultiTensorArgs args{};
  int nt = 0, nb = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].dtype() != pd || grads[i].dtype() != gd) continue;
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    if (nt == kMaxTensors) {
      launch(args, nb);
      nt = nb = 0;
    }
    args.p[nt] = params[i].data_ptr();
    args.g[nt] = grads[i].data_ptr();
    args.s1[nt] = s1[i].data<float>();
    args.s2[nt] = s2 ? (*s2)[i].data<float>() : nullptr;
    args.n[nt] = n;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      args.block_tensor[nb] = nt;
      args.block_chunk[nb] = static_cast<int>(c);
      ++nb;
      if (nb == kMaxBlocks) {
        launch(args, nb);
        nb = 0;
        if (c + 1 < chunks) {
          // The tensor continues in the next launch as slot 0.
          args.p[0] = args.p[nt];
          args.g[0] = args.g[nt];
          args.s1[0] = args.s1[nt];
          args.s2[0] = args.s2[nt];
          args.n[0] = args.n[nt];
          nt = 0;
        } else {
          nt = -1;  // this tensor is done; the next one starts at slot 0
        }
      }
    }
    ++nt;
  }
  if (nb > 0) launch(args, nb);
}

// Calls f(P{}, G{}, pd, gd) for each (param, grad) dtype pair present.
template <class F>
void for_dtype_pairs(std::span<const Tensor> params, std::span<const Tensor> grads, F&& f) {
  for (DType pd : {DType::f32, DType::bf16, DType::f16}) {
    for (DType gd : {DType::f32, DType::bf16, DType::f16}) {
      bool present = false;
      for (size_t i = 0; i < params.size(); ++i)
        present = present || (params[i].dtype() == pd && grads[i].dtype() == gd);
      if (!present) continue;
      dispatch_float(pd, [&](auto ptag) {
        using P = decltype(ptag);
        if (gd == DType::f32) {
          f(ptag, float{}, pd, gd);
        } else {
          f(ptag, P{}, pd, gd);  // validated: a 16-bit grad has its param's dtype
        }
      });
    }
  }
}

}  // namespace

void adamw_update(Context& ctx, Stream& s, std::span<const Tensor> params,
                  std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
                  std::span<const Tensor> exp_avg_sq, const ops::AdamWConfig& cfg) {
  DeviceGuard guard(s.device().index);
  kmath::AdamWScalars c;
  c.lr = cfg.lr;
  c.beta1 = cfg.beta1;
  c.beta2 = cfg.beta2;
  c.eps = cfg.eps;
  c.decay = 1.0f - cfg.lr * cfg.weight_decay;
  const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(cfg.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(cfg.step));
  c.step_size = static_cast<float>(cfg.lr / bc1);
  c.bc2_sqrt_inv = static_cast<float>(1.0 / std::sqrt(bc2));
  c.grad_scale = cfg.grad_scale;
  const cudaStream_t st = native(s);
  for_dtype_pairs(params, grads, [&](auto ptag, auto gtag, DType pd, DType gd) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    for_batches(
        params, grads, exp_avg, &exp_avg_sq, pd, gd, [&](const MultiTensorArgs& a, int blocks) {
          adamw_kernel<P, G><<<blocks, kThreads, 0, st>>>(a, c);
          MESHRT_CUDA_CHECK_LAUNCH("adamw<" << dtype_name(pd) << ", " << dtype_name(gd) << ">");
        });
  });
}

void sgd_momentum_update(Context& ctx, Stream& s, std::span<const Tensor> params,
                         std::span<const Tensor> grads, std::span<const Tensor> bufs,
                         const ops::SgdConfig& cfg) {
  DeviceGuard guard(s.device().index);
  kmath::SgdScalars c{cfg.lr,         cfg.momentum, cfg.dampening,   cfg.weight_decay,
                      cfg.grad_scale, cfg.nesterov, cfg.init_buffers};
  const cudaStream_t st = native(s);
  for_dtype_pairs(params, grads, [&](auto ptag, auto gtag, DType pd, DType gd) {
    using P = decltype(ptag);
    using G = decltype(gtag);
    for_batches(params, grads, bufs, nullptr, pd, gd, [&](const MultiTensorArgs& a, int blocks) {
      sgd_kernel<P, G><<<blocks, kThreads, 0, st>>>(a, c);
      MESHRT_CUDA_CHECK_LAUNCH("sgd_momentum<" << dtype_name(pd) << ", " << dtype_name(gd) << ">");
    });
  });
}

}  // namespace meshrt::kernels::cuda
