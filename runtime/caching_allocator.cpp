#include "runtime/caching_allocator.h"

#include <algorithm>
#include <cstdlib>

#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/shared_host_memory.h"

namespace meshrt {

size_t allocator_size_class(size_t bytes) {
  if (bytes <= 64) return 64;
  // Four classes per power of two: at most 25% rounding waste, few distinct sizes to cache.
  size_t p = size_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(bytes - 1)));
  size_t step = std::max<size_t>(64, p / 4);
  return (bytes + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(Device device, std::string name, Raw raw)
    : device_(device), name_(std::move(name)), raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& b : pending_) {
    for (auto& e : b.pending) {
      try {
        e.synchronize();
      } catch (...) {
        // the stream's error was reported (or will be) where its work was waited for
      }
    }
    raw_.free(b.ptr);
  }
  pending_.clear();
  for (auto& b : stranded_) raw_.free(b.ptr);
  stranded_.clear();
  release_cached_locked();
  if (!leaked_.empty()) {
    // Reachable from static storage, so leak checkers do not report what was kept on purpose.
    static std::mutex mu;
    static auto* forever = new std::vector<void*>;
    std::lock_guard<std::mutex> g(mu);
    forever->insert(forever->end(), leaked_.begin(), leaked_.end());
  }
  if (!live_.empty())
    MESHRT_LOG_WARN("allocator " << name_ << " destroyed with " << live_.size()
                                 << " live blocks; they are leaked to stay valid");
}

void CachingAllocator::process_pending_locked() {
  auto ready = [](Block& b) {
    for (auto& e : b.pending)
      if (!e.query()) return false;
    return true;
  };
  for (size_t i = 0; i < pending_.size();) {
    if (ready(pending_[i])) {
      Block b = std::move(pending_[i]);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
      b.pending.clear();
      b.used_on.clear();
      free_.emplace(b.size, std::move(b));
    } else {
      ++i;
    }
  }
}

void CachingAllocator::release_cached_locked() {
  for (auto& [size, b] : free_) {
    raw_.free(b.ptr);
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }
  free_.clear();
}

void* CachingAllocator::take_free_locked(size_t size, Stream* stream) {
  auto it = free_.find(size);
  if (it != free_.end()) {
    Block b = std::move(it->second);
    free_.erase(it);
    b.stream = stream;
    b.alive = stream ? stream->lifetime() : std::weak_ptr<const void>();
    void* p = b.ptr;
    live_.emplace(p, std::move(b));
    return p;
  }
  // A block freed by work on this same stream only may be reused at once: the stream's order
  // puts the new user after the old one (as CUDA caching allocators do).
  if (stream) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      Block& b = pending_[i];
      if (b.size == size && b.stream == stream && b.used_on.empty() && !b.alive.expired()) {
        Block nb = std::move(b);
        pending_[i] = std::move(pending_.back());
        pending_.pop_back();
        nb.pending.clear();
        void* p = nb.ptr;
        live_.emplace(p, std::move(nb));
        return p;
      }
    }
  }
  return nullptr;
}

void* CachingAllocator::allocate(size_t bytes, Stream* stream) {
  const size_t size = allocator_size_class(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.alloc_count++;
  process_pending_locked();
  void* p = take_free_locked(size, stream);
  if (p) {
    stats_.cache_hits++;
  } else {
    p = raw_.alloc(size);
    if (!p) {
      // Out of memory: give the cache back, wait for pending frees, and try once more.
      for (auto& b : pending_)
        for (auto& e : b.pending) {
          try {
            e.synchronize();
          } catch (...) {
          }
        }
      process_pending_locked();
      release_cached_locked();
      p = raw_.alloc(size);
    }
    MESHRT_CHECK_ALLOC(p != nullptr,
                       "allocator "
                           << name_ << ": out of memory allocating " << bytes << " bytes (class "
                           << size << ") on " << device_.str() << "; allocated "
                           << stats_.allocated_bytes << ", reserved " << stats_.reserved_bytes
                           << (raw_.describe_free ? "; " + raw_.describe_free() : std::string()));
    stats_.system_allocs++;
    stats_.reserved_bytes += static_cast<int64_t>(size);
    Block b;
    b.ptr = p;
    b.size = size;
    b.stream = stream;
    b.alive = stream ? stream->lifetime() : std::weak_ptr<const void>();
    live_.emplace(p, std::move(b));
  }
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.live_blocks++;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return p;
}

void CachingAllocator::record_stream(void* ptr, Stream& stream) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(ptr);
  MESHRT_CHECK(it != live_.end(), "allocator " << name_ << ": record_stream on " << ptr
                                               << ", which it did not allocate");
  Block& b = it->second;
  if (&stream == b.stream) return;
  for (auto& u : b.used_on)
    if (u.first == &stream) return;
  b.used_on.emplace_back(&stream, stream.lifetime());
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  Block b;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(ptr);
    MESHRT_CHECK(it != live_.end(), "allocator " << name_ << ": deallocate of " << ptr
                                                 << ", which it did not allocate (or freed twice)");
    b = std::move(it->second);
    live_.erase(it);
    stats_.allocated_bytes -= static_cast<int64_t>(b.size);
    stats_.live_blocks--;
  }
  file_freed(std::move(b));
}

