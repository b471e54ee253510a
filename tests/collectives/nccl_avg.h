// How NCCL averages: the reference the NCCL Avg tests compare with, and the tolerance they allow.
//
// NCCL computes a floating Avg as a sum of premultiplied inputs, sum_j fl(x_j * fl(1/n)), not as
// the correctly rounded sum / n that the host and MPI backends produce: for 3, 5, 6 or 7 ranks
// about half of the f32 elements differ. The NCCL tests therefore compare with the premultiplied
// sum (accumulated in f32 in rank order), allowing the rounding of the partial sums that NCCL
// adds in another order (its ring starts each chunk at a different rank; trees pair them up):
// (n - 1) f32 ulps of sum_j |fl(x_j / n)|, the bound on the difference between two summation
// orders. "Within one ulp of the result" is not enough: with cancellation ({8, -7, 0} over three
// ranks) the premultiplied sum is 3 ulps from sum / n, and another order may give 0 where rank
// order does not. bf16 / f16 results (meshrt reduces them in f32 and narrows once) also get one
// ulp of their own dtype. Integer Avg is the exact sum divided by n (NCCL divides after summing).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "coll_test_util.h"

namespace meshrt::test {

// fl(1/n) as NCCL computes it.
inline float premultiplier(size_t n) { return static_cast<float>(1.0 / static_cast<double>(n)); }

// fl(x_0 * s) + fl(x_1 * s) + ... accumulated in f32 in the order given, s = fl(1/n).
inline float premultiplied_avg(const std::vector<float>& xs) {
  const float s = premultiplier(xs.size());
  float acc = 0.f;
  for (float x : xs) acc += x * s;
  return acc;
}

// Spacing of doubles' f32 neighbours at |v| (the smallest subnormal step at 0).
inline double f32_ulp(double v) {
  if (v == 0.0) return std::ldexp(1.0, -149);
  int e = 0;
  (void)std::frexp(std::fabs(v), &e);
  return std::ldexp(1.0, std::max(e - 24, -149));
}

// Spacing of dt's values at |v| (f32, bf16 or f16).
inline double dtype_ulp(double v, DType dt) {
  if (dt == DType::f32) return f32_ulp(v);
  const int digits = dt == DType::bf16 ? 8 : 11;
  int e = 0;
  (void)std::frexp(v == 0.0 ? 1.0 : std::fabs(v), &e);
  double u = std::ldexp(1.0, e - digits);
  if (dt == DType::f16) u = std::max(u, std::ldexp(1.0, -24));  // f16 subnormal spacing
  return u;
}

// What an f32 premultiplied sum of xs may differ by between summation orders.
inline double premultiplied_tolerance(const std::vector<float>& xs) {
  const float s = premultiplier(xs.size());
  double mag = 0.0;
  for (float x : xs) mag += std::fabs(static_cast<double>(x * s));
  return static_cast<double>(xs.size() - 1) * f32_ulp(mag);
}

inline double round_to_dtype(float v, DType dt) {
  if (dt == DType::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  if (dt == DType::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  return v;
}

inline bool is_float_dtype(DType dt) {
  return dt == DType::f32 || dt == DType::bf16 || dt == DType::f16;
}

inline std::vector<float> pattern_column(uint64_t seed, int n, int64_t i) {
  std::vector<float> xs;
  for (int j = 0; j < n; ++j) xs.push_back(static_cast<float>(pattern(seed, j, i)));
  return xs;
}

// NCCL's Avg of pattern(seed, j, i) over ranks j = 0..n-1 in dtype dt, summed in rank order.
inline double nccl_avg_reference(DType dt, uint64_t seed, int n, int64_t i) {
  if (!is_float_dtype(dt)) return reduced(dt, ReduceOp::Avg, seed, n, i);
  return round_to_dtype(premultiplied_avg(pattern_column(seed, n, i)), dt);
}

// How far an NCCL Avg result may be from nccl_avg_reference (0 for integer dtypes).
inline double nccl_avg_tolerance(DType dt, uint64_t seed, int n, int64_t i) {
  if (!is_float_dtype(dt)) return 0.0;
  const double ref = nccl_avg_reference(dt, seed, n, i);
  const double f32_tol = premultiplied_tolerance(pattern_column(seed, n, i));
  return dt == DType::f32 ? f32_tol : f32_tol + dtype_ulp(ref, dt);
}

// Checks NCCL Avg results got[i] = element first + i (i < count) against nccl_avg_reference.
inline bool check_nccl_avg(Failures& f, const std::string& what, const Tensor& got, DType dt,
                           uint64_t seed, int n, int64_t first, int64_t count) {
  int bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double g = load(got.data_ptr(), got.dtype(), i);
    const double e = nccl_avg_reference(dt, seed, n, first + i);
    const double tol = nccl_avg_tolerance(dt, seed, n, first + i);
    if (std::fabs(g - e) <= tol) continue;  // NaN fails
    if (bad++ < 3) {
      std::ostringstream os;
      os.precision(9);
      os << what << ": element " << i << " = " << g << ", NCCL's premultiplied Avg " << e << " (+- "
         << tol << ")";
      f.add(os.str());
    }
  }
  return bad == 0;
}

}  // namespace meshrt::test
