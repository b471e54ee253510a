// The CUDA backend's op table, bound once from the op table to this namespace's functions.
#include "kernels/backend.h"

namespace meshrt::kernels::cuda {

namespace {
// The ops the CUDA kernels leave out, per op the dtypes. An entry here
// (`case Op::foo: return kAnyDType;`) makes calls on CUDA tensors fail naming op, dtype and
// backend instead of the build failing to link. None today.
constexpr DTypeSet gaps(Op) { return {}; }
}  // namespace

const OpTable& backend() {
  static const OpTable be = [] {
    OpTable b("cuda");
    MESHRT_BIND_BACKEND_OPS
    return b;
  }();
  return be;
}

}  // namespace meshrt::kernels::cuda
