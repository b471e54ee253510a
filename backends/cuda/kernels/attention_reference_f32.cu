// The reference attention kernels for f32 (one compile unit per dtype).
#include "backends/cuda/kernels/attention_reference.cuh"

namespace meshrt::kernels::cuda {
MESHRT_REFERENCE_ATTENTION(float);
}  // namespace meshrt::kernels::cuda
