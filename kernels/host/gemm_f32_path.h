// The two f32 GEMM paths of the host backend, OpenBLAS sgemm and oneDNN's f32 matmul, and the
// choice between them per tile shape. OpenBLAS's speed is whatever kernels its core detection
// (or OPENBLAS_CORETYPE) picks; oneDNN dispatches on the ISA itself. MESHRT_HOST_F32_GEMM:
//   auto     (default) a fixed table, f32_auto_path(): oneDNN for tiles of at least 2^22
//            multiply-adds where oneDNN runs its AVX-512 kernels (dnnl_avx512()), OpenBLAS for
//            every other tile and in a build without oneDNN. Nothing is timed: the choice is a
//            function of the tile's shape and the CPU (as oneDNN sees it), so every process on
//            a machine makes the same one and the same command gives the same bits. (Measured
//            in bench/results/cpu-perf.md: oneDNN at or above OpenBLAS on AVX-512 Xeons and EPYCs,
//            up to 1.5x where OpenBLAS runs Haswell kernels there; the two level on AVX2 CPUs.)
//   openblas / onednn: that path for every shape (onednn is refused in a build without oneDNN);
//   bf16     oneDNN's f32 matmul for every shape, allowed to round A and B to bf16 for the
//            products (fpmath_mode::bf16: its AMX kernels, f32 accumulation and f32 in
//            and out): PyTorch's set_float32_matmul_precision("medium") on CPUs, the host's
//            counterpart of MESHRT_CUBLAS_TF32. Products carry bf16's 8-bit mantissa, so results
//            differ from f32 arithmetic around 1e-3 relative; opt-in only. Where oneDNN has no
//            such kernel (3.2: CPUs without AMX) it keeps f32 arithmetic (dnnl_f32_bf16_impl()).
//            Refused in a build without oneDNN.
// Used by host/gemm.cpp's f32 tiles; the choices are reported by `meshrt info` and the JSON of
// `bench gemm` / `bench block`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/host/gemm_dnnl.h"

namespace meshrt::kernels::host {

enum class F32Path { openblas, onednn, onednn_bf16 };
const char* f32_path_name(F32Path p);

// One shape's choice: the tile shape, the path, and whether MESHRT_HOST_F32_GEMM forced it.
struct F32Choice {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  F32Path path = F32Path::openblas;
  bool forced = false;
};

// auto's table: the path of an f32 tile of m x n x k multiply-adds, given whether oneDNN runs its
// AVX-512 kernels (dnnl_avx512(); false in a build without oneDNN). A pure function: no timing,
// no state.
F32Path f32_auto_path(int64_t m, int64_t n, int64_t k, bool onednn_avx512);
// Runs one f32 tile (a DnnlTile with ab_f32, no bias, k > 0) on the calling thread through the
// path chosen for its shape. Thread-safe.
void f32_tile(const DnnlTile& t);
// The same tile through the given path (tests compare the two).
void f32_tile_on(const DnnlTile& t, F32Path p);
// True under MESHRT_HOST_F32_GEMM=bf16: oneDNN takes bf16 products only for dense B and C rows
// (a column panel's row stride above n falls back to f32 arithmetic), so host/gemm.cpp splits
// these GEMMs into row panels.
bool f32_bf16_math();
// True when f32_bf16_math() and oneDNN has a bf16-product f32 matmul for this CPU (3.2: AMX);
// without one the mode's GEMMs run on oneDNN in f32 arithmetic.
bool f32_bf16_products();
// Every shape decided so far in this process, in first-use order (auto's small tiles, always
// OpenBLAS, are not recorded).
std::vector<F32Choice> f32_choices();
// One line for `meshrt info`: the mode, the libraries and what auto does.
std::string host_gemm_f32_info();

}  // namespace meshrt::kernels::host
