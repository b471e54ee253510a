// The CUDA backend as the core sees it: one table, whose parts live in the CUDA backend
// (backends/cuda/runtime, backends/cuda/kernels with cuBLASLt,
// backends/cuda/collectives/nccl_comm.cpp: the only code that includes CUDA or NCCL headers;
// backends/cuda/cuda_plugin.cpp assembles the table). Static builds link it in; libmeshrt.so loads
// it from libmeshrt-cuda.so (runtime/plugin.h) the first time a CUDA device is asked for, so the
// core itself never depends on a CUDA or NCCL library. A build without CUDA has no table
// (runtime/cuda_absent.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/backend.h"

namespace meshrt::detail {

struct CudaPlugin {
  // Devices, streams and events, the caching allocator over cudaMalloc, copies, fills
  // (backends/cuda/runtime/cuda_backend.cpp).
  const DeviceRuntime* device;
  // NVTX ranges for runtime/ranges.h (backends/cuda/runtime/nvtx_ranges.cpp).
  void (*nvtx_push)(const std::string& name, uint64_t payload);
  void (*nvtx_pop)();
  // The CUDA op table: a const kernels::OpTable* (kernels/backend.h; backends/cuda/kernels, GEMMs
  // on cuBLASLt). Typed by the kernels layer, which reads it (kernels/ops.cpp).
  const void* kernels;
  // "cuBLASLt 13.1.0" (a library call: needs no GPU).
  std::string (*gemm_library_version)();
  // The NCCL collective backend: a const NcclBackend* (collectives/nccl_comm.h), typed by the
  // collectives layer, which reads it (collectives/nccl_backend.cpp).
  const void* nccl;
};

// The CUDA backend: linked in, or loaded from libmeshrt-cuda.so on the first call (one attempt
// per process). nullptr when this build has no CUDA backend or the plugin cannot be loaded, with
// `why` (when not null) set to the reason: for the plugin the loader's one line naming the
// library and dlerror()'s reason.
const CudaPlugin* cuda_plugin(std::string* why = nullptr);
// The backend when it is linked in or already loaded, else nullptr (never loads the plugin).
const CudaPlugin* cuda_plugin_if_loaded();
// Where the backend comes from: "linked in", the plugin's path once loaded, "not built" in a
// build without CUDA, "" before the plugin is loaded.
std::string cuda_plugin_origin();

}  // namespace meshrt::detail
