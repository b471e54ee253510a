// Internals shared by the communicator backends: call signatures, messages, deadlines, ordering.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/plugin_api.h"

namespace meshrt::detail {

using Clock = std::chrono::steady_clock;

// What a rank is about to call; exchanged between ranks (as int64 words) to detect mismatches.
struct MESHRT_PLUGIN_API CallSig {
  static constexpr int kWords = 8;
  static constexpr int64_t kMagic = 0x6d657368636f6c6cLL;  // guards against reading garbage
  int64_t magic = kMagic;
  int64_t op = 0;
  int64_t dtype = 0;
  int64_t redop = 0;
  int64_t count = 0;
  int64_t root = -1;
  int64_t seq = 0;
  int64_t color = 0;  // split only

  static CallSig make(CommOp op, DType dt, ReduceOp redop, int64_t count, int root, uint64_t seq);
  // "all_reduce(f32, count=8, sum)", "broadcast(bf16, count=3, root=1)", "split(color=2)".
  std::string str() const;
  // Same call as far as the ranks must agree (op, dtype, count, reduction, root, seq).
  bool matches(const CallSig& o) const;
};
static_assert(sizeof(CallSig) == CallSig::kWords * sizeof(int64_t));

// "" when every rank's call matches; otherwise a message naming which ranks called what, e.g.
// "collective mismatch on group 'world': rank 0 called all_reduce(f32, count=4, sum) at seq 3;
// ranks 1, 2 called all_reduce(f32, count=5, sum) at seq 3".
// `globals`: each member's global rank, for a group that is not the world (empty: the world);
// the ranks are then named "global rank 2 (rank 0 of group 'world/tp')".
MESHRT_PLUGIN_API std::string mismatch_message(const std::string& group,
                                               const std::vector<CallSig>& sigs,
                                               const std::vector<int>& globals = {});

// "rank 3" / "ranks 1, 2, 5" / "ranks 0-7, 9" (runs of three or more as a range; at most 32
// pieces, then "and N more").
MESHRT_PLUGIN_API std::string format_ranks(const std::vector<int>& ranks);

// How messages name a member of a group: "rank 6 [group rank 1]" (its global rank, then its rank
// in the group), or "rank 3" for a member of the world (`in_world`).
MESHRT_PLUGIN_API std::string global_rank_label(int global_rank, int group_rank, bool in_world);

// The watchdog's message: "watchdog: all_reduce(f32, count=8, sum) on group 'world' (seq 7,
// rank 0) did not complete within 1 s (MESHRT_COMM_TIMEOUT); rank 3 never arrived; the
// communicators were aborted", naming the setting the timeout came from (cfg.timeout_setting).
MESHRT_PLUGIN_API std::string timeout_message(const std::string& call, const std::string& group,
                                              uint64_t seq, const std::string& rank,
                                              const CommConfig& cfg, const std::string& missing);
inline std::string timeout_message(const std::string& call, const std::string& group, uint64_t seq,
                                   int rank, const CommConfig& cfg, const std::string& missing) {
  return timeout_message(call, group, seq, "rank " + std::to_string(rank), cfg, missing);
}

// A point in time after which a wait gives up (never, when the timeout is 0).
struct MESHRT_PLUGIN_API Deadline {
  Clock::time_point at{};
  bool never = true;
  static Deadline after(double seconds);
  bool passed() const { return !never && Clock::now() >= at; }
  // Seconds left (a large number when never).
  double left_s() const;
};

// Runs a rank's operations on one communicator in issue order, whatever stream they were
// enqueued on: operation `t` starts only after operations 1..t-1 finished on this rank.
class TicketOrder {
 public:
  // Waits for the turn of ticket `t`. Returns false if `deadline` passed first.
  bool wait_turn(uint64_t t, const Deadline& deadline);
  void done(uint64_t t);
  // Waits until ticket `t` and all before it are done.
  void wait_done(uint64_t t);
  uint64_t done_through() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t done_ = 0;
};

// The execution orders of one rank on one communicator: collectives in sequence order, and the
// messages to / from each peer in their order. Independent orders never wait for each other, so
// a send and a recv on two streams can both be in flight.
class OrderBook {
 public:
  // The order a call belongs to: collectives (peer < 0), sends to or receives from `peer`.
  TicketOrder& order(CommOp op, int peer);
  void wait_issued(uint64_t coll_seq, const std::unordered_map<int, uint64_t>& sent,
                   const std::unordered_map<int, uint64_t>& received);

 private:
  TicketOrder coll_;
  std::mutex mu_;
  std::map<std::pair<int, int>, std::unique_ptr<TicketOrder>> p2p_;  // (is_send, peer)
};

// Marks ticket `t` done when it goes out of scope (also when the operation throws).
class TicketGuard {
 public:
  TicketGuard(TicketOrder& o, uint64_t t) : o_(o), t_(t) {}
  ~TicketGuard() { o_.done(t_); }
  TicketGuard(const TicketGuard&) = delete;
  TicketGuard& operator=(const TicketGuard&) = delete;

 private:
  TicketOrder& o_;
  uint64_t t_;
};

// Hash of this machine's host name (ranks on one node share it): used for local ranks.
// What makes ranks one node: "id:<MESHRT_NODE_ID>" when that is set (simulated nodes on one
// machine), else the host name. Ranks with equal identities share memory.
std::string node_identity();

}  // namespace meshrt::detail
