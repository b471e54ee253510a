// GEMM tiles through oneDNN's matmul primitive. bf16: the AVX512-BF16 / AMX kernels PyTorch runs
// on the CPU, used by host/gemm.cpp when the build has oneDNN and the running CPU has bf16 dot
// product instructions. f16: oneDNN 3.x's AVX512-FP16 / AMX-FP16 kernels, when the build has
// oneDNN 3 and the CPU has them (oneDNN 2 has no f16 matmul on CPUs). Otherwise the 16-bit path
// converts panels to f32 for OpenBLAS sgemm. f32: one of the two f32 paths host/gemm_f32_path.h
// chooses between per tile shape. Builds against oneDNN 2.x (Debian's) or 3.x.
#pragma once

#include <cstdint>
#include <string>

namespace meshrt::kernels::host {

// One C tile: c[m, n] (row stride ldc) = alpha * op(A) op(B) + beta * c + bias, A / B bf16 (f16
// when f16, f32 when ab_f32) with op() applied to the stored layout (A [m, k] with row stride lda,
// or [k, m] when trans_a; same for B), accumulated in f32; c (and bias, length n, may be null)
// f32, or the inputs' 16-bit type when c16 (f32 when ab_f32).
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
  bool c16;
  const void* bias;
  float alpha, beta;
  bool ab_f32 = false;
  bool f16 = false;
  // ab_f32 only: oneDNN may round A and B to bf16 for the products (fpmath_mode::bf16, f32
  // accumulation; where it has such a kernel: dnnl_f32_bf16_impl()).
  bool bf16_math = false;
};

// True when this build links oneDNN.
bool dnnl_built();
// True when oneDNN runs with its AVX-512 kernels here (effective ISA avx512_core or above:
// ONEDNN_MAX_CPU_ISA honoured). Decided once per process; false without oneDNN.
bool dnnl_avx512();

// The implementation oneDNN picks for a dense 256^3 f32 matmul allowed bf16 products
// (DnnlTile::bf16_math) when it differs from the one it picks without ("brg:avx512_core_amx" on an
// AMX CPU), else "": oneDNN then keeps f32 arithmetic on this CPU (3.2 does so without AMX, even
// with AVX512-BF16). ONEDNN_MAX_CPU_ISA is honoured. Decided once per process; "" without oneDNN.
std::string dnnl_f32_bf16_impl();
// True when bf16 GEMMs go through oneDNN: built with it, the CPU (as oneDNN sees it, so
// ONEDNN_MAX_CPU_ISA is honoured) has bf16 dot products, and MESHRT_HOST_BF16_GEMM is not "f32".
// Decided once per process.
bool dnnl_bf16_gemm_enabled();
// True when f16 GEMMs go through oneDNN: built with oneDNN 3 or later, the CPU (as oneDNN sees
// it) has AVX512-FP16, and MESHRT_HOST_F16_GEMM is not "f32". Decided once per process.
bool dnnl_f16_gemm_enabled();
// Runs one tile on the calling thread (oneDNN's OpenMP team is kept at 1 thread per caller: the
// rank's pool does the parallelism, as for OpenBLAS) and returns true. k > 0. Returns false,
// running nothing, when oneDNN has only its reference implementation for this tile's shape and
// layout (oneDNN 3.2's f16 matmul takes it for a B or C with a row stride above n: 1000x slower),
// and the caller runs the tile its other way. Throws with the problem on failure (and in a build
// without oneDNN).
bool dnnl_tile(const DnnlTile& t);
// How many tiles dnnl_tile has declined in this process (its reference-implementation guard).
int64_t dnnl_reference_skips();
// "oneDNN 3.2.0 (CPU ISA avx512_core_amx)": the library and the ISA it runs at (ONEDNN_MAX_CPU_ISA
// honoured).
std::string dnnl_description();
// One line for `meshrt info`: which path bf16 and f16 GEMMs take on this machine and why.
std::string host_gemm_16bit_info();

}  // namespace meshrt::kernels::host
