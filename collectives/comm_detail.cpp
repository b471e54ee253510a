#include "collectives/comm_detail.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "runtime/env.h"

namespace meshrt::detail {

CallSig CallSig::make(CommOp op, DType dt, ReduceOp redop, int64_t count, int root, uint64_t seq) {
  CallSig s;
  s.op = static_cast<int64_t>(op);
  s.dtype = static_cast<int64_t>(dt);
  s.redop = static_cast<int64_t>(redop);
  s.count = count;
  s.root = root;
  s.seq = static_cast<int64_t>(seq);
  return s;
}

namespace {

bool is_reduction(CommOp op) { return op == CommOp::AllReduce || op == CommOp::ReduceScatter; }

bool has_payload(CommOp op) { return op != CommOp::Barrier && op != CommOp::Split; }

}  // namespace

std::string CallSig::str() const {
  std::ostringstream os;
  if (magic != kMagic || op < 0 || op > static_cast<int64_t>(CommOp::Split)) {
    os << "<unreadable call>";
    return os.str();
  }
  auto o = static_cast<CommOp>(op);
  os << comm_op_name(o) << "(";
  if (o == CommOp::Split) {
    os << "color=" << color << ")";
    return os.str();
  }
  if (has_payload(o)) {
    os << dtype_name(static_cast<DType>(dtype)) << ", count=" << count;
    if (is_reduction(o)) os << ", " << reduce_op_name(static_cast<ReduceOp>(redop));
    if (o == CommOp::Broadcast) os << ", root=" << root;
  }
  os << ")";
  return os.str();
}

bool CallSig::matches(const CallSig& o) const {
  if (magic != o.magic || op != o.op || seq != o.seq) return false;
  auto c = static_cast<CommOp>(op);
  if (has_payload(c) && (dtype != o.dtype || count != o.count)) return false;
  if (is_reduction(c) && redop != o.redop) return false;
  if (c == CommOp::Broadcast && root != o.root) return false;
  return true;
}

std::string format_ranks(const std::vector<int>& ranks) {
  // Runs of three or more consecutive ranks as "a-b", and at most kMaxPieces pieces: a world of
  // a million ranks with no record is one line, not megabytes.
  constexpr size_t kMaxPieces = 32;
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  size_t pieces = 0, i = 0;
  for (; i < ranks.size() && pieces < kMaxPieces; ++pieces) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    os << (pieces ? ", " : "") << ranks[i];
    if (j >= i + 2) {
      os << "-" << ranks[j];
      i = j + 1;
    } else {
      ++i;
    }
  }
  if (i < ranks.size()) os << " and " << ranks.size() - i << " more";
  return os.str();
}

std::string global_rank_label(int global_rank, int group_rank, bool in_world) {
  if (in_world) return "rank " + std::to_string(global_rank);
  return "rank " + std::to_string(global_rank) + " [group rank " + std::to_string(group_rank) + "]";
}

namespace {

// "rank 3" in the world; "global ranks 2, 3 (ranks 0, 1 of group 'world/tp')" in a group.
std::string member_ranks(const std::vector<int>& members, const std::vector<int>& globals,
                         const std::string& group) {
  if (globals.empty()) return format_ranks(members);
  std::vector<int> g;
  for (int m : members)
    g.push_back(m < static_cast<int>(globals.size()) ? globals[static_cast<size_t>(m)] : -1);
  return "global " + format_ranks(g) + " (" + format_ranks(members) + " of group '" + group + "')";
}

}  // namespace

std::string mismatch_message(const std::string& group, const std::vector<CallSig>& sigs,
                             const std::vector<int>& globals) {
  bool all_same = true;
  for (size_t i = 1; i < sigs.size() && all_same; ++i) all_same = sigs[i].matches(sigs[0]);
  if (all_same) return "";
  // Group ranks by identical calls, in order of first appearance.
  std::vector<std::pair<CallSig, std::vector<int>>> groups;
  for (size_t r = 0; r < sigs.size(); ++r) {
    bool placed = false;
    for (auto& g : groups) {
      if (g.first.matches(sigs[r])) {
        g.second.push_back(static_cast<int>(r));
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({sigs[r], {static_cast<int>(r)}});
  }
  std::ostringstream os;
  bool counts_only = true;
  for (auto& g : groups) {
    CallSig a = g.first, b = groups[0].first;
    a.count = b.count = 0;
    counts_only = counts_only && a.matches(b);
  }
  os << "collective mismatch on group '" << group << "': ";
  for (size_t i = 0; i < groups.size(); ++i) {
    os << (i ? "; " : "") << member_ranks(groups[i].second, globals, group) << " called "
       << groups[i].first.str() << " at seq " << groups[i].first.seq;
  }
  if (counts_only) {
    os << " (element counts differ: every rank must pass the same count to "
       << comm_op_name(static_cast<CommOp>(groups[0].first.op)) << ")";
  }
  return os.str();
}

std::string timeout_message(const std::string& call, const std::string& group, uint64_t seq,
                            const std::string& rank, const CommConfig& cfg,
                            const std::string& missing) {
  std::ostringstream os;
  os << "watchdog: " << call << " on group '" << group << "' (seq " << seq << ", " << rank
     << ") did not complete within " << cfg.timeout_s << " s (" << cfg.timeout_setting << ")";
  if (!missing.empty()) os << "; " << missing;
  os << "; the communicators were aborted";
  return os.str();
}

Deadline Deadline::after(double seconds) {
  Deadline d;
  if (seconds > 0 && std::isfinite(seconds)) {
    // Saturate: a timeout past what the clock's 64-bit ticks can hold from now (about 292
    // years of nanoseconds) means never; converting it would overflow.
    const auto now = Clock::now();
    const double room = std::chrono::duration<double>(Clock::time_point::max() - now).count() * 0.5;
    if (seconds >= room) return d;
    d.never = false;
    d.at =
        now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  return d;
}

double Deadline::left_s() const {
  if (never) return std::numeric_limits<double>::max();
  return std::chrono::duration<double>(at - Clock::now()).count();
}

bool TicketOrder::wait_turn(uint64_t t, const Deadline& deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return done_ + 1 >= t; };
  if (deadline.never) {
    cv_.wait(lk, ready);
    return true;
  }
  return cv_.wait_until(lk, deadline.at, ready);
}

void TicketOrder::done(uint64_t t) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (t > done_) done_ = t;
  }
  cv_.notify_all();
}

void TicketOrder::wait_done(uint64_t t) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= t; });
}

uint64_t TicketOrder::done_through() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

TicketOrder& OrderBook::order(CommOp op, int peer) {
  if (op != CommOp::Send && op != CommOp::Recv) return coll_;
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = p2p_[{op == CommOp::Send ? 1 : 0, peer}];
  if (!slot) slot = std::make_unique<TicketOrder>();
  return *slot;
}

void OrderBook::wait_issued(uint64_t coll_seq, const std::unordered_map<int, uint64_t>& sent,
                            const std::unordered_map<int, uint64_t>& received) {
  if (coll_seq > 0) coll_.wait_done(coll_seq);
  for (auto& [peer, n] : sent) order(CommOp::Send, peer).wait_done(n);
  for (auto& [peer, n] : received) order(CommOp::Recv, peer).wait_done(n);
}

std::string node_identity() {
  const int64_t id = env_int("MESHRT_NODE_ID", -1);
  if (id >= 0) return "id:" + std::to_string(id);
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace meshrt::detail
