#include "runtime/shared_host_memory.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>

#include "runtime/env.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

constexpr size_t kMaxBlocks = 256;

struct Block {
  size_t bytes;
  int fd;
  uint64_t id;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Block> blocks;  // by base address
  uint64_t next_id = 1;
  std::atomic<bool> enabled{false};
  std::atomic<size_t> min_bytes{0};
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: blocks may be freed during exit
  return *r;
}

void disable_in_child() { registry().enabled.store(false); }

}  // namespace

void enable_shared_host_memory(size_t min_bytes) {
  if (!env_switch("MESHRT_SHM_ZERO_COPY")) return;
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, disable_in_child); });
  Registry& r = registry();
  r.min_bytes.store(min_bytes);
  r.enabled.store(true);
}

bool shared_host_memory_enabled() { return registry().enabled.load(); }

void* shared_host_alloc(size_t bytes) {
  Registry& r = registry();
  if (!r.enabled.load() || bytes < r.min_bytes.load() || bytes == 0) return nullptr;
  {
    // Each block holds a descriptor until it is freed: at most kMaxBlocks, so a process never
    // runs short of descriptors because of them (the rest are private).
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.blocks.size() >= kMaxBlocks) return nullptr;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  const int fd = memfd_create("meshrt-host", MFD_CLOEXEC);
  if (fd < 0) {
    MESHRT_LOG_DEBUG("shared host memory: memfd_create failed (errno " << errno
                                                                       << "); a private block");
    return nullptr;
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0)
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    MESHRT_LOG_DEBUG("shared host memory: " << size << " bytes refused (errno " << errno
                                            << "); a private block");
    close(fd);
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(r.mu);
  r.blocks[reinterpret_cast<uintptr_t>(p)] = {size, fd, r.next_id++};
  return p;
}

bool shared_host_free(void* p) {
  Registry& r = registry();
  Block b{};
  {
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it == r.blocks.end()) return false;
    b = it->second;
    r.blocks.erase(it);
  }
  if (munmap(p, b.bytes) != 0)
    MESHRT_LOG_WARN("shared host memory: munmap of " << b.bytes << " bytes failed (errno " << errno
                                                     << ")");
  close(b.fd);
  return true;
}

bool find_shared_host_range(const void* p, size_t bytes, SharedHostRange* out) {
  Registry& r = registry();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.blocks.upper_bound(a);
  if (it == r.blocks.begin()) return false;
  --it;
  const Block& b = it->second;
  if (a + bytes > it->first + b.bytes) return false;
  if (out) *out = {b.fd, b.id, b.bytes, a - it->first};
  return true;
}

}  // namespace meshrt
