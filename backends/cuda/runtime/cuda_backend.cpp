// The CUDA DeviceRuntime: streams (cuda_stream.cpp), the caching allocator over cudaMalloc,
// copies, and the kernels of cuda_tensor_ops.cu. Links only the shared CUDA runtime, so a
// CUDA-enabled build starts on a machine without a driver and says why CUDA is unusable
// (cuda_device.cpp).
#include <cuda_runtime_api.h>

#include <functional>
#include <new>
#include <sstream>
#include <utility>

#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/cuda_device.h"
#include "backends/cuda/runtime/cuda_ops.h"
#include "backends/cuda/runtime/cuda_stream.h"
#include "backends/cuda/runtime/device_guard.h"
#include "runtime/backend.h"
#include "runtime/caching_allocator.h"
#include "runtime/error.h"

namespace meshrt {

namespace cuda_detail {

namespace {

// The CUDA device that owns `p` (for work run from a host stream, which has no device).
int device_of_pointer(const void* p, const char* what) {
  cudaPointerAttributes attr{};
  MESHRT_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  MESHRT_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
               what << ": " << p << " is not CUDA device memory");
  return attr.device;
}

// Runs `launch(cudaStream_t)` in the order of stream `s`. On a CUDA stream it is issued right
// away with the stream's device current. On a host stream it runs as one of that stream's tasks
// on `device`'s per-thread default stream, and the task waits for it, so the host stream's order
// holds.
void run_on(Stream& s, int device, const std::function<void(cudaStream_t)>& launch) {
  if (s.device().is_cuda()) {
    DeviceGuard g(s.device().index);
    launch(static_cast<cudaStream_t>(s.native_handle()));
    return;
  }
  s.enqueue([device, launch] {
    DeviceGuard g(device);
    launch(cudaStreamPerThread);
    MESHRT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  });
}

class CudaBackend final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }

  int device_count(std::string* why) const override {
    const Probe& p = probe();
    if (p.count == 0 && why) *why = p.why;
    return p.count;
  }

  std::unique_ptr<Stream> create_stream(int device, std::string name) const override {
    check_device(device, "create_stream");
    DeviceGuard g(device);
    cudaStream_t s = nullptr;
    MESHRT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    try {
      return make_cuda_stream(device, s, /*owned=*/true, std::move(name));
    } catch (...) {
      (void)cudaStreamDestroy(s);
      throw;
    }
  }

  std::unique_ptr<Stream> wrap_stream(int device, void* native, std::string name) const override {
    check_device(device, "wrap_stream");
    // A null handle is the legacy default stream; name it explicitly so native_handle() of a
    // CUDA stream is never null (null means "host stream").
    cudaStream_t s = native ? static_cast<cudaStream_t>(native) : cudaStreamLegacy;
#if CUDART_VERSION >= 12080
    if (native) {
      int owner = -1;
      const cudaError_t err = cudaStreamGetDevice(s, &owner);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        MESHRT_FAIL("wrap_stream('" << name << "'): " << native
                                    << " is not a valid cudaStream_t: " << cuda_error_text(err));
      }
      MESHRT_CHECK(owner == device, "wrap_stream('" << name << "'): the stream belongs to cuda:"
                                                    << owner << ", not cuda:" << device);
    }
#endif
    return make_cuda_stream(device, s, /*owned=*/false, std::move(name));
  }

  std::shared_ptr<Allocator> create_caching_allocator(int device) const override {
    check_device(device, "create_caching_allocator");
    CachingAllocator::Raw raw;
    raw.alloc = [device](size_t bytes) -> void* {
      DeviceGuard g(device);
      void* p = nullptr;
      const cudaError_t err = cudaMalloc(&p, bytes);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // out of memory is not sticky: the caller may free and retry
        return nullptr;
      }
      MESHRT_CUDA_CHECK(err);
      return p;
    };
    raw.free = [device](void* p) {  // runs in destructors: never throws
      DeviceGuard g(device, std::nothrow);
      const cudaError_t err = cudaFree(p);
      if (err != cudaSuccess) warn_cuda("cudaFree", err);
    };
    raw.describe_free = [device] { return describe_free_memory(device); };
    return std::make_shared<CachingAllocator>(Device::cuda(device), "cuda-caching", std::move(raw));
  }

  void memcpy_async(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes,
                    Stream& s) const override {
    MESHRT_CHECK(dst_dev.is_cuda() || src_dev.is_cuda(),
                 "CUDA memcpy_async between " << src_dev.str() << " and " << dst_dev.str());
    if (bytes == 0) return;
    const int device = s.device().is_cuda() ? s.device().index
                                            : (dst_dev.is_cuda() ? dst_dev.index : src_dev.index);
    if (dst_dev.is_cuda() && src_dev.is_cuda() && dst_dev.index != src_dev.index) {
      run_on(s, device, [=](cudaStream_t cs) {
        MESHRT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, bytes, cs));
      });
      return;
    }
    const cudaMemcpyKind kind =
        dst_dev.is_cuda() ? (src_dev.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                          : cudaMemcpyDeviceToHost;
    run_on(s, device,
           [=](cudaStream_t cs) { MESHRT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cs)); });
  }

  void copy_strided(const TensorDesc& dst, const TensorDesc& src, Stream& s) const override {
    const int device =
        s.device().is_cuda() ? s.device().index : device_of_pointer(dst.ptr, "CUDA copy_strided");
    run_on(s, device, [dst, src](cudaStream_t cs) { launch_copy_strided(dst, src, cs); });
  }

  void fill(const TensorDesc& dst, double value, Stream& s) const override {
    const int device =
        s.device().is_cuda() ? s.device().index : device_of_pointer(dst.ptr, "CUDA fill");
    run_on(s, device, [dst, value](cudaStream_t cs) { launch_fill(dst, value, cs); });
  }

  void init_philox(const TensorDesc& dst, const PhiloxInit& init, const Shape& full_shape,
                   const Shape& offsets, Stream& s) const override {
    const int device =
        s.device().is_cuda() ? s.device().index : device_of_pointer(dst.ptr, "CUDA init_philox");
    run_on(s, device, [dst, init, full_shape, offsets](cudaStream_t cs) {
      launch_init_philox(dst, init, full_shape, offsets, cs);
    });
  }

  std::string versions() const override {
    const Probe& p = probe();
    std::ostringstream os;
    os << "CUDA runtime " << cuda_version_str(p.runtime_version);
    if (p.driver_version > 0)
      os << ", driver for CUDA " << cuda_version_str(p.driver_version);
    else
      os << ", no CUDA driver";
    if (p.count == 0) {
      os << "; no usable GPU: " << p.why;
      return os.str();
    }
    for (int i = 0; i < p.count; ++i) {
      cudaDeviceProp prop{};
      const cudaError_t err = cudaGetDeviceProperties(&prop, i);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        os << "; cuda:" << i << " (" << cuda_error_text(err) << ")";
        continue;
      }
      os << "; cuda:" << i << " " << prop.name << " (sm_" << prop.major << prop.minor << ", "
         << prop.multiProcessorCount << " SMs, " << (prop.totalGlobalMem >> 20) << " MiB)";
    }
    return os.str();
  }
};

}  // namespace

const DeviceRuntime& device_backend() {
  static const CudaBackend be;
  return be;
}

}  // namespace cuda_detail

}  // namespace meshrt
