#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/half.h"

using namespace meshrt;

namespace {

// Reference f32 -> bf16 by exhaustive neighbour comparison in double (round to nearest even).
uint16_t ref_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u = f32_bits(f);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dl = std::fabs(static_cast<double>(bf16_bits_to_f32(lo)) - f);
  double dh = std::fabs(static_cast<double>(bf16_bits_to_f32(hi)) - f);
  if ((hi & 0x7fffu) == 0x7f80u) {  // rounding up lands on Inf: compare with the next step
    dh = std::fabs(std::ldexp(1.0, 128) * (f < 0 ? -1 : 1) - f);
  }
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

}  // namespace

TEST_CASE("bf16 round trip of every bit pattern", "[dtype]") {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_bits_to_f32(static_cast<uint16_t>(b));
    uint16_t back = f32_to_bf16_bits(f);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(bf16_bits_to_f32(back)));
      REQUIRE((back & 0x8000u) == (b & 0x8000u));
    } else {
      REQUIRE(back == b);
    }
  }
}

TEST_CASE("f16 round trip of every bit pattern", "[dtype]") {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = f16_bits_to_f32(static_cast<uint16_t>(b));
    uint16_t back = f32_to_f16_bits(f);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(f16_bits_to_f32(back)));
    } else {
      REQUIRE(back == b);
    }
  }
}

TEST_CASE("f16 decode matches the IEEE definition", "[dtype]") {
  for (uint32_t b = 0; b < 65536; ++b) {
    uint32_t e = (b >> 10) & 31u, m = b & 1023u;
    double sign = (b & 0x8000u) ? -1.0 : 1.0;
    float f = f16_bits_to_f32(static_cast<uint16_t>(b));
    if (e == 31) {
      REQUIRE((m ? std::isnan(f) : std::isinf(f)));
      continue;
    }
    double ref = e == 0 ? sign * std::ldexp(static_cast<double>(m), -24)
                        : sign * std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
    REQUIRE(static_cast<double>(f) == ref);
  }
}

TEST_CASE("f32 -> bf16 / f16 round to nearest even", "[dtype]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = bits_f32(bits(rng));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_bf16_bits(f) == ref_bf16(f));
#if defined(__FLT16_MAX__)
    _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    INFO("f=" << f);
    REQUIRE(f32_to_f16_bits(f) == hb);
#endif
  }
#if defined(__FLT16_MAX__)
  // A sweep over the f32 bit patterns (every 4099th: each exponent, both signs, NaN payloads)
  // against the compiler's conversion; NaN keeps its sign and top payload bits, quiet.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    const float f = bits_f32(static_cast<uint32_t>(u));
    const uint16_t got = f32_to_f16_bits(f);
    if (std::isnan(f)) {
      const uint32_t ax = static_cast<uint32_t>(u) & 0x7fffffffu;
      REQUIRE(got == (((u >> 16) & 0x8000u) | 0x7e00u | ((ax >> 13) & 0x3ffu)));
      continue;
    }
    _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    INFO("bits=" << u);
    REQUIRE(got == hb);
  }
#endif
  // Ties: 1 + 2^-8 lies halfway between bf16 1 and 1+2^-7; ties go to the even mantissa (1).
  REQUIRE(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  REQUIRE(f32_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  // f16: 65504 is the largest finite; 65520 is the midpoint to 2^16 and rounds to Inf.
  REQUIRE(f32_to_f16_bits(65504.f) == 0x7bff);
  REQUIRE(f32_to_f16_bits(65519.f) == 0x7bff);
  REQUIRE(f32_to_f16_bits(65520.f) == 0x7c00);
  REQUIRE(f32_to_f16_bits(-1e10f) == 0xfc00);
  // Subnormals: 2^-24 is the smallest f16 subnormal; 2^-25 ties to zero, just above rounds up.
  REQUIRE(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);
  REQUIRE(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);
  REQUIRE(f32_to_f16_bits(std::ldexp(1.0f, -25) * 1.0001f) == 0x0001);
  REQUIRE(f32_to_f16_bits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: tie to even 2
  REQUIRE(f32_to_f16_bits(std::ldexp(1023.0f, -24)) == 0x03ff);
  REQUIRE(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  // Inf / NaN / signed zero / f32 denormals in bf16.
  const float inf = std::numeric_limits<float>::infinity();
  REQUIRE(f32_to_bf16_bits(inf) == 0x7f80);
  REQUIRE(f32_to_bf16_bits(-inf) == 0xff80);
  REQUIRE(f32_to_f16_bits(inf) == 0x7c00);
  REQUIRE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
  REQUIRE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(-std::nanf("")))));
  REQUIRE(f32_to_bf16_bits(-0.0f) == 0x8000);
  REQUIRE(f32_to_f16_bits(-0.0f) == 0x8000);
  float denorm = std::numeric_limits<float>::denorm_min() * 65536.f;  // exact in bf16
  REQUIRE(bf16_bits_to_f32(f32_to_bf16_bits(denorm)) == denorm);
  REQUIRE(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // overflows
}

TEST_CASE("dtype names parse and bad names are rejected", "[dtype]") {
  REQUIRE(parse_dtype("bf16") == DType::bf16);
  REQUIRE(parse_dtype("float32") == DType::f32);
  REQUIRE(dtype_size(DType::i64) == 8);
  REQUIRE(std::string(dtype_name(DType::f16)) == "f16");
  REQUIRE_THROWS_WITH(parse_dtype("f64"),
                      Catch::Contains("unknown dtype 'f64'") && Catch::Contains("f32, bf16, f16"));
}
