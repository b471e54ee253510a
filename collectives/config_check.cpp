#include "collectives/config_check.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

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
  // Ranks running different commands (or one that refused its options) differ in that alone.
  auto cmd = values.find("command");
  if (cmd != values.end() && std::any_of(cmd->second.begin(), cmd->second.end(),
                                         [&](const std::string& v) { return v != cmd->second[0]; }))
    order = {"command"};
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

void check_same_config(BootstrapTransport& t, const ConfigFields& fields, const std::string& what) {
  if (t.size() == 1) return;
  // The command first: ranks running different commands differ there, not in every option.
  ConfigFields mine{{"command", what}};
  mine.insert(mine.end(), fields.begin(), fields.end());
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
  c.checked = false;
  c.fields = std::move(fields);
  c.what = std::move(what);
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
  }
  check_same_config(t, fields, what);
}

bool process_config_unchecked() {
  ProcessConfig& c = process_config();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.set && !c.checked;
}

}  // namespace meshrt::detail
