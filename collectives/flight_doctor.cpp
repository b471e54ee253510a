#include "collectives/flight_doctor.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "collectives/comm_detail.h"
#include "runtime/error.h"

namespace meshrt::detail {

namespace {

using nlohmann::json;

struct Entry {
  std::string group, gid, op, dtype, redop, stream, state, note;
  int group_rank = 0, group_size = 0, root = -1, peer = -1;
  uint64_t seq = 0;
  int64_t count = 0, bytes = 0, enqueue_ns = 0, start_ns = 0, end_ns = 0;
  std::vector<int> data_bad;  // group ranks the data check named (optional field)
  bool collective() const { return op != "send" && op != "recv"; }
  bool open() const { return state == "issued" || state == "started"; }
  // What ranks must agree on (as CallSig::matches).
  std::string sig() const {
    std::ostringstream os;
    os << op << "(";
    if (op == "split") return "split()";
    if (op != "barrier") {
      os << dtype << ", count=" << count;
      if (op == "all_reduce" || op == "reduce_scatter") os << ", " << redop;
      if (op == "broadcast") os << ", root=" << root;
    }
    os << ")";
    return os.str();
  }
};

constexpr int kFlightVersion =
    1;  // "meshrt_flight": the format version collectives/flight.cpp writes

struct Record {
  std::string path, backend, fault, reason, job;
  int rank = -1, world_size = 0;
  int64_t dumped_ns = 0;
  std::vector<Entry> entries;
};

template <class T>
T field(const json& j, const char* key, const std::string& path) {
  MESHRT_CHECK(j.contains(key), path << ": not a meshrt flight record (no '" << key << "')");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    MESHRT_FAIL(path << ": field '" << key << "' has the wrong type: " << e.what());
  }
}

Record parse(const FlightFile& f) {
  json j;
  try {
    j = json::parse(f.text);
  } catch (const json::exception& e) {
    MESHRT_FAIL(f.path << ": not JSON (" << e.what() << "); pass meshrt-flight-<rank>.json files");
  }
  MESHRT_CHECK(j.is_object() && j.contains("meshrt_flight"),
               f.path << ": not a meshrt flight record (no 'meshrt_flight' field)");
  const json& v = j.at("meshrt_flight");
  MESHRT_CHECK(v.is_number_integer() && v.get<int64_t>() == kFlightVersion,
               f.path << ": flight record format version " << v.dump()
                      << "; this meshrt reads version " << kFlightVersion
                      << " (written by another meshrt?)");
  Record r;
  r.path = f.path;
  r.rank = field<int>(j, "rank", f.path);
  r.world_size = field<int>(j, "world_size", f.path);
  r.backend = field<std::string>(j, "backend", f.path);
  r.fault = field<std::string>(j, "fault", f.path);
  r.reason = field<std::string>(j, "reason", f.path);
  r.dumped_ns = field<int64_t>(j, "dumped_ns", f.path);
  if (j.contains("job")) r.job = field<std::string>(j, "job", f.path);
  MESHRT_CHECK(
      r.rank >= 0 && r.world_size >= 1 && r.rank < r.world_size && r.world_size <= (1 << 24),
      f.path << ": rank " << r.rank << " outside world size " << r.world_size);
  const json& es = j.contains("entries") ? j.at("entries") : json::array();
  MESHRT_CHECK(es.is_array(), f.path << ": 'entries' is not a list");
  for (const json& e : es) {
    MESHRT_CHECK(e.is_object(), f.path << ": an entry is not an object");
    Entry x;
    x.group = field<std::string>(e, "group", f.path);
    x.gid = field<std::string>(e, "gid", f.path);
    x.op = field<std::string>(e, "op", f.path);
    x.dtype = field<std::string>(e, "dtype", f.path);
    x.redop = field<std::string>(e, "redop", f.path);
    x.stream = field<std::string>(e, "stream", f.path);
    x.state = field<std::string>(e, "state", f.path);
    x.note = field<std::string>(e, "note", f.path);
    x.group_rank = field<int>(e, "group_rank", f.path);
    x.group_size = field<int>(e, "group_size", f.path);
    x.root = field<int>(e, "root", f.path);
    x.peer = field<int>(e, "peer", f.path);
    x.seq = field<uint64_t>(e, "seq", f.path);
    x.count = field<int64_t>(e, "count", f.path);
    x.bytes = field<int64_t>(e, "bytes", f.path);
    x.enqueue_ns = field<int64_t>(e, "enqueue_ns", f.path);
    x.start_ns = field<int64_t>(e, "start_ns", f.path);
    x.end_ns = field<int64_t>(e, "end_ns", f.path);
    if (e.contains("data_bad")) {
      x.data_bad = field<std::vector<int>>(e, "data_bad", f.path);
      for (int gr : x.data_bad) {
        MESHRT_CHECK(gr >= 0 && gr < x.group_size, f.path << ": data_bad names group rank " << gr
                                                          << " outside the group of "
                                                          << x.group_size);
      }
    }
    r.entries.push_back(std::move(x));
  }
  return r;
}

std::vector<Record> parse_all(const std::vector<FlightFile>& files) {
  MESHRT_CHECK(!files.empty(), "meshrt doctor: no flight records given (meshrt-flight-*.json)");
  std::vector<Record> rs;
  std::map<int, std::string> seen;
  std::string job, job_path;  // the first record naming its job
  for (const FlightFile& f : files) {
    Record r = parse(f);
    if (!r.job.empty() && !job.empty())
      MESHRT_CHECK(r.job == job, "meshrt doctor: " << job_path << " is a record of job " << job
                                                   << " but " << f.path << " is of job " << r.job
                                                   << ": pass the records of one job");
    if (job.empty() && !r.job.empty()) {
      job = r.job;
      job_path = f.path;
    }
    auto [it, fresh] = seen.emplace(r.rank, f.path);
    MESHRT_CHECK(fresh, "meshrt doctor: " << f.path << " and " << it->second
                                          << " are both records of rank " << r.rank
                                          << ": pass one file per rank, from one job");
    rs.push_back(std::move(r));
  }
  std::sort(rs.begin(), rs.end(), [](const Record& a, const Record& b) { return a.rank < b.rank; });
  return rs;
}

std::string ms(int64_t ns) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(ns >= 10000000 ? 0 : 1) << ns / 1e6 << " ms";
  return os.str();
}

