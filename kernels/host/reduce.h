// Host row reductions written with independent partial sums so that they vectorize without
// -ffast-math (a plain `s += x[i]` loop is a serial dependency the compiler must keep).
#pragma once

#include <cstdint>

namespace meshrt::kernels::host {

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
