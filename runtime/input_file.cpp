#include "runtime/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "runtime/error.h"

namespace meshrt {

const char* file_kind_name(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

InputFile::InputFile(const std::string& path, std::string what, uint64_t max_bytes)
    : path_(path), what_(std::move(what)), max_bytes_(max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. Cleared below for a
  // regular file (where it changes nothing anyway).
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  MESHRT_CHECK(fd_ >= 0, what_ << " " << path << ": cannot open (" << std::strerror(errno)
                               << "); give an existing, readable file");
  struct stat st {};
  const int rc = fstat(fd_, &st);
  const int err = errno;
  if (rc != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    MESHRT_FAIL(what_ << " " << path << ": "
                      << (rc != 0 ? "cannot stat (" + std::string(std::strerror(err)) + ")"
                                  : "is " + std::string(file_kind_name(st.st_mode)) +
                                        ", not a regular file")
                      << "; give a regular file (copy a stream to a file first)");
  }
  const int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0) (void)fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(st.st_size);
  if (max_bytes_ > 0 && size_ > max_bytes_) {
    ::close(fd_);
    fd_ = -1;
    MESHRT_FAIL(what_ << " " << path << ": " << size_ << " bytes is more than the " << max_bytes_
                      << " bytes such a file may have; is it the right file?");
  }
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::read_all() {
  const uint64_t cap = max_bytes_ > 0 ? max_bytes_ : size_;
  std::string out;
  out.resize(static_cast<size_t>(size_ < cap ? size_ : cap));
  size_t n = 0;
  for (;;) {
    if (n == out.size()) {
      // Grown since the open (or a size the kernel does not know): read on, up to the cap.
      if (out.size() >= cap + 1) break;
      out.resize(static_cast<size_t>(std::min<uint64_t>(cap + 1, out.size() * 2 + 4096)));
    }
    const ssize_t r = ::read(fd_, out.data() + n, out.size() - n);
    if (r < 0 && errno == EINTR) continue;
    MESHRT_CHECK(r >= 0, what_ << " " << path_ << ": read failed (" << std::strerror(errno) << ")");
    if (r == 0) break;
    n += static_cast<size_t>(r);
  }
  MESHRT_CHECK(n <= cap, what_ << " " << path_ << ": more than " << cap
                               << " bytes (it grew while being read); give a file that is not "
                                  "being written");
  out.resize(n);
  return out;
}

size_t InputFile::read_at(uint64_t offset, void* buf, size_t n) const {
  auto* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    MESHRT_CHECK(r >= 0, what_ << " " << path_ << ": read of " << n << " bytes at offset " << offset
                               << " failed (" << std::strerror(errno) << ")");
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  InputFile f(path, what, max_bytes);
  return f.read_all();
}

}  // namespace meshrt
