// MESHRT_FAULT / --fault specs (collectives/fault.h): kind@rank=R,step=S[,op=NAME][,ms=T]. A spec
// that parses must print back (FaultSpec::str) to one that parses to the same fault.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "collectives/fault.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using meshrt::detail::FaultSpec;
  FaultSpec f;
  try {
    f = meshrt::detail::parse_fault_spec(
        std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const meshrt::Error&) {
    return 0;
  }
  if (!f.active()) return 0;
  const FaultSpec g = meshrt::detail::parse_fault_spec(f.str());  // must not throw
  if (g.kind != f.kind || g.rank != f.rank || g.step != f.step || g.has_op != f.has_op ||
      (f.has_op && g.op != f.op) || g.ms != f.ms)
    std::abort();
  return 0;
}
