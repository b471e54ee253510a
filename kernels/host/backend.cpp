// The host backend's op table, built once from each source file's register_* function.
#include "kernels/backend.h"

namespace meshrt::kernels::host {

const Backend& backend() {
  static const Backend be = [] {
    Backend b("host");
    register_gemm(b);
    register_elementwise(b);
    register_norm(b);
    register_softmax(b);
    register_attention(b);
    register_embedding(b);
    register_optim(b);
    return b;
  }();
  return be;
}

}  // namespace meshrt::kernels::host
