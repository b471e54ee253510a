// --devices specs (runtime/device.h): cpu, cpu:N, cuda:I, cuda:A-B, cuda:I,J,K, cuda:all.
#include <cstdint>
#include <string_view>

#include "runtime/device.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    meshrt::parse_devices(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const meshrt::Error&) {
  }
  return 0;
}
