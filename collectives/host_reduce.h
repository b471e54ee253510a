// Host reduction and copy loops used by the shared-memory and MPI communicators.
#pragma once

#include <cstdint>

#include "collectives/communicator.h"
#include "runtime/dtype.h"

namespace meshrt::detail {

// dst[i] = op over j = 0..nsrc-1 (in that order) of srcs[j][i], for i in [0, n). bf16 / f16 are
// read into f32, reduced in f32 and rounded once; integer sums wrap; avg divides the sum by
// `avg_divisor` (f32 division for floats, truncating division for integers); max / min propagate
// NaN. dst may be the same pointer as one of srcs; no other overlap is allowed.
void host_reduce(DType dt, ReduceOp op, const void* const* srcs, int nsrc, void* dst, int64_t n,
                 int avg_divisor);

// In-place avg finish for buffers that already hold sums: x[i] = x[i] / divisor.
void host_divide(DType dt, void* x, int64_t n, int divisor);

// f32 <-> 16-bit float conversions (for backends that reduce 16-bit floats in f32).
void host_to_f32(DType dt, const void* src, float* dst, int64_t n);
void host_from_f32(DType dt, const float* src, void* dst, int64_t n);

}  // namespace meshrt::detail
