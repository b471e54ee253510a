// CUDA kernels of the runtime: n-d strided copy with dtype conversion, fill, Philox init, and the
// gate that holds a stream until the host says so. Host-side results are the reference: every
// conversion goes through runtime/half.h, exactly as the host backend does.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/cuda_ops.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/half.h"
#include "runtime/philox.h"

namespace meshrt::cuda_detail {

namespace {

constexpr int kThreads = 256;

// The iteration space of an op: extents and two stride sets (`a`: the destination; `b`: the
// source, or the full tensor's strides for Philox), with size-1 dims dropped and neighbouring
// dims merged where both sides walk them as one. Dim 0 is outermost.
struct Layout {
  int ndim = 1;
  int64_t shape[kMaxDims] = {};
  int64_t a[kMaxDims] = {};
  int64_t b[kMaxDims] = {};
};

Layout make_layout(int ndim, const int64_t* shape, const int64_t* sa, const int64_t* sb) {
  Layout l;
  l.ndim = 0;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] == 1) continue;
    if (l.ndim > 0) {
      const int j = l.ndim - 1;
      if (l.a[j] == sa[i] * shape[i] && l.b[j] == sb[i] * shape[i]) {
        l.shape[j] *= shape[i];
        l.a[j] = sa[i];
        l.b[j] = sb[i];
        continue;
      }
    }
    l.shape[l.ndim] = shape[i];
    l.a[l.ndim] = sa[i];
    l.b[l.ndim] = sb[i];
    ++l.ndim;
  }
  if (l.ndim == 0) {  // a scalar or all extents 1: one element at offset 0
    l.ndim = 1;
    l.shape[0] = 1;
    l.a[0] = 1;
    l.b[0] = 1;
  }
  return l;
}

bool fits_u32(int64_t n) { return n <= static_cast<int64_t>(UINT32_MAX); }

// Element offsets (in elements) of linear index e on both sides. I is the index type of the
// divisions: 32-bit when the whole range fits, which is several times cheaper on the GPU.
template <class I>
__device__ __forceinline__ void offsets_of(const Layout& l, int64_t linear, int64_t* oa,
                                           int64_t* ob) {
  I e = static_cast<I>(linear);
  int64_t ra = 0, rb = 0;
#pragma unroll
  for (int k = kMaxDims - 1; k > 0; --k) {
    if (k < l.ndim) {
      const I n = static_cast<I>(l.shape[k]);
      const I q = e / n;
      const int64_t r = static_cast<int64_t>(e - q * n);
      ra += r * l.a[k];
      rb += r * l.b[k];
      e = q;
    }
  }
  ra += static_cast<int64_t>(e) * l.a[0];
  rb += static_cast<int64_t>(e) * l.b[0];
  *oa = ra;
  *ob = rb;
}

template <class D, class S, class I>
__global__ void copy_kernel(D* dst, const S* src, Layout l, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t od, os;
    offsets_of<I>(l, i, &od, &os);
    dst[od] = convert_elem<D>(src[os]);
  }
}

template <class D, class I>
__global__ void fill_kernel(D* dst, D value, Layout l, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t od, unused;
    offsets_of<I>(l, i, &od, &unused);
    dst[od] = value;
  }
}

struct PhiloxParams {
  uint64_t seed;
  uint64_t id;
  int64_t base;  // global index of the shard's first element: sum(offsets_i * full_stride_i)
  float a;
  float b;
  bool normal;
};

template <class D, class I>
__global__ void philox_kernel(D* dst, PhiloxParams p, Layout l, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t od, g;
    offsets_of<I>(l, i, &od, &g);
    const Philox4 r = philox_draw(p.seed, p.id, static_cast<uint64_t>(p.base + g));
    // philox_value uses explicitly rounded operations (no FMA contraction): bit-identical to
    // the host.
    const float v = philox_value(p.normal, p.a, p.b, r);
    store_f32(dst, od, v);
  }
}

