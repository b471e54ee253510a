#include "bench/block/flops.h"

#include <array>
#include <cctype>

#include "runtime/error.h"

namespace meshrt {

const char* bench_block_kind_name(BenchBlockKind k) {
  switch (k) {
    case BenchBlockKind::Transformer:
      return "block";
    case BenchBlockKind::Mlp:
      return "mlp";
    case BenchBlockKind::Attention:
      return "attn";
  }
  return "?";
}

BenchBlockKind parse_bench_block_kind(const std::string& s) {
  if (s == "block" || s == "transformer") return BenchBlockKind::Transformer;
  if (s == "mlp") return BenchBlockKind::Mlp;
  if (s == "attn" || s == "attention") return BenchBlockKind::Attention;
  MESHRT_FAIL("unknown block kind '" << s << "': use block (attention + MLP), mlp or attn");
}

LayerFlops layer_flops(BenchBlockKind kind, int64_t batch, int64_t seq, int64_t hidden, int64_t ffn,
                       bool causal_halved) {
  const double B = static_cast<double>(batch), s = static_cast<double>(seq),
               h = static_cast<double>(hidden), f = static_cast<double>(ffn);
  LayerFlops r;
  if (kind != BenchBlockKind::Mlp) {
    r.qkv = 6 * B * s * h * h;
    r.attn_full = 4 * B * s * s * h;
    r.attn = causal_halved ? r.attn_full / 2 : r.attn_full;
    r.proj = 2 * B * s * h * h;
  }
  if (kind != BenchBlockKind::Attention) r.mlp = 4 * B * s * h * f;
  return r;
}

double step_flops(const LayerFlops& per_layer, int layers, bool fwd_only) {
  return per_layer.forward() * layers * (fwd_only ? 1.0 : 3.0);
}

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
