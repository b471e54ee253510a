#include "runtime/shared_host_memory.h"

#include <fcntl.h>
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

// Mappings (blocks and slabs) alive at once: each holds a descriptor, so a process never runs
// short of descriptors because of them (beyond it blocks are private).
constexpr size_t kMaxMappings = 256;
// Blocks under kSlabBlockMax are carved out of kSlabBytes slabs (one memfd each), as CUDA's
// caching allocator carves small blocks out of 2 MiB segments: small blocks then cost no
// descriptor of their own, and a peer maps a slab once for all the blocks in it.
constexpr size_t kSlabBytes = size_t{2} << 20;
constexpr size_t kSlabBlockMax = size_t{256} << 10;
constexpr size_t kSlabAlign = 64;

// One memfd mapping: a block of its own, or a slab of small blocks.
struct Mapping {
  size_t bytes;
  int fd;
  uint64_t id;
  bool slab = false;
  size_t bump = 0;                      // slab: bytes handed out from its start so far
  size_t live = 0;                      // slab: blocks handed out and not freed
  std::multimap<size_t, size_t> freed;  // slab: freed blocks' offsets by size, reused exactly
};

struct SlabBlock {
  uintptr_t slab;  // the slab's base address
  size_t bytes;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Mapping> maps;       // by base address
  std::map<uintptr_t, SlabBlock> in_slab;  // blocks carved out of slabs, by address
  uint64_t next_id = 1;
  std::atomic<bool> enabled{false};
  std::atomic<size_t> min_bytes{0};
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: blocks may be freed during exit
  return *r;
}

void disable_in_child() { registry().enabled.store(false); }

// A new memfd mapping of `size` bytes (a page multiple), registered: its base address, 0 when
// refused. Called with r.mu held.
uintptr_t new_mapping(Registry& r, size_t size, bool slab) {
  if (r.maps.size() >= kMaxMappings) return 0;
  const int fd = memfd_create("meshrt-host", MFD_CLOEXEC);
  if (fd < 0) {
    MESHRT_LOG_DEBUG("shared host memory: memfd_create failed (errno " << errno
                                                                       << "); a private block");
    return 0;
  }
  void* p = MAP_FAILED;
  int err = reserve_shared_pages(fd, size);
  if (err == 0) {
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) err = errno;
  }
  if (p == MAP_FAILED) {
    MESHRT_LOG_DEBUG("shared host memory: " << size << " bytes refused (errno " << err
                                            << "); a private block");
    close(fd);
    return 0;
  }
  const auto base = reinterpret_cast<uintptr_t>(p);
  Mapping& m = r.maps[base];
  m.bytes = size;
  m.fd = fd;
  m.id = r.next_id++;
  m.slab = slab;
  return base;
}

void release_mapping(Registry& r, std::map<uintptr_t, Mapping>::iterator it) {
  if (munmap(reinterpret_cast<void*>(it->first), it->second.bytes) != 0)
    MESHRT_LOG_WARN("shared host memory: munmap of " << it->second.bytes << " bytes failed (errno "
                                                     << errno << ")");
  close(it->second.fd);
  r.maps.erase(it);
}

// A block of `size` bytes (a kSlabAlign multiple) from a slab: a freed block of that size, else
// room at some slab's end, else a new slab. Called with r.mu held.
void* slab_alloc(Registry& r, size_t size) {
  uintptr_t room = 0;
  for (auto& [base, m] : r.maps) {
    if (!m.slab) continue;
    auto f = m.freed.find(size);
    if (f != m.freed.end()) {
      const uintptr_t a = base + f->second;
      m.freed.erase(f);
      ++m.live;
      r.in_slab[a] = {base, size};
      return reinterpret_cast<void*>(a);
    }
    if (!room && m.bytes - m.bump >= size) room = base;
  }
  if (!room && !(room = new_mapping(r, kSlabBytes, true))) return nullptr;
  Mapping& m = r.maps.at(room);
  const uintptr_t a = room + m.bump;
  m.bump += size;
  ++m.live;
  r.in_slab[a] = {room, size};
  return reinterpret_cast<void*>(a);
}

}  // namespace

int reserve_shared_pages(int fd, size_t bytes) {
  if (bytes == 0) return ftruncate(fd, 0) == 0 ? 0 : errno;
  int err = 0;
  do {
    // Returns the error (it does not set errno); also extends the file to `bytes`.
    err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  return err;
}

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
  std::lock_guard<std::mutex> lk(r.mu);
  if (bytes < kSlabBlockMax)
    return slab_alloc(r, (bytes + kSlabAlign - 1) / kSlabAlign * kSlabAlign);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return reinterpret_cast<void*>(new_mapping(r, (bytes + page - 1) / page * page, false));
}

bool shared_host_free(void* p) {
  Registry& r = registry();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(r.mu);
  // A slab's first block starts at the slab's base: blocks in slabs are looked up first.
  if (auto b = r.in_slab.find(a); b != r.in_slab.end()) {
    auto s = r.maps.find(b->second.slab);
    Mapping& m = s->second;
    m.freed.emplace(b->second.bytes, a - s->first);
    r.in_slab.erase(b);
    if (--m.live == 0) release_mapping(r, s);
    return true;
  }
  auto it = r.maps.find(a);
  if (it == r.maps.end() || it->second.slab) return false;
  release_mapping(r, it);
  return true;
}

bool find_shared_host_range(const void* p, size_t bytes, SharedHostRange* out) {
  Registry& r = registry();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.maps.upper_bound(a);
  if (it == r.maps.begin()) return false;
  --it;
  const Mapping& m = it->second;
  if (a + bytes > it->first + m.bytes) return false;
  if (out) *out = {m.fd, m.id, m.bytes, a - it->first};
  return true;
}

}  // namespace meshrt
