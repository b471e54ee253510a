// CachingAllocator: the size-class pool with stream-aware reuse shared by the host and CUDA
// allocators; a backend supplies only the raw system allocation and release.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/plugin_api.h"

namespace meshrt {

class MESHRT_PLUGIN_API CachingAllocator : public Allocator {
 public:
  struct Raw {
    // Returns memory of exactly `bytes` (a size class) or nullptr when out of memory.
    std::function<void*(size_t bytes)> alloc;
    std::function<void(void* p)> free;
    // Memory left on the device (for error messages); may be empty.
    std::function<std::string()> describe_free;
    // Whether stream_ordered() says so: host tasks then capture blocks without owning them
    // (Tensor::stream_ref). MESHRT_HOST_STREAM_REUSE=0 turns it off for the host pool.
    bool stream_ordered = true;
  };

  CachingAllocator(Device device, std::string name, Raw raw);
  ~CachingAllocator() override;

  Device device() const override { return device_; }
  void* allocate(size_t bytes, Stream* stream) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, Stream& stream) override;
  bool stream_ordered() const override { return raw_.stream_ordered; }
  void leak(void* ptr) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  std::string name() const override { return name_; }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    Stream* stream = nullptr;  // allocation stream; used only while `alive` has not expired
    std::weak_ptr<const void> alive;
    std::vector<std::pair<Stream*, std::weak_ptr<const void>>> used_on;  // record_stream
    std::vector<Event> pending;  // work that must finish before reuse
    bool leaked = false;         // leak(): dropped, not filed, when the program frees it
  };

  // Moves pending blocks whose events completed to the free lists. Caller holds mu_.
  void process_pending_locked();
  // Releases every cached free block to the system. Caller holds mu_.
  void release_cached_locked();
  void* take_free_locked(size_t size, Stream* stream);
  // Files a freed block: cached at once, pending on its streams' events, or stranded.
  void file_freed(Block b);

  Device device_;
  std::string name_;
  Raw raw_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::multimap<size_t, Block> free_;  // ready for reuse, keyed by size class
  std::vector<Block> pending_;         // freed, waiting on stream events
  std::vector<Block> stranded_;        // freed, but their stream could not record: never reused
  std::vector<void*> leaked_;          // leak(): never reused nor freed
  AllocatorStats stats_;
};

}  // namespace meshrt
