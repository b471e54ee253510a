// Model FLOP counts of the benchmarked blocks (the standard Megatron / PaLM formulas) and the
// table of device peaks that MFU is measured against.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/dtype.h"

namespace meshrt {

enum class BenchBlockKind : uint8_t { Transformer, Mlp, Attention };
const char* bench_block_kind_name(BenchBlockKind k);  // "block", "mlp", "attn"
// Parses block|transformer, mlp, attn|attention; throws listing the accepted names.
BenchBlockKind parse_bench_block_kind(const std::string& s);

// FLOPs of one layer's forward pass for `batch` sequences of `seq` tokens (all replicas: pass the
// global batch). Matrix multiplies only, 2 FLOPs per multiply-add; norms, GeLU, softmax and
// residual adds are not counted (they are a few percent and not "model FLOPs").
struct LayerFlops {
  double qkv = 0;        // 6 B s h^2: the fused QKV projection
  double attn = 0;       // 4 B s^2 h (QK^T and PV), halved under the causal mask when halved
  double attn_full = 0;  // the same without halving, for reference
  double proj = 0;       // 2 B s h^2: the attention output projection
  double mlp = 0;        // 4 B s h ffn: fc1 and fc2
  double forward() const { return qkv + attn + proj + mlp; }
};

// `causal_halved`: count the causal score / value GEMMs at half, which is what meshrt's fused
// attention kernels compute (host and CUDA both skip key tiles above the diagonal).
LayerFlops layer_flops(BenchBlockKind kind, int64_t batch, int64_t seq, int64_t hidden, int64_t ffn,
                       bool causal_halved = true);

// FLOPs of one training step: forward, plus 2x forward for backward (dgrad + wgrad) unless
// forward only.
double step_flops(const LayerFlops& per_layer, int layers, bool fwd_only);

// Dense tensor-core (or FP32 for f32) peak of a known GPU in TFLOP/s for `dt`, matched by name
// ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", ...); 0 when the GPU is not in the table. f32 is the
// non-tensor-core FP32 rate (meshrt's f32 GEMMs do not use TF32 unless MESHRT_CUBLAS_TF32=1).
double gpu_peak_tflops(const std::string& device_name, DType dt, std::string* matched = nullptr);

}  // namespace meshrt
