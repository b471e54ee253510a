// The collective algorithm layer: which algorithm runs a collective, chosen from one table by op,
// message size and world (backend, ranks, nodes), with MESHRT_ALGO as the override.
//
// Transports move bytes: the host backend's slots (threads), the shm backend's segment, MPI,
// NCCL. An algorithm runs on top of one. Two kinds:
//  - an engine's own algorithm (eager, flat, one_step, staged, zero_copy, two_level, native, and
//    tcp's socket_ring, pairwise, binomial, ring_pipeline, linear) runs over its backend's
//    transport (threads and shm: a file of this folder written over the engine's transport
//    interface, host_transport.h / shm_transport.h; tcp: its sockets, in tcp_comm.cpp); the engine
//    asks its AlgoPlan which one to run and calls it;
//  - a composed algorithm (ring, ...) is one file of this folder that issues the collective as
//    calls of the communicator's own primitives (send / recv, all_to_all, all_gather, ...), so it
//    runs on every backend, NCCL included: the Communicator runs it instead of the backend.
// Adding one is a file and a row of table.cpp (docs/extending.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"

namespace meshrt {
struct CommCall;
}

namespace meshrt::detail {

// The world a communicator spans, as the table reads it.
struct AlgoWorld {
  std::string_view backend;  // "host", "shm", "mpi", "tcp", "hier", "nccl"
  int ranks = 1;
  int nodes = 1;
};

// A composed algorithm: issues the validated call `c` through `comm`'s own primitives on `stream`
// after `after`, and returns the event marking its end. Every rank runs it with the same call.
using ComposedRun = Event (*)(Communicator& comm, const CommCall& c, Stream& stream,
                              const EventList& after);

struct Algorithm {
  const char* name;     // "eager": what MESHRT_ALGO and `meshrt info` call it
  const char* summary;  // one line: what it does
  // Null for an engine's own algorithm; set for a composed one.
  ComposedRun run = nullptr;
  // The largest message (CommCall::bytes()) it can carry at all, or 0 for any: a forced
  // algorithm leaves larger messages to the table's default.
  int64_t capacity = 0;
};

// The engines' own algorithms (threads: eager.cpp, flat.cpp over host_transport.h; shm:
// one_step.cpp, staged.cpp, zero_copy.cpp over shm_transport.h; hier: two_level.cpp over the
// node's and the inter-node communicators; mpi and nccl are native).
namespace algos {
extern const Algorithm eager, flat, one_step, staged, zero_copy, two_level, native;
// tcp (tcp_comm.cpp, over its sockets): socket_ring (all-reduce, all-gather, reduce-scatter),
// pairwise (all-to-all), binomial, ring_pipeline and linear (broadcast).
extern const Algorithm socket_ring, pairwise, binomial, ring_pipeline, linear;
}  // namespace algos

constexpr int64_t kAnySize = INT64_MAX;

// One row of the table: `algorithm` runs `ops` on `backend` ("*": every backend). The first row
// of a (backend, op) whose limit holds is the default choice; every row's algorithm may also be
// forced with MESHRT_ALGO.
struct AlgoRow {
  const char* backend;
  uint32_t ops;  // a mask of 1 << CommOp
  const Algorithm* algorithm;
  int64_t up_to = kAnySize;  // default for messages of at most this many bytes
  bool per_rank = false;     // the limit is on bytes x ranks (the sum over the ranks)
  int min_nodes = 1;         // default only on worlds of at least this many nodes
  bool forced_only = false;  // never the default: only MESHRT_ALGO chooses it
};

constexpr uint32_t op_bit(CommOp op) { return uint32_t{1} << static_cast<unsigned>(op); }
// all_reduce, all_gather, reduce_scatter, broadcast, all_to_all: the ops the table chooses for.
constexpr uint32_t kTableOps = op_bit(CommOp::AllReduce) | op_bit(CommOp::AllGather) |
                               op_bit(CommOp::ReduceScatter) | op_bit(CommOp::Broadcast) |
                               op_bit(CommOp::AllToAll);

// The table (collectives/algorithms/table.cpp).
const std::vector<AlgoRow>& algo_table();

// MESHRT_ALGO, parsed: per op, the algorithm forced (null: the table's choice). Throws
// meshrt::Error naming the variable, the value and the accepted names.
struct AlgoOverride {
  const Algorithm* forced[static_cast<int>(CommOp::Split) + 1] = {};
};
AlgoOverride parse_algo_override(std::string_view spec);

// One communicator's choices, resolved once when it is made: pick() is a scan of at most a few
// entries per call.
class AlgoPlan {
 public:
  AlgoPlan(const AlgoWorld& world, std::string_view override_spec);
  // The algorithm for a call of `op` carrying `bytes` (CommCall::bytes()).
  const Algorithm* pick(CommOp op, int64_t bytes) const {
    for (const Choice& c : choices_[static_cast<size_t>(op)])
      if (bytes <= c.up_to) return c.algorithm;
    return &algos::native;  // an op the table has no row for (send, recv, barrier)
  }
  // Whether any choice of `op` is a composed algorithm (the Communicator runs those).
  bool composed(CommOp op) const { return (composed_ops_ & op_bit(op)) != 0; }
  bool any_composed() const { return composed_ops_ != 0; }

 private:
  struct Choice {
    int64_t up_to;
    const Algorithm* algorithm;
  };
  std::vector<Choice> choices_[static_cast<int>(CommOp::Split) + 1];
  uint32_t composed_ops_ = 0;
};

// The algorithms of `op` on `backend` (every row's, in table order, without repeats).
std::vector<const Algorithm*> algorithms_of(std::string_view backend, CommOp op);

// `meshrt info`'s table for `world`: one row per op, one column per message size (8 B, 4 KiB,
// 256 KiB, 64 MiB), each cell the algorithm chosen; one line when every cell is the same.
std::string algo_table_text(const AlgoWorld& world, std::string_view override_spec);

}  // namespace meshrt::detail
