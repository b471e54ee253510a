// The host-side logic of picking a GEMM library algorithm: heuristic candidates filtered by their
// reported state, tried in order until one runs, and an error naming the problem when none does.
// Backend-neutral so that the CPU tests drive it with fake candidates
// (backends/cuda/kernels/gemm.cu uses it with cuBLASLt's). Defined in gemm_algos.cpp:
// host-compiled, away from nvcc's front end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/plugin_api.h"

namespace meshrt::kernels {

// One heuristic result: whether the library marked it usable, and its state's name if not.
struct AlgoCandidate {
  bool usable = false;
  std::string state;
};

// Indices of the usable candidates, in the heuristic's order of preference. Throws meshrt::Error
// naming `problem` and each candidate's state when none is usable.
MESHRT_PLUGIN_API std::vector<int> usable_algos(const std::vector<AlgoCandidate>& cands,
                                                const std::string& problem);

// Tries candidates order[first], order[first + 1], ... with try_algo(index), which returns "" when
// the algorithm ran and the library's status otherwise. Returns the position in `order` of the
// one that ran (the caller starts there next time). Throws meshrt::Error naming `problem` and each
// failure when none runs.
MESHRT_PLUGIN_API size_t run_with_fallback(const std::vector<int>& order, size_t first,
                                           const std::function<std::string(int)>& try_algo,
                                           const std::string& problem);

// cuBLASLt's bias epilogue reads the bias with 16-byte loads: a bias at a less aligned address is
// added by a separate kernel after the GEMM.
inline bool bias_in_epilogue(const void* bias) {
  return bias != nullptr && reinterpret_cast<uintptr_t>(bias) % 16 == 0;
}

// "m=.. n=.. k=.. batch=.. bf16 x bf16 -> f32 + bias bf16, A transposed" for error messages.
MESHRT_PLUGIN_API std::string gemm_problem_str(int64_t m, int64_t n, int64_t k, int64_t batch,
                                               bool trans_a, bool trans_b, const std::string& in,
                                               const std::string& out, const std::string& bias);

}  // namespace meshrt::kernels
