// meshrt::Error and the check macros: every failure says what failed and the values involved.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "meshrt/export.h"

namespace meshrt {

// Error, CommError, OutOfMemoryError and SystemError have their destructor out of line (error.cpp):
// that key function makes their vtable and typeinfo exist once, in libmeshrt.so, which exports them
// to its plugins (cmake/libmeshrt.map), so an error thrown in a plugin is caught by type in the
// core and the other way round, whatever the C++ runtime's rule for comparing typeinfo.
class MESHRT_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what), message_(what) {}
  // `message` plus where it was raised: what() is "message [file.cpp:line]".
  Error(const std::string& message, const std::string& where);
  Error(const Error&) = default;
  Error& operator=(const Error&) = default;
  ~Error() override;
  // The message alone (what a command line shows a user), and "file.cpp:line" or "".
  const std::string& message() const { return message_; }
  const std::string& where() const { return where_; }

 private:
  std::string message_, where_;
};

// Raised when a collective times out or a communicator was aborted.
class MESHRT_API CommError : public Error {
 public:
  using Error::Error;
  CommError(const CommError&) = default;
  CommError& operator=(const CommError&) = default;
  ~CommError() override;
};

// Raised when memory cannot be allocated (an allocator out of memory): the C API returns
// MESHRT_ERROR_OUT_OF_MEMORY for it, as for std::bad_alloc.
class MESHRT_API OutOfMemoryError : public Error {
 public:
  using Error::Error;
  OutOfMemoryError(const OutOfMemoryError&) = default;
  OutOfMemoryError& operator=(const OutOfMemoryError&) = default;
  ~OutOfMemoryError() override;
};

// Raised when the operating system refuses a resource meshrt needs that is not memory (a thread
// it cannot start: runtime/thread.h): the C API returns MESHRT_ERROR_SYSTEM for it.
class MESHRT_API SystemError : public Error {
 public:
  using Error::Error;
  SystemError(const SystemError&) = default;
  SystemError& operator=(const SystemError&) = default;
  ~SystemError() override;
};

// A user's error that every rank of a launch raises at the same point, having agreed on it (one
// verdict exchanged among the ranks, or options every rank checks alike): a checkpoint that cannot
// be read, a --save folder of another run, options that do not fit the world. No rank is left
// waiting for another, so it is not a fault: Launch::run (collectives/bootstrap.h) does not abort
// the world for it, so no flight record is written and no MPI job is aborted, and the command line
// prints it once and exits 1. Raise it only where every rank raises it.
class MESHRT_API AgreedError : public Error {
 public:
  using Error::Error;
  explicit AgreedError(const Error& e) : Error(e.message(), e.where()) {}
  AgreedError(const AgreedError&) = default;
  AgreedError& operator=(const AgreedError&) = default;
  ~AgreedError() override;
};

[[noreturn]] MESHRT_API void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] MESHRT_API void throw_out_of_memory(const char* file, int line,
                                                 const std::string& msg);
[[noreturn]] MESHRT_API void throw_system_error(const char* file, int line, const std::string& msg);

// What to show a user for `e`: a meshrt::Error's message without its source location, or with
// it (what()) when MESHRT_LOG_LEVEL is debug or trace; any other exception's what().
MESHRT_API std::string error_message(const std::exception& e);

}  // namespace meshrt

// MESHRT_CHECK(cond, "shape mismatch: a=" << a << " b=" << b)
#define MESHRT_CHECK(cond, msg)                                    \
  do {                                                             \
    if (!(cond)) {                                                 \
      std::ostringstream meshrt_os_;                               \
      meshrt_os_ << msg;                                           \
      ::meshrt::throw_error(__FILE__, __LINE__, meshrt_os_.str()); \
    }                                                              \
  } while (0)

// MESHRT_CHECK for an allocation: raises OutOfMemoryError.
#define MESHRT_CHECK_ALLOC(cond, msg)                                      \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::ostringstream meshrt_os_;                                       \
      meshrt_os_ << msg;                                                   \
      ::meshrt::throw_out_of_memory(__FILE__, __LINE__, meshrt_os_.str()); \
    }                                                                      \
  } while (0)

// MESHRT_FAIL for a resource the operating system refused: raises SystemError.
#define MESHRT_FAIL_SYSTEM(msg)                                         \
  do {                                                                  \
    std::ostringstream meshrt_os_;                                      \
    meshrt_os_ << msg;                                                  \
    ::meshrt::throw_system_error(__FILE__, __LINE__, meshrt_os_.str()); \
  } while (0)

#define MESHRT_FAIL(msg)                                         \
  do {                                                           \
    std::ostringstream meshrt_os_;                               \
    meshrt_os_ << msg;                                           \
    ::meshrt::throw_error(__FILE__, __LINE__, meshrt_os_.str()); \
  } while (0)
