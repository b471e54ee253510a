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

// c ? a : b on bit patterns, written as masks: compilers keep it branch-free, so loops vectorize.
MESHRT_HD uint32_t select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

// f32 -> IEEE binary16 bits, round to nearest even, overflow to Inf, subnormals kept, NaN quiet
// with its sign and top payload bits. Branch-free (each case computed, one selected) so that the
// host loops converting f16 tensors vectorize.
MESHRT_HD uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  // Normal results: rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest
  // even (adding 0xfff plus the kept lowest bit carries exactly when rounding up).
  const uint32_t r = ax - 0x38000000u;
  const uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  // Subnormal results (2^-25 <= |f| < 2^-14): the 24-bit significand m is worth m * 2^(e - 150)
  // and the half subnormal unit is 2^-24, so drop 126 - e bits, rounding the same way. The shift
  // is clamped to 14..31, where the selected cases need 14..24.
  const uint32_t e = ax >> 23;
  const uint32_t drop = e >= 112u ? 14u : (e <= 95u ? 31u : 126u - e);
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t sub = (m + ((1u << (drop - 1u)) - 1u) + ((m >> drop) & 1u)) >> drop;
  uint32_t out = select_bits(ax < 0x38800000u, select_bits(ax < 0x33000000u, 0u, sub), normal);
  out = select_bits(ax >= 0x477ff000u, 0x7c00u, out);  // rounds to 65520 or more: Inf
  out = select_bits(ax > 0x7f800000u, 0x7e00u | ((ax >> 13) & 0x3ffu), out);
  return static_cast<uint16_t>(sign | out);
}

// IEEE binary16 bits -> f32, exact (subnormals included). Branch-free, as above.
MESHRT_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  // A subnormal is m * 2^-24: exact in f32 as a normal number.
  const float sub = static_cast<float>(static_cast<int32_t>(m)) * 5.9604644775390625e-08f;
  uint32_t bits = select_bits(e == 31u, 0x7f800000u | (m << 13), ((e + 112u) << 23) | (m << 13));
  bits = select_bits(e == 0u, f32_bits(sub), bits);
  return bits_f32(sign | bits);
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
