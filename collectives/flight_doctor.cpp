#include "collectives/flight_doctor.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "collectives/comm_detail.h"
#include "runtime/error.h"
#include "runtime/json_field.h"

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

constexpr int64_t kMaxRanks = int64_t{1} << 24;
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// One entry of a record's 'entries' list.
Entry parse_entry(const JsonFields<json>& e) {
  Entry x;
  x.group = e.string("group");
  x.gid = e.string("gid");
  x.op = e.string("op");
  x.dtype = e.string("dtype");
  x.redop = e.string("redop");
  x.stream = e.string("stream");
  x.state = e.string("state");
  if (x.state != "issued" && x.state != "started" && x.state != "completed" &&
      x.state != "failed" && x.state != "skipped")
    json_field_fail(e.where(), e.name("state"), json_value_text("\"" + x.state + "\""),
                    "one of issued, started, completed, failed, skipped");
  x.note = e.string("note");
  x.group_size = static_cast<int>(e.integer("group_size", 1, kMaxRanks));
  x.group_rank = static_cast<int>(e.integer("group_rank", 0, x.group_size - 1));
  x.root = static_cast<int>(e.integer("root", -1, kMaxRanks));
  x.peer = static_cast<int>(e.integer("peer", -1, kMaxRanks));
  // 0 to 2^62: the checks visit only numbers some rank holds, whatever the gaps.
  x.seq = static_cast<uint64_t>(e.integer("seq", 0, int64_t{1} << 62));
  x.count = e.integer("count", 0, kMaxInt64);
  x.bytes = e.integer("bytes", 0, kMaxInt64);
  x.enqueue_ns = e.integer("enqueue_ns", 0, kMaxInt64);
  x.start_ns = e.integer("start_ns", 0, kMaxInt64);
  x.end_ns = e.integer("end_ns", 0, kMaxInt64);
  if (e.has("data_bad")) {  // the group ranks the data check named
    const json& bad = e.array("data_bad");
    for (size_t i = 0; i < bad.size(); ++i) {
      const json& g = bad[i];
      const bool ok = g.is_number_unsigned() || (g.is_number_integer() && g.get<int64_t>() >= 0);
      if (!ok || g.get<uint64_t>() >= static_cast<uint64_t>(x.group_size))
        json_field_fail(e.where(), e.name("data_bad[" + std::to_string(i) + "]"),
                        json_value_text(g.dump()), json_integer_text(0, x.group_size - 1));
      x.data_bad.push_back(static_cast<int>(g.get<int64_t>()));
    }
  }
  return x;
}

