// OrderedEngine: the shell shared by backends whose operations run on the stream's worker thread
// (host, MPI): issue order, deadlines, abort checks, split bookkeeping; each backend adds its ops.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/comm_detail.h"
#include "collectives/comm_impl.h"
#include "runtime/plugin_api.h"

namespace meshrt::detail {

// One operation being run on this rank: what messages call it (formatted only when a message
// needs it: formatting on every call would cost a noticeable share of a small collective) and
// when the watchdog gives up on it.
struct Op {
  CallSig sig;
  int peer = -1;  // send / recv
  Deadline dl;
  // "all_reduce(f32, count=8, sum)", "send(f32, count=3) to rank 1 (#2)", "split(color=0)".
  std::string str() const;
  uint64_t seq() const { return static_cast<uint64_t>(sig.seq); }
};

// One rank's side of a group. The shell (run / run_split) takes the operation's turn in this
// rank's issue order, checks for an abort, and calls the backend's function for the op; a turn
// that does not come before the deadline aborts (abort_group) and raises CommError.
class MESHRT_PLUGIN_API OrderedEngine {
 public:
  OrderedEngine(int rank, int size, std::string name, CommConfig cfg);
  virtual ~OrderedEngine();
  OrderedEngine(const OrderedEngine&) = delete;
  OrderedEngine& operator=(const OrderedEngine&) = delete;

  virtual std::string_view backend() const = 0;
  // The abort domain this group belongs to (host: every group split from one world; MPI: the
  // process): aborting it fails every communicator in it.
  virtual bool aborted() const = 0;
  virtual std::string abort_reason() const = 0;
  virtual void abort_group(const std::string& why) = 0;

  // Runs `c` on this rank (called on the stream's worker thread).
  void run(const CommCall& c);
  // Runs a split on this rank (called on the caller's thread).
  std::unique_ptr<Communicator> run_split(int color, int key, const std::string& name,
                                          uint64_t seq);
  OrderBook& orders() { return orders_; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const CommConfig& config() const { return cfg_; }

 protected:
  // The backend's operations. Collectives: every rank calls them with the same sequence number.
  virtual void all_reduce(const CommCall& c, const Op& op) = 0;
  virtual void all_gather(const CommCall& c, const Op& op) = 0;
  virtual void reduce_scatter(const CommCall& c, const Op& op) = 0;
  virtual void broadcast(const CommCall& c, const Op& op) = 0;
  virtual void all_to_all(const CommCall& c, const Op& op) = 0;
  virtual void send(const CommCall& c, const Op& op) = 0;
  virtual void recv(const CommCall& c, const Op& op) = 0;
  virtual void barrier(const CommCall& c, const Op& op) = 0;
  // `op.sig` carries the colour; returns nullptr for a negative colour.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                              const Op& op) = 0;
  // Called before every collective and split (not send / recv), once its turn came.
  virtual void entering(const Op& op) { (void)op; }
  // Every rank's `mine` (the same length on each), concatenated in group-rank order: the data
  // check's exchange under MESHRT_COMM_DEBUG=1, run inside the collective's turn.
  virtual std::vector<int64_t> exchange_words(const Op& op, const std::vector<int64_t>& mine) = 0;

  // Whether the ranks must compare their calls before this collective: always where a
  // mismatched count would read or write out of bounds, every collective under
  // MESHRT_COMM_DEBUG=1.
  bool must_compare(CommOp op) const;
  // How messages name a rank of this group: "rank 3", or with the global rank where the group
  // is not the world ("rank 6 [group rank 1]").
  virtual std::string rank_label(int group_rank) const;
  // "<call> on group 'world' (seq 3, rank 1)".
  std::string context(const Op& op) const;
  [[noreturn]] void throw_aborted(const Op& op) const;
  // The watchdog's message for `op` (detail::timeout_message).
  std::string timeout(const Op& op, const std::string& missing) const;
  // Aborts the group with the timeout message and raises it.
  [[noreturn]] void fail_timeout(const Op& op, const std::string& missing);

 private:
  void take_turn(TicketOrder& order, const Op& op);
  void run_op(const CommCall& c, const Op& op);
  void run_backend_op(const CommCall& c, const Op& op);

  int rank_;
  int size_;
  std::string name_;
  CommConfig cfg_;
  OrderBook orders_;
};

// The communicator of an engine on `device` (the engine is shared with the work it enqueues).
MESHRT_PLUGIN_API std::unique_ptr<Communicator> make_ordered_communicator(
    std::shared_ptr<OrderedEngine> e, Device device);

}  // namespace meshrt::detail