// One group instance across ranks.
struct Group {
  std::string name;
  int size = 0;
  std::map<int, int> global_of;                        // group rank -> global rank
  std::map<int, std::map<uint64_t, const Entry*>> by;  // global rank -> seq -> entry
};

// Of two equal sides mismatched at `seq` (sigs: call -> global ranks), the call of the side
// running one call ahead (it skipped one): the side whose current call is the other side's next
// one (or whose previous call is the other's current one, when the skip repeated calls), or
// failing that evidence, the side whose record notes an injected skip on this group (`skipped`).
// "" when neither tells them apart.
std::string side_ahead(const Group& g, const std::map<std::string, std::vector<int>>& sigs,
                       uint64_t seq, const std::set<int>& skipped) {
  auto call_at = [&g](int w, uint64_t q) -> std::string {
    auto it = g.by.find(w);
    if (it == g.by.end() || !it->second.count(q)) return "";
    return it->second.at(q)->sig();
  };
  auto runs_ahead = [&](int x, int y) {
    const std::string next_of_y = call_at(y, seq + 1), prev_of_x = call_at(x, seq - 1);
    return (!next_of_y.empty() && next_of_y == call_at(x, seq)) ||
           (seq > 1 && !prev_of_x.empty() && prev_of_x == call_at(y, seq));
  };
  const int a = sigs.begin()->second.front(), b = sigs.rbegin()->second.front();
  bool a_ahead = runs_ahead(a, b), b_ahead = runs_ahead(b, a);
  if (a_ahead == b_ahead) {
    a_ahead = skipped.count(a) > 0;
    b_ahead = skipped.count(b) > 0;
  }
  if (a_ahead == b_ahead) return "";
  return a_ahead ? sigs.begin()->first : sigs.rbegin()->first;
}

bool seqs_all_completed(const Group& g) {
  for (auto& [w, seqs] : g.by) {
    for (auto& [q, e] : seqs) {
      if (e->state != "completed") return false;
    }
  }
  return true;
}

}  // namespace

