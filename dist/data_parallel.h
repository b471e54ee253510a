// Data parallelism over a mesh's dp dim (kDpDim; with a cp dim, dp x cp: DeviceMesh::grad_dim,
// gradients summed over cp and averaged over dp): gradients packed into buckets (in the reverse of
// forward order, the order backward produces them), each all-reduced (average) on the dp stream
// as soon as its last gradient is final, overlapping the rest of backward.
//
// ZeRO (DpOptions::zero, docs/zero.md) shards each bucket's flat buffer over dp: it is padded to
// a multiple of dp and rank r owns elements [r S, (r + 1) S) of it (S = padded / dp; elements past
// the bucket's end are padding). Stage 1: gradients are all-reduced as at stage 0, each rank
// updates its shard of the parameters (the optimizer keeps state for its shard only) and the
// updated shards are all-gathered bucket by bucket. Stage 2: a bucket's full buffer exists only
// from the backward that fills it (prepare_grads) to its reduce-scatter (averaged) and the rank
// keeps only its gradient shard. Stage 3: gradients as at stage 2, and the parameters are sharded
// too: a bucket never spans two pieces (the model's units: embedding, each stack piece, LM head),
// each rank keeps its shard of every bucket's flat parameter buffer, and a piece's buckets are
// all-gathered into full buffers just before its forward and again before its backward
// (gather_piece, which also prefetches the next piece's on the dp stream) and freed after it
// (release_piece). The optimizer updates the shards in place and gathers nothing.
#pragma once

#include <memory>
#include <vector>

#include "collectives/fixed_order.h"
#include "dist/parallel.h"
#include "meshrt/export.h"

namespace meshrt {

struct MESHRT_API DpOptions {
  double bucket_mb = 25.0;  // bucket capacity; a parameter larger than this gets its own bucket
  bool bf16_comm = false;   // communicate f32 gradients as bf16 (reduced in f32, cast back)
  Overlap overlap = Overlap::Async;  // None: wait for each bucket right after launching it
  int zero = 0;                      // ZeRO stage 0, 1, 2 or 3 (see above)
  // --deterministic (docs/training.md): the step's gradients are summed per grain (push_grain)
  // and reduced over dp in one fixed tree (reduce_grains) instead of bucket all-reduces.
  bool deterministic = false;
};

// Throws naming the stage and what to use instead: --zero outside 0..3.
MESHRT_API void validate_zero_stage(int zero);

// One parameter's part of this rank's ZeRO shard of a bucket: views of `len` elements of its
// value (stage 3: of the parameter shard) and its gradient (the reduced gradient: the full bucket
// at stage 1, the shard at stages 2 and 3), starting `at` elements into the shard and `offset`
// elements into the parameter.
struct MESHRT_API ShardPiece {
  Param* param = nullptr;
  Tensor value, grad;
  int64_t at = 0, len = 0, offset = 0;
};

// The fixed-order sum (collectives/fixed_order.h) of `leaves` leaves spread evenly over dp
// (rank r: [leaves r / dp, leaves (r + 1) / dp)), from this rank's node partials `blocks`: `out`
// is the root's chunk of this rank (or, with `all`, the whole root). On the compute stream; dp = 1
// folds locally (a mesh without a dp dim has no group).
MESHRT_API Event fixed_order_sum(CommScheduler& dp, const std::vector<Tensor>& blocks,
                                 int64_t leaves, const Tensor& out, bool all,
                                 const FixedOrderOps& fo);

class MESHRT_API GradSync {
 public:
  // `params` in forward order. Each parameter's grad is rebound to a view of its bucket's flat
  // buffer (so the all-reduce needs no copies) and zeroed. `grad_sets` > 1 keeps that many
  // independent gradient buffers (for delayed, staleness-aware updates); set 0 is active.
  // Stage 3 needs `pieces`: the parameters grouped by the model's units in forward order (their
  // concatenation is `params`); buckets then follow piece boundaries. Other stages ignore it.
  // At stage 3 the parameters stay gathered (whole) until shard_params().
  GradSync(DeviceMesh& mesh, std::vector<Param*> params, DpOptions opts, int grad_sets = 1,
           std::vector<std::vector<Param*>> pieces = {});

