#include "runtime/device.h"

#include <charconv>
#include <set>

#include "runtime/backend.h"
#include "runtime/error.h"

namespace meshrt {

std::string Device::str() const {
  return std::string(is_cpu() ? "cpu:" : "cuda:") + std::to_string(index);
}

namespace {

int parse_int(std::string_view s, std::string_view spec) {
  int v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  MESHRT_CHECK(ec == std::errc() && p == s.data() + s.size() && v >= 0,
               "device spec '" << spec << "': '" << s << "' is not a non-negative integer");
  return v;
}

}  // namespace

std::vector<Device> parse_devices(std::string_view spec) {
  const char* usage = ": use cpu, cpu:N (N host ranks), cuda:I, cuda:A-B, cuda:I,J,K or cuda:all";
  std::string_view kind = spec, rest;
  if (auto c = spec.find(':'); c != std::string_view::npos) {
    kind = spec.substr(0, c);
    rest = spec.substr(c + 1);
    MESHRT_CHECK(!rest.empty(), "device spec '" << spec << "' has nothing after ':'" << usage);
  }
  std::vector<Device> out;
  if (kind == "cpu") {
    int n = rest.empty() ? 1 : parse_int(rest, spec);
    MESHRT_CHECK(n >= 1 && n <= kMaxRanksPerProcess,
                 "device spec '" << spec << "': host rank count " << n << " must be in [1, "
                                 << kMaxRanksPerProcess << "]");
    for (int i = 0; i < n; ++i) out.push_back(Device::cpu(i));
    return out;
  }
  MESHRT_CHECK(kind == "cuda",
               "device spec '" << spec << "': unknown device kind '" << kind << "'" << usage);
  if (rest.empty() || rest == "all") {
    std::string why;
    MESHRT_CHECK(cuda_available(&why), "device spec '" << spec << "': CUDA unavailable: " << why
                                                       << "; use --devices cpu:N instead");
    int n = cuda_backend()->device_count(nullptr);
    for (int i = 0; i < n; ++i) out.push_back(Device::cuda(i));
    return out;
  }
  // At most kMaxRanksPerProcess devices in all (ranges add up), duplicates refused as they come.
  std::set<int> seen;
  auto add = [&](int i) {
    MESHRT_CHECK(seen.insert(i).second,
                 "device spec '" << spec << "' names cuda:" << i << " twice");
    MESHRT_CHECK(
        out.size() < static_cast<size_t>(kMaxRanksPerProcess),
        "device spec '" << spec << "' names more than " << kMaxRanksPerProcess << " devices");
    out.push_back(Device::cuda(i));
  };
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string_view item =
        rest.substr(pos, comma == std::string_view::npos ? rest.npos : comma - pos);
    MESHRT_CHECK(!item.empty(), "device spec '" << spec << "' has an empty entry" << usage);
    if (auto dash = item.find('-'); dash != std::string_view::npos) {
      int a = parse_int(item.substr(0, dash), spec), b = parse_int(item.substr(dash + 1), spec);
      MESHRT_CHECK(a <= b, "device spec '" << spec << "': range " << a << "-" << b
                                           << " is empty; write it low-high");
      MESHRT_CHECK(b - a < kMaxRanksPerProcess, "device spec '" << spec << "': range too large");
      for (int i = a; i <= b; ++i) add(i);
    } else {
      add(parse_int(item, spec));
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace meshrt
