#include "runtime/error.h"

#include <cstring>

#include "runtime/logging.h"

namespace meshrt {
namespace {

std::string with_where(const std::string& message, const std::string& where) {
  if (where.empty()) return message;
  std::ostringstream os;
  os << message << " [" << where << "]";
  return os.str();
}

}  // namespace

Error::Error(const std::string& message, const std::string& where)
    : std::runtime_error(with_where(message, where)), message_(message), where_(where) {}

Error::~Error() = default;
CommError::~CommError() = default;
OutOfMemoryError::~OutOfMemoryError() = default;
SystemError::~SystemError() = default;
AgreedError::~AgreedError() = default;

std::string error_message(const std::exception& e) {
  const auto* me = dynamic_cast<const Error*>(&e);
  if (me && !log_enabled(LogLevel::Debug)) return me->message();
  return e.what();
}

namespace {

std::string where_of(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream where;
  where << (base ? base + 1 : file) << ":" << line;
  return where.str();
}

}  // namespace

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(msg, where_of(file, line));
}

[[noreturn]] void throw_out_of_memory(const char* file, int line, const std::string& msg) {
  throw OutOfMemoryError(msg, where_of(file, line));
}

[[noreturn]] void throw_system_error(const char* file, int line, const std::string& msg) {
  throw SystemError(msg, where_of(file, line));
}

}  // namespace meshrt
