// The host DeviceRuntime: streams are worker threads; copies, fills and Philox init run as tasks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <type_traits>

#include "runtime/backend.h"
#include "runtime/cuda_plugin.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/error.h"
#include "runtime/half.h"
#include "runtime/host_copy.h"
#include "runtime/philox.h"

namespace meshrt {

namespace {

// Visits every innermost row of an n-d iteration: f(dst_offset, src_offset, count, dst_inner,
// src_inner) with offsets in elements.
template <class F>
void for_each_row(const TensorDesc& d, const int64_t* src_strides, F&& f) {
  if (d.ndim == 0) {
    f(0, 0, 1, 1, 1);
    return;
  }
  const int last = d.ndim - 1;
  int64_t idx[kMaxDims] = {};
  int64_t rows = 1;
  for (int i = 0; i < last; ++i) rows *= d.shape[i];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < last; ++i) {
      doff += idx[i] * d.strides[i];
      soff += idx[i] * src_strides[i];
    }
    f(doff, soff, d.shape[last], d.strides[last], src_strides[last]);
    for (int i = last - 1; i >= 0; --i) {
      if (++idx[i] < d.shape[i]) break;
      idx[i] = 0;
    }
  }
}

bool contiguous_desc(const TensorDesc& d) {
  int64_t expect = 1;
  for (int i = d.ndim - 1; i >= 0; --i) {
    if (d.shape[i] == 1) continue;
    if (d.strides[i] != expect) return false;
    expect *= d.shape[i];
  }
  return true;
}

void host_init_philox(const TensorDesc& dst, const PhiloxInit& init, const Shape& full,
                      const Shape& offsets) {
  Shape fstride = contiguous_strides(full);
  dispatch_any(dst.dtype, [&](auto de) {
    using D = decltype(de);
    if constexpr (std::is_integral_v<D>) {
      MESHRT_FAIL("init_philox_: integer dtype " << dtype_name(dst.dtype));
    } else {
      D* dp = static_cast<D*>(dst.ptr);
      const int nd = dst.ndim;
      int64_t idx[kMaxDims] = {};
      const int64_t n = dst.numel();
      for (int64_t e = 0; e < n; ++e) {
        int64_t doff = 0, g = 0;
        for (int i = 0; i < nd; ++i) {
          doff += idx[i] * dst.strides[i];
          g += (idx[i] + offsets[i]) * fstride[i];
        }
        Philox4 r = philox_draw(init.seed, init.id, static_cast<uint64_t>(g));
        float v = philox_value(init.dist == PhiloxInit::Dist::Normal, init.a, init.b, r);
        store_f32(dp, doff, v);
        for (int i = nd - 1; i >= 0; --i) {
          if (++idx[i] < dst.shape[i]) break;
          idx[i] = 0;
        }
      }
    }
  });
}

class HostBackend final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::CPU; }
  int device_count(std::string*) const override {
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  std::unique_ptr<Stream> create_stream(int device, std::string name) const override {
    return make_host_stream(std::move(name), device);
  }
  std::unique_ptr<Stream> wrap_stream(int, void*, std::string name) const override {
    MESHRT_FAIL("wrap_stream(" << name << "): host streams cannot wrap a native handle");
  }
  std::shared_ptr<Allocator> create_caching_allocator(int device) const override {
    return make_host_caching_allocator(device);
  }
  void memcpy_async(void* dst, Device dd, const void* src, Device sd, size_t bytes,
                    Stream& s) const override {
    MESHRT_CHECK(dd.is_cpu() && sd.is_cpu(),
                 "host memcpy between " << sd.str() << " and " << dd.str());
    s.enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  void copy_strided(const TensorDesc& dst, const TensorDesc& src, Stream& s) const override {
    s.enqueue([dst, src] { host_copy_strided(dst, src); });
  }
  void fill(const TensorDesc& dst, double value, Stream& s) const override {
    s.enqueue([dst, value] { host_fill(dst, value); });
  }
  void init_philox(const TensorDesc& dst, const PhiloxInit& init, const Shape& full,
                   const Shape& offsets, Stream& s) const override {
    s.enqueue([dst, init, full, offsets] { host_init_philox(dst, init, full, offsets); });
  }
  std::string versions() const override { return "host"; }
};

}  // namespace

