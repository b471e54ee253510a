// bf16 / f16 <-> f32 conversions (round to nearest even; NaN, Inf, denormals), host and device.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime/hd.h"

namespace meshrt {

MESHRT_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MESHRT_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN with its sign.
MESHRT_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

MESHRT_HD float bf16_bits_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// f32 -> IEEE binary16 bits, round to nearest even, overflow to Inf, subnormals kept.
MESHRT_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (ax < 0x38800000u) {                                               // below 2^-14: subnormal
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);           // below 2^-25: zero
    uint32_t e = ax >> 23;                                              // 102..112
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t drop = 126u - e;  // value = m * 2^(e-150); the half subnormal unit is 2^-24
    uint32_t q = m >> drop;
    uint32_t rem = m & ((1u << drop) - 1u);
    uint32_t halfway = 1u << (drop - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t q = r >> 13;
  uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
  return static_cast<uint16_t>(sign | q);
}

MESHRT_HD float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    // subnormal: m * 2^-24
    float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// Storage types: 16-bit payloads with explicit conversion (no implicit arithmetic on purpose).
struct bf16 {
  uint16_t bits;
  MESHRT_HD static bf16 from_float(float f) { return bf16{f32_to_bf16_bits(f)}; }
  MESHRT_HD float to_float() const { return bf16_bits_to_f32(bits); }
};
struct f16 {
  uint16_t bits;
  MESHRT_HD static f16 from_float(float f) { return f16{f32_to_f16_bits(f)}; }
  MESHRT_HD float to_float() const { return f16_bits_to_f32(bits); }
};

// The one element conversion between storage types (copies, fills, casts; host and CUDA): 16-bit
// floats go through f32 (round to nearest even), everything else is a static_cast.
template <class D, class S>
MESHRT_HD D convert_elem(S v) {
  constexpr bool kHalfS = std::is_same_v<S, bf16> || std::is_same_v<S, f16>;
  constexpr bool kHalfD = std::is_same_v<D, bf16> || std::is_same_v<D, f16>;
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (kHalfS) {
    return convert_elem<D>(v.to_float());
  } else if constexpr (kHalfD) {
    return D::from_float(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// Loads/stores an element of storage type T as float: how kernels read and write their tensors
// (math is done in f32).
template <class T>
MESHRT_HD float load_f32(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 2) {
    return p[i].to_float();
  } else {
    return static_cast<float>(p[i]);
  }
}
template <class T>
MESHRT_HD void store_f32(T* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 2) {
    p[i] = T::from_float(v);
  } else {
    p[i] = static_cast<T>(v);
  }
}

}  // namespace meshrt
