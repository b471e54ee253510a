// Allocator: the memory interface (host and CUDA caching pools; engines may hand in their own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "meshrt/export.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace meshrt {

struct MESHRT_API AllocatorStats {
  int64_t allocated_bytes = 0;  // currently handed out (rounded sizes)
  int64_t reserved_bytes = 0;   // held from the system, handed out or cached
  int64_t peak_allocated_bytes = 0;
  int64_t alloc_count = 0;    // allocate() calls
  int64_t cache_hits = 0;     // allocate() served from the cache
  int64_t system_allocs = 0;  // calls to the underlying malloc / cudaMalloc
  int64_t live_blocks = 0;
};

class MESHRT_API Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns memory for `bytes` (64-byte aligned at least). `stream` is the stream the memory is
  // first used on (may be null for host). Never returns null: throws meshrt::Error on failure.
  virtual void* allocate(size_t bytes, Stream* stream) = 0;
  // Returns ptr; the memory is reused only after all work enqueued so far on the streams it was
  // used on (its allocation stream and any passed to record_stream) has finished.
  virtual void deallocate(void* ptr) = 0;
  // Marks that ptr is also used on `stream` (stream-aware reuse, as torch's record_stream).
  virtual void record_stream(void* ptr, Stream& stream) {
    (void)ptr;
    (void)stream;
  }
  // True when deallocate() honours the stream-ordered contract above (the caching pools): host
  // tasks may then capture a block without owning it (Tensor::stream_ref), as CUDA kernels do.
  virtual bool stream_ordered() const { return false; }
  // Never hands out nor frees the block at ptr again, whether the program still holds it, freed
  // it or it waits in the cache: a communicator abort may leave a peer writing it
  // (Tensor::keep_forever). The memory stays reserved until the process exits.
  virtual void leak(void* ptr) { (void)ptr; }
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() {}
  // Gives cached, unused memory back to the system.
  virtual void empty_cache() {}
  virtual std::string name() const = 0;
};

// 64-byte aligned host memory with a caching pool by size class.
MESHRT_API std::shared_ptr<Allocator> make_host_caching_allocator(int device_index = 0);
// Plain aligned malloc/free with stats and no cache (for comparisons and debugging).
MESHRT_API std::shared_ptr<Allocator> make_host_plain_allocator(int device_index = 0);

// Rounds a request up to its size class (shared by the host and CUDA pools).
MESHRT_API size_t allocator_size_class(size_t bytes);

}  // namespace meshrt