void host_copy_strided(const TensorDesc& dst, const TensorDesc& src) {
  if (dst.dtype == src.dtype && contiguous_desc(dst) && contiguous_desc(src)) {
    std::memmove(dst.ptr, src.ptr, static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype));
    return;
  }
  dispatch_any(dst.dtype, [&](auto de) {
    using D = decltype(de);
    dispatch_any(src.dtype, [&](auto se) {
      using S = decltype(se);
      D* dp = static_cast<D*>(dst.ptr);
      const S* sp = static_cast<const S*>(src.ptr);
      for_each_row(dst, src.strides,
                   [&](int64_t doff, int64_t soff, int64_t n, int64_t ds, int64_t ss) {
                     D* o = dp + doff;
                     const S* in = sp + soff;
                     if constexpr (std::is_same_v<D, S>) {
                       if (ds == 1 && ss == 1) {
                         std::memcpy(o, in, static_cast<size_t>(n) * sizeof(D));
                         return;
                       }
                     }
                     if (ds == 1 && ss == 1) {
                       for (int64_t i = 0; i < n; ++i) o[i] = convert_elem<D>(in[i]);
                     } else {
                       for (int64_t i = 0; i < n; ++i) o[i * ds] = convert_elem<D>(in[i * ss]);
                     }
                   });
    });
  });
}

void host_fill(const TensorDesc& dst, double value) {
  dispatch_any(dst.dtype, [&](auto de) {
    using D = decltype(de);
    const D v = convert_elem<D>(value);
    const bool zero = value == 0.0 && !std::signbit(value);
    D* dp = static_cast<D*>(dst.ptr);
    for_each_row(dst, dst.strides, [&](int64_t doff, int64_t, int64_t n, int64_t ds, int64_t) {
      D* o = dp + doff;
      if (ds == 1) {
        // +0 is all-zero bytes in every dtype: memset, whose large-size path streams the stores
        // (no read for ownership), fills a zero_grad's buckets in half the time of fill_n's
        // vector stores, which the compiler cannot turn into a memset for a runtime value.
        if (zero)
          std::memset(o, 0, static_cast<size_t>(n) * sizeof(D));
        else
          std::fill_n(o, n, v);
        return;
      }
      for (int64_t i = 0; i < n; ++i) o[i * ds] = v;
    });
  });
}

const DeviceRuntime& host_backend() {
  static const HostBackend be;
  return be;
}

const DeviceRuntime& backend_for(Device d) {
  if (d.is_cpu()) return host_backend();
  std::string why;
  MESHRT_CHECK(cuda_available(&why), "device " << d.str() << " requested but CUDA is unavailable: "
                                               << why << "; use cpu devices instead");
  int n = cuda_backend()->device_count(nullptr);
  MESHRT_CHECK(d.index < n,
               "device " << d.str() << " does not exist: " << n << " CUDA device(s) visible");
  return *cuda_backend();
}

const DeviceRuntime* cuda_backend() {
  const detail::CudaPlugin* p = detail::cuda_plugin();
  return p ? p->device : nullptr;
}

bool cuda_available(std::string* why) {
  std::string reason;
  const detail::CudaPlugin* p = detail::cuda_plugin(&reason);
  const int n = p ? p->device->device_count(&reason) : 0;
  if (n <= 0 && why) *why = reason;
  return n > 0;
}

int cuda_device_count() {
  const DeviceRuntime* be = cuda_backend();
  return be ? std::max(0, be->device_count(nullptr)) : 0;
}

std::string device_versions(DeviceType type) {
  if (type == DeviceType::CPU) return host_backend().versions();
  const DeviceRuntime* be = cuda_backend();
  return be ? be->versions() : "";
}

}  // namespace meshrt
