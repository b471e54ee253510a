// The flash attention kernels for bf16 (one compile unit per dtype).
#include "backends/cuda/kernels/flash_attention.cuh"

namespace meshrt::kernels::cuda {
MESHRT_FLASH_ATTENTION(bf16);
}  // namespace meshrt::kernels::cuda
