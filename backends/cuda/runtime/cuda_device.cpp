// CUDA device probing: device count, versions and the reason CUDA is unusable, asked once.
#include <cstdlib>
#include <sstream>

#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/cuda_device.h"
#include "backends/cuda/runtime/device_guard.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt::cuda_detail {

void warn_cuda(const char* what, cudaError_t err) {
  (void)cudaGetLastError();
  if (err == cudaErrorCudartUnloading) return;
  MESHRT_LOG_WARN(what << " failed: " << cuda_error_text(err));
}

std::string cuda_version_str(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    if (cudaRuntimeGetVersion(&r.runtime_version) != cudaSuccess) (void)cudaGetLastError();
    if (cudaDriverGetVersion(&r.driver_version) != cudaSuccess) {
      (void)cudaGetLastError();
      r.driver_version = 0;
    }
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
      r.why = "cudaGetDeviceCount failed: " + cuda_error_text(err);
      if (r.driver_version == 0)
        r.why += "; no NVIDIA driver was found (libcuda is not installed or not loadable)";
      else if (r.driver_version < r.runtime_version)
        r.why += "; the driver supports CUDA " + cuda_version_str(r.driver_version) +
                 " but meshrt was built with CUDA runtime " + cuda_version_str(r.runtime_version) +
                 ": update the NVIDIA driver";
    } else if (n <= 0) {
      n = 0;
      r.why = "no CUDA device (cudaGetDeviceCount returned 0)";
    }
    if (n == 0) {
      if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES"))
        r.why += std::string("; CUDA_VISIBLE_DEVICES=\"") + vis + "\"";
    }
    r.count = n;
    return r;
  }();
  return p;
}

void check_device(int device, const char* what) {
  const Probe& p = probe();
  MESHRT_CHECK(p.count > 0, what << " on cuda:" << device << ": CUDA is unavailable: " << p.why);
  MESHRT_CHECK(device >= 0 && device < p.count, what << " on cuda:" << device
                                                     << ": no such device (" << p.count
                                                     << " CUDA device(s) visible)");
}

std::string describe_free_memory(int device) {
  DeviceGuard g(device, std::nothrow);
  size_t free_b = 0, total_b = 0;
  const cudaError_t err = g.ok() ? cudaMemGetInfo(&free_b, &total_b) : cudaErrorInvalidDevice;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaMemGetInfo failed: " + cuda_error_text(err);
  }
  std::ostringstream os;
  os << "cuda:" << device << " has " << (free_b >> 20) << " MiB free of " << (total_b >> 20)
     << " MiB";
  return os.str();
}

}  // namespace meshrt::cuda_detail
