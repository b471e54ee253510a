// torch's current CUDA stream for the "meshrt" backend (see backend_cuda.h).
#include "backend_cuda.h"

#if defined(MESHRT_TORCH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace meshrt_torch {

#if defined(MESHRT_TORCH_CUDA)
bool cuda_built() { return true; }
void* current_cuda_stream(int device) {
  return static_cast<void*>(
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
}
#else
bool cuda_built() { return false; }
void* current_cuda_stream(int) { return nullptr; }
#endif

}  // namespace meshrt_torch