Record parse(const FlightFile& f) {
  const json j = parse_json_text(f.text, f.path);
  MESHRT_CHECK(j.is_object() && j.contains("meshrt_flight"),
               f.path << ": not a meshrt flight record (no 'meshrt_flight' field); pass "
                         "meshrt-flight-<rank>.json files");
  const json& v = j.at("meshrt_flight");
  MESHRT_CHECK(v.is_number_integer() && v.get<int64_t>() == kFlightVersion,
               f.path << ": flight record format version " << v.dump()
                      << "; this meshrt reads version " << kFlightVersion
                      << " (written by another meshrt?)");
  const JsonFields<json> top(j, f.path);
  Record r;
  r.path = f.path;
  r.world_size = static_cast<int>(top.integer("world_size", 1, kMaxRanks));
  r.rank = static_cast<int>(top.integer("rank", 0, r.world_size - 1));
  r.backend = top.string("backend");
  r.fault = top.string("fault");
  r.reason = top.string("reason");
  r.dumped_ns = top.integer("dumped_ns", 0, kMaxInt64);
  r.job = top.string_or("job", "");
  if (!top.has("entries")) return r;
  const json& es = top.array("entries");
  for (size_t i = 0; i < es.size(); ++i)
    r.entries.push_back(
        parse_entry(JsonFields<json>(es[i], f.path, "entries[" + std::to_string(i) + "].")));
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

// What one run of the diagnosis knows about the whole world, read once from the records.
struct WorldView {
  int size = 0;
  std::vector<int> no_record;  // ranks of the world without a record
  std::set<int> blocked;       // ranks that were inside a collective when they wrote theirs
  std::string earliest_open;   // the call the first rank to wait started waiting in
  std::map<std::string, std::set<int>> injected_skip;  // gid -> ranks whose record notes one
};

// What the checks have found so far, strongest evidence first: a failed data check or a call
// mismatch, then ranks behind, silent ranks, skew; the verdict names the culprits.
struct Diagnosis {
  std::ostringstream findings;
  std::set<int> culprits;
  std::string culprit_call;
  bool mismatch_found = false;
  std::set<int> behind_idle, behind_blocked;  // ranks that never reached a call others issued
  std::string behind_call;
  int64_t behind_t = INT64_MAX;
  int behind_rank = 2;  // 0: a group where an idle rank is behind; 1: only blocked ones
};

// One group as the checks see it: its members and the window of sequence numbers they hold.
struct GroupWindow {
  std::vector<int> members;  // ranks with entries, plus (world-sized 'world') those with no record
  std::vector<int> unknown;  // group ranks without a record (their global rank is unknown)
  uint64_t lo = 1, hi = 0;   // the window every present member still holds (rings drop old ones)
};

std::string fd_call_on(const std::string& sig, uint64_t seq, const std::string& group) {
  return sig + " seq " + std::to_string(seq) + " on group '" + group + "'";
}

// The call the first rank to wait started waiting in ("" when none had started one).
std::string fd_earliest_open(const std::vector<Record>& rs) {
  std::string earliest;
  int64_t t = INT64_MAX;
  for (const Record& r : rs) {
    for (const Entry& e : r.entries) {
      if (e.open() && e.collective() && e.start_ns > 0 && e.start_ns < t) {
        t = e.start_ns;
        earliest = fd_call_on(e.sig(), e.seq, e.group);
      }
    }
  }
  return earliest;
}

// Writes the heading (records, world, backend, who left none, why the first was written, the
// injected faults the records mention) and the call each blocked rank was inside.
WorldView fd_survey(const std::vector<Record>& rs, std::ostream& os) {
  WorldView v;
  std::set<int> have;
  for (const Record& r : rs) {
    v.size = std::max(v.size, r.world_size);
    have.insert(r.rank);
  }
  for (int w = 0; w < v.size; ++w) {
    if (!have.count(w)) v.no_record.push_back(w);
  }
  os << "meshrt doctor: " << rs.size() << " flight record" << (rs.size() == 1 ? "" : "s")
     << " of a world of " << v.size << " (" << rs.front().backend << " backend)\n";
  if (!v.no_record.empty()) {
    os << "  " << format_ranks(v.no_record)
       << " left no record (killed or crashed before writing one, or the file was not given)\n";
  }
  // Why the first record was written (the others were written for the same failure, seen
  // from their rank).
  os << "  why written (rank " << rs.front().rank << "): " << rs.front().reason << "\n";
  // Injected faults the records mention (the recorder logs them; the diagnosis does not use
  // them, except an injected skip to tell two sides of a mismatch apart).
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
  for (const Record& r : rs)
    for (const Entry& e : r.entries)
      if (e.note == "injected skip") v.injected_skip[e.gid].insert(r.rank);
  // Open collectives: the ranks that were waiting when they wrote their record (the first
  // entry not completed; open, or failed: it timed out or was aborted while waiting).
  for (const Record& r : rs) {
    for (const Entry& e : r.entries) {
      if ((e.open() || e.state == "failed") && e.collective()) {
        v.blocked.insert(r.rank);
        os << "  rank " << r.rank << " was inside " << e.sig() << " seq " << e.seq << " on group '"
           << e.group << "' (" << e.state << ", "
           << ms(r.dumped_ns - (e.start_ns ? e.start_ns : e.enqueue_ns)) << " before its record)\n";
        break;
      }
    }
  }
  v.earliest_open = fd_earliest_open(rs);
  return v;
}

// The group instances across ranks, by gid, from the collectives the records hold.
std::map<std::string, Group> fd_groups(const std::vector<Record>& rs) {
  std::map<std::string, Group> groups;
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
  return groups;
}

GroupWindow fd_window(const Group& g, const WorldView& world) {
  GroupWindow v;
  for (auto& [gr, w] : g.global_of) v.members.push_back(w);
  if (g.name == "world" && g.size == world.size) {
    for (int w : world.no_record) v.members.push_back(w);
  } else {
    for (int gr = 0; gr < g.size; ++gr) {
      if (!g.global_of.count(gr)) v.unknown.push_back(gr);
    }
  }
  std::sort(v.members.begin(), v.members.end());
  for (auto& [w, seqs] : g.by) {
    v.lo = std::max(v.lo, seqs.begin()->first);
    v.hi = std::max(v.hi, seqs.rbegin()->first);
  }
  return v;
}

// The sequence numbers some member holds in the window, in order: what the checks below visit
// (records are sparse, so the numbers between are not walked one by one).
std::set<uint64_t> fd_window_seqs(const Group& g, const GroupWindow& v) {
  std::set<uint64_t> out;
  for (auto& [w, seqs] : g.by)
    for (auto it = seqs.lower_bound(v.lo); it != seqs.end() && it->first <= v.hi; ++it)
      out.insert(it->first);
  return out;
}

// A failed data check (MESHRT_COMM_DEBUG=1): every rank computed the same verdict.
void fd_check_data(const Group& g, const GroupWindow& v, Diagnosis& d) {
  for (uint64_t s : fd_window_seqs(g, v)) {
    if (d.mismatch_found) break;
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
    d.findings << "  group '" << g.name << "' seq " << s << ": " << at->sig()
               << " failed its data check: the data of " << format_ranks({bad.begin(), bad.end()})
               << " disagreed with what the ranks sent\n";
    d.mismatch_found = true;
    d.culprits = bad;
    d.culprit_call =
        fd_call_on(at->sig(), s, g.name) + " (its data disagreed with the other ranks')";
  }
}

// Of the sides of a mismatch at `s` (sigs: call -> global ranks), the culprits: the smallest
// side, or of two equal sides the one that skipped a call (both when a tie cannot tell).
void fd_blame_mismatch(const Group& g, const std::map<std::string, std::vector<int>>& sigs,
                       uint64_t s, const std::set<int>& skipped, Diagnosis& d) {
  size_t fewest = SIZE_MAX;
  for (auto& [sig, ws] : sigs) fewest = std::min(fewest, ws.size());
  d.mismatch_found = true;
  d.culprits.clear();
  const bool two_sides =
      sigs.size() == 2 && sigs.begin()->second.size() == sigs.rbegin()->second.size();
  const std::string ahead = two_sides ? side_ahead(g, sigs, s, skipped) : "";
  const bool tie = two_sides && ahead.empty();
  bool named = false;
  for (auto& [sig, ws] : sigs) {
    if (tie || (ahead.empty() ? ws.size() == fewest : sig == ahead)) {
      d.culprits.insert(ws.begin(), ws.end());
      if (!named) d.culprit_call = fd_call_on(sig, s, g.name);
      named = true;
      if (!tie) break;
    }
  }
}

// The first sequence number at which the members called different collectives.
void fd_check_signatures(const Group& g, const GroupWindow& v, const std::set<int>& skipped,
                         Diagnosis& d) {
  for (uint64_t s : fd_window_seqs(g, v)) {
    std::map<std::string, std::vector<int>> sigs;
    for (auto& [w, seqs] : g.by) {
      auto it = seqs.find(s);
      if (it != seqs.end()) sigs[it->second->sig()].push_back(w);
    }
    if (sigs.size() < 2) continue;
    d.findings << "  group '" << g.name << "' seq " << s << ": mismatched calls:";
    for (auto& [sig, ws] : sigs) d.findings << " " << format_ranks(ws) << " called " << sig << ";";
    d.findings << "\n";
    if (!d.mismatch_found) fd_blame_mismatch(g, sigs, s, skipped, d);
    return;
  }
}

// The first sequence number some member with a record never reached (hi + 1 when all did).
uint64_t fd_first_unreached(const Group& g, const GroupWindow& v) {
  uint64_t first = v.hi + 1;
  for (auto& [w, seqs] : g.by) {
    const uint64_t last = seqs.rbegin()->first;
    if (last < v.hi) first = std::min(first, std::max(last + 1, v.lo));
  }
  return first;
}

// Members without any record, when every member with one reached the end of the window: where
// the others got to is all that is known. True when the group needs no further check (every
// call on it finished: the others moved on to groups the silent ranks belong to).
bool fd_check_silent(const Group& g, const GroupWindow& v, uint64_t first, const WorldView& world,
                     Diagnosis& d) {
  std::vector<int> silent;
  for (int w : v.members) {
    if (!g.by.count(w)) silent.push_back(w);
  }
  if (silent.empty() || first <= v.hi || v.hi == 0) return false;
  std::vector<int> present;
  uint64_t at = v.hi;  // the first call the others did not finish (where they waited)
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
    d.findings << "  group '" << g.name << "' (" << g.size << " ranks): " << format_ranks(silent)
               << " left no record; the others finished every call on it they issued\n";
    if (d.culprits.empty()) {
      d.culprits.insert(silent.begin(), silent.end());
      d.culprit_call =
          world.earliest_open.empty()
              ? "(no record)"
              : world.earliest_open + " (where the others waited; no record of its own)";
    }
    return true;
  }
  d.findings << "  group '" << g.name << "' (" << g.size << " ranks): " << format_ranks(present)
             << " issued up to seq " << v.hi << " and stopped at seq " << at << " (" << sig << "); "
             << format_ranks(silent) << " left no record\n";
  if (d.culprits.empty()) {
    d.culprits.insert(silent.begin(), silent.end());
    d.culprit_call =
        fd_call_on(sig, at, g.name) + " (where the others waited; no record of its own)";
  }
  return false;
}

