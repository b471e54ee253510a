// CommImpl: what a collective backend implements behind the user-facing Communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "collectives/communicator.h"
#include "runtime/plugin_api.h"

namespace meshrt {

namespace detail {
class FlightRing;

// While one lives on this thread, the communicators made on it (and split from them on it) get
// no rank state of their own (flight recorder, injected fault): they are the inner parts of a
// communicator built over others (the two-level backend), whose own state records and injects.
class InnerCommScope {
 public:
  InnerCommScope();
  ~InnerCommScope();
  InnerCommScope(const InnerCommScope&) = delete;
  InnerCommScope& operator=(const InnerCommScope&) = delete;
};
}  // namespace detail

// One validated call, as the Communicator hands it to its backend. `count` is the per-rank
// element count the ranks must agree on: all_reduce / broadcast: numel; all_gather: input numel;
// reduce_scatter: output numel; all_to_all: block numel; send / recv: numel.
struct MESHRT_PLUGIN_API CommCall {
  CommOp op = CommOp::Barrier;
  DType dtype = DType::f32;
  ReduceOp redop = ReduceOp::Sum;
  int64_t count = 0;
  int root = -1;  // broadcast root
  int peer = -1;  // send / recv peer
  bool in_place = false;
  Tensor in, out;
  // Collectives: the group's sequence number (also their execution order on each rank).
  // send / recv: the number of this message between the pair, in that direction.
  uint64_t seq = 0;
  // This call's flight-recorder entry (collectives/flight.h): backends mark its start and end.
  std::shared_ptr<detail::FlightRing> flight;
  uint64_t flight_id = 0;
  // MESHRT_FAULT=corrupt hit this call: the backend flips this rank's result before its data
  // check (collectives/data_check.h) sees it.
  bool corrupt = false;
  std::string str() const;  // "all_reduce(f32, count=8, sum)"
  // Bytes of this rank's side of the call: the output for all_gather and recv (the gathered
  // tensor), the input otherwise; 0 for barrier and split.
  int64_t bytes() const;
};

// One rank's side of a group in a backend. The Communicator has already validated the call,
// given it its sequence number and ordered `stream` after the caller's events.
class MESHRT_PLUGIN_API CommImpl {
 public:
  virtual ~CommImpl();
  // The name the backend registered under (collectives/backend_registry.h).
  virtual std::string_view backend() const = 0;
  // Enqueues the call's work on `stream`.
  virtual void issue(CommCall call, Stream& stream) = 0;
  // Collective split (see Communicator::split); `name` is final, `seq` the split's sequence
  // number. Returns nullptr for a negative colour.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                              uint64_t seq) = 0;
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;
  virtual std::string abort_reason() const = 0;
  // Blocks until collectives 1..coll_seq and, per peer, messages 1..n sent / received finished
  // on this rank.
  virtual void wait_issued(uint64_t coll_seq, const std::unordered_map<int, uint64_t>& sent,
                           const std::unordered_map<int, uint64_t>& received) = 0;
  // An implementation that forwards every call to another communicator returns false, so each
  // call opens one profiler range (runtime/ranges.h), in the communicator that does the work.
  virtual bool opens_ranges() const { return true; }
  // How many nodes the group spans, for the choice of algorithms (collectives/algorithms/).
  virtual int nodes() const { return 1; }
};

}  // namespace meshrt
