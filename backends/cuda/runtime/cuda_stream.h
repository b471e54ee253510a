// CUDA streams and events (internal to backends/cuda/runtime): a cudaStream_t behind the Stream
// interface, with host work, cross-stream waits on host events and error propagation like host
// streams.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "runtime/stream.h"

namespace meshrt::cuda_detail {

// Wraps `stream` of cuda:`device`; destroys it with the Stream when `owned`.
std::unique_ptr<Stream> make_cuda_stream(int device, cudaStream_t stream, bool owned,
                                         std::string name);

}  // namespace meshrt::cuda_detail
