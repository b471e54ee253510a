#include "tools/tune.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "bench/common/stats.h"
#include "bench/sweep/sweep.h"
#include "collectives/config_check.h"
#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/json_field.h"
#include "runtime/logging.h"
#include "runtime/output_file.h"
#include "tools/cli/cli_checks.h"
#include "tools/report.h"
#include "tools/signals.h"
#include "train/metrics_record.h"

namespace meshrt::cli {

namespace {

using nlohmann::json;
constexpr double kTnNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kTuneStop = 100;  // tune's own stop request (not a signal number)
constexpr const char* kStateName = "tune-state.json";
constexpr const char* kLockName = "tune.lock";

struct TuneTrial {
  int index = 0;  // in the full grid (lr slowest, then batch, micro-batches, mesh)
  double lr = 0;
  int64_t batch = 0;
  int micro = 1;
  std::string mesh;
  std::string label() const {
    char b[48];
    std::snprintf(b, sizeof b, "lr=%g b=%lld mb=%d", lr, static_cast<long long>(batch), micro);
    return b + (mesh.empty() ? std::string() : " " + mesh);
  }
};

struct TuneResult {
  int index = 0;
  std::string status;  // "ok", "diverged", "trailing"
  int steps = 0;
  double last_loss = kTnNaN, val_loss = kTnNaN, tokens_per_s = 0;
  std::vector<double> losses;
  int window = 1;  // tune_loss_window(--steps)
  // The training loss it is ranked by without validation data: the mean of its last steps.
  double train_loss() const { return tune_rank_loss(losses, kTnNaN, window); }
  double key() const { return tune_rank_loss(losses, val_loss, window); }
};

std::vector<double> tn_doubles(const std::string& s, const char* flag, double dflt) {
  if (s.empty()) return {dflt};
  std::vector<double> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    double x = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    MESHRT_CHECK(
        ec == std::errc() && p == item.data() + item.size() && std::isfinite(x) && x >= 0,
        flag << " " << s << ": '" << item << "' is not a number >= 0; give e.g. 1e-3,3e-3");
    v.push_back(x);
  }
  MESHRT_CHECK(!v.empty(), flag << " is empty; give e.g. 1e-3,3e-3");
  return v;
}

std::vector<std::string> tn_meshes(const std::string& s, const std::string& dflt) {
  if (s.empty()) return {dflt};
  std::vector<std::string> v;
  std::stringstream ss(s + ";");  // a trailing ';' leaves an empty last mesh
  for (std::string item; std::getline(ss, item, ';');) {
    MESHRT_CHECK(!item.empty(), "--grid-mesh " << s << ": an empty mesh; separate meshes with "
                                               << "';', e.g. 'dp=2;tp=2'");
    v.push_back(item);
  }
  return v;
}

uint64_t tn_splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The grid, or `samples` of its points drawn by a seeded Fisher-Yates shuffle (the same on every
// machine), in grid order.
std::vector<TuneTrial> tn_grid(const TuneCliOptions& o) {
  std::vector<TuneTrial> g;
  const auto lrs = tn_doubles(o.grid_lr, "--grid-lr", o.base.lr);
  const auto bs = o.grid_batch.empty() ? std::vector<int64_t>{o.base.batch}
                                       : parse_int_list(o.grid_batch, "--grid-batch");
  const auto mbs = o.grid_micro.empty() ? std::vector<int64_t>{o.base.micro_batches}
                                        : parse_int_list(o.grid_micro, "--grid-micro-batches");
  for (int64_t mb : mbs)  // each becomes a trial's --micro-batches, an int
    MESHRT_CHECK(mb <= std::numeric_limits<int>::max(),
                 "--grid-micro-batches: " << mb << " is more than "
                                          << std::numeric_limits<int>::max()
                                          << " micro-batches; give counts that divide --batch");
  for (double lr : lrs)
    for (int64_t b : bs)
      for (int64_t mb : mbs)
        for (const std::string& m : tn_meshes(o.grid_mesh, o.base.mesh))
          g.push_back({static_cast<int>(g.size()), lr, b, static_cast<int>(mb), m});
  if (o.samples <= 0 || o.samples >= static_cast<int>(g.size())) return g;
  uint64_t x = o.search_seed;
  for (size_t i = g.size() - 1; i > 0; --i) std::swap(g[i], g[tn_splitmix(x) % (i + 1)]);
  g.resize(static_cast<size_t>(o.samples));
  std::sort(g.begin(), g.end(), [](auto& a, auto& b) { return a.index < b.index; });
  return g;
}

// What a state file must match to be resumed: every shared train option and the search, in the
// order tn_fingerprint writes them.
std::vector<std::pair<std::string, std::string>> tn_fingerprint_fields(const TuneCliOptions& o) {
  std::vector<std::pair<std::string, std::string>> f = train_shared_options(o.base);
  char b[32];
  std::snprintf(b, sizeof b, "%g", o.margin);
  f.insert(f.end(), {{"grid-lr", o.grid_lr},
                     {"grid-batch", o.grid_batch},
                     {"grid-micro-batches", o.grid_micro},
                     {"grid-mesh", o.grid_mesh},
                     {"samples", std::to_string(o.samples)},
                     {"search-seed", std::to_string(o.search_seed)},
                     {"margin", b}});
  return f;
}

std::string tn_fingerprint(const TuneCliOptions& o) {
  std::string s;
  for (const auto& [k, v] : tn_fingerprint_fields(o)) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

// The flags whose values differ between a state's fingerprint and this run's ("--lr (the state:
// 0.001, this run: 0.003)"), or "" when the state's keys are not this version's.
std::string tn_fingerprint_diff(const std::string& search, const TuneCliOptions& o) {
  const auto want = tn_fingerprint_fields(o);
  std::string diff;
  size_t pos = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string head = want[i].first + "=";
    if (search.compare(pos, head.size(), head) != 0) return "";
    pos += head.size();
    const size_t end =
        i + 1 < want.size() ? search.find(" " + want[i + 1].first + "=", pos) : search.size();
    if (end == std::string::npos) return "";
    const std::string had = search.substr(pos, end - pos), name = want[i].first;
    auto shown = [](const std::string& v) { return v.empty() ? std::string("(not given)") : v; };
    if (had != want[i].second)
      diff += std::string(diff.empty() ? "" : ", ") + (name.rfind("--", 0) == 0 ? "" : "--") +
              name + " (the state: " + shown(had) + ", this run: " + shown(want[i].second) + ")";
    pos = end + 1;
  }
  return diff;
}

json tn_num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json tn_result_json(const TuneResult& r, const TuneTrial& t) {
  return {{"index", r.index},
          {"label", t.label()},
          {"lr", t.lr},
          {"batch", t.batch},
          {"micro_batches", t.micro},
          {"mesh", t.mesh},
          {"status", r.status},
          {"steps", r.steps},
          {"last_loss", tn_num(r.last_loss)},
          {"train_loss", tn_num(r.train_loss())},
          {"val_loss", tn_num(r.val_loss)},
          {"tokens_per_s", r.tokens_per_s},
          {"losses", r.losses}};
}

using TnFields = JsonFields<json>;

// A loss as the state file holds it: a number >= 0, or null for one that was not finite.
double tn_loss_field(const TnFields& t, const char* key) {
  if (t.at(key, "a loss >= 0 (or null)").is_null()) return kTnNaN;
  return t.number(key, json_at_least(0));
}

// Trial `i` of a state file, checked against the grid (`seen`: the indexes read so far).
TuneResult tn_read_trial(const TnFields& t, const TuneCliOptions& o,
                         const std::vector<TuneTrial>& grid, std::vector<int>& seen) {
  TuneResult r;
  r.window = tune_loss_window(o.base.steps);
  r.index = static_cast<int>(t.integer("index", 0, std::numeric_limits<int>::max()));
  if (std::none_of(grid.begin(), grid.end(), [&](auto& g) { return g.index == r.index; }) ||
      std::count(seen.begin(), seen.end(), r.index) > 0)
    t.fail("index", t.raw().at("index"),
           "the index of a trial of this search's grid listed once (the file was edited?)");
  seen.push_back(r.index);
  r.status = t.string("status");
  if (r.status != "ok" && r.status != "diverged" && r.status != "trailing")
    t.fail("status", t.raw().at("status"), "\"ok\", \"diverged\" or \"trailing\"");
  r.steps = static_cast<int>(t.integer("steps", 0, std::max(o.base.steps, 0)));
  r.last_loss = tn_loss_field(t, "last_loss");
  r.val_loss = tn_loss_field(t, "val_loss");
  r.tokens_per_s = t.number("tokens_per_s", json_at_least(0));
  const json& losses = t.array("losses");
  MESHRT_CHECK(losses.size() <= static_cast<size_t>(r.steps),
               t.where() << ": field '" << t.name("losses") << "' has " << losses.size()
                         << " losses but field '" << t.name("steps") << "' is " << r.steps
                         << " (one loss per step; the file was edited?)");
  for (size_t k = 0; k < losses.size(); ++k) {
    if (!losses[k].is_null() &&
        !(losses[k].is_number() && json_at_least(0).holds(losses[k].get<double>())))
      json_field_fail(t.where(), t.name("losses") + "[" + std::to_string(k) + "]",
                      json_value_text(losses[k]), "a loss >= 0 (or null)");
    r.losses.push_back(losses[k].is_null() ? kTnNaN : losses[k].get<double>());
  }
  return r;
}

// The finished trials of the state file in --out ({} when there is none); refused when it holds
// another search or a field is not what tn_write_state writes.
std::vector<TuneResult> tn_read_state(const TuneCliOptions& o, const std::vector<TuneTrial>& grid) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(o.out) / kStateName).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    MESHRT_CHECK(!ec, "tune: cannot look for " << path << ": " << ec.message());
    return {};
  }
  const json j = parse_json_text(read_input_file(path, "--out state", 64u << 20), path);
  const TnFields f(j, path);
  const std::string want =
      "\"meshrt.tune.state\" (not a meshrt tune state file; use another --out "
      "folder)";
  if (!f.has("schema")) json_field_fail(path, "schema", "", want);
  if (f.raw().at("schema") != "meshrt.tune.state") f.fail("schema", f.raw().at("schema"), want);
  f.integer("version", 1, 1);
  const std::string search = f.string("search");
  // A search that stopped before finishing a trial (e.g. its grid was refused) holds nothing to
  // resume: a rerun with other flags takes the folder over.
  if (search != tn_fingerprint(o) && f.array("trials").empty()) return {};
  if (search != tn_fingerprint(o)) {
    const std::string diff = tn_fingerprint_diff(search, o);
    MESHRT_FAIL(path << " is the state of another search ("
                     << (diff.empty() ? search : "different " + diff)
                     << "); use the same flags to resume it, or another --out folder");
  }
  const json& trials = f.array("trials");
  std::vector<TuneResult> out;
  std::vector<int> seen;
  for (size_t i = 0; i < trials.size(); ++i)
    out.push_back(tn_read_trial(TnFields(trials[i], path, "trials[" + std::to_string(i) + "]."), o,
                                grid, seen));
  return out;
}