  int dp_size() const { return dp_.size(); }
  CommScheduler& scheduler() { return dp_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Parameter names of bucket b, in the order they are packed.
  std::vector<std::string> bucket_params(int b) const;
  size_t bucket_bytes(int b) const;

  // Makes every dp replica's parameters equal dp rank 0's (collective over dp).
  void broadcast_params();
  // Collective over dp: throws naming the first parameter that differs between replicas.
  void verify_params_identical();

  // Selects which gradient buffer set the parameters' grads point to.
  void set_active(int grad_set);
  int active() const { return active_; }
  // Zeroes the active set's gradients (on the compute stream). With `first_write`, one gradient
  // set and ZeRO stage 0, the gradients of overwritable parameters (Param::grad_overwritable) are
  // only marked unwritten: their first backward write overwrites them, and mark_ready / finish
  // zero-fill those no backward wrote. For a caller that runs the model's backward (which calls
  // them) before reading any gradient: it saves a pass over every weight gradient.
  void zero_grad(bool first_write = false);
  // ZeRO stage 2: allocates (zeroed) the full buckets holding the gradients of `ps` when they are
  // not allocated; the model calls it before the backward that writes them. No-op otherwise.
  void prepare_grads(const std::vector<Param*>& ps);
  // With false, mark_ready launches nothing (micro-batches before the last accumulate locally).
  void enable_sync(bool on) { sync_enabled_ = on; }

  // The gradients of `ps` are final for this step: launch every bucket all of whose parameters
  // are now final. Called by the model after each block's backward. `writes_on`: the scheduler
  // whose comm stream may still be writing some of them (the tp one inside BlockStack::backward);
  // a launch that reads the bucket (dp > 1, ZeRO 2 / 3, the probe) settles those writes first.
  void mark_ready(const std::vector<Param*>& ps, CommScheduler* writes_on = nullptr);
  // Launches any bucket not launched yet (end of backward).
  void finish();
  // When defined (a one-element f32 tensor), each bucket adds ops::sum_squares of its local
  // gradients to it on the compute stream just before its all-reduce is launched: the training
  // guard's finiteness check then overlaps backward and needs no wait for the all-reduces.
  void set_sumsq_probe(Tensor sumsq) { probe_ = std::move(sumsq); }
  // Compute-stream wait for bucket b of `grad_set` (-1: active); the optimizer calls it per bucket
  // so it waits only for the buckets it is about to update.
  void wait_bucket(int b, int grad_set = -1);
  void wait_all(int grad_set = -1);
  // Parameters of bucket b.
  const std::vector<Param*>& bucket(int b) const { return buckets_[static_cast<size_t>(b)].params; }
  // Rebinds the grads to `grad_set` (like set_active) without touching launches.
  void bind(int grad_set);

  // Local SGD: average the parameter values over dp (collective; compute waits at the end).
  void average_params();

  // --- deterministic (DpOptions::deterministic; kernels/deterministic.h) ---
  // Adds the gradients the model's backward just wrote (one grain: global sample `grain`, with
  // zero_grad before its backward and sync disabled) to the step's fixed tree of partial sums.
  void push_grain(int64_t grain);
  // The step's reduction: every grain's gradient summed over dp in the fixed tree over `grains`
  // (the global batch; this rank held [dp_rank x grains / dp, ...)) and scaled by 1 / grains,
  // into the buckets (stages 0, 1: whole; 2, 3: this rank's shard); the stack is emptied. On the
  // compute stream; the optimizer's waits are no-ops afterwards.
  void reduce_grains(int64_t grains);
  // out[0] += the sum of squares of the reduced gradients this rank holds (reduce_grains').
  void sum_squares_reduced(const Tensor& out);
  // Stages 2 and 3: the reduced gradient shard of bucket b (of the active set).
  const Tensor& grad_shard(int b) const {
    return buckets_[static_cast<size_t>(b)].grad_shard[static_cast<size_t>(active_)];
  }
  FixedOrderOps fixed_order_ops() const;

  // --- ZeRO (zero() >= 1) ---
  int zero() const { return opts_.zero; }
  bool deterministic() const { return opts_.deterministic; }
  // Elements of bucket b: its parameters', its padded size (a multiple of dp), a rank's shard.
  int64_t bucket_numel(int b) const { return buckets_[static_cast<size_t>(b)].numel; }
  int64_t shard_numel(int b) const;
  // Offset of bucket b's parameter `slot` (bucket(b) order) in the bucket's flat buffer.
  int64_t bucket_offset(int b, int slot) const;
  // This rank's shard of bucket b, parameter by parameter (pieces of zero length left out).
  std::vector<ShardPiece> shard_pieces(int b) const;
  int dp_rank() const { return dp_.rank(); }
  int64_t padded_numel(int b) const { return buckets_[static_cast<size_t>(b)].padded; }
  DType bucket_dtype(int b) const { return buckets_[static_cast<size_t>(b)].dtype; }
  // This rank's shard of bucket b's flat parameter buffer (stage 3: the kept shard; stages 1 and
  // 2: the range it updates), for checkpoints.
  Tensor param_shard(int b) const;
  // Launches the all-gather of bucket b's parameters from every rank's updated shard (in place).
  void gather_params(int b);
  // Compute-stream wait for every gather_params launched (before the next forward).
  void wait_gathers();

  // --- ZeRO stage 3 (no-ops at other stages) ---
  // Makes piece k's parameters whole for the compute stream: launches the all-gather of each of
  // its buckets not gathered (or prefetched) yet and makes the compute stream wait for them; then
  // launches the all-gathers of piece `prefetch` (-1: none) on the dp stream, so they overlap
  // piece k's compute. At most kMaxGatheredPieces pieces' full buffers are alive at once (the
  // issuing thread waits for the compute of the oldest released one; FSDP's limit_all_gathers).
  void gather_piece(int k, int prefetch = -1);
  // Frees piece k's full parameter buffers (its parameters' values become undefined) once the
  // compute queued on them is done.
  void release_piece(int k);
  int num_pieces() const { return static_cast<int>(piece_buckets_.size()); }
  // Every bucket whole (collective over dp; waits): for checkpoints and tests.
  void gather_all_params();
  // Takes this rank's shard of every whole bucket (after a checkpoint load, the initial broadcast
  // or gather_all_params) and frees the full buffers.
  void shard_params();
  static constexpr int kMaxGatheredPieces = 3;

 private:
  struct Bucket {
    std::vector<Param*> params;  // backward order
    std::vector<int64_t> offsets;
    std::vector<Shape> shapes;  // the parameters' (stage 3 frees their values between uses)
    int64_t numel = 0;
    DType dtype = DType::f32;
    std::vector<Tensor> flat;      // one per grad set
    std::vector<Tensor> comm_buf;  // bf16 staging when bf16_comm
    std::vector<Event> done;       // per grad set
    std::vector<bool> launched;    // per grad set
    int ready = 0;                 // params marked in the current step
    // ZeRO: padded numel, the parameters' flat buffer (values are views of it), stage 2's
    // reduced gradient shard (per grad set) and the pending parameter all-gather.
    int64_t padded = 0;
    Tensor values;
    std::vector<Tensor> grad_shard;
    Tensor comm_stage;  // stage 2 with bf16_comm: the bf16 reduced shard
    Event gathered;
    Tensor param_shard;  // stage 3: this rank's shard of the parameters (values: when gathered)
  };
  void launch(Bucket& b);
  // The reduction of a bucket's gradients `flat` over the gradient group: average over dp; with
  // a cp dim, scales `flat` by 1 / dp (on the compute stream) and returns Sum.
  ReduceOp grad_op(const Tensor& flat);
  // Zero-fills the gradients of `ps` still marked unwritten by a first-write zero_grad (on the
  // compute stream) and clears the marks.
  void zero_unwritten(const std::vector<Param*>& ps);
  // Deterministic: a new gradient buffer for bucket b (the old one went onto the grains' stack).
  void renew_flat(Bucket& b, size_t s);
  // Stage 2: allocates grad set s's full bucket buffers (zeroed).
  void allocate_full(Bucket& b, size_t s);
  void launch_reduce_scatter(Bucket& b, size_t s);
  // Stage 3: allocates bucket b's full buffer and launches its all-gather; binds the values.
  void launch_param_gather(Bucket& b);
  void bind_values(Bucket& b);
  Bucket& bucket_of(const Param* p);

  DeviceMesh& mesh_;
  DpOptions opts_;
  CommScheduler dp_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int, int>> where_;  // param index -> (bucket, slot)
  std::vector<Param*> params_;
  std::vector<Bucket*> in_flight_;  // stage 2: reduce-scatters not yet waited for, oldest first
  // Stage 3: each piece's buckets, whether each piece is gathered, and the compute-stream events
  // of released pieces whose buffers the queued compute may still read (oldest first).
  std::vector<std::vector<int>> piece_buckets_;
  std::vector<bool> piece_gathered_;
  std::vector<Event> released_;
  // Deterministic: each bucket's binary counter of gradient partial sums (its padded buffers).
  std::vector<FixedOrderStack> grains_;
  int sets_ = 1;
  int active_ = 0;
  bool sync_enabled_ = true;
  Tensor probe_;
};

}  // namespace meshrt
