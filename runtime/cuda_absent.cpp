// Built when meshrt is configured without CUDA: there is no CUDA backend (runtime/cuda_plugin.h).
#include "runtime/cuda_plugin.h"

namespace meshrt::detail {

const CudaPlugin* cuda_plugin(std::string* why) {
  if (why) *why = "meshrt was built without CUDA (configure with -DMESHRT_CUDA=ON)";
  return nullptr;
}

const CudaPlugin* cuda_plugin_if_loaded() { return nullptr; }

std::string cuda_plugin_origin() { return "not built"; }

}  // namespace meshrt::detail
