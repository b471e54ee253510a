// The threads backend's eager all-reduce (collectives/algorithms/host_transport.h).
#include <vector>

#include "collectives/algorithms/host_transport.h"
#include "collectives/host_reduce.h"

namespace meshrt::detail {

// Every rank copies its input into its slot's eager buffer as it enters, then reduces all the
// buffers, in rank order 0..n-1 as the flat algorithm does (the same bits on every rank and at
// every size), into its own output, and leaves without waiting for the others: one wait per
// collective instead of two.
void eager_all_reduce(HostTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size();
  const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
  const uint64_t seq = c.seq;
  t.enter(op, c.in.data_ptr(), c.out.data_ptr(), bytes);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) srcs[static_cast<size_t>(j)] = t.peer_eager(j, seq);
  void* dsts[1] = {c.out.data_ptr()};
  host_reduce_multi(c.dtype, c.redop, srcs.data(), n, dsts, 1, c.count, n, 0);
  t.leave_early(seq);
}

}  // namespace meshrt::detail
