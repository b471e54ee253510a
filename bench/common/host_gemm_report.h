// The host backend's f32 GEMM path choices (kernels/host/gemm_f32_path.h) as the benchmarks
// report them: JSON for --json, and lines for the text output.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

namespace meshrt::bench {

// {"mode": info line, "choices": [{m, n, k, trans_a, trans_b, path, forced, openblas_us,
// onednn_us}, ...]}: every tile shape this process has run so far.
nlohmann::json host_f32_gemm_json();
// One line per choice ("  1024x1024x1024 NN  onednn  (openblas 10.20 ms, onednn 9.50 ms)").
void print_host_f32_gemm(std::ostream& os);
// True under MESHRT_HOST_F32_GEMM=bf16 (f32 GEMMs, the calibration GEMM's too, allowed bf16
// products).
bool host_f32_gemm_bf16_products();

}  // namespace meshrt::bench
