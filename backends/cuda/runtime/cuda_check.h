// MESHRT_CUDA_CHECK / MESHRT_CUDA_CHECK_LAUNCH: every CUDA runtime return code becomes a
// meshrt::Error naming the call, the error and where it happened (backend header, not public).
#pragma once

#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "runtime/error.h"

namespace meshrt::cuda_detail {

// "cudaErrorMemoryAllocation (out of memory)"
inline std::string cuda_error_text(cudaError_t err) {
  std::string s = cudaGetErrorName(err);
  s += " (";
  s += cudaGetErrorString(err);
  s += ")";
  return s;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
  // A failed runtime call also leaves its code as the thread's "last error"; clear it so the next
  // launch check does not blame an unrelated kernel (sticky errors stay, as they must).
  (void)cudaGetLastError();
  std::ostringstream os;
  os << what << " failed: " << cuda_error_text(err);
  ::meshrt::throw_error(file, line, os.str());
}

}  // namespace meshrt::cuda_detail

// MESHRT_CUDA_CHECK(cudaMalloc(&p, n)) -> "cudaMalloc(&p, n) failed: cudaErrorMemoryAllocation
// (out of memory) [file.cpp:42]"
#define MESHRT_CUDA_CHECK(expr)                                                             \
  do {                                                                                      \
    const cudaError_t meshrt_cuda_err_ = (expr);                                            \
    if (meshrt_cuda_err_ != cudaSuccess)                                                    \
      ::meshrt::cuda_detail::throw_cuda_error(meshrt_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch (<<<...>>> returns nothing): reports a bad configuration or a missing
// kernel image for this GPU. `kernel` names what was launched, e.g. "copy_strided<f32, bf16>".
#define MESHRT_CUDA_CHECK_LAUNCH(kernel)                                                       \
  do {                                                                                         \
    const cudaError_t meshrt_cuda_err_ = cudaGetLastError();                                   \
    if (meshrt_cuda_err_ != cudaSuccess) {                                                     \
      std::ostringstream meshrt_cuda_os_;                                                      \
      meshrt_cuda_os_ << "launch of " << kernel;                                               \
      ::meshrt::cuda_detail::throw_cuda_error(meshrt_cuda_err_, meshrt_cuda_os_.str().c_str(), \
                                              __FILE__, __LINE__);                             \
    }                                                                                          \
  } while (0)
