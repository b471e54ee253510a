// The measurement behind the host kernels' "plain loops, no SIMD library" choice
// (bench/results/kernels-cpu.md): one thread, 2048 x 768 floats, medians of 9 timings in each of
// 5 alternating rounds, each figure also as a fraction of a memcpy timed in the same round.
//   - bf16 add with half.h's f32_to_bf16_bits (early return for NaN) vs a branch-free select:
//     GCC 12 vectorizes both under -fno-trapping-math (EXH=1 also checks the select is
//     bit-identical over all 2^32 floats);
//   - GPT-2 GeLU and exp: kmath's inline polynomials (what the kernels use) vs SLEEF 3.5.1
//     (Sleef_tanhf8_u35avx2 / Sleef_expf8_u10avx2) vs Highway 1.0.3 (hwy/contrib/math Tanh / Exp)
//     vs libm.
// Not part of the build (needs libsleef-dev and libhwy-dev); from the repository root:
//   g++ -std=c++20 -O3 -march=x86-64-v3 -fno-math-errno -fno-trapping-math -I. -o /tmp/sc
//       bench/gemm/kernels_simd_choice.cpp -lsleef -lhwy && /tmp/sc
#include <sleef.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/math.h"
using namespace meshrt;
namespace hn = hwy::HWY_NAMESPACE;

inline uint16_t bf16_new(float f) {
  uint32_t u = f32_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
const int64_t N = 2048 * 768;
template <class F>
double med(F f) {
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    auto a = std::chrono::steady_clock::now();
    f();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[4];
}
__attribute__((noinline)) void add_bf_old(const uint16_t* a, const uint16_t* b, uint16_t* o) {
  for (int64_t i = 0; i < N; ++i)
    o[i] = f32_to_bf16_bits(bf16_bits_to_f32(a[i]) + bf16_bits_to_f32(b[i]));
}
__attribute__((noinline)) void add_bf_new(const uint16_t* a, const uint16_t* b, uint16_t* o) {
  for (int64_t i = 0; i < N; ++i) o[i] = bf16_new(bf16_bits_to_f32(a[i]) + bf16_bits_to_f32(b[i]));
}
__attribute__((noinline)) void gelu_f32(const float* a, float* o) {
  for (int64_t i = 0; i < N; ++i) o[i] = kmath::gelu_tanh(a[i]);
}
__attribute__((noinline)) void gelu_sleef(const float* a, float* o) {
  for (int64_t i = 0; i < N; i += 8) {
    __m256 x = _mm256_loadu_ps(a + i);
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(kmath::kSqrt2OverPi),
                             _mm256_fmadd_ps(_mm256_set1_ps(kmath::kGeluCubic), x3, x));
    __m256 t = Sleef_tanhf8_u35avx2(u);
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                                          _mm256_add_ps(_mm256_set1_ps(1.f), t)));
  }
}
__attribute__((noinline)) void gelu_libm(const float* a, float* o) {
  for (int64_t i = 0; i < N; ++i) {
    float x = a[i];
    o[i] = 0.5f * x * (1.f + std::tanh(kmath::kSqrt2OverPi * (x + kmath::kGeluCubic * x * x * x)));
  }
}
__attribute__((noinline)) void exp_km(const float* a, float* o) {
  for (int64_t i = 0; i < N; ++i) o[i] = kmath::exp_f32(a[i]);
}
__attribute__((noinline)) void exp_sleef(const float* a, float* o) {
  for (int64_t i = 0; i < N; i += 8)
    _mm256_storeu_ps(o + i, Sleef_expf8_u10avx2(_mm256_loadu_ps(a + i)));
}
__attribute__((noinline)) void exp_hwy(const float* a, float* o) {
  const hn::ScalableTag<float> d;
  for (int64_t i = 0; i < N; i += hn::Lanes(d))
    hn::StoreU(hn::Exp(d, hn::LoadU(d, a + i)), d, o + i);
}
__attribute__((noinline)) void gelu_hwy(const float* a, float* o) {
  const hn::ScalableTag<float> d;
  const auto c = hn::Set(d, kmath::kSqrt2OverPi), k = hn::Set(d, kmath::kGeluCubic),
             h = hn::Set(d, 0.5f), one = hn::Set(d, 1.f);
  for (int64_t i = 0; i < N; i += hn::Lanes(d)) {
    auto x = hn::LoadU(d, a + i);
    auto u = hn::Mul(c, hn::MulAdd(k, hn::Mul(hn::Mul(x, x), x), x));
    auto t = hn::Tanh(d, u);
    hn::StoreU(hn::Mul(hn::Mul(h, x), hn::Add(one, t)), d, o + i);
  }
}
int main() {
  std::vector<float> a(N), b(N), o(N);
  std::vector<uint16_t> ab(N), bb(N), ob(N);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 2);
  for (int64_t i = 0; i < N; ++i) {
    a[i] = dist(rng);
    b[i] = dist(rng);
    ab[i] = bf16_new(a[i]);
    bb[i] = bf16_new(b[i]);
  }
  // exhaustive bit check of new conversion
  if (getenv("EXH")) {
    uint64_t bad = 0;
    for (uint64_t u = 0; u < (1ull << 32); ++u) {
      float f = bits_f32((uint32_t)u);
      bad += f32_to_bf16_bits(f) != bf16_new(f);
    }
    printf("bf16 mismatches: %llu\n", (unsigned long long)bad);
  }
  std::map<std::string, std::vector<double>> R;
  for (int rep = 0; rep < 5; ++rep) {
    double mf = 8.0 * N / med([&] { std::memcpy(o.data(), a.data(), N * 4); }) * 1e-9;
    double mb = 4.0 * N / med([&] { std::memcpy(ob.data(), ab.data(), N * 2); }) * 1e-9;
    auto add = [&](const char* nm, double bytes, double t, double ref) {
      R[nm].push_back(bytes / t * 1e-9);
      R[std::string(nm) + " /memcpy"].push_back(bytes / t * 1e-9 / ref);
    };
    R["memcpy f32"].push_back(mf);
    R["memcpy bf16"].push_back(mb);
    add("add bf16, branch (half.h)", 6.0 * N,
        med([&] { add_bf_old(ab.data(), bb.data(), ob.data()); }), mb);
    add("add bf16, select", 6.0 * N, med([&] { add_bf_new(ab.data(), bb.data(), ob.data()); }), mb);
    add("gelu f32 kmath inline", 8.0 * N, med([&] { gelu_f32(a.data(), o.data()); }), mf);
    add("gelu f32 SLEEF tanhf8_u35", 8.0 * N, med([&] { gelu_sleef(a.data(), o.data()); }), mf);
    add("gelu f32 Highway Tanh", 8.0 * N, med([&] { gelu_hwy(a.data(), o.data()); }), mf);
    add("gelu f32 libm tanhf", 8.0 * N, med([&] { gelu_libm(a.data(), o.data()); }), mf);
    add("exp f32 kmath inline", 8.0 * N, med([&] { exp_km(a.data(), o.data()); }), mf);
    add("exp f32 SLEEF expf8_u10", 8.0 * N, med([&] { exp_sleef(a.data(), o.data()); }), mf);
    add("exp f32 Highway Exp", 8.0 * N, med([&] { exp_hwy(a.data(), o.data()); }), mf);
  }
  for (auto& [k, v] : R) {
    std::sort(v.begin(), v.end());
    printf("%-36s %8.2f\n", k.c_str(), v[2]);
  }
}
