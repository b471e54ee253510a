// Host memory other processes of the job can map: each block a memfd mapped MAP_SHARED. Once a
// shm communicator turns it on (enable_shared_host_memory), the host caching allocator takes its
// large blocks from here, so the shm backend can run a collective between the ranks' own
// buffers (zero copy, as the threads backend does) instead of copying through its segment.
// A peer maps a block by opening /proc/<pid>/fd/<fd> (same user; no ptrace restriction).
// Blocks under 256 KiB are carved from 2 MiB slabs (one memfd each; a peer maps the whole slab),
// larger ones own a memfd; at most 256 memfds live at once, beyond that blocks are private.
// MESHRT_SHM_ZERO_COPY=0 keeps every host block private.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshrt {

// Where a range of shared host memory lies: the memfd in its owner's process of the block or
// slab holding it, that mapping's id (unique in the process, never reused), its size and the
// range's offset in it.
struct SharedHostRange {
  int fd = -1;
  uint64_t id = 0;
  uint64_t block_bytes = 0;
  uint64_t offset = 0;
};

// Blocks of at least `min_bytes` come from shared memory from now on in this process (unless
// MESHRT_SHM_ZERO_COPY=0). A forked child allocates private memory again; blocks it inherited
// stay shared with its parent.
void enable_shared_host_memory(size_t min_bytes);
bool shared_host_memory_enabled();

// A shared block of `bytes` (64-byte aligned), or nullptr when shared memory is off, the block
// is smaller than the minimum, or the system refused one (the caller then allocates privately).
void* shared_host_alloc(size_t bytes);
// Frees p when it is a shared block (true); false when it is not one.
bool shared_host_free(void* p);

// Whether [p, p + bytes) lies inside one shared block of this process, and where.
bool find_shared_host_range(const void* p, size_t bytes, SharedHostRange* out);

// Sizes the shared-memory file `fd` (a memfd, or a segment in /dev/shm) to `bytes` and reserves
// every page of it (posix_fallocate, retried on EINTR): 0, or the errno value why the file system
// refused (ENOSPC: /dev/shm is full). Every shared mapping meshrt creates is made this way, so
// that a full tmpfs is an error at creation, never a SIGBUS at the first write to a page.
int reserve_shared_pages(int fd, size_t bytes);

}  // namespace meshrt
