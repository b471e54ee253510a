#include "collectives/host_reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "runtime/error.h"
#include "runtime/half.h"

namespace meshrt::detail {

namespace {

// Elements per block: the accumulator stays in L1 while the sources stream through.
constexpr int64_t kBlock = 1024;

// Accumulator type and conversions per storage type.
template <class S>
struct Acc {
  using type = S;
  static type load(S v) { return v; }
  static S store(type v) { return v; }
};
template <>
struct Acc<bf16> {
  using type = float;
  static float load(bf16 v) { return bf16_bits_to_f32(v.bits); }
  static bf16 store(float v) { return bf16{f32_to_bf16_bits(v)}; }
};
template <>
struct Acc<f16> {
  using type = float;
  static float load(f16 v) { return f16_bits_to_f32(v.bits); }
  static f16 store(float v) { return f16{f32_to_f16_bits(v)}; }
};

template <class A>
inline A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    // Wrapping integer sum, as NCCL and MPI implementations do (signed overflow is UB in C++).
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class A>
inline A max_of(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    return (a > b || a != a) ? a : b;  // NaN wins
  } else {
    return a > b ? a : b;
  }
}

template <class A>
inline A min_of(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    return (a < b || a != a) ? a : b;
  } else {
    return a < b ? a : b;
  }
}

template <class S, ReduceOp kOp>
void reduce_typed(const void* const* srcs, int nsrc, void* dst, int64_t n, int avg_divisor) {
  using A = typename Acc<S>::type;
  alignas(64) A acc[kBlock];
  S* d = static_cast<S*>(dst);
  for (int64_t base = 0; base < n; base += kBlock) {
    const int64_t len = std::min(kBlock, n - base);
    const S* s0 = static_cast<const S*>(srcs[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = Acc<S>::load(s0[i]);
    for (int j = 1; j < nsrc; ++j) {
      const S* sj = static_cast<const S*>(srcs[j]) + base;
      if constexpr (kOp == ReduceOp::Sum || kOp == ReduceOp::Avg) {
        for (int64_t i = 0; i < len; ++i) acc[i] = add<A>(acc[i], Acc<S>::load(sj[i]));
      } else if constexpr (kOp == ReduceOp::Max) {
        for (int64_t i = 0; i < len; ++i) acc[i] = max_of<A>(acc[i], Acc<S>::load(sj[i]));
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] = min_of<A>(acc[i], Acc<S>::load(sj[i]));
      }
    }
    S* db = d + base;
    if constexpr (kOp == ReduceOp::Avg) {
      const A div = static_cast<A>(avg_divisor);
      for (int64_t i = 0; i < len; ++i) db[i] = Acc<S>::store(acc[i] / div);
    } else {
      for (int64_t i = 0; i < len; ++i) db[i] = Acc<S>::store(acc[i]);
    }
  }
}

// Two sources summed straight into dst (the common case on two ranks): one pass, no accumulator.
template <class S>
void sum2(const void* a, const void* b, void* dst, int64_t n) {
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  S* d = static_cast<S*>(dst);
  // dst may equal x or y exactly; element i is read before it is written, so this is safe.
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
}

template <class S>
void reduce_dispatch_op(ReduceOp op, const void* const* srcs, int nsrc, void* dst, int64_t n,
                        int avg_divisor) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_same_v<S, float>) {
        if (nsrc == 2) return sum2<float>(srcs[0], srcs[1], dst, n);
      }
      return reduce_typed<S, ReduceOp::Sum>(srcs, nsrc, dst, n, avg_divisor);
    case ReduceOp::Avg:
      return reduce_typed<S, ReduceOp::Avg>(srcs, nsrc, dst, n, avg_divisor);
    case ReduceOp::Max:
      return reduce_typed<S, ReduceOp::Max>(srcs, nsrc, dst, n, avg_divisor);
    case ReduceOp::Min:
      return reduce_typed<S, ReduceOp::Min>(srcs, nsrc, dst, n, avg_divisor);
  }
}

}  // namespace

void host_reduce(DType dt, ReduceOp op, const void* const* srcs, int nsrc, void* dst, int64_t n,
                 int avg_divisor) {
  if (n <= 0) return;
  MESHRT_CHECK(nsrc >= 1, "host_reduce: no sources");
  switch (dt) {
    case DType::f32:
      return reduce_dispatch_op<float>(op, srcs, nsrc, dst, n, avg_divisor);
    case DType::bf16:
      return reduce_dispatch_op<bf16>(op, srcs, nsrc, dst, n, avg_divisor);
    case DType::f16:
      return reduce_dispatch_op<f16>(op, srcs, nsrc, dst, n, avg_divisor);
    case DType::i32:
      return reduce_dispatch_op<int32_t>(op, srcs, nsrc, dst, n, avg_divisor);
    case DType::i64:
      return reduce_dispatch_op<int64_t>(op, srcs, nsrc, dst, n, avg_divisor);
    case DType::u8:
      break;
  }
  MESHRT_FAIL("host_reduce: dtype " << dtype_name(dt) << " cannot be reduced");
}

namespace {

template <class S>
void divide_typed(void* x, int64_t n, int divisor) {
  using A = typename Acc<S>::type;
  S* p = static_cast<S*>(x);
  const A div = static_cast<A>(divisor);
  for (int64_t i = 0; i < n; ++i) p[i] = Acc<S>::store(Acc<S>::load(p[i]) / div);
}

}  // namespace

void host_divide(DType dt, void* x, int64_t n, int divisor) {
  switch (dt) {
    case DType::f32:
      return divide_typed<float>(x, n, divisor);
    case DType::bf16:
      return divide_typed<bf16>(x, n, divisor);
    case DType::f16:
      return divide_typed<f16>(x, n, divisor);
    case DType::i32:
      return divide_typed<int32_t>(x, n, divisor);
    case DType::i64:
      return divide_typed<int64_t>(x, n, divisor);
    case DType::u8:
      break;
  }
  MESHRT_FAIL("host_divide: dtype " << dtype_name(dt) << " cannot be averaged");
}

void host_to_f32(DType dt, const void* src, float* dst, int64_t n) {
  if (dt == DType::bf16) {
    const bf16* s = static_cast<const bf16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(s[i].bits);
  } else if (dt == DType::f16) {
    const f16* s = static_cast<const f16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(s[i].bits);
  } else if (dt == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else {
    MESHRT_FAIL("host_to_f32: dtype " << dtype_name(dt) << " is not a float type");
  }
}

void host_from_f32(DType dt, const float* src, void* dst, int64_t n) {
  if (dt == DType::bf16) {
    bf16* d = static_cast<bf16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i].bits = f32_to_bf16_bits(src[i]);
  } else if (dt == DType::f16) {
    f16* d = static_cast<f16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i].bits = f32_to_f16_bits(src[i]);
  } else if (dt == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else {
    MESHRT_FAIL("host_from_f32: dtype " << dtype_name(dt) << " is not a float type");
  }
}

}  // namespace meshrt::detail
