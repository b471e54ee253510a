// The overlap modes of the tp collectives: how CommScheduler (dist/parallel.h) places the compute
// waits. The blocks' description (model/block_desc.h) and the planner's cost model name them too.
#pragma once

#include <cstdint>
#include <string_view>

#include "meshrt/export.h"

namespace meshrt {

// How collectives overlap compute. None: the compute stream waits right after each collective.
// Async: collectives run on the tp stream and compute waits only where the result is needed
// (Megatron's backward: all-gather || dgrad GEMM, reduce-scatter || wgrad GEMM); a GEMM over a
// sequence all-gather (a colwise forward, a rowwise dgrad under sequence parallel) computes the
// rank's own shard's rows first, while the other shards are still in flight, and a GEMM before a
// sequence reduce-scatter (a rowwise forward) computes the rows the other ranks own first and
// sends them while its own rows compute. Chunked: the
// sequence all-gather before a colwise GEMM and the reduce-scatter after a rowwise GEMM are split
// into tp pieces so each GEMM piece starts as its input arrives (needs sequence parallel).
enum class Overlap : uint8_t { None, Async, Chunked };
MESHRT_API const char* overlap_name(Overlap o);  // "none", "async", "chunked"
MESHRT_API Overlap parse_overlap(std::string_view s);

}  // namespace meshrt
