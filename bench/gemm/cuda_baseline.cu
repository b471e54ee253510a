// Plain cuBLAS GEMM and device copies: the yardsticks the CUDA GEMM bench compares against.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "backends/cuda/kernels/cublas_check.h"
#include "backends/cuda/runtime/cuda_check.h"
#include "backends/cuda/runtime/device_guard.h"
#include "bench/common/stats.h"
#include "bench/gemm/cuda_baseline.h"
#include "runtime/error.h"

namespace meshrt::bench {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

using cuda_detail::DeviceGuard;

// Times `fn` (enqueued on st) with CUDA events: median milliseconds over `repeats`.
template <class F>
double time_ms(cudaStream_t st, int warmup, int repeats, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  MESHRT_CUDA_CHECK(cudaEventCreate(&a));
  MESHRT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    MESHRT_CUDA_CHECK(cudaEventRecord(a, st));
    fn();
    MESHRT_CUDA_CHECK(cudaEventRecord(b, st));
    MESHRT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0.f;
    MESHRT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return median(ms);
}

}  // namespace

double cublas_gemm_ms(int device, int64_t m, int64_t n, int64_t k, bool trans_b, DType dtype,
                      int warmup, int repeats) {
  DeviceGuard scope(device);
  const size_t es = dtype_size(dtype);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  MESHRT_CUDA_CHECK(cudaMalloc(&a, static_cast<size_t>(m * k) * es));
  MESHRT_CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(k * n) * es));
  MESHRT_CUDA_CHECK(cudaMalloc(&c, static_cast<size_t>(m * n) * es));
  MESHRT_CUDA_CHECK(cudaMemset(a, 0, static_cast<size_t>(m * k) * es));
  MESHRT_CUDA_CHECK(cudaMemset(b, 0, static_cast<size_t>(k * n) * es));
  cudaStream_t st;
  MESHRT_CUDA_CHECK(cudaStreamCreate(&st));
  cublasHandle_t h;
  MESHRT_CUBLAS_CHECK(cublasCreate(&h));
  MESHRT_CUBLAS_CHECK(cublasSetStream(h, st));
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t t = cuda_type(dtype);
  // Row-major C = A B is column-major C^T = B^T A^T.
  auto run = [&] {
    MESHRT_CUBLAS_CHECK(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                                     static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                     &alpha, b, t, static_cast<int>(trans_b ? k : n), a, t,
                                     static_cast<int>(k), &beta, c, t, static_cast<int>(n),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  double ms = time_ms(st, warmup, repeats, run);
  (void)cublasDestroy(h);
  (void)cudaStreamDestroy(st);
  (void)cudaFree(a);
  (void)cudaFree(b);
  (void)cudaFree(c);
  return ms;
}

double device_copy_ms(int device, size_t bytes, int warmup, int repeats) {
  DeviceGuard scope(device);
  void *src = nullptr, *dst = nullptr;
  MESHRT_CUDA_CHECK(cudaMalloc(&src, bytes));
  MESHRT_CUDA_CHECK(cudaMalloc(&dst, bytes));
  cudaStream_t st;
  MESHRT_CUDA_CHECK(cudaStreamCreate(&st));
  double ms = time_ms(st, warmup, repeats, [&] {
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  });
  (void)cudaStreamDestroy(st);
  (void)cudaFree(src);
  (void)cudaFree(dst);
  return ms;
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  MESHRT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return std::string(p.name) + ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB";
}

}  // namespace meshrt::bench