void tn_write_state(const TuneCliOptions& o, const std::vector<TuneResult>& done,
                    const std::vector<TuneTrial>& grid) {
  json j = {{"schema", "meshrt.tune.state"}, {"version", 1}, {"search", tn_fingerprint(o)}};
  j["trials"] = json::array();
  for (const TuneResult& r : done)
    for (const TuneTrial& t : grid)
      if (t.index == r.index) j["trials"].push_back(tn_result_json(r, t));
  write_output_file((std::filesystem::path(o.out) / kStateName).string(), j.dump(1) + "\n",
                    "--out state", /*durable=*/true);
}

// The best finished trial so far (ok, lowest key), or nullptr.
const TuneResult* tn_best(const std::vector<TuneResult>& done) {
  const TuneResult* best = nullptr;
  for (const TuneResult& r : done)
    if (r.status == "ok" && std::isfinite(r.key()) && (!best || r.key() < best->key())) best = &r;
  return best;
}

}  // namespace

namespace {

std::string tn_metrics_path(const TuneCliOptions& o, int index) {
  return (std::filesystem::path(o.out) / ("trial-" + std::to_string(index) + ".jsonl")).string();
}

// Tokens/s of the median step (steps 2..N when there are more than one: step 1 warms up).
double tn_tokens_per_s(const std::vector<StepStats>& st, int64_t tokens) {
  std::vector<double> ms;
  for (size_t i = st.size() > 1 ? 1 : 0; i < st.size(); ++i) ms.push_back(st[i].step_ms);
  const double m = ms.empty() ? 0.0 : bench::median(ms);
  return m > 0 ? static_cast<double>(tokens) / (m / 1e3) : 0.0;
}

// One short training in this process. A trial that trails the best one (tune_trails) asks to
// stop (it stops after the next step).
// Every trial of `grid` on `world` ranks, checked as its run would check it: a value of a grid
// that cannot run fails the search before its first trial, not when its turn comes.
void tn_check_grid(const TrainConfig& cfg, const std::vector<TuneTrial>& grid, int world) {
  for (const TuneTrial& t : grid) {
    TrainConfig c = cfg;
    c.optim.lr = static_cast<float>(t.lr);
    c.batch = t.batch;
    c.micro_batches = t.micro;
    c.mesh = t.mesh;
    try {
      check_train_config(c, world);
    } catch (const Error& e) {
      MESHRT_FAIL("tune: trial " << t.index << " of the grid (" << t.label()
                                 << ") cannot run: " << e.message()
                                 << "; change the grid flags (--grid-*) so that every trial can");
    }
  }
}

TuneResult tn_run_trial(const TuneCliOptions& o, const TuneTrial& t, const TuneResult* best,
                        const std::vector<TuneTrial>* check_grid) {
  TrainCliOptions to = o.base;
  to.lr = static_cast<float>(t.lr);
  to.batch = t.batch;
  to.micro_batches = t.micro;
  to.mesh = t.mesh;
  to.metrics = tn_metrics_path(o, t.index);
  TrainConfig cfg = train_config(to, parse_grad_sync(to.grad_sync));
  // Under mpirun the trial's bootstrap refuses ranks that are not in the same search or trial
  // (e.g. a rank that found no state to resume in an --out it does not share).
  detail::ConfigFields same = tn_fingerprint_fields(o);
  same.emplace_back("tune trial", "#" + std::to_string(t.index) + " " + t.label());
  detail::set_process_config(std::move(same), "meshrt tune");
  const std::vector<double> curve = best ? best->losses : std::vector<double>();
  std::atomic<bool> trailing{false};
  // Every rank reports each step (threads: at once); all report the same loss.
  std::mutex mu;
  std::vector<double> mine;
  cfg.on_step = [&](const StepStats& st) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t k = static_cast<size_t>(st.step);
    if (mine.size() < k) mine.resize(k, kTnNaN);
    mine[k - 1] = st.loss;
    if (tune_trails(std::vector<double>(mine.begin(), mine.begin() + static_cast<long>(k)), curve,
                    cfg.steps, o.margin))
      trailing = true;
  };
  cfg.stop_requested = [&] {
    const int s = StopSignals::received();
    return s > 0 ? s : (trailing ? kTuneStop : 0);
  };
  TuneResult r;
  r.window = tune_loss_window(o.base.steps);
  r.index = t.index;
  std::vector<StepStats> st;
  try {
    st = run_train_once(cfg, to, nullptr, [&](int world) {
           if (check_grid) tn_check_grid(cfg, *check_grid, world);
         }).stats;
  } catch (const TrainDivergedError&) {
    r.status = "diverged";
    try {
      const auto recs = read_metrics_file(to.metrics);
      r.steps = static_cast<int>(recs.back().step);
      for (const MetricsRecord& m : recs) r.losses.push_back(m.loss);
    } catch (const Error&) {
    }
    return r;
  }
  if (StopSignals::received() != 0) {
    r.status = "interrupted";
    return r;
  }
  r.status = trailing ? "trailing" : "ok";
  r.steps = st.empty() ? 0 : st.back().step;
  for (const StepStats& s : st) r.losses.push_back(s.loss);
  if (!st.empty()) r.last_loss = st.back().loss, r.val_loss = st.back().val_loss;
  r.tokens_per_s = tn_tokens_per_s(st, t.batch * to.seq);
  return r;
}

