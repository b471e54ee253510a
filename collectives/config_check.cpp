#include "collectives/config_check.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "runtime/env.h"

namespace meshrt::detail {

namespace {

// One "name=value" line per field (a line break inside a value is written as "\\n").
std::string encode(const ConfigFields& f) {
  std::string s;
  for (auto& [k, v] : f) {
    s += k + "=";
    for (char c : v) s += c == '\n' ? std::string("\\n") : std::string(1, c);
    s += "\n";
  }
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

namespace {

// "field: rank 0 has a, rank 1 has b; ..." for the fields whose values differ ("" when none). A
// rank in `failed` that never set a field (its value "(unset)") does not count for that field.
std::string differing_fields(const std::vector<ConfigFields>& by_rank,
                             const std::vector<std::string>& failed) {
  std::map<std::string, std::vector<std::string>> values;  // field -> value per rank
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    for (auto& [k, v] : by_rank[r]) {
      if (k == kConfigFailure) continue;
      auto [it, fresh] = values.emplace(k, std::vector<std::string>(by_rank.size(), "(unset)"));
      if (fresh) order.push_back(k);
      it->second[r] = v;
    }
  }
  // Ranks running different commands (or one that refused its options) differ in that alone.
  auto cmd = values.find("command");
  if (cmd != values.end() && std::any_of(cmd->second.begin(), cmd->second.end(),
                                         [&](const std::string& v) { return v != cmd->second[0]; }))
    order = {"command"};
  std::ostringstream os;
  bool any = false;
  for (const std::string& k : order) {
    const auto& vs = values[k];
    const std::string* first = nullptr;
    bool same = true;
    for (size_t r = 0; r < vs.size(); ++r) {
      if (!failed[r].empty() && vs[r] == "(unset)") continue;  // not reached by a failed rank
      if (first == nullptr) first = &vs[r];
      same = same && vs[r] == *first;
    }
    if (same) continue;
    os << (any ? "; " : "") << k << ":";
    for (size_t r = 0; r < vs.size(); ++r)
      os << (r ? "," : "") << " rank " << r << " has " << vs[r];
    any = true;
  }
  return os.str();
}

}  // namespace

std::string config_mismatch(const std::vector<ConfigFields>& by_rank, const std::string& what) {
  std::vector<std::string> failed(by_rank.size());
  for (size_t r = 0; r < by_rank.size(); ++r)
    for (auto& [k, v] : by_rank[r])
      if (k == kConfigFailure) failed[r] = v;
  const std::string fields = differing_fields(by_rank, failed);
  if (!fields.empty())
    return "the ranks of this " + what + " were started with different configurations (" + fields +
           "): start every rank with the same options and environment";
  // The same configuration, but some rank failed before the check (its environment, its files):
  // its error, not the fields it never set.
  std::string why;
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (!failed[r].empty())
      why += (why.empty() ? "rank " : "; rank ") + std::to_string(r) + " failed: " + failed[r];
  if (why.empty()) return "";
  return "the ranks of this " + what + " did not all start (" + why +
         "): fix what that rank was started with (its environment, files or options)";
}

void check_same_config(BootstrapTransport& t, const ConfigFields& fields, const std::string& what) {
  if (t.size() == 1) return;
  // The command first: ranks running different commands differ there, not in every option.
  ConfigFields mine{{"command", what}};
  mine.insert(mine.end(), fields.begin(), fields.end());
  for (auto& f : env_rank_shared_settings()) mine.push_back(std::move(f));
  const std::vector<std::string> all = t.all_gather("config", encode(mine));
  std::vector<ConfigFields> by_rank;
  bool same = true;
  for (const std::string& s : all) {
    same = same && s == all[static_cast<size_t>(t.rank())];
    by_rank.push_back(decode(s));
  }
  if (same) return;
  throw ConfigMismatchError(config_mismatch(by_rank, what));
}

namespace {

struct ProcessConfig {
  std::mutex mu;
  bool set = false;
  bool checked = false;
  ConfigFields fields;
  std::string what, failure;
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
  c.checked = false;
  c.fields = std::move(fields);
  c.what = std::move(what);
  c.failure.clear();
}

void set_process_failure(const std::string& error) {
  ProcessConfig& c = process_config();
  std::lock_guard<std::mutex> lk(c.mu);
  c.failure = error.empty() ? std::string("(no message)") : error;
}

void check_process_config(BootstrapTransport& t) {
  ConfigFields fields;
  std::string what;
  {
    ProcessConfig& c = process_config();
    std::lock_guard<std::mutex> lk(c.mu);
    if (!c.set || c.checked) return;
    c.checked = true;
    fields = c.fields;
    what = c.what;
    if (!c.failure.empty()) fields.emplace_back(kConfigFailure, c.failure);
  }
  check_same_config(t, fields, what);
}

bool process_config_unchecked() {
  ProcessConfig& c = process_config();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.set && !c.checked;
}

}  // namespace meshrt::detail
