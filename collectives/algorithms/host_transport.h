// The threads backend's transport as its own algorithms see it (collectives/host_comm.cpp
// implements it over the group's slots), and those algorithms: eager (eager.cpp) and flat
// (flat.cpp). Ranks are threads of one process, so a rank reads and writes its peers' buffers
// directly once they published them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/ordered_comm.h"

namespace meshrt::detail {

// Bytes of each slot's eager buffers (two per rank, by the collective's parity): the eager
// algorithm's capacity (collectives/algorithms/table.cpp) must fit them.
constexpr size_t kHostEagerBytes = 4096;

class HostTransport {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Publishes this rank's call (`in`, `out`), waits until every rank entered the same collective
  // and compares the calls (CommError on a mismatch). `eager_bytes` > 0: first copies that many
  // bytes of `in` into this rank's eager buffer, which the peers then read (peer_eager).
  virtual void enter(const Op& op, const void* in, void* out, size_t eager_bytes = 0) = 0;
  // Rank j's input / output as it published them in enter().
  virtual const void* peer_in(int j) const = 0;
  virtual void* peer_out(int j) const = 0;
  // Rank j's eager buffer of collective `seq`.
  virtual const void* peer_eager(int j, uint64_t seq) const = 0;
  // Marks collective `seq` finished here and waits until every rank did: after it, no rank reads
  // this rank's buffers.
  virtual void leave(uint64_t seq, const Op& op) = 0;
  // Marks collective `seq` finished here without waiting (this rank's buffers were not read, only
  // its eager copy): the next enter() waits for the peers before it overwrites that copy.
  virtual void leave_early(uint64_t seq) = 0;

 protected:
  ~HostTransport() = default;
};

// eager (eager.cpp): an all-reduce of at most kHostEagerBytes through the eager buffers, one wait.
void eager_all_reduce(HostTransport& t, const CommCall& c, const Op& op);

// flat (flat.cpp): every rank reads its peers' buffers directly, between enter and leave.
void flat_all_reduce(HostTransport& t, const CommCall& c, const Op& op);
void flat_reduce_scatter(HostTransport& t, const CommCall& c, const Op& op);
void flat_all_gather(HostTransport& t, const CommCall& c, const Op& op);
void flat_broadcast(HostTransport& t, const CommCall& c, const Op& op);
void flat_all_to_all(HostTransport& t, const CommCall& c, const Op& op);

}  // namespace meshrt::detail
