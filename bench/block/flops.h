// The table of device peaks that the block benchmark's MFU is measured against. (The model FLOP
// counts are the blocks' description's: layer_flops in model/block_desc.h.)
#pragma once

#include <cstdint>
#include <string>

#include "runtime/dtype.h"

namespace meshrt {

// Dense tensor-core (or FP32 for f32) peak of a known GPU in TFLOP/s for `dt`, matched by name
// ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", ...); 0 when the GPU is not in the table. f32 is the
// non-tensor-core FP32 rate (meshrt's f32 GEMMs do not use TF32 unless MESHRT_CUBLAS_TF32=1).
double gpu_peak_tflops(const std::string& device_name, DType dt, std::string* matched = nullptr);

}  // namespace meshrt
