// dtype dispatch: one switch per op call, then templated code (no dtype branches inside loops).
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__F16C__) && defined(__AVX__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/half.h"

namespace meshrt::kernels {

// Calls f(T{}) with T the storage type of a floating dtype.
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
  MESHRT_FAIL("kernels: dtype " << dtype_name(dt) << " is not a floating type");
}

// Calls f(T{}) with T the storage type of an index dtype (i32 / i64).
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
  MESHRT_FAIL("kernels: dtype " << dtype_name(dt) << " is not an index type");
}

// Calls f(T{}) for any dtype.
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
  MESHRT_FAIL("kernels: unknown dtype " << static_cast<int>(dt));
}

// Converts n elements to f32 (contiguous; vectorizes for f32 / bf16; f16 uses the F16C
// instruction when the loops are built for it, an exact conversion like the software one).
template <class T>
inline void load_row(const T* __restrict src, float* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__) && !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, f16>) {
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = load_f32(src, i);
}
template <class T>
inline void store_row(T* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_f32(dst, i, src[i]);
}

}  // namespace meshrt::kernels
