// The shm backend's staged algorithms (collectives/algorithms/shm_transport.h): chunk by chunk
// through the segment's staging buffers, copying in, stepping, then reading the peers' buffers.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms/shm_transport.h"
#include "collectives/host_reduce.h"

namespace meshrt::detail {

namespace {

// dst[0, n) = src[0, n) with non-temporal stores (a one-source reduction is a copy).
void copy_streaming(DType dt, const void* src, void* dst, int64_t n) {
  const void* srcs[1] = {src};
  void* dsts[1] = {dst};
  host_reduce_multi(dt, ReduceOp::Sum, srcs, 1, dsts, 1, n, 1, 1u);
}

// Bytes of one rank's region for each destination when a buffer is split n ways.
size_t region_bytes(int n) { return kShmChunkBytes / static_cast<size_t>(n) / 64 * 64; }

// The first chunk's step is the collective's enter, every later one a plain step.
void chunk_step(ShmTransport& t, const Op& op, uint64_t use, int64_t k) {
  if (k == 0) {
    t.enter(op, use);
  } else {
    t.step_all(op, "stalled inside the collective");
  }
}

// Orders the streaming stores of an out-of-place all-reduce before the call completes, on every
// way out.
struct Fence {
  bool on;
  ~Fence() {
    if (on) host_store_fence();
  }
};

}  // namespace

// Chunk by chunk: every rank copies the other ranks' 1/n slices of its chunk into its buffer;
// each rank reduces its own slice over every rank's (its own straight from its input, the others'
// from their buffers) in rank order 0..n-1 (so every rank gets bit-identical results, those of
// the threads backend) into its buffer and its output; then every rank copies the other slices
// out of their owners' buffers. Per rank that moves 4 units of the message on 2 ranks (copying
// its own slice in too would make 5).
void staged_all_reduce(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t N = c.count;
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  const Fence fence{!c.in_place};
  const int64_t per = static_cast<int64_t>(kShmChunkBytes / es);
  const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(es));
  // A large out-of-place output is in no cache: non-temporal stores skip its read-for-ownership
  // (in place it was just read as input, and plain stores hit).
  const bool streaming = stream_output(static_cast<size_t>(N) * es, c.in_place);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (int64_t off = 0, k = 0; k == 0 || off < N; ++k) {
    const int64_t len = std::min(per, N - off);
    const uint64_t use = t.next_use();
    char* mine = t.buffer(me, use);
    const char* chunk = in + off * static_cast<int64_t>(es);
    const int64_t part = ((len + n - 1) / n + align - 1) / align * align;
    auto lo_of = [&](int r) { return std::min(len, part * r); };
    const int64_t lo = lo_of(me), hi = std::min(len, lo + part);
    for (int j = 0; j < n; ++j) {
      const int64_t jlo = lo_of(j), jhi = std::min(len, jlo + part);
      if (j != me && jlo < jhi)
        std::memcpy(mine + jlo * static_cast<int64_t>(es), chunk + jlo * static_cast<int64_t>(es),
                    static_cast<size_t>(jhi - jlo) * es);
    }
    chunk_step(t, op, use, k);
    if (lo < hi) {
      // In place the output slice is the input slice: the reduction reads each block before it
      // writes it.
      for (int j = 0; j < n; ++j)
        srcs[static_cast<size_t>(j)] =
            (j == me ? chunk : t.buffer(j, use)) + lo * static_cast<int64_t>(es);
      void* dsts[2] = {mine + lo * static_cast<int64_t>(es),
                       out + (off + lo) * static_cast<int64_t>(es)};
      host_reduce_multi(c.dtype, c.redop, srcs.data(), n, dsts, 2, hi - lo, n, streaming ? 2u : 0u);
    }
    t.step_all(op, "stalled inside the collective");
    for (int j = 0; j < n; ++j) {
      const int64_t jlo = lo_of(j), jhi = std::min(len, jlo + part);
      if (j == me || jlo >= jhi) continue;
      char* dst = out + (off + jlo) * static_cast<int64_t>(es);
      const char* src = t.buffer(j, use) + jlo * static_cast<int64_t>(es);
      if (streaming) {
        copy_streaming(c.dtype, src, dst, jhi - jlo);
      } else {
        std::memcpy(dst, src, static_cast<size_t>(jhi - jlo) * es);
      }
    }
    off += len;
  }
}

