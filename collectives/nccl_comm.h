// NCCL backend: one rank per GPU; collectives on CUDA tensors enqueued on CUDA streams. Its
// communicators come from bootstrap() (backend "nccl"); collectives are watched by a background
// thread that polls ncclCommGetAsyncError and, on an error or a timeout, aborts every NCCL
// communicator of the process. bf16 / f16 reductions run in f32 (converted on the stream) unless
// MESHRT_NCCL_HALF_REDUCE=native.
//
// This header is the core's view of it: the functions below live in the core
// (nccl_backend.cpp, with the "nccl" entry of the backend registry) and reach the backend
// (nccl_comm.cpp, the only file that includes <nccl.h>) through its table, part of the CUDA
// backend's (runtime/cuda_plugin.h): linked in, or loaded from libmeshrt-cuda.so. They throw the
// loader's one-line error when the plugin cannot be loaded.
#pragma once

#include <memory>
#include <string>

#include "collectives/backend_registry.h"
#include "collectives/communicator.h"

namespace meshrt {

// "2.28.9"
std::string nccl_version_string();

// Wraps an NCCL communicator (an ncclComm_t passed as void*, so callers need no nccl.h) that the
// caller created on CUDA device `device` and keeps owning: rank and size come from NCCL; meshrt
// never destroys it, but aborts it (ncclCommAbort) on a timeout or abort(), after which the
// caller must not use it. CUDA builds only.
std::unique_ptr<Communicator> adopt_nccl_communicator(void* nccl_comm, int device,
                                                      const std::string& name, CommConfig config);

namespace detail {

// The NCCL backend's table (CudaPlugin::nccl).
struct NcclBackend {
  // The world communicators of a launch on CUDA devices (the "nccl" registry entry's prepare).
  WorldFactory (*prepare)(const WorldPlan& plan);
  std::unique_ptr<Communicator> (*adopt)(void* nccl_comm, int device, const std::string& name,
                                         CommConfig config);
  std::string (*version)();
};

// The table, defined by the backend (nccl_comm.cpp) for backends/cuda/cuda_plugin.cpp.
const NcclBackend& nccl_table();

}  // namespace detail

}  // namespace meshrt
