// The CUDA backend's op table, built once from each source file's register_* function.
#include "kernels/backend.h"

namespace meshrt::kernels::cuda {

const Backend& backend() {
  static const Backend be = [] {
    Backend b("cuda");
    MESHRT_KERNEL_FAMILIES(MESHRT_CALL_FAMILY)
    return b;
  }();
  return be;
}

}  // namespace meshrt::kernels::cuda
