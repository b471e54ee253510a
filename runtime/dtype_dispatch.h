// dispatch_dtype: one switch per call turning a DType into its storage type (host and CUDA
// backends), so loops are templated and never branch on the dtype.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/half.h"

namespace meshrt {

template <class T>
struct Elem {
  using type = T;
};

// Calls f(Elem<T>{}) with T the storage type of `dt` (float, bf16, f16, int32_t, int64_t,
// uint8_t).
template <class F>
void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(Elem<float>{});
      return;
    case DType::bf16:
      f(Elem<bf16>{});
      return;
    case DType::f16:
      f(Elem<f16>{});
      return;
    case DType::i32:
      f(Elem<int32_t>{});
      return;
    case DType::i64:
      f(Elem<int64_t>{});
      return;
    case DType::u8:
      f(Elem<uint8_t>{});
      return;
  }
  MESHRT_FAIL("unknown dtype code " << static_cast<int>(dt));
}

}  // namespace meshrt