void CachingAllocator::leak(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = live_.find(ptr); it != live_.end()) {
    it->second.leaked = true;
    return;
  }
  leaked_.push_back(ptr);
  auto drop = [ptr](std::vector<Block>& v) {
    auto it = std::find_if(v.begin(), v.end(), [ptr](const Block& b) { return b.ptr == ptr; });
    if (it == v.end()) return false;
    v.erase(it);
    return true;
  };
  if (drop(pending_) || drop(stranded_)) return;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second.ptr == ptr) {
      free_.erase(it);
      return;
    }
  }
  leaked_.pop_back();  // not a block of this pool (already released): nothing to keep
}

void CachingAllocator::file_freed(Block b) {
  if (b.leaked) {
    std::lock_guard<std::mutex> lk(mu_);
    leaked_.push_back(b.ptr);
    return;
  }
  // The block is tagged with the position of each stream it was used on: an event recorded now,
  // after all work enqueued so far there. Recording is done without the lock: under
  // MESHRT_LAUNCH_BLOCKING it waits for the stream, whose tasks may allocate or free.
  // A stream that no longer exists drained its work when it was destroyed: nothing to wait for.
  // Recording can fail on a stream being shut down (a task's captures are freed while it
  // drains, after a watchdog abort); deallocate runs in destructors and must not throw, so the
  // block is then kept out of circulation until the allocator goes.
  bool stranded = false;
  try {
    if (b.stream && !b.alive.expired()) b.pending.push_back(b.stream->record());
    for (auto& [s, alive] : b.used_on)
      if (!alive.expired()) b.pending.push_back(s->record());
  } catch (const std::exception& e) {
    MESHRT_LOG_DEBUG("allocator " << name_ << ": block " << b.ptr
                                  << " not reused (cannot record on its stream: " << e.what()
                                  << ")");
    stranded = true;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (stranded) {
    stranded_.push_back(std::move(b));
  } else if (b.pending.empty()) {
    b.used_on.clear();
    free_.emplace(b.size, std::move(b));
  } else {
    // Work queued later on b.stream may take it at once (take_free_locked); other streams
    // once the events completed (process_pending_locked).
    pending_.push_back(std::move(b));
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  process_pending_locked();
  release_cached_locked();
}

// ---- host allocators ---------------------------------------------------------------------------

namespace {

void* host_raw_alloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }

class HostPlainAllocator final : public Allocator {
 public:
  explicit HostPlainAllocator(int index) : index_(index) {}
  Device device() const override { return Device::cpu(index_); }
  void* allocate(size_t bytes, Stream*) override {
    size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = host_raw_alloc(size);
    MESHRT_CHECK_ALLOC(p, "host allocator: out of memory allocating " << bytes << " bytes");
    std::lock_guard<std::mutex> lk(mu_);
    sizes_[p] = size;
    stats_.alloc_count++;
    stats_.system_allocs++;
    stats_.live_blocks++;
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return p;
  }
  void deallocate(void* p) override {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    MESHRT_CHECK(it != sizes_.end(), "host allocator: deallocate of unknown pointer " << p);
    stats_.allocated_bytes -= static_cast<int64_t>(it->second);
    stats_.reserved_bytes -= static_cast<int64_t>(it->second);
    stats_.live_blocks--;
    sizes_.erase(it);
    std::free(p);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  std::string name() const override { return "host-plain"; }

 private:
  int index_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  AllocatorStats stats_;
};

}  // namespace

std::shared_ptr<Allocator> make_host_caching_allocator(int device_index) {
  CachingAllocator::Raw raw;
  raw.stream_ordered = env_switch("MESHRT_HOST_STREAM_REUSE");
  // Large blocks come from shared memory once a shm communicator asked for it
  // (runtime/shared_host_memory.h), so its collectives can run on them in place.
  raw.alloc = [](size_t bytes) {
    void* p = shared_host_alloc(bytes);
    return p ? p : host_raw_alloc(bytes);
  };
  raw.free = [](void* p) {
    if (!shared_host_free(p)) std::free(p);
  };
  return std::make_shared<CachingAllocator>(Device::cpu(device_index), "host-caching",
                                            std::move(raw));
}

std::shared_ptr<Allocator> make_host_plain_allocator(int device_index) {
  return std::make_shared<HostPlainAllocator>(device_index);
}

}  // namespace meshrt
