// The CUDA backend's op table, bound once from the op table to this namespace's functions.
#include "kernels/backend.h"

namespace meshrt::kernels::cuda {

namespace {
// The ops the CUDA kernels leave out, per op the dtypes. An entry here
// (`case Op::foo: return kAnyDType;`) makes calls on CUDA tensors fail naming op, dtype and
// backend instead of the build failing to link. The context-parallel attention blocks are host
// only so far.
constexpr DTypeSet gaps(Op op) {
  switch (op) {
    case Op::attention_block_fwd:
    case Op::attention_block_bwd:
    case Op::attention_merge:
      return kAnyDType;
    default:
      return {};
  }
}
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
