#include "collectives/host_reduce.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "runtime/error.h"
#include "runtime/half.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// Copies `bytes` from the (L1-resident) block to dst, with non-temporal stores if `nt`.
inline void emit(void* dst, const void* src, size_t bytes, bool nt) {
#if defined(__SSE2__)
  if (nt && bytes >= 64) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#else
  (void)nt;
#endif
  std::memcpy(dst, src, bytes);
}

template <class S, ReduceOp kOp>
void reduce_typed(const void* const* srcs, int nsrc, void* const* dsts, int ndst, int64_t n,
                  int avg_divisor, uint64_t streaming) {
  using A = typename Acc<S>::type;
  alignas(64) A acc[kBlock];
  alignas(64) S out[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    const int64_t len = std::min(kBlock, n - base);
    bool done = false;
    if constexpr (std::is_same_v<S, float> && kOp == ReduceOp::Sum) {
      if (nsrc == 2) {
        // Two ranks: one pass, no accumulator.
        const float* x = static_cast<const float*>(srcs[0]) + base;
        const float* y = static_cast<const float*>(srcs[1]) + base;
        for (int64_t i = 0; i < len; ++i) out[i] = x[i] + y[i];
        done = true;
      }
    }
    if (!done) {
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
      if constexpr (kOp == ReduceOp::Avg) {
        const A div = static_cast<A>(avg_divisor);
        for (int64_t i = 0; i < len; ++i) out[i] = Acc<S>::store(acc[i] / div);
      } else {
        for (int64_t i = 0; i < len; ++i) out[i] = Acc<S>::store(acc[i]);
      }
    }
    for (int d = 0; d < ndst; ++d) {
      emit(static_cast<S*>(dsts[d]) + base, out, static_cast<size_t>(len) * sizeof(S),
           d < 64 && ((streaming >> d) & 1u));
    }
  }
}

template <class S>
void reduce_dispatch_op(ReduceOp op, const void* const* srcs, int nsrc, void* const* dsts, int ndst,
                        int64_t n, int avg_divisor, uint64_t streaming) {
  switch (op) {
    case ReduceOp::Sum:
      return reduce_typed<S, ReduceOp::Sum>(srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case ReduceOp::Avg:
      return reduce_typed<S, ReduceOp::Avg>(srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case ReduceOp::Max:
      return reduce_typed<S, ReduceOp::Max>(srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case ReduceOp::Min:
      return reduce_typed<S, ReduceOp::Min>(srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
  }
}

}  // namespace

void host_reduce_multi(DType dt, ReduceOp op, const void* const* srcs, int nsrc, void* const* dsts,
                       int ndst, int64_t n, int avg_divisor, uint64_t streaming) {
  if (n <= 0 || ndst <= 0) return;
  MESHRT_CHECK(nsrc >= 1, "host_reduce: no sources");
  switch (dt) {
    case DType::f32:
      return reduce_dispatch_op<float>(op, srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case DType::bf16:
      return reduce_dispatch_op<bf16>(op, srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case DType::f16:
      return reduce_dispatch_op<f16>(op, srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case DType::i32:
      return reduce_dispatch_op<int32_t>(op, srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case DType::i64:
      return reduce_dispatch_op<int64_t>(op, srcs, nsrc, dsts, ndst, n, avg_divisor, streaming);
    case DType::u8:
      break;
  }
  MESHRT_FAIL("host_reduce: dtype " << dtype_name(dt) << " cannot be reduced");
}

void host_reduce(DType dt, ReduceOp op, const void* const* srcs, int nsrc, void* dst, int64_t n,
                 int avg_divisor) {
  void* dsts[1] = {dst};
  host_reduce_multi(dt, op, srcs, nsrc, dsts, 1, n, avg_divisor, 0);
}

void host_store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
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

void reduce_through_f32(DType dt, ReduceOp op, const void* in, int64_t n_in, void* out,
                        int64_t n_out, int avg_divisor, float* wide_in, float* wide_out,
                        const std::function<void(float* wide_in, float* wide_out)>& reduce) {
  host_to_f32(dt, in, wide_in, n_in);
  reduce(wide_in, wide_out);
  if (op == ReduceOp::Avg) host_divide(DType::f32, wide_out, n_out, avg_divisor);
  host_from_f32(dt, wide_out, out, n_out);
}

}  // namespace meshrt::detail
