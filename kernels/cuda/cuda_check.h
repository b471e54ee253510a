// MESHRT_CUDA_CHECK / MESHRT_CUDA_CHECK_LAUNCH / MESHRT_CUBLAS_CHECK for the CUDA kernels.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "runtime/error.h"

// The runtime's CUDA backend defines the CUDA macros (one macro per return-code family in the
// whole project); they are defined here only when building against a runtime without them.
#if __has_include("runtime/cuda/cuda_check.h")
#include "runtime/cuda/cuda_check.h"
#endif

#ifndef MESHRT_CUDA_CHECK
#define MESHRT_CUDA_CHECK(expr)                                                      \
  do {                                                                               \
    const cudaError_t meshrt_cuda_err_ = (expr);                                     \
    if (meshrt_cuda_err_ != cudaSuccess) {                                           \
      (void)cudaGetLastError();                                                      \
      MESHRT_FAIL(#expr << " failed: " << cudaGetErrorName(meshrt_cuda_err_) << " (" \
                        << cudaGetErrorString(meshrt_cuda_err_) << ")");             \
    }                                                                                \
  } while (0)
#endif

#ifndef MESHRT_CUDA_CHECK_LAUNCH
#define MESHRT_CUDA_CHECK_LAUNCH(kernel)                                                      \
  do {                                                                                        \
    const cudaError_t meshrt_cuda_err_ = cudaGetLastError();                                  \
    if (meshrt_cuda_err_ != cudaSuccess) {                                                    \
      MESHRT_FAIL("launch of " << kernel << " failed: " << cudaGetErrorName(meshrt_cuda_err_) \
                               << " (" << cudaGetErrorString(meshrt_cuda_err_) << ")");       \
    }                                                                                         \
  } while (0)
#endif

// MESHRT_CUBLAS_CHECK(cublasLtMatmul(...)): cuBLAS / cuBLASLt status codes.
#define MESHRT_CUBLAS_CHECK(expr)                                                        \
  do {                                                                                   \
    const cublasStatus_t meshrt_cublas_st_ = (expr);                                     \
    if (meshrt_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                    \
      MESHRT_FAIL(#expr << " failed: " << cublasGetStatusName(meshrt_cublas_st_) << " (" \
                        << cublasGetStatusString(meshrt_cublas_st_) << ")");             \
    }                                                                                    \
  } while (0)
