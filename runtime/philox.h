// Philox 4x32-10 counter-based RNG (Salmon et al. 2011) and the distributions built on it.
#pragma once

#include <cmath>
#include <cstdint>

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

// Uniform in [0, 1) with 24 bits of randomness.
MESHRT_HD float philox_u01(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Standard normal by Box-Muller from two words.
MESHRT_HD float philox_normal(uint32_t x0, uint32_t x1) {
  float u1 = (static_cast<float>(x0 >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = philox_u01(x1);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace meshrt
