// MESHRT_CUBLAS_CHECK: every cuBLAS / cuBLASLt status code becomes a meshrt::Error naming the call
// and the status (the one definition for backends/cuda/kernels and the CUDA GEMM benchmark's
// baseline).
#pragma once

#include <cublas_api.h>

#include "runtime/error.h"

// MESHRT_CUBLAS_CHECK(cublasLtMatmul(...)) -> "cublasLtMatmul(...) failed:
// CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported) [gemm.cu:42]"
#define MESHRT_CUBLAS_CHECK(expr)                                                        \
  do {                                                                                   \
    const cublasStatus_t meshrt_cublas_st_ = (expr);                                     \
    if (meshrt_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                    \
      MESHRT_FAIL(#expr << " failed: " << cublasGetStatusName(meshrt_cublas_st_) << " (" \
                        << cublasGetStatusString(meshrt_cublas_st_) << ")");             \
    }                                                                                    \
  } while (0)
