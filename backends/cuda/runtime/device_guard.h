// DeviceGuard: makes a CUDA device current for a scope and restores the previous one (runtime,
// kernels and collectives share this one; ranks may share a host thread).
#pragma once

#include <cuda_runtime_api.h>

#include <new>

#include "backends/cuda/runtime/cuda_check.h"

namespace meshrt::cuda_detail {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MESHRT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) {
      MESHRT_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  // For destructors and teardown: never throws; ok() says whether `device` is current.
  DeviceGuard(int device, std::nothrow_t) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      ok_ = false;
      return;
    }
    if (prev_ != device) {
      if (cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        ok_ = false;
        return;
      }
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_ && cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  bool ok() const { return ok_; }

 private:
  int prev_ = 0;
  bool switched_ = false;
  bool ok_ = true;
};

}  // namespace meshrt::cuda_detail