// Finished trials sorted: ok ones by validation loss (else their train_loss), then the stopped
// ones.
std::vector<TuneResult> tn_sorted(std::vector<TuneResult> done) {
  auto rank = [](const TuneResult& r) {
    return r.status == "ok" && std::isfinite(r.key()) ? 0 : 1;
  };
  std::stable_sort(done.begin(), done.end(), [&](const TuneResult& a, const TuneResult& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (rank(a) == 0 && a.key() != b.key()) return a.key() < b.key();
    return a.index < b.index;
  });
  return done;
}

const TuneTrial& tn_trial(const std::vector<TuneTrial>& grid, int index) {
  for (const TuneTrial& t : grid)
    if (t.index == index) return t;
  MESHRT_FAIL("tune: trial " << index << " is not in the grid");
}

std::string tn_loss(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6f", x);
  return std::isfinite(x) ? b : "-";
}

void tn_print_table(const TuneCliOptions& o, const std::vector<TuneResult>& sorted,
                    const std::vector<TuneTrial>& grid, std::ostream& os) {
  std::ostringstream t;
  t << "tune: " << sorted.size() << " trials, " << o.base.steps << " steps each, sorted by "
    << (o.base.val_data.empty() ? "training loss (no --val-data)" : "validation loss")
    << " (* best; train loss: "
    << (tune_loss_window(o.base.steps) == 1
            ? std::string("the last step's")
            : "the mean of the last " + std::to_string(tune_loss_window(o.base.steps)) + " steps")
    << ")\n"
    << "   trial  lr          batch  micro  mesh          val loss  train loss   tokens/s  "
       "status\n";
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TuneResult& r = sorted[i];
    const TuneTrial& g = tn_trial(grid, r.index);
    char line[256];
    std::snprintf(
        line, sizeof line, " %s %5d  %-10g %6lld %6d  %-12s %9s  %10s %10.0f  %s (%d steps)\n",
        i == 0 && r.status == "ok" ? "*" : " ", r.index, g.lr, static_cast<long long>(g.batch),
        g.micro, g.mesh.empty() ? "-" : g.mesh.c_str(), tn_loss(r.val_loss).c_str(),
        tn_loss(r.train_loss()).c_str(), r.tokens_per_s, r.status.c_str(), r.steps);
    t << line;
  }
  print_line(os, t.str());
}

