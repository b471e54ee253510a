// DType: element types of meshrt tensors (f32/bf16/f16 storage, f32 accumulation; i32/i64/u8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "meshrt/export.h"

namespace meshrt {

enum class DType : uint8_t { f32 = 0, bf16, f16, i32, i64, u8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

MESHRT_API const char* dtype_name(DType t);
// Parses "f32"/"float32"/"bf16"/"bfloat16"/"f16"/"float16"/"i32"/"i64"/"u8"; throws with the
// accepted names otherwise.
MESHRT_API DType parse_dtype(std::string_view s);

}  // namespace meshrt
