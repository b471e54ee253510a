// Tensor-parallel configuration, parameters (local shards with their place in the full tensor)
// and the scheduler that issues tp collectives on the tp stream and places the compute waits.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "runtime/tensor.h"

namespace meshrt {

// How collectives overlap compute. None: the compute stream waits right after each collective.
// Async: collectives run on the tp stream and compute waits only where the result is needed
// (Megatron's backward: all-gather || dgrad GEMM, reduce-scatter || wgrad GEMM). Chunked: the
// sequence all-gather before a colwise GEMM and the reduce-scatter after a rowwise GEMM are split
// into tp pieces so each GEMM piece starts as its input arrives (needs sequence parallel).
enum class Overlap : uint8_t { None, Async, Chunked };
const char* overlap_name(Overlap o);
Overlap parse_overlap(std::string_view s);

struct TpOptions {
  bool sequence_parallel = false;
  Overlap overlap = Overlap::Async;
};

// A parameter: the local shard, its gradient, and where the shard sits in the full tensor.
struct Param {
  std::string name;
  uint64_t id = 0;  // Philox stream id: same for every layout
  Tensor value;     // local shard
  Tensor grad;      // same shape and dtype as value
  Shape full_shape;
  Shape offsets;                 // of the shard in the full tensor
  int tp_shard_dim = -1;         // tensor dim sharded over tp, -1 when replicated over tp
  bool tp_partial_grad = false;  // replicated over tp but its gradient is a per-rank partial sum
                                 // (norm weights and rowwise biases under sequence parallel)
  std::vector<Placement> placements(const DeviceMesh& mesh) const;
};

// Creates a parameter of full shape `full`, sharded over tp on `shard_dim` (-1: replicated),
// initialised by the Philox rule so every layout starts from the same full weights.
Param make_param(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                 int shard_dim, DType dtype, const PhiloxInit& init);
// Same, filled with a constant (norm gains 1, biases 0).
Param make_param_const(const DeviceMesh& mesh, std::string name, uint64_t id, const Shape& full,
                       int shard_dim, DType dtype, double value);

// Time accounting of communication, per mesh dim (host: exact; CUDA: from events).
struct CommTimes {
  double comm_ms = 0;     // time collectives ran on the comm stream
  double exposed_ms = 0;  // time the compute stream stood waiting for them
  int64_t bytes = 0;
  int64_t count = 0;
};

// Issues one mesh dim's collectives on that dim's stream, ordered after the compute stream's
// current point, and places compute waits. With a dim of size 1 every call is a local no-op copy.
class CommScheduler {
 public:
  CommScheduler(DeviceMesh& mesh, std::string dim, Overlap overlap);
  int size() const { return size_; }
  int rank() const { return rank_; }
  Overlap overlap() const { return overlap_; }
  Stream& compute() const { return compute_; }
  Stream& comm() const;
  Communicator& group() const;

  // Each returns the completion event; under Overlap::None the compute stream already waits.
  Event all_gather(const Tensor& in, const Tensor& out, const char* what);
  Event reduce_scatter(const Tensor& in, const Tensor& out, const char* what);
  Event all_reduce(const Tensor& t, const char* what, ReduceOp op = ReduceOp::Sum);
  Event broadcast(const Tensor& t, int root, const char* what);
  // The compute stream waits for `e` (timed as exposed communication).
  void wait(const Event& e);

  // Totals since the last reset. Blocks until the timed collectives and waits have completed
  // (call it after synchronising).
  CommTimes times() const;
  void reset_times();

 private:
  Event finish(Event done, const Tensor& a, const Tensor& b, int64_t bytes);
  // Runs call(comm stream) after the compute stream's current point, bracketed by timing events.
  template <class F>
  Event timed(F&& call);

  DeviceMesh& mesh_;
  std::string dim_;
  Overlap overlap_;
  Stream& compute_;
  int size_ = 1, rank_ = 0;
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace meshrt
