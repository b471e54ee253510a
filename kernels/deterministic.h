// --deterministic (docs/training.md#deterministic-training): what the kernels pin so that a
// result does not depend on the rank's thread count.
#pragma once

#include <cstdint>

#include "meshrt/export.h"
#include "runtime/context.h"

namespace meshrt::ops {

// With `on`, the host GEMMs of this context split their panels as for kDeterministicGemmThreads
// threads whatever the pool holds, so a result does not depend on the number of host threads
// (cores / local ranks, MESHRT_HOST_THREADS): OpenBLAS's Haswell kernels round a row differently
// by the panel's row count. No-op for CUDA contexts.
MESHRT_API void set_deterministic_gemm(Context& ctx, bool on);
constexpr int kDeterministicGemmThreads = 4;
// ... and each of those panels holds at least this many multiply-adds (2^24; the pool's own plan:
// 2^21): a grain's GEMMs are small (64 or 128 rows at the default --seq). With 2^23 the default
// `train --deterministic` step took 1.27x the CPU time of the run without the flag, with 2^24
// 1.05x (docs/training.md).
constexpr int64_t kDeterministicGemmMinFma = int64_t{1} << 24;

}  // namespace meshrt::ops

namespace meshrt::kernels::host {
// The thread count the host GEMM plans its panels for: the pool's, or kDeterministicGemmThreads
// under ops::set_deterministic_gemm.
int gemm_plan_threads(Context& ctx);
// Whether ops::set_deterministic_gemm is on for this context.
bool gemm_deterministic(Context& ctx);
}  // namespace meshrt::kernels::host
