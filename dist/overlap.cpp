#include "dist/overlap.h"

#include "runtime/error.h"

namespace meshrt {

const char* overlap_name(Overlap o) {
  switch (o) {
    case Overlap::None:
      return "none";
    case Overlap::Async:
      return "async";
    case Overlap::Chunked:
      return "chunked";
  }
  return "?";
}

Overlap parse_overlap(std::string_view s) {
  if (s == "none") return Overlap::None;
  if (s == "async") return Overlap::Async;
  if (s == "chunked") return Overlap::Chunked;
  MESHRT_FAIL("unknown overlap mode '" << s << "': use none, async or chunked");
}

}  // namespace meshrt
