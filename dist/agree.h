// Agreement among the ranks of a world before they go on: small values reduced over the ranks, and
// an error one rank met, raised on every rank, so that no rank is left waiting in a collective a
// failed one never reaches (train/checkpoint.cpp's reads and writes, train's --metrics file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/context.h"

namespace meshrt {

// Collective over `world`: elementwise `op` of `v` over its ranks (small host vectors), on ctx's
// compute stream.
std::vector<int64_t> agree_values(Context& ctx, Communicator& world, const std::vector<int64_t>& v,
                                  ReduceOp op);

// Collective over `world`: when some rank's `err` is set (its error's message), throws
// AgreedError (runtime/error.h) on every rank after the same collectives, so the launch is not
// aborted as for a fault. The failing rank throws its own message; the others "<area>: rank N
// <what>: " and the lowest failing rank's message (its own "<area>: " dropped), so a rank that did
// not fail still says why. `area`: "checkpoint", or "" for none.
void agree_error(Context& ctx, Communicator& world, const std::string& err, const std::string& area,
                 const std::string& what);

}  // namespace meshrt