__global__ void host_gate_kernel(const volatile uint64_t* released, uint64_t ticket) {
  while (*released < ticket) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(2000);
#endif
  }
}

// Enough blocks to fill the current device a few times over; grid-stride loops do the rest.
unsigned grid_for(int64_t n) {
  int dev = 0, sms = 0;
  MESHRT_CUDA_CHECK(cudaGetDevice(&dev));
  MESHRT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t want = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t{sms} * 8)));
}

}  // namespace

void launch_copy_strided(TensorDesc dst, TensorDesc src, cudaStream_t stream) {
  MESHRT_CHECK(dst.ndim == src.ndim,
               "CUDA copy_strided: rank " << src.ndim << " into rank " << dst.ndim);
  for (int i = 0; i < dst.ndim; ++i)
    MESHRT_CHECK(dst.shape[i] == src.shape[i], "CUDA copy_strided: extent "
                                                   << src.shape[i] << " into " << dst.shape[i]
                                                   << " at dim " << i);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Layout l = make_layout(dst.ndim, dst.shape, dst.strides, src.strides);
  if (dst.dtype == src.dtype) {
    const size_t es = dtype_size(dst.dtype);
    if (dst.ptr == src.ptr && std::equal(l.a, l.a + l.ndim, l.b)) return;  // copy onto itself
    if (l.ndim == 1 && l.a[0] == 1 && l.b[0] == 1) {
      const size_t bytes = static_cast<size_t>(n) * es;
      const auto d = reinterpret_cast<uintptr_t>(dst.ptr);
      const auto s = reinterpret_cast<uintptr_t>(src.ptr);
      if (d < s + bytes && s < d + bytes) {
        // Overlapping ranges (the host backend memmoves): go through a stream-ordered temporary.
        void* tmp = nullptr;
        MESHRT_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, stream));
        MESHRT_CUDA_CHECK(cudaMemcpyAsync(tmp, src.ptr, bytes, cudaMemcpyDeviceToDevice, stream));
        MESHRT_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, tmp, bytes, cudaMemcpyDeviceToDevice, stream));
        MESHRT_CUDA_CHECK(cudaFreeAsync(tmp, stream));
        return;
      }
      MESHRT_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, stream));
      return;
    }
    constexpr int64_t kMaxPitch = int64_t{1} << 30;  // well inside cudaDevAttrMaxPitch
    if (l.ndim == 2 && l.a[1] == 1 && l.b[1] == 1 && l.a[0] >= l.shape[1] && l.b[0] >= l.shape[1] &&
        l.a[0] * static_cast<int64_t>(es) <= kMaxPitch &&
        l.b[0] * static_cast<int64_t>(es) <= kMaxPitch) {
      // Rows with gaps (narrow / slice of the last dim): one 2-d copy.
      MESHRT_CUDA_CHECK(
          cudaMemcpy2DAsync(dst.ptr, static_cast<size_t>(l.a[0]) * es, src.ptr,
                            static_cast<size_t>(l.b[0]) * es, static_cast<size_t>(l.shape[1]) * es,
                            static_cast<size_t>(l.shape[0]), cudaMemcpyDeviceToDevice, stream));
      return;
    }
  }
  const unsigned grid = grid_for(n);
  dispatch_any(dst.dtype, [&](auto de) {
    using D = decltype(de);
    dispatch_any(src.dtype, [&](auto se) {
      using S = decltype(se);
      D* dp = static_cast<D*>(dst.ptr);
      const S* sp = static_cast<const S*>(src.ptr);
      if (fits_u32(n))
        copy_kernel<D, S, uint32_t><<<grid, kThreads, 0, stream>>>(dp, sp, l, n);
      else
        copy_kernel<D, S, uint64_t><<<grid, kThreads, 0, stream>>>(dp, sp, l, n);
      MESHRT_CUDA_CHECK_LAUNCH("copy_strided<" << dtype_name(dst.dtype) << " <- "
                                               << dtype_name(src.dtype) << "> of " << n
                                               << " elements");
    });
  });
}