DoctorReport flight_diagnose(const std::vector<FlightFile>& files) {
  const std::vector<Record> rs = parse_all(files);
  DoctorReport rep;
  std::ostringstream os;
  int world = 0;
  std::set<int> have;
  for (const Record& r : rs) {
    world = std::max(world, r.world_size);
    have.insert(r.rank);
  }
  std::vector<int> no_record;
  for (int w = 0; w < world; ++w) {
    if (!have.count(w)) no_record.push_back(w);
  }
  os << "meshrt doctor: " << rs.size() << " flight record" << (rs.size() == 1 ? "" : "s")
     << " of a world of " << world << " (" << rs.front().backend << " backend)\n";
  if (!no_record.empty()) {
    os << "  " << format_ranks(no_record)
       << " left no record (killed or crashed before writing one, or the file was not given)\n";
  }
  // Why the first record was written (the others were written for the same failure, seen
  // from their rank).
  os << "  why written (rank " << rs.front().rank << "): " << rs.front().reason << "\n";
  // Injected faults the records mention (the recorder logs them; the diagnosis below does not
  // use them).
  for (const Record& r : rs) {
    for (const Entry& e : r.entries) {
      if (!e.note.empty()) {
        os << "  recorded on rank " << r.rank << ": " << e.note << " at " << e.sig()
           << " on group '" << e.group << "'"
           << (e.seq ? " seq " + std::to_string(e.seq) : std::string()) << "\n";
        break;
      }
    }
  }

  std::map<std::string, Group> groups;                 // by gid
  std::map<std::string, std::set<int>> injected_skip;  // gid -> ranks whose record notes one
  for (const Record& r : rs)
    for (const Entry& e : r.entries)
      if (e.note == "injected skip") injected_skip[e.gid].insert(r.rank);
  for (const Record& r : rs) {
    for (const Entry& e : r.entries) {
      if (!e.collective() || e.seq == 0) continue;
      Group& g = groups[e.gid];
      g.name = e.group;
      g.size = e.group_size;
      g.global_of[e.group_rank] = r.rank;
      g.by[r.rank][e.seq] = &e;
    }
  }
  // Open collectives: the ranks that were waiting when they wrote their record (the first
  // entry not completed).
  std::set<int> blocked;
  for (const Record& r : rs) {
    for (const Entry& e : r.entries) {
      // Open, or failed (it timed out or was aborted while waiting): either way inside a call.
      if ((e.open() || e.state == "failed") && e.collective()) {
        blocked.insert(r.rank);
        os << "  rank " << r.rank << " was inside " << e.sig() << " seq " << e.seq << " on group '"
           << e.group << "' (" << e.state << ", "
           << ms(r.dumped_ns - (e.start_ns ? e.start_ns : e.enqueue_ns)) << " before its record)\n";
        break;
      }
    }
  }

  // The call the first rank to wait started waiting in.
  std::string earliest_open;
  {
    int64_t t = INT64_MAX;
    for (const Record& r : rs) {
      for (const Entry& e : r.entries) {
        if (e.open() && e.collective() && e.start_ns > 0 && e.start_ns < t) {
          t = e.start_ns;
          earliest_open = e.sig() + " seq " + std::to_string(e.seq) + " on group '" + e.group + "'";
        }
      }
    }
  }
  std::set<int> culprits;  // from a call mismatch (the strongest evidence), else silent / skew
  std::string culprit_call;
  std::set<int> behind_idle, behind_blocked;
  bool mismatch_found = false;  // ranks that never reached a call others issued
  std::string behind_call;
  int64_t behind_t = INT64_MAX;
  int behind_rank = 2;  // 0: a group where an idle rank is behind; 1: only blocked ones
  std::ostringstream findings;
  for (auto& [gid, g] : groups) {
    // Members: ranks with entries, plus (for a world-sized 'world') the ranks with no record.
    std::vector<int> members;
    for (auto& [gr, w] : g.global_of) members.push_back(w);
    std::vector<int> unknown;
    if (g.name == "world" && g.size == world) {
      for (int w : no_record) members.push_back(w);
    } else {
      for (int gr = 0; gr < g.size; ++gr) {
        if (!g.global_of.count(gr)) unknown.push_back(gr);
      }
    }
    std::sort(members.begin(), members.end());
    // The window every present member still holds (rings drop old entries).
    uint64_t lo = 1, hi = 0;
    for (auto& [w, seqs] : g.by) {
      lo = std::max(lo, seqs.begin()->first);
      hi = std::max(hi, seqs.rbegin()->first);
    }
    // A failed data check (MESHRT_COMM_DEBUG=1): every rank computed the same verdict.
    for (uint64_t s = lo; s <= hi && !mismatch_found; ++s) {
      std::set<int> bad;
      const Entry* at = nullptr;
      for (auto& [w, seqs] : g.by) {
        auto it = seqs.find(s);
        if (it == seqs.end() || it->second->data_bad.empty()) continue;
        at = it->second;
        for (int gr : at->data_bad) {
          auto gw = g.global_of.find(gr);
          if (gw != g.global_of.end()) bad.insert(gw->second);
        }
      }
      if (at == nullptr || bad.empty()) continue;
      findings << "  group '" << g.name << "' seq " << s << ": " << at->sig()
               << " failed its data check: the data of " << format_ranks({bad.begin(), bad.end()})
               << " disagreed with what the ranks sent\n";
      mismatch_found = true;
      culprits = bad;
      culprit_call = at->sig() + " seq " + std::to_string(s) + " on group '" + g.name +
                     "' (its data disagreed with the other ranks')";
    }
    // Mismatched signatures.
    for (uint64_t s = lo; s <= hi; ++s) {
      std::map<std::string, std::vector<int>> sigs;
      for (auto& [w, seqs] : g.by) {
        auto it = seqs.find(s);
        if (it != seqs.end()) sigs[it->second->sig()].push_back(w);
      }
      if (sigs.size() < 2) continue;
      findings << "  group '" << g.name << "' seq " << s << ": mismatched calls:";
      size_t fewest = SIZE_MAX;
      for (auto& [sig, ws] : sigs) {
        findings << " " << format_ranks(ws) << " called " << sig << ";";
        fewest = std::min(fewest, ws.size());
      }
      findings << "\n";
      if (!mismatch_found) {
        mismatch_found = true;
        culprits.clear();
        // Two sides of one size: the one that skipped a call, "" when a tie cannot tell.
        const bool two_sides =
            sigs.size() == 2 && sigs.begin()->second.size() == sigs.rbegin()->second.size();
        const std::string ahead = two_sides ? side_ahead(g, sigs, s, injected_skip[gid]) : "";
        const bool tie = two_sides && ahead.empty();
        bool named = false;
        for (auto& [sig, ws] : sigs) {
          if (tie || (ahead.empty() ? ws.size() == fewest : sig == ahead)) {
            culprits.insert(ws.begin(), ws.end());
            if (!named)
              culprit_call = sig + " seq " + std::to_string(s) + " on group '" + g.name + "'";
            named = true;
            if (!tie) break;
          }
        }
      }
      break;
    }
    // The first sequence number some member with a record never reached.
    uint64_t first = hi + 1;
    for (auto& [w, seqs] : g.by) {
      const uint64_t last = seqs.rbegin()->first;
      if (last < hi) first = std::min(first, std::max(last + 1, lo));
    }
    // Members without any record: where the others got to is all that is known.
    std::vector<int> silent;
    for (int w : members) {
      if (!g.by.count(w)) silent.push_back(w);
    }
    if (!silent.empty() && first > hi && hi > 0) {
      std::vector<int> present;
      uint64_t at = hi;  // the first call the others did not finish (where they waited)
      for (auto& [w, seqs] : g.by) {
        present.push_back(w);
        for (auto& [q, e] : seqs) {
          if (e->state != "completed") {
            at = std::min(at, q);
            break;
          }
        }
      }
      std::string sig;
      for (auto& [w, seqs] : g.by) {
        if (sig.empty() && seqs.count(at)) sig = seqs.at(at)->sig();
      }
      if (seqs_all_completed(g)) {
        // Nobody waits here: the others moved on to groups the silent ranks belong to.
        findings << "  group '" << g.name << "' (" << g.size << " ranks): " << format_ranks(silent)
                 << " left no record; the others finished every call on it they issued\n";
        if (culprits.empty()) {
          culprits.insert(silent.begin(), silent.end());
          culprit_call = earliest_open.empty()
                             ? "(no record)"
                             : earliest_open + " (where the others waited; no record of its own)";
        }
        continue;
      }
      findings << "  group '" << g.name << "' (" << g.size << " ranks): " << format_ranks(present)
               << " issued up to seq " << hi << " and stopped at seq " << at << " (" << sig << "); "
               << format_ranks(silent) << " left no record\n";
      if (culprits.empty()) {
        culprits.insert(silent.begin(), silent.end());
        culprit_call = sig + " seq " + std::to_string(at) + " on group '" + g.name +
                       "' (where the others waited; no record of its own)";
      }
    }
    if (first <= hi || !unknown.empty()) {
      std::vector<int> did, didnt;
      std::string sig;
      for (int w : members) {
        auto it = g.by.find(w);
        if (it == g.by.end()) continue;  // no record: reported above
        const bool reached = it != g.by.end() && it->second.rbegin()->first >= first;
        (reached ? did : didnt).push_back(w);
        if (reached && sig.empty() && it->second.count(first)) sig = it->second.at(first)->sig();
      }
      if (first <= hi) {
        findings << "  group '" << g.name << "' (" << g.size << " ranks): first divergence at seq "
                 << first << " (" << sig << "): " << format_ranks(did) << " reached it; "
                 << format_ranks(didnt) << " never did";
        for (int w : didnt) {
          auto it = g.by.find(w);
          if (it == g.by.end()) continue;
          const Entry& last = *it->second.rbegin()->second;
          findings << "; rank " << w << "'s last there: " << last.sig() << " seq " << last.seq
                   << " (" << last.state << ")";
        }
        findings << "\n";
        // Ranks behind here but waiting inside another collective are blocked, not culprits.
        for (int w : didnt) {
          (blocked.count(w) ? behind_blocked : behind_idle).insert(w);
        }
        // The call to name: of the groups where an idle rank is behind, the one the others
        // entered first.
        int64_t t = INT64_MAX;
        for (int w : did) {
          auto it = g.by.find(w);
          if (it != g.by.end() && it->second.count(first)) {
            const Entry& e = *it->second.at(first);
            t = std::min(t, e.start_ns ? e.start_ns : e.enqueue_ns);
          }
        }
        const bool has_idle =
            std::any_of(didnt.begin(), didnt.end(), [&](int w) { return !blocked.count(w); });
        const int rank_of_group = has_idle ? 0 : 1;
        if (behind_call.empty() || rank_of_group < behind_rank ||
            (rank_of_group == behind_rank && t < behind_t)) {
          behind_call = sig + " seq " + std::to_string(first) + " on group '" + g.name + "'";
          behind_t = t;
          behind_rank = rank_of_group;
        }
      }
      if (!unknown.empty()) {
        findings << "  group '" << g.name << "': no record from group rank";
        for (size_t i = 0; i < unknown.size(); ++i) findings << (i ? ", " : " ") << unknown[i];
        findings << " (its global rank is unknown)\n";
      }
    }
    // Arrival skew (same-node clocks only): over the collectives every member issued, each
    // rank's lag behind the first to issue. A rank is late when its median lag is at least
    // 25 ms over at least 4 collectives. The median, not who came last most often: a scheduler
    // stall of another rank now and then makes that rank last once, but leaves the slow rank's
    // lag behind the first arrival unchanged.
    if (g.by.size() >= 2) {
      std::map<int, std::vector<int64_t>> lags;  // rank -> lag behind the first, per collective
      std::map<int, int> last_in;                // rank -> collectives it issued last
      int n = 0;
      for (uint64_t s = lo; s <= hi; ++s) {
        std::vector<std::pair<int, int64_t>> at;
        for (auto& [w, seqs] : g.by) {
          auto it = seqs.find(s);
          if (it == seqs.end()) break;
          at.emplace_back(w, it->second->enqueue_ns);
        }
        if (at.size() != g.by.size()) continue;
        auto cmp = [](const auto& a, const auto& b) { return a.second < b.second; };
        const int64_t t0 = std::min_element(at.begin(), at.end(), cmp)->second;
        ++last_in[std::max_element(at.begin(), at.end(), cmp)->first];
        for (auto& [w, t] : at) lags[w].push_back(t - t0);
        ++n;
      }
      std::set<int> slow;
      if (n >= 4) {
        for (auto& [w, v] : lags) {
          std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2),
                           v.end());
          const int64_t median = v[v.size() / 2];
          if (median < 25'000'000) continue;
          findings << "  group '" << g.name << "': skew: rank " << w << " issued last in "
                   << last_in[w] << " of " << n << " collectives, a median " << ms(median)
                   << " after the first rank\n";
          slow.insert(w);
        }
      }
      if (culprits.empty() && !slow.empty()) {
        culprits = slow;
        culprit_call = "every collective on group '" + g.name + "' (slow, not stopped)";
      }
    }
  }
  // Ranks behind that were not waiting elsewhere come before ranks without a record and skew.
  if (!mismatch_found && (!behind_idle.empty() || !behind_blocked.empty())) {
    culprits = behind_idle.empty() ? behind_blocked : behind_idle;
    culprit_call = behind_call;
  }
  // A rank whose record was written as it crashed (a fatal signal other than the launcher's
  // SIGTERM, or an injected crash) comes before ranks without a record.
  if (culprits.empty()) {
    for (const Record& r : rs) {
      const bool fatal =
          r.reason.rfind("fatal signal", 0) == 0 && r.reason.rfind("fatal signal 15 ", 0) != 0;
      if (fatal || r.reason.rfind("crash", 0) == 0) {
        culprits.insert(r.rank);
        culprit_call = "(crashed) " + r.reason.substr(0, 160);
      }
    }
  }
  // A rank without a record in a world whose others all waited: it is the one to look at.
  if (culprits.empty() && !no_record.empty()) {
    culprits.insert(no_record.begin(), no_record.end());
    culprit_call = "(no record)";
  }
  os << findings.str();
  rep.culprits.assign(culprits.begin(), culprits.end());
  rep.culprit_call = culprit_call;
  if (rep.culprits.empty()) {
    os << "verdict: the records agree: no rank diverged\n";
  } else {
    os << "verdict: " << format_ranks(rep.culprits) << " "
       << (culprit_call == "(no record)"              ? "left no record: look there first"
           : culprit_call.rfind("(crashed) ", 0) == 0 ? "crashed: " + culprit_call.substr(10)
                                                      : "diverged first, at " + culprit_call)
       << "\n";
  }
  rep.text = os.str();
  return rep;
}

