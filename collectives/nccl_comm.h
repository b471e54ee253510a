// NCCL backend: one rank per GPU; collectives on CUDA tensors enqueued on CUDA streams. Its
// communicators come from bootstrap() (backend "nccl"); collectives are watched by a background
// thread that polls ncclCommGetAsyncError and, on an error or a timeout, aborts every NCCL
// communicator of the process. bf16 / f16 reductions run in f32 (converted on the stream) unless
// MESHRT_NCCL_HALF_REDUCE=native.
#pragma once

#include <string>

namespace meshrt {

// "2.28.9"
std::string nccl_version_string();

}  // namespace meshrt
