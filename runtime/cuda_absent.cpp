// Built when meshrt is configured without CUDA: there is no CUDA backend.
#include "runtime/backend.h"

namespace meshrt {

const DeviceBackend* cuda_backend() { return nullptr; }

}  // namespace meshrt

#include "runtime/ranges.h"

namespace meshrt::ranges::detail {

bool nvtx_built() { return false; }
void nvtx_push(const std::string&, uint64_t) {}
void nvtx_pop() {}

}  // namespace meshrt::ranges::detail