// Ranks that never reached seq `first` of a group whose other members issued it.
void fd_check_behind(const Group& g, const GroupWindow& v, uint64_t first, const WorldView& world,
                     Diagnosis& d) {
  std::vector<int> did, didnt;
  std::string sig;
  for (int w : v.members) {
    auto it = g.by.find(w);
    if (it == g.by.end()) continue;  // no record: reported by fd_check_silent
    const bool reached = it->second.rbegin()->first >= first;
    (reached ? did : didnt).push_back(w);
    if (reached && sig.empty() && it->second.count(first)) sig = it->second.at(first)->sig();
  }
  d.findings << "  group '" << g.name << "' (" << g.size << " ranks): first divergence at seq "
             << first << " (" << sig << "): " << format_ranks(did) << " reached it; "
             << format_ranks(didnt) << " never did";
  for (int w : didnt) {
    const Entry& last = *g.by.at(w).rbegin()->second;
    d.findings << "; rank " << w << "'s last there: " << last.sig() << " seq " << last.seq << " ("
               << last.state << ")";
  }
  d.findings << "\n";
  // Ranks behind here but waiting inside another collective are blocked, not culprits.
  for (int w : didnt) {
    (world.blocked.count(w) ? d.behind_blocked : d.behind_idle).insert(w);
  }
  // The call to name: of the groups where an idle rank is behind, the one the others entered
  // first.
  int64_t t = INT64_MAX;
  for (int w : did) {
    auto it = g.by.find(w);
    if (it != g.by.end() && it->second.count(first)) {
      const Entry& e = *it->second.at(first);
      t = std::min(t, e.start_ns ? e.start_ns : e.enqueue_ns);
    }
  }
  const bool has_idle =
      std::any_of(didnt.begin(), didnt.end(), [&](int w) { return !world.blocked.count(w); });
  const int rank_of_group = has_idle ? 0 : 1;
  if (d.behind_call.empty() || rank_of_group < d.behind_rank ||
      (rank_of_group == d.behind_rank && t < d.behind_t)) {
    d.behind_call = fd_call_on(sig, first, g.name);
    d.behind_t = t;
    d.behind_rank = rank_of_group;
  }
}