void tn_write_outputs(const TuneCliOptions& o, const std::vector<TuneResult>& sorted,
                      const std::vector<TuneTrial>& grid, std::ostream& os) {
  if (!o.json.empty()) {
    json j = {{"schema", "meshrt.tune"},
              {"version", 1},
              {"sorted_by", o.base.val_data.empty() ? "train_loss" : "val_loss"},
              {"steps", o.base.steps},
              {"loss_window", tune_loss_window(o.base.steps)},
              {"seed", o.base.seed}};
    j["best_index"] = !sorted.empty() && sorted[0].status == "ok" ? json(sorted[0].index) : json();
    j["trials"] = json::array();
    for (const TuneResult& r : sorted)
      j["trials"].push_back(tn_result_json(r, tn_trial(grid, r.index)));
    write_output_file(o.json, j.dump(2) + "\n", "--json");
    os << "wrote " << o.json << "\n";
  }
  if (o.plot.empty()) return;
  std::vector<ReportRun> runs;
  for (const TuneResult& r : sorted) {
    const std::string p = tn_metrics_path(o, r.index);
    if (std::error_code ec; std::filesystem::exists(p, ec))
      runs.push_back({"#" + std::to_string(r.index) + " " + tn_trial(grid, r.index).label(),
                      read_metrics_file(p)});
  }
  MESHRT_CHECK(!runs.empty(), "--plot: no trial wrote a metrics record");
  plot_report_runs(o.plot, runs);
  os << "wrote " << o.plot << "\n";
}

