// The reference attention kernels for bf16 (one compile unit per dtype).
#include "backends/cuda/kernels/attention_reference.cuh"

namespace meshrt::kernels::cuda {
MESHRT_REFERENCE_ATTENTION(bf16);
}  // namespace meshrt::kernels::cuda
