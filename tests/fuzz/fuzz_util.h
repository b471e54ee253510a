// Shared by the fuzz targets: inputs that parsers read from files, and the rule for what a
// target may throw.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "tests/common/files.h"

namespace meshrt::fuzz {

// A folder of this process's own (in /dev/shm when it is there: fuzzing writes a file per input),
// removed at exit (tests/common/files.h).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::error_code ec;
    const bool shm =
        std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0;
    return test::scratch_dir("fuzz", shm ? std::filesystem::path("/dev/shm")
                                         : std::filesystem::temp_directory_path())
        .string();
  }();
  return dir;
}

// Writes `data` to <scratch>/<name> (replacing it) and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string p = scratch_dir() + "/" + name;
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  return p;
}

}  // namespace meshrt::fuzz
