// CUDA device probing (internal to backends/cuda/runtime): what the CUDA runtime says about this
// machine, device checks with the reason CUDA is unusable, and quiet error reports for teardown
// paths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace meshrt {
class DeviceRuntime;
}  // namespace meshrt

namespace meshrt::cuda_detail {

// The parts of the CUDA backend's table (runtime/cuda_plugin.h) that backends/cuda/runtime
// provides: the DeviceRuntime (cuda_backend.cpp) and NVTX ranges (nvtx_ranges.cpp).
const DeviceRuntime& device_backend();
void nvtx_push(const std::string& name, uint64_t payload);
void nvtx_pop();

// What the CUDA runtime says about this machine, asked once: the device count does not change
// during a process (CUDA_VISIBLE_DEVICES is read when the runtime initialises).
struct Probe {
  int count = 0;
  std::string why;  // when count == 0
  int runtime_version = 0;
  int driver_version = 0;  // the CUDA version the driver supports; 0 when no driver was found
};
const Probe& probe();

// Throws naming `what`, the device and why, unless cuda:`device` exists and CUDA is usable.
void check_device(int device, const char* what);

// Reports a failure in a destructor or teardown path, where throwing is not an option. Calls made
// while the process exits (the runtime already unloading) are expected to fail and stay quiet.
void warn_cuda(const char* what, cudaError_t err);

// 13000 -> "13.0"
std::string cuda_version_str(int v);

// "cuda:0 has 1234 MiB free of 80000 MiB" (or why that could not be asked).
std::string describe_free_memory(int device);

}  // namespace meshrt::cuda_detail