// Holds --out/tune.lock (flock, exclusive, non-blocking) while the search runs: a second tune
// on the same folder fails at once, naming the holder. The file stays when the search ends (were
// it removed, a third tune could lock a new file while a second still holds the old one); the
// lock itself dies with its process.
class TnLock {
 public:
  explicit TnLock(const std::string& out) {
    const std::string path = (std::filesystem::path(out) / kLockName).string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    MESHRT_CHECK(fd_ >= 0, "tune: --out " << out << ": cannot open the lock file " << path << ": "
                                          << std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      char buf[64] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
      ::close(fd_);
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      MESHRT_CHECK(e != EWOULDBLOCK,
                   "tune: another meshrt tune is using --out "
                       << out << " (" << (holder.empty() ? "another process" : holder) << " holds "
                       << path << "); wait for it to end or give another --out "
                       << "folder");
      MESHRT_FAIL("tune: --out " << out << ": cannot lock " << path << ": " << std::strerror(e));
    }
    const std::string me = "pid " + std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0)
      MESHRT_LOG_DEBUG("tune: cannot record the holder in " << path);
  }
  ~TnLock() { ::close(fd_); }
  TnLock(const TnLock&) = delete;
  TnLock& operator=(const TnLock&) = delete;

 private:
  int fd_ = -1;
};

