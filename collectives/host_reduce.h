// Host reduction and copy loops used by the shared-memory and MPI communicators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "collectives/communicator.h"
#include "runtime/dtype.h"
#include "runtime/plugin_api.h"

namespace meshrt::detail {

// dst[i] = op over j = 0..nsrc-1 (in that order) of srcs[j][i], for i in [0, n). bf16 / f16 are
// read into f32, reduced in f32 and rounded once; integer sums wrap; avg divides the sum by
// `avg_divisor` (f32 division for floats, truncating division for integers); max / min propagate
// NaN. dst may be the same pointer as one of srcs; no other overlap is allowed.
void host_reduce(DType dt, ReduceOp op, const void* const* srcs, int nsrc, void* dst, int64_t n,
                 int avg_divisor);

// As host_reduce, but writes the result to each of the `ndst` destinations (the all-reduce's
// fused scatter: every rank's output receives the slice this rank reduced). Works block by block
// so the reduced block is computed once, in L1, and then stored `ndst` times. Destination j uses
// non-temporal stores when bit j of `streaming` is set (large out-of-place outputs: it saves the
// read-for-ownership); call host_store_fence() before publishing the results to other threads.
// A destination may equal the source of the same index; no other overlap is allowed.
void host_reduce_multi(DType dt, ReduceOp op, const void* const* srcs, int nsrc, void* const* dsts,
                       int ndst, int64_t n, int avg_divisor, uint64_t streaming);

// Orders earlier non-temporal stores before later stores (sfence on x86).
void host_store_fence();

// In-place avg finish for buffers that already hold sums: x[i] = x[i] / divisor.
MESHRT_PLUGIN_API void host_divide(DType dt, void* x, int64_t n, int divisor);

// f32 <-> 16-bit float conversions (for backends that reduce 16-bit floats in f32).
void host_to_f32(DType dt, const void* src, float* dst, int64_t n);
void host_from_f32(DType dt, const float* src, void* dst, int64_t n);

// Whether collectives reduce `dt` through f32 (bf16, f16) rather than in its own type.
// A spin-wait iteration's pause (the threads and shm backends' waits).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether a reduction writes an output of `bytes` with non-temporal stores: an out-of-place
// output is in no cache, so a large one skips its read-for-ownership; an in-place one was just
// read as input, so plain stores hit the cache (the threads and shm backends' all-reduce).
constexpr size_t kStreamingBytes = size_t{4} << 20;
inline bool stream_output(size_t bytes, bool in_place) {
  return !in_place && bytes >= kStreamingBytes;
}

inline bool is_half_float(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

// A reduction of 16-bit floats run in f32 by a backend that reduces f32 only: widens `n_in`
// elements of `in` into `wide_in`, calls reduce(wide_in, wide_out) (the backend's f32 reduction;
// for avg it must sum), divides by `avg_divisor` for avg, and narrows `n_out` results into `out`,
// rounding once. wide_in may equal wide_out (an in-place reduction).
MESHRT_PLUGIN_API void reduce_through_f32(
    DType dt, ReduceOp op, const void* in, int64_t n_in, void* out, int64_t n_out, int avg_divisor,
    float* wide_in, float* wide_out,
    const std::function<void(float* wide_in, float* wide_out)>& reduce);

}  // namespace meshrt::detail
