// Communicator: a group of ranks and the collectives they run together, enqueued on streams.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meshrt/export.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt {

enum class ReduceOp : uint8_t { Sum = 0, Avg, Max, Min };
MESHRT_API const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"
// Parses sum|avg|max|min (also "mean"); throws listing the accepted names.
MESHRT_API ReduceOp parse_reduce_op(std::string_view s);

enum class CommOp : uint8_t {
  AllReduce = 0,
  AllGather,
  ReduceScatter,
  Broadcast,
  AllToAll,
  Send,
  Recv,
  Barrier,
  Split
};
MESHRT_API const char* comm_op_name(CommOp op);  // "all_reduce", ...
// Parses all_reduce|all_gather|reduce_scatter|broadcast|all_to_all (also without '_').
MESHRT_API CommOp parse_comm_op(std::string_view s);

// Whether `dt` can be carried by collectives (f32, bf16, f16, i32, i64; u8 for data movement only).
MESHRT_API bool comm_dtype_supported(DType dt, bool reduction);

// Behaviour read from the environment when a communicator is created.
struct MESHRT_API CommConfig {
  // MESHRT_COMM_TIMEOUT (seconds, may be fractional; default 300; 0 disables): a collective not
  // complete this long after it started aborts the communicators and raises CommError.
  double timeout_s = 300.0;
  // The setting timeout_s came from, as a timeout message names it: MESHRT_COMM_TIMEOUT (or its
  // default), or the caller's own (the C API: "meshrt_comm_config.timeout_s").
  std::string timeout_setting = "MESHRT_COMM_TIMEOUT";
  // MESHRT_COMM_DEBUG=1: ranks compare (op, dtype, count, root, sequence number) before each
  // collective and raise an error naming the differing ranks instead of hanging or corrupting.
  bool debug = false;
  // MESHRT_FAULT (or --fault): a fault to inject, kind@rank=R,step=S[,op=NAME][,ms=T]
  // (collectives/fault.h; docs/faults.md). Empty: none.
  std::string fault;
  // MESHRT_ALGO: algorithms forced over the table's choice (collectives/algorithms/algorithm.h;
  // docs/environment.md). Empty: the table's.
  std::string algo;
  static CommConfig from_env();
};

using EventList = std::vector<Event>;

// What a backend implements behind a Communicator, and the calls it receives
// (collectives/comm_impl.h).
class CommImpl;
struct CommCall;
namespace detail {
struct RankState;
struct FlightEntry;
enum class FaultKind : uint8_t;
class AlgoPlan;
}  // namespace detail

// Colour that makes split() return no communicator for the calling rank.
constexpr int kNoColor = -1;

// One rank's handle on a group. Every operation is enqueued on `stream` after the events in
// `after`, returns the event that marks its completion, and must be issued by all ranks of the
// group in the same order (point-to-point: in the same order per pair of ranks). Tensors must be
// contiguous, on the communicator's device; they are kept alive until the operation finishes.
// Errors (including watchdog timeouts, raised as CommError) are carried by the returned event.
//
// Reductions: bf16 / f16 are reduced in f32 and rounded once; integer sums wrap; avg is the sum
// divided by size() (truncating for integers); max / min propagate NaN. Before a collective the
// ranks compare their calls (host: always; MPI: always for all_gather, reduce_scatter and
// all_to_all, every collective with MESHRT_COMM_DEBUG=1; NCCL: with MESHRT_COMM_DEBUG=1): a
// mismatch raises CommError on every rank, naming the ranks and their calls, and the
// communicator stays usable. send completes only once the peer receives (host, NCCL), so a
// rank exchanging with a peer posts its send and its recv on different streams.
class MESHRT_API Communicator {
 public:
  // Made by a backend (collectives/comm_impl.h) or by a wrapper around another communicator.
  Communicator(int rank, int size, std::string name, Device device, CommConfig config,
               std::unique_ptr<CommImpl> impl);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's name in messages and logs: "world", "world/tp", ...
  const std::string& name() const { return name_; }
  Device device() const { return device_; }
  // The backend's registered name: "host", "mpi", "nccl", ...
  std::string_view backend() const;
  const CommConfig& config() const { return config_; }
  // Sequence number the next collective on this communicator will carry (starts at 1).
  uint64_t next_seq() const { return next_seq_.load(); }

  // out = op over ranks of `in` (same count everywhere). In place when in and out are the same.
  Event all_reduce(const Tensor& t, ReduceOp op, Stream& stream, const EventList& after = {});
  Event all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, Stream& stream,
                   const EventList& after = {});
  // out (size() x in.numel()) = concatenation of every rank's `in` in rank order. In place when
  // `in` is this rank's block of `out`.
  Event all_gather(const Tensor& in, const Tensor& out, Stream& stream,
                   const EventList& after = {});
  // out (in.numel() / size()) = this rank's block of op over ranks of `in`. In place when `out`
  // is this rank's block of `in`.
  Event reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, Stream& stream,
                       const EventList& after = {});
  // Every rank's `t` becomes root's `t`.
  Event broadcast(const Tensor& t, int root, Stream& stream, const EventList& after = {});
  // out = root's `in` (`in` is read on root only).
  Event broadcast(const Tensor& in, const Tensor& out, int root, Stream& stream,
                  const EventList& after = {});
  // Block j of `in` goes to rank j; block i of `out` comes from rank i (numel divisible by
  // size()). `in` and `out` may be the same tensor.
  Event all_to_all(const Tensor& in, const Tensor& out, Stream& stream,
                   const EventList& after = {});
  // Point to point: completes when `peer` has received `t` (its recv must match count and dtype).
  Event send(const Tensor& t, int peer, Stream& stream, const EventList& after = {});
  Event recv(const Tensor& t, int peer, Stream& stream, const EventList& after = {});
  Event barrier(Stream& stream, const EventList& after = {});

  // Collective over this group, blocking the caller: ranks passing the same colour form a new
  // group, ordered by (key, rank). Returns nullptr for kNoColor (any negative colour).
  // `name` names the new group (default: "<this name>/split<colour>").
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name = "");

  // Marks this communicator (and every communicator sharing its ranks in this process) failed:
  // pending and later operations raise CommError with `reason`. Safe from any thread.
  void abort(const std::string& reason = "aborted by the application");
  // Whether this communicator was aborted (by abort(), a watchdog timeout or an error), and why.
  bool aborted() const;
  std::string abort_reason() const;

  // Blocks until every operation issued so far on this communicator has finished on this rank.
  void wait_idle();

 private:
  Event submit(CommCall& call, Stream& stream, const EventList& after);
  void check_tensor(const char* what, const char* role, const Tensor& t, bool reduction) const;
  detail::FlightEntry flight_entry(const CommCall& call, Stream& stream) const;
  void inject(detail::FaultKind kind, const CommCall& call, Stream& stream);

  int rank_;
  int size_;
  std::string name_;
  Device device_;
  CommConfig config_;
  std::unique_ptr<CommImpl> impl_;
  std::atomic<uint64_t> next_seq_{1};
  std::mutex p2p_mu_;
  std::unordered_map<int, uint64_t> send_seq_, recv_seq_;
  // Shared by every communicator of this rank: global rank, flight recorder, injected fault
  // (collectives/flight.h). Null for communicators that forward to another one.
  std::shared_ptr<detail::RankState> state_;
  uint64_t gid_ = 0;  // group instance id in flight records: equal on all members
  // The algorithm choices of this group when some are composed algorithms (which the
  // communicator runs itself over its own primitives); null otherwise.
  std::shared_ptr<const detail::AlgoPlan> composed_;
};

}  // namespace meshrt