// Chunk by chunk: every rank copies its chunk of every destination's block into that
// destination's region of its buffer; each rank reduces its region over every buffer.
void staged_reduce_scatter(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype), region = region_bytes(n);
  const int64_t N = c.count, per = static_cast<int64_t>(region / es);
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (int64_t off = 0, k = 0; k == 0 || off < N; ++k) {
    const int64_t len = std::min(per, N - off);
    const uint64_t use = t.next_use();
    char* mine = t.buffer(me, use);
    for (int j = 0; j < n && len > 0; ++j) {
      std::memcpy(mine + static_cast<size_t>(j) * region,
                  in + (static_cast<int64_t>(j) * N + off) * static_cast<int64_t>(es),
                  static_cast<size_t>(len) * es);
    }
    chunk_step(t, op, use, k);
    for (int j = 0; j < n; ++j)
      srcs[static_cast<size_t>(j)] = t.buffer(j, use) + static_cast<size_t>(me) * region;
    host_reduce(c.dtype, c.redop, srcs.data(), n, out + off * static_cast<int64_t>(es), len, n);
    off += len;
  }
}

// Chunk by chunk: every rank copies its chunk into its buffer, then every peer's out of theirs.
void staged_all_gather(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype);
  const int64_t N = c.count, per = static_cast<int64_t>(kShmChunkBytes / es);
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  for (int64_t off = 0, k = 0; k == 0 || off < N; ++k) {
    const int64_t len = std::min(per, N - off);
    const size_t bytes = static_cast<size_t>(len) * es;
    const uint64_t use = t.next_use();
    const char* src = in + off * static_cast<int64_t>(es);
    if (len > 0) std::memcpy(t.buffer(me, use), src, bytes);
    chunk_step(t, op, use, k);
    for (int j = 0; j < n && len > 0; ++j) {
      char* dst = out + (static_cast<int64_t>(j) * N + off) * static_cast<int64_t>(es);
      const char* from = j == me ? src : t.buffer(j, use);
      if (dst != from) std::memcpy(dst, from, bytes);
    }
    off += len;
  }
}

// Chunk by chunk: the root copies its chunk into its buffer, every other rank out of it.
void staged_broadcast(ShmTransport& t, const CommCall& c, const Op& op) {
  const size_t es = dtype_size(c.dtype);
  const int64_t N = c.count, per = static_cast<int64_t>(kShmChunkBytes / es);
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  const bool root = t.rank() == c.root;
  for (int64_t off = 0, k = 0; k == 0 || off < N; ++k) {
    const int64_t len = std::min(per, N - off);
    const size_t bytes = static_cast<size_t>(len) * es;
    const uint64_t use = t.next_use();
    const int64_t at = off * static_cast<int64_t>(es);
    if (root && len > 0) {
      std::memcpy(t.buffer(t.rank(), use), in + at, bytes);
      if (out != in) std::memcpy(out + at, in + at, bytes);
    }
    chunk_step(t, op, use, k);
    if (!root && len > 0) std::memcpy(out + at, t.buffer(c.root, use), bytes);
    off += len;
  }
}

// Chunk by chunk: every rank copies its chunk of the block for each destination into that
// destination's region of its buffer, then copies its region out of every rank's buffer. In
// place, a chunk is read in full before any of it is written.
void staged_all_to_all(ShmTransport& t, const CommCall& c, const Op& op) {
  const int n = t.size(), me = t.rank();
  const size_t es = dtype_size(c.dtype), region = region_bytes(n);
  const int64_t N = c.count, per = static_cast<int64_t>(region / es);
  char* out = static_cast<char*>(c.out.data_ptr());
  const char* in = static_cast<const char*>(c.in.data_ptr());
  for (int64_t off = 0, k = 0; k == 0 || off < N; ++k) {
    const int64_t len = std::min(per, N - off);
    const size_t bytes = static_cast<size_t>(len) * es;
    const uint64_t use = t.next_use();
    char* mine = t.buffer(me, use);
    for (int j = 0; j < n && len > 0; ++j) {
      std::memcpy(mine + static_cast<size_t>(j) * region,
                  in + (static_cast<int64_t>(j) * N + off) * static_cast<int64_t>(es), bytes);
    }
    chunk_step(t, op, use, k);
    for (int j = 0; j < n && len > 0; ++j) {
      std::memcpy(out + (static_cast<int64_t>(j) * N + off) * static_cast<int64_t>(es),
                  t.buffer(j, use) + static_cast<size_t>(me) * region, bytes);
    }
    off += len;
  }
}

}  // namespace meshrt::detail
