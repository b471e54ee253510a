// Vendor baselines for the CUDA half of the GEMM bench (cuda_baseline.cu; CUDA builds only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/dtype.h"

namespace meshrt::bench {

// Median milliseconds of one plain cublasGemmEx (default algorithm, f32 compute) on `device`,
// row-major C[m, n] = A[m, k] B[k, n] (B [n, k] when trans_b), inputs and output of `dtype`.
double cublas_gemm_ms(int device, int64_t m, int64_t n, int64_t k, bool trans_b, DType dtype,
                      int warmup, int repeats);
// Median milliseconds of a device-to-device cudaMemcpyAsync of `bytes`.
double device_copy_ms(int device, size_t bytes, int warmup, int repeats);
// "NVIDIA H200, 132 SMs, 141 GiB"
std::string device_description(int device);

}  // namespace meshrt::bench