// `owner`: this process owns --out (see run_tune); the others check the flags only.
void tn_check(const TuneCliOptions& o, bool owner) {
  MESHRT_CHECK(o.base.metrics.empty() && o.base.save.empty() && o.base.resume.empty(),
               "tune: --metrics, --save and --resume are tune's own (each trial's metrics go to "
               "--out/trial-N.jsonl); drop them");
  MESHRT_CHECK(
      std::isfinite(o.margin) && o.margin >= 0,
      "tune: --margin " << o.margin << " must be >= 0 (0: no early stop of trailing trials)");
  check_output_path(o.json, "--json");
  check_output_path(o.plot, "--plot");
  if (!owner) return;
  namespace fs = std::filesystem;
  std::error_code made, st;
  fs::create_directories(o.out, made);
  const bool dir = fs::is_directory(o.out, st);
  MESHRT_CHECK(dir, "tune: --out " << o.out << " is not a folder and cannot be made one"
                                   << (st     ? ": " + st.message()
                                       : made ? ": " + made.message()
                                              : "")
                                   << "; give a new or empty folder, or one a tune search made");
  // A folder a search made holds its state file from the start (run_tune writes it before the
  // first trial); files without one are someone else's, which trial-N.jsonl would replace. The
  // lock file and the state's temporary (".tune-state.json.tmp-...", write_output_file's) are
  // tune's own: a search that holds the lock and is writing its first state.
  std::error_code ec;
  bool foreign = false;
  if (!fs::exists(fs::path(o.out) / kStateName, ec)) {
    const std::string tmp = std::string(".") + kStateName + ".tmp-";
    for (auto it = fs::directory_iterator(o.out, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string n = it->path().filename().string();
      foreign = foreign || (n != kLockName && n.rfind(tmp, 0) != 0);
    }
  }
  MESHRT_CHECK(!ec, "tune: --out " << o.out << ": cannot list the folder: " << ec.message());
  MESHRT_CHECK(!foreign, "tune: --out "
                             << o.out << " holds files but no " << kStateName
                             << ": not a folder a tune search made (its trial-N.jsonl files "
                                "would replace files there); give a new or empty folder");
  check_distinct_outputs({{"--json", o.json}, {"--plot", o.plot}});
  check_outputs_spare_inputs({{"--json", o.json}, {"--plot", o.plot}},
                             {{"--data", o.base.data}, {"--val-data", o.base.val_data}});
  check_outputs_outside({{"--json", o.json}, {"--plot", o.plot}}, "--out", o.out,
                        "the search's state and trial metrics", [](const std::string& n) {
                          return n == kStateName || n == kLockName ||
                                 n.rfind(std::string(".") + kStateName, 0) == 0 ||
                                 (n.rfind("trial-", 0) == 0 && n.size() > 6);
                        });
}

}  // namespace

int tune_loss_window(int steps) { return std::clamp(steps / 10, 1, 50); }

double tune_window_mean(const std::vector<double>& losses, size_t end, int window) {
  if (end == 0 || end > losses.size() || window < 1) return kTnNaN;
  const size_t w = std::min(end, static_cast<size_t>(window));
  double sum = 0;
  for (size_t i = end - w; i < end; ++i) {
    if (!std::isfinite(losses[i])) return kTnNaN;
    sum += losses[i];
  }
  return sum / static_cast<double>(w);
}

double tune_rank_loss(const std::vector<double>& losses, double val_loss, int window) {
  if (!std::isnan(val_loss)) return val_loss;
  return tune_window_mean(losses, losses.size(), window);
}

bool tune_trails(const std::vector<double>& mine, const std::vector<double>& best, int steps,
                 double margin) {
  const size_t k = mine.size();
  if (!(margin > 0) || k == 0 || 2 * k < static_cast<size_t>(steps) || best.size() < k)
    return false;
  const int w = tune_loss_window(steps);
  const double b = tune_window_mean(best, k, w);
  if (!std::isfinite(b)) return false;
  return !(tune_window_mean(mine, k, w) <= b * (1 + margin));
}

