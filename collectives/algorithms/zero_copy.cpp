// The shm backend's zero-copy algorithms (collectives/algorithms/shm_transport.h): between the
// ranks' own buffers, mapped from shared host memory, as the threads backend's flat ones.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms/shm_transport.h"
#include "collectives/host_reduce.h"

namespace meshrt::detail {

// Each rank reduces its 1/n slice over every rank's input, in rank order, into every rank's
// output.
bool zero_copy_all_reduce(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size();
  const size_t es = dtype_size(c.dtype);
  const int64_t N = c.count;
  std::vector<char*> ins, outs;
  const size_t bytes = static_cast<size_t>(N) * es;
  if (!t.map_all_buffers(c, op, bytes, bytes, ins, outs)) return false;
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(es));
  const int64_t part = ((N + n - 1) / n + align - 1) / align * align;
  const int64_t lo = std::min(N, part * t.rank()), hi = std::min(N, lo + part);
  // Out of place the outputs are in no cache: non-temporal stores skip their reads for ownership
  // (in place each block was just read, and plain stores hit).
  const bool streaming = stream_output(static_cast<size_t>(N) * es, c.in_place);
  if (lo < hi) {
    std::vector<const void*> srcs(static_cast<size_t>(n));
    std::vector<void*> dsts(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      srcs[static_cast<size_t>(j)] = ins[static_cast<size_t>(j)] + lo * static_cast<int64_t>(es);
      dsts[static_cast<size_t>(j)] = outs[static_cast<size_t>(j)] + lo * static_cast<int64_t>(es);
    }
    host_reduce_multi(c.dtype, c.redop, srcs.data(), n, dsts.data(), n, hi - lo, n,
                      streaming ? ~uint64_t{0} : 0u);
    if (streaming) host_store_fence();
  }
  t.step_all(op, "stalled inside the collective");  // every slice is in every output
  return true;
}

// Each rank reduces its block of every rank's input, in rank order, into its output (in place
// that is its own block of its input: each block of it is read before it is written, and no peer
// reads it).
bool zero_copy_reduce_scatter(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size();
  const size_t es = dtype_size(c.dtype), bytes = static_cast<size_t>(c.count) * es;
  std::vector<char*> ins, outs;
  if (!t.map_all_buffers(c, op, bytes * static_cast<size_t>(n), bytes, ins, outs)) return false;
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j)
    srcs[static_cast<size_t>(j)] =
        ins[static_cast<size_t>(j)] + bytes * static_cast<size_t>(t.rank());
  host_reduce(c.dtype, c.redop, srcs.data(), n, c.out.data_ptr(), c.count, n);
  t.step_all(op, "stalled inside the collective");  // no peer reads this input any more
  return true;
}

// Each rank copies every peer's input into its output (in place a peer's input is its own block
// of its output, which only it writes).
bool zero_copy_all_gather(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size();
  const size_t es = dtype_size(c.dtype), bytes = static_cast<size_t>(c.count) * es;
  std::vector<char*> ins, outs;
  if (!t.map_all_buffers(c, op, bytes, bytes * static_cast<size_t>(n), ins, outs)) return false;
  char* out = static_cast<char*>(c.out.data_ptr());
  for (int j = 0; j < n; ++j) {
    char* dst = out + bytes * static_cast<size_t>(j);
    if (dst != ins[static_cast<size_t>(j)]) std::memcpy(dst, ins[static_cast<size_t>(j)], bytes);
  }
  t.step_all(op, "stalled inside the collective");  // no peer reads this input any more
  return true;
}

}  // namespace meshrt::detail
