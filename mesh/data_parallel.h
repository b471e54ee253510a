// Data parallelism over a mesh's dp dim (kDpDim): gradients packed into buckets (in the reverse of
// forward order, the order backward produces them), each all-reduced (average) on the dp stream
// as soon as its last gradient is final, overlapping the rest of backward.
#pragma once

#include <vector>

#include "mesh/parallel.h"
#include "meshrt/export.h"

namespace meshrt {

struct MESHRT_API DpOptions {
  double bucket_mb = 25.0;  // bucket capacity; a parameter larger than this gets its own bucket
  bool bf16_comm = false;   // communicate f32 gradients as bf16 (reduced in f32, cast back)
  Overlap overlap = Overlap::Async;  // None: wait for each bucket right after launching it
};

class MESHRT_API GradSync {
 public:
  // `params` in forward order. Each parameter's grad is rebound to a view of its bucket's flat
  // buffer (so the all-reduce needs no copies) and zeroed. `grad_sets` > 1 keeps that many
  // independent gradient buffers (for delayed, staleness-aware updates); set 0 is active.
  GradSync(DeviceMesh& mesh, std::vector<Param*> params, DpOptions opts, int grad_sets = 1);

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
  // Zeroes the active set's gradients (on the compute stream).
  void zero_grad();
  // With false, mark_ready launches nothing (micro-batches before the last accumulate locally).
  void enable_sync(bool on) { sync_enabled_ = on; }

  // The gradients of `ps` are final for this step: launch every bucket all of whose parameters
  // are now final. Called by the model after each block's backward.
  void mark_ready(const std::vector<Param*>& ps);
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

 private:
  struct Bucket {
    std::vector<Param*> params;  // backward order
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    DType dtype = DType::f32;
    std::vector<Tensor> flat;      // one per grad set
    std::vector<Tensor> comm_buf;  // bf16 staging when bf16_comm
    std::vector<Event> done;       // per grad set
    std::vector<bool> launched;    // per grad set
    int ready = 0;                 // params marked in the current step
  };
  void launch(Bucket& b);

  DeviceMesh& mesh_;
  DpOptions opts_;
  CommScheduler dp_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int, int>> where_;  // param index -> (bucket, slot)
  std::vector<Param*> params_;
  int sets_ = 1;
  int active_ = 0;
  bool sync_enabled_ = true;
  Tensor probe_;
};

}  // namespace meshrt
