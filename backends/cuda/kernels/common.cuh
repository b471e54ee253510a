// Shared pieces of the CUDA kernels: stream plumbing, scratch memory from the caching allocator,
// launch shapes, warp and block reductions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/device_guard.h"
#include "kernels/backend.h"
#include "kernels/math.h"
#include "runtime/context.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/half.h"

namespace meshrt::kernels::cuda {

using cuda_detail::DeviceGuard;

inline cudaStream_t native(Stream& s) { return static_cast<cudaStream_t>(s.native_handle()); }

// Temporary device memory from the rank's caching allocator, released when the scope ends: the
// allocator's stream-aware reuse keeps it from being handed out before the work enqueued on
// `stream` so far (which includes the kernels using it) has finished.
class Scratch {
 public:
  Scratch(Context& ctx, Stream& s, size_t bytes)
      : alloc_(ctx.allocator_ptr()), ptr_(bytes ? alloc_->allocate(bytes, &s) : nullptr) {}
  ~Scratch() {
    if (ptr_) alloc_->deallocate(ptr_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  std::shared_ptr<Allocator> alloc_;
  void* ptr_;
};

constexpr int kThreads = 256;

// Grid for a grid-stride loop over n items (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65536 * 8) b = 65536 * 8;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// Threads per block for one-block-per-row kernels: enough to cover the row, multiple of 32.
inline int row_threads(int64_t n) {
  int64_t t = (n + 31) / 32 * 32;
  if (t > 512) t = 512;
  if (t < 32) t = 32;
  return static_cast<int>(t);
}

// ---- reductions ---------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max returned to every thread. blockDim.x must be a multiple of 32; smem holds
// at least 32 floats. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float t = lane < nw ? smem[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) smem[0] = t;
  }
  __syncthreads();
  return smem[0];
}

__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float t = lane < nw ? smem[lane] : -kmath::kInf;
    t = warp_max(t);
    if (lane == 0) smem[0] = t;
  }
  __syncthreads();
  return smem[0];
}

// Online-softmax state merged across the block (kmath::softmax_merge); smem >= 64 floats.
__device__ __forceinline__ kmath::SoftmaxState block_softmax_merge(kmath::SoftmaxState s,
                                                                   float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    kmath::SoftmaxState t{__shfl_xor_sync(0xffffffffu, s.m, o),
                          __shfl_xor_sync(0xffffffffu, s.l, o)};
    s = kmath::softmax_merge(s, t);
  }
  __syncthreads();
  if (lane == 0) {
    smem[wid] = s.m;
    smem[32 + wid] = s.l;
  }
  __syncthreads();
  if (wid == 0) {
    kmath::SoftmaxState t{lane < nw ? smem[lane] : -kmath::kInf, lane < nw ? smem[32 + lane] : 0.f};
    for (int o = 16; o > 0; o >>= 1) {
      kmath::SoftmaxState u{__shfl_xor_sync(0xffffffffu, t.m, o),
                            __shfl_xor_sync(0xffffffffu, t.l, o)};
      t = kmath::softmax_merge(t, u);
    }
    if (lane == 0) {
      smem[0] = t.m;
      smem[32] = t.l;
    }
  }
  __syncthreads();
  return kmath::SoftmaxState{smem[0], smem[32]};
}

// Welford state merged across the block (kmath::welford_merge); smem >= 96 floats.
__device__ __forceinline__ kmath::Welford block_welford(kmath::Welford w, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    kmath::Welford t;
    t.mean = __shfl_xor_sync(0xffffffffu, w.mean, o);
    t.m2 = __shfl_xor_sync(0xffffffffu, w.m2, o);
    t.count = __shfl_xor_sync(0xffffffffu, w.count, o);
    w = kmath::welford_merge(w, t);
  }
  __syncthreads();
  if (lane == 0) {
    smem[wid] = w.mean;
    smem[32 + wid] = w.m2;
    smem[64 + wid] = w.count;
  }
  __syncthreads();
  if (wid == 0) {
    kmath::Welford t;
    if (lane < nw) {
      t.mean = smem[lane];
      t.m2 = smem[32 + lane];
      t.count = smem[64 + lane];
    }
    for (int o = 16; o > 0; o >>= 1) {
      kmath::Welford u;
      u.mean = __shfl_xor_sync(0xffffffffu, t.mean, o);
      u.m2 = __shfl_xor_sync(0xffffffffu, t.m2, o);
      u.count = __shfl_xor_sync(0xffffffffu, t.count, o);
      t = kmath::welford_merge(t, u);
    }
    if (lane == 0) {
      smem[0] = t.mean;
      smem[32] = t.m2;
      smem[64] = t.count;
    }
  }
  __syncthreads();
  kmath::Welford r;
  r.mean = smem[0];
  r.m2 = smem[32];
  r.count = smem[64];
  return r;
}

// ---- column reductions (parameter gradients) ----------------------------------------------------
// Stage 1 kernels write partial[chunk][col] (f32) over fixed row chunks; stage 2 sums the chunks
// in order (deterministic) and stores, optionally adding the old contents.

constexpr int kColTile = 32;  // columns per block (one warp wide)
constexpr int kColRowsY = 8;  // threads along rows per block

// Row chunks of a column reduction: at least 64 rows each, at most 256 chunks (bounds the
// partial buffer to 256 x n floats).
struct ColPlan {
  int64_t per = 64, chunks = 0;
  explicit ColPlan(int64_t rows) {
    per = (rows + 255) / 256;
    if (per < 64) per = 64;
    chunks = (rows + per - 1) / per;
  }
  dim3 grid(int64_t n) const {
    return dim3(static_cast<unsigned>((n + kColTile - 1) / kColTile),
                static_cast<unsigned>(chunks < 1 ? 1 : chunks));
  }
  static dim3 block() { return dim3(kColTile, kColRowsY); }
};

template <class T>
__global__ void col_finalize_kernel(const float* __restrict__ part, int64_t chunks, int64_t n,
                                    T* __restrict__ out, bool accumulate) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = accumulate ? load_f32(out, j) : 0.f;
    for (int64_t c = 0; c < chunks; ++c) s += part[c * n + j];
    store_f32(out, j, s);
  }
}

template <class T>
void col_finalize(const float* part, int64_t chunks, int64_t n, T* out, bool accumulate,
                  cudaStream_t st) {
  col_finalize_kernel<T><<<grid_for(n), kThreads, 0, st>>>(part, chunks, n, out, accumulate);
  MESHRT_CUDA_CHECK_LAUNCH("col_finalize");
}

// Sums a [kColRowsY][kColTile] tile of per-thread partials over y into part[chunk][col].
__device__ __forceinline__ void col_tile_store(float v, float (*tile)[kColTile + 1], float* part,
                                               int64_t n, int64_t col) {
  tile[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0) {
    float s = 0.f;
    for (int y = 0; y < kColRowsY; ++y) s += tile[y][threadIdx.x];
    if (col < n) part[blockIdx.y * n + col] = s;
  }
  __syncthreads();
}

}  // namespace meshrt::kernels::cuda
