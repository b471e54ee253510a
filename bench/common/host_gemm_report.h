// The host backend's f32 GEMM path choices (kernels/host/gemm_f32_path.h) as the benchmarks
// report them: JSON for --json, and lines for the text output.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace meshrt::bench {

// {"mode": info line, "choices": [{m, n, k, trans_a, trans_b, path, forced}, ...]}: every tile
// shape this process has run so far.
nlohmann::json host_f32_gemm_json();
// One line per choice ("  512x1024x1024 NN  onednn (table)", "... (forced)").
void print_host_f32_gemm(std::ostream& os);
// What an f32 calibration GEMM's label adds under MESHRT_HOST_F32_GEMM=bf16 (whether this CPU's
// oneDNN took bf16 products); empty in the other modes.
std::string host_f32_gemm_calibration_note();

}  // namespace meshrt::bench
