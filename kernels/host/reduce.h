// Host row helpers: f32 row loads / stores, and reductions written with independent partial sums
// so that they vectorize without -ffast-math (a plain `s += x[i]` loop is a serial dependency the
// compiler must keep).
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "runtime/half.h"

namespace meshrt::kernels::host {

// Converts n elements to f32 (contiguous; vectorizes for f32 / bf16; f16 uses the F16C
// instruction when the loops are built for it, an exact conversion like the software one).
template <class T>
inline void load_row(const T* __restrict src, float* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
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

inline float sum_f32(const float* __restrict x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  }
  float s = 0.f;
  for (; i < n; ++i) s += x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

inline float dot_f32(const float* __restrict x, const float* __restrict y, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * y[i + j];
  }
  float s = 0.f;
  for (; i < n; ++i) s += x[i] * y[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// sum((x - mu)^2)
inline float sum_sq_dev_f32(const float* __restrict x, float mu, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) {
      float d = x[i + j] - mu;
      acc[j] += d * d;
    }
  }
  float s = 0.f;
  for (; i < n; ++i) {
    float d = x[i] - mu;
    s += d * d;
  }
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

inline float max_f32(const float* __restrict x, int64_t n) {
  float acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = -__builtin_huge_valf();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  }
  float m = -__builtin_huge_valf();
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  for (int j = 0; j < 16; ++j) m = m > acc[j] ? m : acc[j];
  return m;
}

}  // namespace meshrt::kernels::host
