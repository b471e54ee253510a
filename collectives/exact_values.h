// Inputs whose collective results are exact in every dtype, and the results they must give: the
// collective benchmark's #wrong check and the collective tests compare element by element.
#pragma once

#include <algorithm>
#include <cstdint>

#include "collectives/communicator.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/half.h"

namespace meshrt::exact {

// Small integers that depend on (seed, rank, index) only, v in [-8, 8]: exact in every dtype,
// and so are their sums over up to a few hundred ranks.
inline double pattern(uint64_t seed, int rank, int64_t i) {
  uint64_t h = static_cast<uint64_t>(i) * 7u + static_cast<uint64_t>(rank) * 13u + seed * 5u;
  return static_cast<double>(static_cast<int64_t>(h % 17u) - 8);
}

// Writes v into element i of a contiguous host buffer of dtype dt.
inline void store(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(static_cast<float>(v));
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
  }
}

// Element i of a contiguous host buffer of dtype dt, as a double.
inline double load(const void* p, DType dt, int64_t i) { return load_as_double(p, dt, i); }

// What a reduction `op` over ranks 0..n-1 of pattern(seed, j, i) must give, in dtype dt (avg:
// integer division for integers, one f32 division rounded to dt for floats).
inline double reduced(DType dt, ReduceOp op, uint64_t seed, int n, int64_t i) {
  double acc = pattern(seed, 0, i);
  for (int j = 1; j < n; ++j) {
    double v = pattern(seed, j, i);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
    if (op == ReduceOp::Max) acc = std::max(acc, v);
    if (op == ReduceOp::Min) acc = std::min(acc, v);
  }
  if (op != ReduceOp::Avg) return acc;
  if (dt == DType::i32 || dt == DType::i64)
    return static_cast<double>(static_cast<int64_t>(acc) / n);
  float q = static_cast<float>(acc) / static_cast<float>(n);
  if (dt == DType::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(q));
  if (dt == DType::f16) return f16_bits_to_f32(f32_to_f16_bits(q));
  return q;
}

}  // namespace meshrt::exact
