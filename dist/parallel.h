// Tensor-parallel configuration, parameters (local shards with their place in the full tensor)
// and the scheduler that issues tp collectives on the tp stream and places the compute waits.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/device_mesh.h"
#include "dist/overlap.h"
#include "dist/placement.h"
#include "meshrt/export.h"
#include "runtime/tensor.h"

namespace meshrt {

struct MESHRT_API TpOptions {
  bool sequence_parallel = false;
  Overlap overlap = Overlap::Async;
};

// A parameter: the local shard, its gradient, and where the shard sits in the full tensor.
struct MESHRT_API Param {
  std::string name;
  uint64_t id = 0;  // Philox stream id: same for every layout
  Tensor value;     // local shard
  Tensor grad;      // same shape, dtype and placements as value
  Shape full_shape;
  Shape offsets;                      // of the shard in the full tensor
  std::vector<Placement> placements;  // one per mesh dim; the layout of value and grad
  // First-write gradients (GradSync::zero_grad): a parameter whose only gradient writer can
  // overwrite instead of accumulate (a Linear's weight: its GEMM with beta 0) is
  // `grad_overwritable`. zero_grad then marks its gradient `grad_unwritten` instead of filling it
  // with zeros: its stale contents read as zero, the first writer of the step overwrites them
  // (take_grad_overwrite) and GradSync zero-fills whatever is still unwritten before anything
  // reads the gradients (mark_ready, finish).
  bool grad_overwritable = false;
  bool grad_unwritten = false;
  // Whether the parameter is sharded over mesh dim `dim` (false when the mesh has no such dim).
  bool sharded_on(const DeviceMesh& mesh, std::string_view dim) const;
};

// For the gradient's writer: true when it must overwrite the gradient (its first write since a
// first-write zero_grad), which also clears the mark; false when it must accumulate.
inline bool take_grad_overwrite(Param& p) {
  const bool o = p.grad_unwritten;
  p.grad_unwritten = false;
  return o;
}

// One placement per mesh dim: `p` on `dim` (when the mesh has it), Replicate elsewhere.
MESHRT_API std::vector<Placement> placements_on(const DeviceMesh& mesh, std::string_view dim,
                                                Placement p);

// Creates a parameter of full shape `full` laid out by `pl` (shards may be uneven: see
// shard_size), initialised by the Philox rule so every layout starts from the same full weights.
MESHRT_API Param make_param(const DeviceMesh& mesh, std::string name, uint64_t id,
                            const Shape& full, std::vector<Placement> pl, DType dtype,
                            const PhiloxInit& init);
// Same, filled with a constant (norm gains 1, biases 0).
MESHRT_API Param make_param_const(const DeviceMesh& mesh, std::string name, uint64_t id,
                                  const Shape& full, std::vector<Placement> pl, DType dtype,
                                  double value);

// Time accounting of communication, per mesh dim (host: exact; CUDA: from events).
struct MESHRT_API CommTimes {
  double comm_ms = 0;     // time collectives ran on the comm stream
  double exposed_ms = 0;  // time the compute stream stood waiting for them
  int64_t bytes = 0;
  int64_t count = 0;
  // Bytes by kind (this rank's side, as `bytes`): all-reduce, reduce-scatter, all-gather.
  int64_t all_reduce_bytes = 0, reduce_scatter_bytes = 0, all_gather_bytes = 0;
};

// Issues one mesh dim's collectives on that dim's stream, ordered after the compute stream's
// current point, and places compute waits. With a dim of size 1 every call is a local no-op copy.
class MESHRT_API CommScheduler {
 public:
  CommScheduler(DeviceMesh& mesh, std::string_view dim, Overlap overlap);
  int size() const { return size_; }
  int rank() const { return rank_; }
  Overlap overlap() const { return overlap_; }
  Stream& compute() const { return compute_; }
  Stream& comm() const;
  Communicator& group() const;

