#include "collectives/config_check.h"

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt::detail {

namespace {

constexpr size_t kBytes = 4096;  // per rank; longer configurations are compared by their hash

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

std::string encode(const ConfigFields& f) {
  std::string s;
  for (auto& [k, v] : f) s += k + "=" + v + "\n";
  return s;
}

ConfigFields decode(const std::string& s) {
  ConfigFields f;
  std::istringstream is(s);
  std::string line;
  while (std::getline(is, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    f.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return f;
}

}  // namespace

std::string config_mismatch(const std::vector<ConfigFields>& by_rank, const std::string& what) {
  std::map<std::string, std::vector<std::string>> values;  // field -> value per rank
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    for (auto& [k, v] : by_rank[r]) {
      auto [it, fresh] = values.emplace(k, std::vector<std::string>(by_rank.size(), "(unset)"));
      if (fresh) order.push_back(k);
      it->second[r] = v;
    }
  }
  std::ostringstream os;
  bool any = false;
  for (const std::string& k : order) {
    const auto& vs = values[k];
    bool same = true;
    for (const auto& v : vs) same = same && v == vs[0];
    if (same) continue;
    os << (any ? "; " : "") << k << ":";
    for (size_t r = 0; r < vs.size(); ++r)
      os << (r ? "," : "") << " rank " << r << " has " << vs[r];
    any = true;
  }
  if (!any) return "";
  return "the ranks of this " + what + " were started with different configurations (" + os.str() +
         "): start every rank with the same options";
}

void check_same_config(Communicator& world, const ConfigFields& fields, const std::string& what) {
  if (world.size() == 1 || !world.device().is_cpu()) return;
  const std::string text = encode(fields);
  const uint64_t h = fnv(text);
  auto alloc = make_host_caching_allocator();
  auto stream = make_host_stream("config-check");
  Tensor mine = Tensor::empty(Shape{static_cast<int64_t>(kBytes)}, DType::u8, alloc);
  Tensor all = Tensor::empty(Shape{static_cast<int64_t>(kBytes) * world.size()}, DType::u8, alloc);
  auto* p = static_cast<char*>(mine.data_ptr());
  std::memset(p, 0, kBytes);
  std::memcpy(p, &h, sizeof(h));
  std::memcpy(p + sizeof(h), text.data(), std::min(text.size(), kBytes - sizeof(h) - 1));
  world.all_gather(mine, all, *stream).synchronize();
  const auto* q = static_cast<const char*>(all.data_ptr());
  std::vector<ConfigFields> by_rank;
  bool same = true;
  for (int r = 0; r < world.size(); ++r) {
    const char* b = q + static_cast<size_t>(r) * kBytes;
    uint64_t hr = 0;
    std::memcpy(&hr, b, sizeof(hr));
    same = same && hr == h;
    by_rank.push_back(
        decode(std::string(b + sizeof(hr), strnlen(b + sizeof(hr), kBytes - sizeof(hr)))));
  }
  if (same) return;
  std::string msg = config_mismatch(by_rank, what);
  if (msg.empty()) {
    msg = "the ranks of this " + what +
          " were started with different configurations (they differ beyond the first " +
          std::to_string(kBytes) + " bytes): start every rank with the same options";
  }
  throw Error(msg);
}

namespace {

struct ProcessConfig {
  std::mutex mu;
  bool set = false;
  ConfigFields fields;
  std::string what;
};
ProcessConfig& process_config() {
  static ProcessConfig c;
  return c;
}

}  // namespace

void set_process_config(ConfigFields fields, std::string what) {
  ProcessConfig& c = process_config();
  std::lock_guard<std::mutex> lk(c.mu);
  c.set = true;
  c.fields = std::move(fields);
  c.what = std::move(what);
}

void check_process_config(Communicator& world) {
  ConfigFields fields;
  std::string what;
  {
    ProcessConfig& c = process_config();
    std::lock_guard<std::mutex> lk(c.mu);
    if (!c.set) return;
    fields = c.fields;
    what = c.what;
  }
  check_same_config(world, fields, what);
}

}  // namespace meshrt::detail
