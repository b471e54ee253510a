// GEMM tiles through oneDNN's matmul primitive. bf16: the AVX512-BF16 / AMX kernels PyTorch runs
// on the CPU, used by host/gemm.cpp when the build has oneDNN and the running CPU has bf16 dot
// product instructions (otherwise the 16-bit path converts panels to f32 for OpenBLAS sgemm).
// f32: one of the two f32 paths host/gemm_f32_path.h chooses between per tile shape.
#pragma once

#include <cstdint>
#include <string>

namespace meshrt::kernels::host {

// One C tile: c[m, n] (row stride ldc) = alpha * op(A) op(B) + beta * c + bias, A / B bf16 (or f32
// when ab_f32) with op() applied to the stored layout (A [m, k] with row stride lda, or [k, m] when
// trans_a; same for B), accumulated in f32; c (and bias, length n, may be null) f32 or bf16 as
// c_bf16 says (f32 when ab_f32).
struct DnnlTile {
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  bool trans_a;
  const void* b;
  int64_t ldb;
  bool trans_b;
  void* c;
  int64_t ldc;
  bool c_bf16;
  const void* bias;
  float alpha, beta;
  bool ab_f32 = false;
};

// True when this build links oneDNN.
bool dnnl_built();

// True when bf16 GEMMs go through oneDNN: built with it, the CPU (as oneDNN sees it, so
// ONEDNN_MAX_CPU_ISA is honoured) has bf16 dot products, and MESHRT_HOST_BF16_GEMM is not "f32".
// Decided once per process.
bool dnnl_bf16_gemm_enabled();
// Runs one tile on the calling thread (oneDNN's OpenMP team is kept at 1 thread per caller: the
// rank's pool does the parallelism, as for OpenBLAS). k > 0. Throws with the problem on failure
// (and in a build without oneDNN).
void dnnl_tile(const DnnlTile& t);
// "oneDNN 2.6.3 (CPU ISA avx2)": the library and the ISA it runs at (ONEDNN_MAX_CPU_ISA honoured).
std::string dnnl_description();
// One line for `meshrt info`: which path bf16 / f16 GEMMs take on this machine and why.
std::string host_gemm_16bit_info();

}  // namespace meshrt::kernels::host
