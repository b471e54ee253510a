// `train --metrics` records as `meshrt report` reads them (train/metrics_record.h): any line either
// parses or throws meshrt::Error; a record that parses has its ranks in order and a valid
// straggler rank.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runtime/error.h"
#include "train/metrics_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  meshrt::MetricsRecord r;
  try {
    r = meshrt::parse_metrics_record(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const meshrt::Error&) {
    return 0;
  }
  if (r.ranks.empty() || r.step < 1 || r.straggler_rank < -1 ||
      r.straggler_rank >= static_cast<int>(r.ranks.size()))
    std::abort();
  for (size_t i = 0; i < r.ranks.size(); ++i)
    if (r.ranks[i].rank != static_cast<int>(i)) std::abort();
  return 0;
}
