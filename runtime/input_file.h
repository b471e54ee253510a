// Files meshrt reads from the user (--data, --val-data, --cluster, flight records): one way to
// open them, so every reader refuses what would hang or never end. A FIFO would block the open
// (or the read) until some writer comes, a device such as /dev/zero never ends, a directory has no
// bytes: each is refused before any byte is read, naming the path and what it is.
#pragma once

#include <cstdint>
#include <string>

#include "meshrt/export.h"

namespace meshrt {

// An open regular file (read only, close-on-exec), closed on destruction.
class MESHRT_API InputFile {
 public:
  // Opens `path` without blocking (O_NONBLOCK, which a FIFO would otherwise need) and refuses
  // anything but a regular file (symlinks are followed): an Error starting with `what` and `path`
  // names what the path is ("a FIFO", "a directory", "a character device", ...) or why it cannot
  // be opened. `max_bytes` > 0: a file larger than that is refused too (naming both sizes).
  InputFile(const std::string& path, std::string what, uint64_t max_bytes = 0);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at open
  const std::string& path() const { return path_; }

  // The whole file, read at most `max_bytes` (the cap given, else size() at open): a file that
  // grew past the cap while being read is refused rather than read without end.
  std::string read_all();

  // Up to `n` bytes at `offset` into `buf` (pread, retried on EINTR and short reads): fewer than
  // `n` only where the file ends first (it may have shrunk since the open). Throws on a read error.
  size_t read_at(uint64_t offset, void* buf, size_t n) const;

 private:
  std::string path_, what_;
  uint64_t max_bytes_ = 0, size_ = 0;
  int fd_ = -1;
};

// "a FIFO", "a directory", "a character device", "a block device", "a socket", "a regular file"
// for a stat mode.
MESHRT_API const char* file_kind_name(unsigned mode);

// The whole of the regular file `path`, refused as InputFile does; at most `max_bytes`.
MESHRT_API std::string read_input_file(const std::string& path, const std::string& what,
                                       uint64_t max_bytes);

}  // namespace meshrt
