// The GEMM library's version, part of the CUDA backend's table (runtime/cuda_plugin.h); defined in
// gemm.cu. The core reaches it only through that table (ops::gemm_library_version).
#pragma once

#include <string>

namespace meshrt::kernels::cuda {

// "cuBLASLt 13.1.0" (cublasLtGetVersion: a library call, no GPU needed).
std::string gemm_library_version();

}  // namespace meshrt::kernels::cuda