void launch_fill(TensorDesc dst, double value, cudaStream_t stream) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Layout l = make_layout(dst.ndim, dst.shape, dst.strides, dst.strides);
  dispatch_any(dst.dtype, [&](auto de) {
    using D = decltype(de);
    const D v = convert_elem<D>(value);
    unsigned char bytes[sizeof(D)];
    std::memcpy(bytes, &v, sizeof(D));
    const bool one_byte =
        std::all_of(bytes, bytes + sizeof(D), [&](unsigned char c) { return c == bytes[0]; });
    if (one_byte && l.ndim == 1 && l.a[0] == 1) {  // zeros and the like: a plain memset
      MESHRT_CUDA_CHECK(
          cudaMemsetAsync(dst.ptr, bytes[0], static_cast<size_t>(n) * sizeof(D), stream));
      return;
    }
    D* dp = static_cast<D*>(dst.ptr);
    const unsigned grid = grid_for(n);
    if (fits_u32(n))
      fill_kernel<D, uint32_t><<<grid, kThreads, 0, stream>>>(dp, v, l, n);
    else
      fill_kernel<D, uint64_t><<<grid, kThreads, 0, stream>>>(dp, v, l, n);
    MESHRT_CUDA_CHECK_LAUNCH("fill<" << dtype_name(dst.dtype) << "> of " << n << " elements");
  });
}

void launch_init_philox(TensorDesc dst, const PhiloxInit& init, const Shape& full_shape,
                        const Shape& offsets, cudaStream_t stream) {
  MESHRT_CHECK(is_floating(dst.dtype),
               "init_philox_: integer dtype " << dtype_name(dst.dtype) << " on CUDA");
  MESHRT_CHECK(full_shape.ndim() == dst.ndim && offsets.ndim() == dst.ndim,
               "CUDA init_philox: shard rank " << dst.ndim << ", full shape " << full_shape.str()
                                               << ", offsets " << offsets.str());
  const int64_t n = dst.numel();
  if (n == 0) return;
  // global index = sum((idx_i + off_i) * F_i) = sum(off_i * F_i) + sum(idx_i * F_i): a base plus
  // a second strided operand, so the shard walks the full tensor like a copy walks its source.
  const Shape fstride = contiguous_strides(full_shape);
  PhiloxParams p{};
  p.seed = init.seed;
  p.id = init.id;
  p.base = 0;
  for (int i = 0; i < dst.ndim; ++i) p.base += offsets[i] * fstride[i];
  p.a = init.a;
  p.b = init.b;
  p.normal = init.dist == PhiloxInit::Dist::Normal;
  const Layout l = make_layout(dst.ndim, dst.shape, dst.strides, fstride.begin());
  const unsigned grid = grid_for(n);
  dispatch_any(dst.dtype, [&](auto de) {
    using D = decltype(de);
    if constexpr (!std::is_integral_v<D>) {
      D* dp = static_cast<D*>(dst.ptr);
      if (fits_u32(n))
        philox_kernel<D, uint32_t><<<grid, kThreads, 0, stream>>>(dp, p, l, n);
      else
        philox_kernel<D, uint64_t><<<grid, kThreads, 0, stream>>>(dp, p, l, n);
      MESHRT_CUDA_CHECK_LAUNCH("init_philox<" << dtype_name(dst.dtype) << "> of " << n
                                              << " elements");
    }
  });
}

void launch_host_gate(const volatile uint64_t* released, uint64_t ticket, cudaStream_t stream) {
  host_gate_kernel<<<1, 1, 0, stream>>>(released, ticket);
  MESHRT_CUDA_CHECK_LAUNCH("host_gate (ticket " << ticket << ")");
}

}  // namespace meshrt::cuda_detail
