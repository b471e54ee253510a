// The dtype dispatcher: one switch per call turning a DType into its storage type, so host and
// CUDA loops are templated and never branch on the dtype inside.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/half.h"

namespace meshrt {

// Calls f(T{}) with T the storage type of any dtype (float, bf16, f16, int32_t, int64_t,
// uint8_t).
template <class F>
void dispatch_any(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(bf16{});
      return;
    case DType::f16:
      f(f16{});
      return;
    case DType::i32:
      f(int32_t{});
      return;
    case DType::i64:
      f(int64_t{});
      return;
    case DType::u8:
      f(uint8_t{});
      return;
  }
  MESHRT_FAIL("unknown dtype code " << static_cast<int>(dt));
}

// Element i of a contiguous host buffer of dtype dt, as a double (Tensor::item, the collective
// checks of collectives/exact_values.h).
inline double load_as_double(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::bf16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::f16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(base)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

// Calls f(T{}) with T the storage type of a floating dtype (f32, bf16, f16).
template <class F>
void dispatch_float(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(bf16{});
      return;
    case DType::f16:
      f(f16{});
      return;
    default:
      break;
  }
  MESHRT_FAIL("dtype " << dtype_name(dt) << " is not a floating type (f32, bf16, f16)");
}

// Calls f(T{}) with T the storage type of an index dtype (i32, i64).
template <class F>
void dispatch_index(DType dt, F&& f) {
  switch (dt) {
    case DType::i32:
      f(int32_t{});
      return;
    case DType::i64:
      f(int64_t{});
      return;
    default:
      break;
  }
  MESHRT_FAIL("dtype " << dtype_name(dt) << " is not an index type (i32, i64)");
}

}  // namespace meshrt
