// Host row helpers: f32 row loads / stores, and reductions written with independent partial sums
// so that they vectorize without -ffast-math (a plain `s += x[i]` loop is a serial dependency the
// compiler must keep). Included by the loop files only (kernels/host/isa.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/half.h"

// The avx2 and avx512 variants of the loop files convert f16 rows with F16C's vcvtph2ps /
// vcvtps2ph (8 elements an instruction; the portable conversion is ~20 vector instructions).
#if defined(MESHRT_HOST_ISA_VARIANT) && MESHRT_HOST_ISA_VARIANT >= 1 && \
    (defined(__x86_64__) || defined(__i386__))
#define MESHRT_ROW_F16C 1
#include <immintrin.h>
#else
#define MESHRT_ROW_F16C 0
#endif

namespace meshrt::kernels::host {

// Internal linkage: the row helpers differ between the variants' builds of a loop file, so no
// variant may take another's out-of-line copy (isa.h: no symbol is shared across ISAs).
namespace {

#if MESHRT_ROW_F16C
// The first n - n % 8 elements; exact, as f16_bits_to_f32 / f32_to_f16_bits (round to nearest
// even whatever MXCSR says; NaNs keep sign and top payload bits and become quiet).
__attribute__((target("avx,f16c"))) inline int64_t f16c_load(const f16* src, float* dst,
                                                             int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  return i;
}
__attribute__((target("avx,f16c"))) inline int64_t f16c_store(f16* dst, const float* src,
                                                              int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}
#endif

// Converts n elements to f32 (contiguous; vectorizes for f32 / bf16, F16C for f16 where built).
template <class T>
inline void load_row(const T* __restrict src, float* __restrict dst, int64_t n) {
  int64_t i = 0;
#if MESHRT_ROW_F16C
  if constexpr (std::is_same_v<T, f16>) i = f16c_load(src, dst, n);
#endif
  for (; i < n; ++i) dst[i] = load_f32(src, i);
}
template <class T>
inline void store_row(T* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
#if MESHRT_ROW_F16C
  if constexpr (std::is_same_v<T, f16>) i = f16c_store(dst, src, n);
#endif
  for (; i < n; ++i) store_f32(dst, i, src[i]);
}

// Views of a loop's rows, so that one loop body (load_f32 / store_f32 on the view) serves every
// storage type at its fastest: where F16C is built, an f16 row is converted into `buf` (n floats)
// with it and the loop runs on f32; f32 and bf16 rows (a bf16 conversion is a shift that fuses into
// the loop's vector code) and f16 without F16C are used in place. Elementwise loops may read and
// write the same view: they read x[j] before writing y[j].
template <class T>
using row_view_t = std::conditional_t<MESHRT_ROW_F16C && std::is_same_v<T, f16>, float, T>;

template <class T>
inline const row_view_t<T>* row_in(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<row_view_t<T>, T>) {
    (void)buf;
    (void)n;
    return src;
  } else {
    load_row(src, buf, n);
    return buf;
  }
}
template <class T>
inline row_view_t<T>* row_out(T* dst, float* buf) {
  if constexpr (std::is_same_v<row_view_t<T>, T>) {
    (void)buf;
    return dst;
  } else {
    (void)dst;
    return buf;
  }
}
// Writes row_out's buffer back (nothing to do for a row used in place).
template <class T>
inline void row_commit(T* dst, const row_view_t<T>* out, int64_t n) {
  if constexpr (!std::is_same_v<row_view_t<T>, T>) store_row(dst, out, n);
}

}  // namespace

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