  // Each returns the completion event; under Overlap::None the compute stream already waits.
  Event all_gather(const Tensor& in, const Tensor& out, const char* what);
  Event reduce_scatter(const Tensor& in, const Tensor& out, const char* what,
                       ReduceOp op = ReduceOp::Sum);
  Event all_reduce(const Tensor& t, const char* what, ReduceOp op = ReduceOp::Sum);
  Event broadcast(const Tensor& t, int root, const char* what);
  // Block j of `in` ([size, ...]) goes to rank j, block i of `out` comes from rank i: the
  // exchange of a reduce-scatter whose sum the caller computes (Linear's peer-rows-first
  // forward); counted as reduce-scatter bytes.
  Event exchange(const Tensor& in, const Tensor& out, const char* what);
  // The compute stream waits for `e` (timed as exposed communication).
  void wait(const Event& e);

  // Gradient writes left on the comm stream. Inside a deferral (BlockStack::backward opens one)
  // the sequence-parallel norms add their all-reduced gain and bias gradients into the gradients
  // on the comm stream, behind the all-reduce, and the compute stream does not wait there: one
  // sync point fewer per norm, so rank skew can even out before the next one (Megatron reduces
  // these gradients once after backward for the same reason). settle_grad_writes() makes the
  // compute stream wait for all of them (timed as exposed); whoever reads gradients calls it
  // first: the stack at its end, GradSync::mark_ready before it reads a bucket.
  class GradDeferral {
   public:
    explicit GradDeferral(CommScheduler& c) : c_(c), was_(c.defer_grads_) { c.defer_grads_ = true; }
    ~GradDeferral() { c_.defer_grads_ = was_; }
    GradDeferral(const GradDeferral&) = delete;
    GradDeferral& operator=(const GradDeferral&) = delete;

   private:
    CommScheduler& c_;
    bool was_;
  };
  bool deferring_grad_writes() const { return defer_grads_; }
  // `written`: recorded on comm() after the last gradient write queued there.
  void defer_grad_writes(const Event& written) { grad_writes_ = written; }
  void settle_grad_writes();

  // Totals since the last reset. Blocks until the timed collectives and waits have completed
  // (call it after synchronising).
  CommTimes times() const;
  void reset_times();

 private:
  Event finish(Event done, const Tensor& a, const Tensor& b, int64_t bytes,
               int64_t CommTimes::*kind = nullptr);
  // Runs call(comm stream) after the compute stream's current point, bracketed by timing events.
  template <class F>
  Event timed(F&& call);

  DeviceMesh& mesh_;
  std::string dim_;
  Overlap overlap_;
  Stream& compute_;
  int size_ = 1, rank_ = 0;
  bool defer_grads_ = false;
  Event grad_writes_;  // the last deferred gradient write (the comm stream runs them in order)
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

// What a redistribution moves: nothing (a local copy at most) or one tp collective.
enum class RedistKind : uint8_t { Copy, AllGather, ReduceScatter, AllReduce };

// A change of an activation's placement over one mesh dim. Supported: Shard(0) -> Replicate
// (all-gather), Partial -> Shard(0) (reduce-scatter), Partial -> Replicate (all-reduce) and
// no change. Sequence-first activations make a dim-0 shard contiguous, so none needs reshuffling.
// The executors (redistribute) and the planner's cost model (plan/) both read kind().
struct MESHRT_API Redistribution {
  Placement from, to;
  bool is_identity() const { return from == to; }
  // The collective this redistribution is; throws for an unsupported one.
  RedistKind kind() const;
  bool operator==(const Redistribution&) const = default;
  // The conjugate the gradient takes in backward, from `to`'s gradient to `from`'s: all-gather
  // <-> reduce-scatter, all-reduce <-> no change.
  Redistribution grad() const;
  // The output shape for an input of shape `in` over `parts` ranks.
  Shape out_shape(const Shape& in, int parts) const;
  std::string str() const;  // "Shard(0) -> Replicate()"
};

// The one place tp activations are communicated: issues the collective that turns `in` (laid out
// as r.from) into `out` (r.to) on the scheduler's stream and returns its completion event without
// making compute wait, so each caller keeps its overlap (wait where the result is needed). `out`
// may alias `in` for all-reduce. With no change, or a dim of size 1, a local copy at most.
MESHRT_API Event redistribute(CommScheduler& c, const Tensor& in, const Tensor& out,
                              const Redistribution& r, const char* what);

}  // namespace meshrt
