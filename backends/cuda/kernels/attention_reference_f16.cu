// The reference attention kernels for f16 (one compile unit per dtype).
#include "backends/cuda/kernels/attention_reference.cuh"

namespace meshrt::kernels::cuda {
MESHRT_REFERENCE_ATTENTION(f16);
}  // namespace meshrt::kernels::cuda