CLI::App* add_tune_command(CLI::App& app, TuneCliOptions& o) {
  auto* c = app.add_subcommand(
      "tune",
      "Short trainings over a grid of --lr, --batch, --micro-batches and the mesh, one after "
      "another; a table sorted by validation loss; resumes an interrupted search from --out");
  add_train_flags(c, o.base);
  c->add_option("--grid-lr", o.grid_lr, "Learning rates to try, e.g. 1e-3,3e-3 (default --lr)")
      ->check(kNonEmpty);
  c->add_option("--grid-batch", o.grid_batch, "Global batches to try, e.g. 4,8 (default --batch)")
      ->check(kNonEmpty);
  c->add_option("--grid-micro-batches", o.grid_micro,
                "Micro-batch counts to try, e.g. 1,2 (default --micro-batches)")
      ->check(kNonEmpty);
  c->add_option("--grid-mesh", o.grid_mesh,
                "Meshes to try, separated by ';', e.g. 'dp=2;tp=2' (default --mesh)")
      ->check(kNonEmpty);
  c->add_option("--samples", o.samples,
                "Random search: this many grid points drawn with --search-seed (default: all)")
      ->check(cli::int_at_least(0, o.samples));
  c->add_option("--search-seed", o.search_seed, "Seed of the --samples draw")
      ->capture_default_str()
      ->check(cli::int_at_least(0, o.search_seed));
  c->add_option("--margin", o.margin,
                "Stop a trial whose loss in its second half, averaged over its last steps/10 "
                "steps (1..50), is over (1 + margin) x the best trial's over the same steps "
                "(0: never)")
      ->capture_default_str();
  c->add_option("--out", o.out, "Folder for the trials' metrics and the state a rerun resumes from")
      ->required();
  c->add_option("--json", o.json, "Write the table as JSON")->check(kNonEmpty);
  c->add_option("--plot", o.plot, "Plot the trials' metrics (as meshrt report --plot)")
      ->check(kNonEmpty);
  return c;
}

int run_tune(const TuneCliOptions& o, std::ostream& os) {
  // Under a process launch (mpirun: one rank per process) the ranks of a trial are one job: rank
  // 0's process owns --out (the checks, the lock, the state, the table); the others read the
  // state to run the same trials, and each trial's start compares them (tn_run_trial).
  const bool owner = bench::launcher_rank() == 0;
  tn_check(o, owner);
  std::optional<TnLock> lock;
  if (owner) lock.emplace(o.out);  // the folder is this process's until it returns
  StopSignals signals(owner);
  auto say = [&](const std::string& line) {
    if (owner) print_line(os, line);
  };
  const std::vector<TuneTrial> grid = tn_grid(o);
  std::vector<TuneResult> done = tn_read_state(o, grid);
  if (done.empty() && owner) tn_write_state(o, done, grid);  // the folder is this search's now
  if (!done.empty())
    say("tune: resuming from " + o.out + ": " + std::to_string(done.size()) + " of " +
        std::to_string(grid.size()) + " trials done\n");
  bool checked = false;
  for (const TuneTrial& t : grid) {
    if (std::any_of(done.begin(), done.end(), [&](auto& r) { return r.index == t.index; }))
      continue;
    // The first trial this run starts checks the whole grid first.
    TuneResult r = tn_run_trial(o, t, tn_best(done), checked ? nullptr : &grid);
    checked = true;
    if (r.status == "interrupted") {
      const int sig = StopSignals::received();
      if (owner)  // standard output closed by its reader: the line goes to stderr
        print_line(sig == SIGPIPE ? std::cerr : os,
                   std::string("tune: stopped by ") + StopSignals::name(sig) + " during trial " +
                       std::to_string(t.index) + "; " + std::to_string(done.size()) + " of " +
                       std::to_string(grid.size()) +
                       " trials done: rerun the same command to resume\n");
      return 128 + sig;
    }
    char line[160];
    std::snprintf(line, sizeof line, "trial %d (%s): %s, %d steps, loss %s, val loss %s\n", t.index,
                  t.label().c_str(), r.status.c_str(), r.steps, tn_loss(r.last_loss).c_str(),
                  tn_loss(r.val_loss).c_str());
    say(line);
    done.push_back(std::move(r));
    if (owner) tn_write_state(o, done, grid);
  }
  if (!owner) return 0;
  const std::vector<TuneResult> sorted = tn_sorted(done);
  tn_print_table(o, sorted, grid, os);
  tn_write_outputs(o, sorted, grid, os);
  return 0;
}

}  // namespace meshrt::cli
