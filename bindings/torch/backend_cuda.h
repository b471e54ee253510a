// The CUDA side of the "meshrt" torch backend: torch's current CUDA stream, as the cudaStream_t
// that meshrt_stream_wrap takes. Built with CUDA only when the torch in use has CUDA and meshrt
// was built with it (MESHRT_TORCH_CUDA); otherwise CUDA tensors are refused.
#pragma once

namespace meshrt_torch {

// Whether this module moves CUDA tensors (built with MESHRT_TORCH_CUDA).
bool cuda_built();
// torch's current CUDA stream on `device` (its cudaStream_t, as void*); nullptr without CUDA.
void* current_cuda_stream(int device);

}  // namespace meshrt_torch
