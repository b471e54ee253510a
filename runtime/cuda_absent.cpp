// Built when meshrt is configured without CUDA: there is no CUDA backend.
#include "runtime/backend.h"

namespace meshrt {

const DeviceBackend* cuda_backend() { return nullptr; }

}  // namespace meshrt
