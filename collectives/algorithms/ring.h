// Ring all-gather, composed of send / recv: runs on every backend (collectives/algorithms/).
#pragma once

#include "collectives/algorithms/algorithm.h"

namespace meshrt::detail {

// In n - 1 steps each rank passes the block it got last to the next rank and receives the next
// block from the previous one (even ranks send first, odd ranks receive first, so that no two
// neighbours both wait in a send). Moves (n - 1) / n of the output per rank, on any transport.
extern const Algorithm ring_all_gather;

}  // namespace meshrt::detail