std::string flight_trace(const std::vector<FlightFile>& files) {
  const std::vector<Record> rs = parse_all(files);
  int64_t t0 = INT64_MAX;
  for (const Record& r : rs) {
    for (const Entry& e : r.entries) {
      if (e.enqueue_ns > 0) t0 = std::min(t0, e.enqueue_ns);
    }
  }
  if (t0 == INT64_MAX) t0 = 0;
  json events = json::array();
  for (const Record& r : rs) {
    events.push_back({{"ph", "M"},
                      {"pid", r.rank},
                      {"name", "process_name"},
                      {"args", {{"name", "rank " + std::to_string(r.rank)}}}});
    std::map<std::string, int> tids;
    for (const Entry& e : r.entries) {
      auto [it, fresh] = tids.emplace(e.group, static_cast<int>(tids.size()) + 1);
      if (fresh) {
        events.push_back({{"ph", "M"},
                          {"pid", r.rank},
                          {"tid", it->second},
                          {"name", "thread_name"},
                          {"args", {{"name", e.group}}}});
      }
      const int64_t b = e.start_ns ? e.start_ns : e.enqueue_ns;
      const int64_t end = e.end_ns ? e.end_ns : r.dumped_ns;
      events.push_back({{"ph", "X"},
                        {"pid", r.rank},
                        {"tid", it->second},
                        {"name", e.sig() + " #" + std::to_string(e.seq)},
                        {"ts", static_cast<double>(b - t0) / 1e3},
                        {"dur", static_cast<double>(std::max<int64_t>(end - b, 0)) / 1e3},
                        {"args",
                         {{"seq", e.seq},
                          {"state", e.state},
                          {"bytes", e.bytes},
                          {"stream", e.stream},
                          {"queued_us", static_cast<double>(b - e.enqueue_ns) / 1e3},
                          {"note", e.note}}}});
    }
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace meshrt::detail
