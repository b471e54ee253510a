// --mesh specs (dist/device_mesh.h): name=size pairs, checked against a world size taken from
// the first byte (0: unchecked).
#include <cstdint>
#include <string_view>

#include "dist/device_mesh.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world = data[0];
  try {
    meshrt::parse_mesh_spec(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
                            world);
  } catch (const meshrt::Error&) {
  }
  return 0;
}
