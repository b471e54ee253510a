// The threads backend's flat algorithms (collectives/algorithms/host_transport.h): every rank
// reads its peers' buffers directly between entering and leaving, with no copy in between.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms/host_transport.h"
#include "collectives/host_reduce.h"

namespace meshrt::detail {

namespace {
constexpr size_t kSwapChunk = 4096;  // all_to_all: bytes saved per step (L1-resident)
}  // namespace

// Reduce-scatter fused with a push all-gather: rank r reduces slice r of the buffer, reading
// every rank's input in rank order 0..n-1, one L1-sized block at a time, and stores each reduced
// block into every rank's output. Every element is computed once, by one rank, so all ranks
// receive bit-identical results; each rank reads n slices and writes n slices, the same memory
// traffic as one memcpy of the buffer, with no step where ranks wait on each other between
// entering and leaving.
void flat_all_reduce(HostTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t N = c.count;
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  t.enter(op, in, out);
  if (n == 1) {
    if (!c.in_place && N > 0) std::memcpy(out, in, static_cast<size_t>(N) * es);
    return t.leave(c.seq, op);
  }
  // Slices are whole cache lines so that no two ranks write the same line.
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(es));
  const int64_t part = ((N + n - 1) / n + align - 1) / align * align;
  const int64_t lo = std::min(N, part * me);
  const int64_t hi = std::min(N, lo + part);
  if (lo < hi) {
    std::vector<const void*> srcs(static_cast<size_t>(n));
    std::vector<void*> dsts(static_cast<size_t>(n));
    uint64_t streaming = 0;
    for (int k = 0; k < n; ++k) {
      srcs[static_cast<size_t>(k)] =
          static_cast<const char*>(t.peer_in(k)) + lo * static_cast<int64_t>(es);
      // Start with the next rank's output so that ranks do not all write the same one.
      const int j = (me + 1 + k) % n;
      dsts[static_cast<size_t>(k)] =
          static_cast<char*>(t.peer_out(j)) + lo * static_cast<int64_t>(es);
      if (k < 64 && stream_output(static_cast<size_t>(N) * es, t.peer_in(j) == t.peer_out(j)))
        streaming |= uint64_t{1} << k;
    }
    host_reduce_multi(c.dtype, c.redop, srcs.data(), n, dsts.data(), n, hi - lo, n, streaming);
    if (streaming) host_store_fence();
  }
  t.leave(c.seq, op);
}

// Rank r reduces block r of every rank's input, in rank order, into its output.
void flat_reduce_scatter(HostTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t N = c.count;
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  t.enter(op, in, out);
  if (N > 0) {
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      srcs[static_cast<size_t>(j)] = static_cast<const char*>(t.peer_in(j)) +
                                     static_cast<size_t>(me) * static_cast<size_t>(N) * es;
    }
    void* dsts[1] = {out};
    // In place the output is this rank's slice of the input it just read.
    const bool in_slice = out == in + static_cast<size_t>(me) * static_cast<size_t>(N) * es;
    const uint64_t streaming = stream_output(static_cast<size_t>(N) * es, in_slice);
    host_reduce_multi(c.dtype, c.redop, srcs.data(), n, dsts, 1, N, n, streaming);
    if (streaming) host_store_fence();
  }
  t.leave(c.seq, op);
}

// Each rank copies every peer's input into its output, starting with its own.
void flat_all_gather(HostTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  t.enter(op, in, out);
  if (bytes > 0) {
    for (int k = 0; k < n; ++k) {
      const int j = (me + k) % n;
      char* dst = out + static_cast<size_t>(j) * bytes;
      const char* src = j == me ? in : static_cast<const char*>(t.peer_in(j));
      if (dst != src) std::memcpy(dst, src, bytes);
    }
  }
  t.leave(c.seq, op);
}

// Each rank copies the root's input into its output.
void flat_broadcast(HostTransport& t, const CommCall& c, const Op& op) {
  const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  t.enter(op, in, out);
  if (bytes > 0) {
    const char* src = t.rank() == c.root ? in : static_cast<const char*>(t.peer_in(c.root));
    if (src != out) std::memcpy(out, src, bytes);
  }
  t.leave(c.seq, op);
}

// Every pair of ranks {i, j} exchanges two blocks (i's block for j, j's block for i); the lower
// rank moves the first half of both, the higher rank the second half, so each byte is moved by
// one rank and the work is even. When either rank is in place the two blocks share memory (the
// block i receives from j is where i's block for j was): a chunk of the one coming back is saved
// before the one going out is written, a swap with no staging copy of the buffer. Each rank moves
// its own block when out of place.
void flat_all_to_all(HostTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype);
  const size_t count = static_cast<size_t>(c.count), block = count * es;
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  t.enter(op, in, out);
  if (block > 0) {
    if (in != out) std::memcpy(out + me * block, in + me * block, block);
    const size_t half = count / 2 * es;
    for (int k = 1; k < n; ++k) {
      const int j = (me + k) % n;
      const int lo = std::min(me, j), hi = std::max(me, j);
      const char* lo_in = static_cast<const char*>(t.peer_in(lo));
      const char* hi_in = static_cast<const char*>(t.peer_in(hi));
      char* lo_out = static_cast<char*>(t.peer_out(lo));
      char* hi_out = static_cast<char*>(t.peer_out(hi));
      const size_t from = me == lo ? 0 : half, to = me == lo ? half : block;
      const char* up_src = lo_in + hi * block;  // lo's block for hi
      char* up_dst = hi_out + lo * block;
      const char* down_src = hi_in + lo * block;  // hi's for lo
      char* down_dst = lo_out + hi * block;
      if (lo_in != lo_out && hi_in != hi_out) {  // no block shares memory: plain copies
        if (from < to) {
          std::memcpy(up_dst + from, up_src + from, to - from);
          std::memcpy(down_dst + from, down_src + from, to - from);
        }
        continue;
      }
      alignas(64) char tmp[kSwapChunk];
      for (size_t off = from; off < to; off += kSwapChunk) {
        const size_t len = std::min(kSwapChunk, to - off);
        std::memcpy(tmp, down_src + off, len);
        std::memcpy(up_dst + off, up_src + off, len);
        std::memcpy(down_dst + off, tmp, len);
      }
    }
  }
  t.leave(c.seq, op);
}

}  // namespace meshrt::detail
