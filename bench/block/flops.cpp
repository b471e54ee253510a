#include "bench/block/flops.h"

#include <array>
#include <cctype>

#include "runtime/error.h"

namespace meshrt {

namespace {

struct GpuPeak {
  const char* pattern;  // matched as a whole word in the device name
  double half;          // bf16 / f16 dense tensor-core TFLOP/s (0: no bf16)
  double bf16;
  double f32;  // FP32 (CUDA cores)
};

// Vendor datasheet figures, dense (no structured sparsity). More specific names first.
constexpr std::array<GpuPeak, 18> kGpus{{
    {"H200 NVL", 835, 835, 60},
    {"H200", 989.4, 989.4, 66.9},
    {"GH200", 989.4, 989.4, 66.9},
    {"H100 PCIe", 756, 756, 51.2},
    {"H100 NVL", 835, 835, 60},
    {"H100", 989.4, 989.4, 66.9},
    {"H800", 989.4, 989.4, 66.9},
    {"B200", 2250, 2250, 80},
    {"B100", 1750, 1750, 60},
    {"A100", 312, 312, 19.5},
    {"A800", 312, 312, 19.5},
    {"L40S", 362, 362, 91.6},
    {"L40", 181, 181, 90.5},
    {"L4", 121, 121, 30.3},
    {"A10", 125, 125, 31.2},
    {"V100", 125, 0, 15.7},
    {"RTX 4090", 165.2, 165.2, 82.6},
    {"RTX 3090", 71, 71, 35.6},
}};

bool word_match(const std::string& name, const std::string& pat) {
  for (size_t pos = name.find(pat); pos != std::string::npos; pos = name.find(pat, pos + 1)) {
    const bool left = pos == 0 || !std::isalnum(static_cast<unsigned char>(name[pos - 1]));
    const size_t end = pos + pat.size();
    const bool right = end == name.size() || !std::isalnum(static_cast<unsigned char>(name[end]));
    if (left && right) return true;
  }
  return false;
}

}  // namespace

double gpu_peak_tflops(const std::string& device_name, DType dt, std::string* matched) {
  for (const GpuPeak& g : kGpus) {
    if (!word_match(device_name, g.pattern)) continue;
    if (matched) *matched = g.pattern;
    switch (dt) {
      case DType::bf16:
        return g.bf16;
      case DType::f16:
        return g.half;
      default:
        return g.f32;
    }
  }
  if (matched) matched->clear();
  return 0;
}

}  // namespace meshrt
