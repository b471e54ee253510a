// The shm backend's one-step all-reduce (collectives/algorithms/shm_transport.h).
#include <cstring>

#include "collectives/algorithms/shm_transport.h"
#include "collectives/host_reduce.h"

namespace meshrt::detail {

// Every rank copies its whole input into its staging buffer and, after one step, reduces every
// rank's buffer itself, in rank order 0..n-1 (so the results are bit-identical on every rank and
// those of the staged algorithm): no second step and no copy out. The message fits one buffer.
void one_step_all_reduce(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size();
  const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
  const uint64_t use = t.next_use();
  if (bytes > 0) std::memcpy(t.buffer(t.rank(), use), c.in.data_ptr(), bytes);
  t.enter(op, use);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) srcs[static_cast<size_t>(j)] = t.buffer(j, use);
  host_reduce(c.dtype, c.redop, srcs.data(), n, c.out.data_ptr(), c.count, n);
}

}  // namespace meshrt::detail