// Arrival skew (same-node clocks only): over the collectives every member issued, each rank's
// lag behind the first to issue. A rank is late when its median lag is at least 25 ms over at
// least 4 collectives. The median, not who came last most often: a scheduler stall of another
// rank now and then makes that rank last once, but leaves the slow rank's lag behind the first
// arrival unchanged.
void fd_check_skew(const Group& g, const GroupWindow& v, Diagnosis& d) {
  if (g.by.size() < 2) return;
  std::map<int, std::vector<int64_t>> lags;  // rank -> lag behind the first, per collective
  std::map<int, int> last_in;                // rank -> collectives it issued last
  int n = 0;
  for (uint64_t s : fd_window_seqs(g, v)) {
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
    for (auto& [w, lag] : lags) {
      std::nth_element(lag.begin(), lag.begin() + static_cast<std::ptrdiff_t>(lag.size() / 2),
                       lag.end());
      const int64_t median = lag[lag.size() / 2];
      if (median < 25'000'000) continue;
      d.findings << "  group '" << g.name << "': skew: rank " << w << " issued last in "
                 << last_in[w] << " of " << n << " collectives, a median " << ms(median)
                 << " after the first rank\n";
      slow.insert(w);
    }
  }
  if (d.culprits.empty() && !slow.empty()) {
    d.culprits = slow;
    d.culprit_call = "every collective on group '" + g.name + "' (slow, not stopped)";
  }
}

