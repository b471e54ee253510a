// safetensors files (runtime/safetensors.h): the whole loader, through a real file. Validation
// errors (meshrt::Error) are the expected outcome of bad input; anything else is a finding.
#include <cstdint>
#include <string>

#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto host = meshrt::make_host_plain_allocator();
  const std::string p = meshrt::fuzz::write_input("in.safetensors", data, size);
  try {
    const meshrt::SafetensorsFile f = meshrt::load_safetensors(p, host);
    for (const auto& [name, t] : f.tensors)
      if (static_cast<int64_t>(t.nbytes()) !=
          t.shape().numel() * static_cast<int64_t>(meshrt::dtype_size(t.dtype())))
        __builtin_trap();
  } catch (const meshrt::Error&) {
  }
  return 0;
}
