#include "runtime/error.h"

#include <cstring>

namespace meshrt {

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream os;
  os << msg << " [" << (base ? base + 1 : file) << ":" << line << "]";
  throw Error(os.str());
}

}  // namespace meshrt
