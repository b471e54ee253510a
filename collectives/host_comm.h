// Host communicator: ranks are threads of one process that reduce and copy through shared memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "meshrt/export.h"

namespace meshrt {

// The communicators of `n` ranks that are threads of this process (`--devices cpu:N`); hand
// element i to the thread running rank i (device cpu:i). Collectives are bandwidth-optimal:
// all-reduce is a reduce-scatter in which each rank reduces its 1/n of every cache-sized chunk
// reading all peers' buffers in rank order (so every rank gets bit-identical results), followed
// by an all-gather of the reduced parts. Waiting ranks spin briefly, then sleep on a futex.
MESHRT_API std::vector<std::unique_ptr<Communicator>> make_host_communicators(
    int n, const std::string& name = "world", CommConfig config = CommConfig::from_env());

}  // namespace meshrt