// Every check of one group, strongest evidence first.
void fd_check_group(const std::string& gid, const Group& g, const WorldView& world, Diagnosis& d) {
  const GroupWindow v = fd_window(g, world);
  fd_check_data(g, v, d);
  static const std::set<int> kNone;
  auto skip = world.injected_skip.find(gid);
  fd_check_signatures(g, v, skip == world.injected_skip.end() ? kNone : skip->second, d);
  const uint64_t first = fd_first_unreached(g, v);
  if (fd_check_silent(g, v, first, world, d)) return;
  if (first <= v.hi) fd_check_behind(g, v, first, world, d);
  if (!v.unknown.empty()) {
    d.findings << "  group '" << g.name << "': no record from group rank";
    for (size_t i = 0; i < v.unknown.size(); ++i) d.findings << (i ? ", " : " ") << v.unknown[i];
    d.findings << " (its global rank is unknown)\n";
  }
  fd_check_skew(g, v, d);
}

// The weaker evidence, when the group checks found no mismatch: ranks behind that were not
// waiting elsewhere, then a rank whose record was written as it crashed (a fatal signal other
// than the launcher's SIGTERM, or an injected crash), then ranks without a record in a world
// whose others all waited.
void fd_settle_culprits(const std::vector<Record>& rs, const WorldView& world, Diagnosis& d) {
  if (!d.mismatch_found && (!d.behind_idle.empty() || !d.behind_blocked.empty())) {
    d.culprits = d.behind_idle.empty() ? d.behind_blocked : d.behind_idle;
    d.culprit_call = d.behind_call;
  }
  if (d.culprits.empty()) {
    for (const Record& r : rs) {
      const bool fatal =
          r.reason.rfind("fatal signal", 0) == 0 && r.reason.rfind("fatal signal 15 ", 0) != 0;
      if (fatal || r.reason.rfind("crash", 0) == 0) {
        d.culprits.insert(r.rank);
        d.culprit_call = "(crashed) " + r.reason.substr(0, 160);
      }
    }
  }
  if (d.culprits.empty() && !world.no_record.empty()) {
    d.culprits.insert(world.no_record.begin(), world.no_record.end());
    d.culprit_call = "(no record)";
  }
}

std::string fd_verdict(const DoctorReport& rep) {
  if (rep.culprits.empty()) return "verdict: the records agree: no rank diverged\n";
  const std::string& call = rep.culprit_call;
  return "verdict: " + format_ranks(rep.culprits) + " " +
         (call == "(no record)"              ? "left no record: look there first"
          : call.rfind("(crashed) ", 0) == 0 ? "crashed: " + call.substr(10)
                                             : "diverged first, at " + call) +
         "\n";
}

}  // namespace

DoctorReport flight_diagnose(const std::vector<FlightFile>& files) {
  const std::vector<Record> rs = parse_all(files);
  std::ostringstream os;
  const WorldView world = fd_survey(rs, os);
  Diagnosis d;
  for (auto& [gid, g] : fd_groups(rs)) fd_check_group(gid, g, world, d);
  fd_settle_culprits(rs, world, d);
  os << d.findings.str();
  DoctorReport rep;
  rep.culprits.assign(d.culprits.begin(), d.culprits.end());
  rep.culprit_call = d.culprit_call;
  os << fd_verdict(rep);
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
