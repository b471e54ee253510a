#include "runtime/shared_host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/env.h"

using namespace meshrt;
namespace fs = std::filesystem;

namespace {

size_t open_descriptors() {
  size_t n = 0;
  for (auto it = fs::directory_iterator("/proc/self/fd"); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

SharedHostRange range_of(const void* p, size_t bytes) {
  SharedHostRange r;
  REQUIRE(find_shared_host_range(p, bytes, &r));
  return r;
}

// Maps the block as a peer process does (through /proc/<pid>/fd) and reads `bytes` at `offset`.
std::string read_as_peer(const SharedHostRange& r, size_t bytes) {
  const std::string path = "/proc/self/fd/" + std::to_string(r.fd);
  const int f = open(path.c_str(), O_RDWR);
  REQUIRE(f >= 0);
  void* p = mmap(nullptr, r.block_bytes, PROT_READ, MAP_SHARED, f, 0);
  close(f);
  REQUIRE(p != MAP_FAILED);
  std::string s(static_cast<const char*>(p) + r.offset, bytes);
  munmap(p, r.block_bytes);
  return s;
}

}  // namespace

TEST_CASE("shared host memory: small blocks share 2 MiB slabs, large ones own a memfd", "[unit]") {
  test::ScopedEnv env("MESHRT_SHM_ZERO_COPY", nullptr);
  const size_t fds_before = open_descriptors();
  enable_shared_host_memory(4096);
  REQUIRE(shared_host_memory_enabled());
  CHECK(shared_host_alloc(1024) == nullptr);  // under the minimum: the caller's private block

  // Small blocks: one slab (one descriptor), 64-byte aligned, disjoint, visible to a peer.
  const std::vector<size_t> sizes = {4096, 8192, 100000, 4096};
  std::vector<void*> small;
  for (size_t b : sizes) small.push_back(shared_host_alloc(b));
  const SharedHostRange first = range_of(small[0], sizes[0]);
  CHECK(first.block_bytes == (size_t{2} << 20));
  for (size_t i = 0; i < small.size(); ++i) {
    REQUIRE(small[i] != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(small[i]) % 64 == 0);
    const SharedHostRange r = range_of(small[i], sizes[i]);
    CHECK(r.id == first.id);
    CHECK(r.fd == first.fd);
    CHECK(static_cast<char*>(small[i]) - static_cast<char*>(small[0]) ==
          static_cast<std::ptrdiff_t>(r.offset) - static_cast<std::ptrdiff_t>(first.offset));
    std::memset(small[i], 'a' + static_cast<int>(i), sizes[i]);
  }
  for (size_t i = 0; i < small.size(); ++i)
    CHECK(read_as_peer(range_of(small[i], sizes[i]), sizes[i]) ==
          std::string(sizes[i], static_cast<char>('a' + i)));
  CHECK(open_descriptors() == fds_before + 1);

  // A large block is a mapping of its own.
  void* big = shared_host_alloc(size_t{1} << 20);
  REQUIRE(big != nullptr);
  const SharedHostRange rb = range_of(big, size_t{1} << 20);
  CHECK(rb.id != first.id);
  CHECK(rb.offset == 0);
  CHECK(rb.block_bytes == (size_t{1} << 20));
  CHECK(open_descriptors() == fds_before + 2);

  // A freed small block is handed out again for its size; a private pointer is not ours.
  REQUIRE(shared_host_free(small[1]));
  CHECK(shared_host_alloc(8192) == small[1]);
  int on_stack = 0;
  CHECK_FALSE(shared_host_free(&on_stack));

  // The slab goes when its last block does (its first block shares the slab's address).
  for (void* p : small) REQUIRE(shared_host_free(p));
  CHECK_FALSE(find_shared_host_range(small[0], 1, nullptr));
  CHECK_FALSE(find_shared_host_range(small[2], 1, nullptr));
  REQUIRE(shared_host_free(big));
  CHECK(open_descriptors() == fds_before);
}

TEST_CASE("shared host memory: 1000 small blocks are all shared on a few descriptors", "[unit]") {
  // One memfd per block stopped at 256 blocks: the rest were private, so their collectives
  // copied through the segment.
  test::ScopedEnv env("MESHRT_SHM_ZERO_COPY", nullptr);
  const size_t fds_before = open_descriptors();
  enable_shared_host_memory(4096);
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) blocks.push_back(shared_host_alloc(size_t{64} << 10));
  for (void* p : blocks) {
    REQUIRE(p != nullptr);
    CHECK(find_shared_host_range(p, size_t{64} << 10, nullptr));
  }
  // 32 blocks of 64 KiB per 2 MiB slab.
  CHECK(open_descriptors() - fds_before == (1000 + 31) / 32);
  for (void* p : blocks) REQUIRE(shared_host_free(p));
  CHECK(open_descriptors() == fds_before);
}

TEST_CASE("shared host memory: every page of a slab or block is reserved when it is made",
          "[unit]") {
  // Unreserved pages of a shared mapping are a SIGBUS at their first write when the tmpfs behind
  // it is full; reserved ones count in the file's blocks at once (before: 0 blocks).
  test::ScopedEnv env("MESHRT_SHM_ZERO_COPY", nullptr);
  enable_shared_host_memory(4096);
  for (const size_t bytes : {size_t{8192}, size_t{3} << 20}) {
    INFO(bytes << " bytes");
    void* p = shared_host_alloc(bytes);
    REQUIRE(p != nullptr);
    const SharedHostRange r = range_of(p, bytes);
    struct stat st {};
    REQUIRE(fstat(r.fd, &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) == r.block_bytes);
    CHECK(static_cast<uint64_t>(st.st_blocks) * 512 >= r.block_bytes);
    CHECK(shared_host_free(p));
  }
  // The helper itself: a file sized and reserved, or the file system's error.
  const int fd = memfd_create("meshrt-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  CHECK(reserve_shared_pages(fd, 65536) == 0);
  struct stat st {};
  REQUIRE(fstat(fd, &st) == 0);
  CHECK(st.st_size == 65536);
  CHECK(st.st_blocks * 512 >= 65536);
  close(fd);
  CHECK(reserve_shared_pages(-1, 4096) == EBADF);
}
