// NCCL backend: one rank per GPU; collectives on CUDA tensors enqueued on CUDA streams. Its
// communicators come from bootstrap() (backend "nccl"); collectives are watched by a background
// thread that polls ncclCommGetAsyncError and, on an error or a timeout, aborts every NCCL
// communicator of the process. bf16 / f16 reductions run in f32 (converted on the stream) unless
// MESHRT_NCCL_HALF_REDUCE=native.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace meshrt {

// "2.28.9"
std::string nccl_version_string();

// Wraps an NCCL communicator (an ncclComm_t passed as void*, so callers need no nccl.h) that the
// caller created on CUDA device `device` and keeps owning: rank and size come from NCCL; meshrt
// never destroys it, but aborts it (ncclCommAbort) on a timeout or abort(), after which the
// caller must not use it. Defined in CUDA builds only.
std::unique_ptr<Communicator> adopt_nccl_communicator(void* nccl_comm, int device,
                                                      const std::string& name, CommConfig config);

}  // namespace meshrt
