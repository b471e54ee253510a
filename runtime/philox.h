// Philox 4x32-10 counter-based RNG (Salmon et al. 2011) and the distributions built on it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/half.h"
#include "runtime/hd.h"

namespace meshrt {

struct Philox4 {
  uint32_t v[4];
};

MESHRT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 on counter `c` with 64-bit key `k`.
MESHRT_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c.v[0], &hi0, &lo0);
    philox_mulhilo(kM1, c.v[2], &hi1, &lo1);
    Philox4 n;
    n.v[0] = hi1 ^ c.v[1] ^ k0;
    n.v[1] = lo1;
    n.v[2] = hi0 ^ c.v[3] ^ k1;
    n.v[3] = lo0;
    c = n;
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Four random words for (seed, stream id, element index): the whole RNG contract of meshrt.
MESHRT_HD Philox4 philox_draw(uint64_t seed, uint64_t id, uint64_t index) {
  Philox4 c{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
             static_cast<uint32_t>(id), static_cast<uint32_t>(id >> 32)}};
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Correctly rounded float operations that the compiler may not contract into FMAs: host and
// device evaluate the same sequence of IEEE operations, so their results are bit-identical.
#if defined(__CUDA_ARCH__)
MESHRT_HD float rn_add(float a, float b) { return __fadd_rn(a, b); }
MESHRT_HD float rn_sub(float a, float b) { return __fsub_rn(a, b); }
MESHRT_HD float rn_mul(float a, float b) { return __fmul_rn(a, b); }
MESHRT_HD float rn_div(float a, float b) { return __fdiv_rn(a, b); }
MESHRT_HD float rn_sqrt(float a) { return __fsqrt_rn(a); }
#else
// Host code is compiled in ISO mode (-ffp-contract=off), so these stay separate operations.
MESHRT_HD float rn_add(float a, float b) { return a + b; }
MESHRT_HD float rn_sub(float a, float b) { return a - b; }
MESHRT_HD float rn_mul(float a, float b) { return a * b; }
MESHRT_HD float rn_div(float a, float b) { return a / b; }
MESHRT_HD float rn_sqrt(float a) { return std::sqrt(a); }
#endif

// Uniform in [0, 1) with 24 bits of randomness.
MESHRT_HD float philox_u01(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// ln(u) for u in (0, 1], from +, -, *, / only (libm's logf differs between host and device in
// the last bit): u = m 2^e with m in [1, 2), ln m = 2 atanh(s), s = (m - 1) / (m + 1) <= 1/3.
MESHRT_HD float philox_log(float u) {
  uint32_t b = f32_bits(u);
  int e = static_cast<int>((b >> 23) & 0xffu) - 127;
  float m = bits_f32((b & 0x7fffffu) | 0x3f800000u);
  float s = rn_div(rn_sub(m, 1.f), rn_add(m, 1.f));
  float s2 = rn_mul(s, s);
  float p = 1.f / 15.f;
  p = rn_add(rn_mul(p, s2), 1.f / 13.f);
  p = rn_add(rn_mul(p, s2), 1.f / 11.f);
  p = rn_add(rn_mul(p, s2), 1.f / 9.f);
  p = rn_add(rn_mul(p, s2), 1.f / 7.f);
  p = rn_add(rn_mul(p, s2), 1.f / 5.f);
  p = rn_add(rn_mul(p, s2), 1.f / 3.f);
  p = rn_add(rn_mul(p, s2), 1.f);
  float lnm = rn_mul(2.f, rn_mul(s, p));
  return rn_add(rn_mul(static_cast<float>(e), 0.693147180559945309f), lnm);
}

// cos(2 pi u) for u in [0, 1), from +, -, * only: x = 2 pi u - pi in [-pi, pi) and
// cos(2 pi u) = -cos(x), a Taylor polynomial in x^2 to the x^20 term.
MESHRT_HD float philox_cos2pi(float u) {
  float x = rn_sub(rn_mul(6.28318530717958647692f, u), 3.14159265358979323846f);
  float x2 = rn_mul(x, x);
  // Coefficients (-1)^k / (2k)! for k = 10 .. 0, Horner from the highest.
  const float k[11] = {4.1103176233121648e-19f,
                       -1.5619206968586225e-16f,
                       4.7794773323873853e-14f,
                       -1.1470745597729725e-11f,
                       2.0876756987868099e-09f,
                       -2.7557319223985893e-07f,
                       2.4801587301587302e-05f,
                       -1.3888888888888889e-03f,
                       4.1666666666666664e-02f,
                       -0.5f,
                       1.f};
  float p = k[0];
  for (int i = 1; i < 11; ++i) p = rn_add(rn_mul(p, x2), k[i]);
  return -p;
}

// Standard normal by Box-Muller from two words.
MESHRT_HD float philox_normal(uint32_t x0, uint32_t x1) {
  float u1 = (static_cast<float>(x0 >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = philox_u01(x1);
  return rn_mul(rn_sqrt(rn_mul(-2.0f, philox_log(u1))), philox_cos2pi(u2));
}

// The value an initialiser gives for one draw: uniform a + (b - a) u, or normal a + b z.
MESHRT_HD float philox_value(bool normal, float a, float b, Philox4 r) {
  return normal ? rn_add(a, rn_mul(b, philox_normal(r.v[0], r.v[1])))
                : rn_add(a, rn_mul(rn_sub(b, a), philox_u01(r.v[0])));
}

}  // namespace meshrt
