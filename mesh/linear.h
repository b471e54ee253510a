// Tensor-parallel linear layers with explicit forward / backward (Megatron semantics).
// Activations are sequence-first, [seq, batch, features] as in Megatron, so a sequence shard is a
// contiguous block and the sequence all-gather / reduce-scatter need no reshuffling.
#pragma once

#include "mesh/parallel.h"

namespace meshrt {

struct LinearSpec {
  std::string name;
  uint64_t id = 0;  // parameter ids: weight id, bias id + 1
  int64_t in = 0, out = 0;
  DType dtype = DType::f32;
  bool bias = true;
  float init_std = 0.02f;
  float bias_std = 0.f;  // biases ~ N(0, bias_std); 0: zeros (the usual init)
  uint64_t seed = 0;
};

// ColwiseParallel: weight [in, out] sharded on out. Input Replicate (or Shard(seq) under sequence
// parallel: all-gathered first), output Shard(-1). Backward: the input gradient is all-reduced
// over tp (reduce-scattered along the sequence under SP).
class ColwiseLinear {
 public:
  ColwiseLinear(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const LinearSpec& s);
  // x [s_local, b, in] -> y [s, b, out / tp]. With apply_bias false the caller adds the bias
  // (e.g. fused into GeLU) and fills bias.grad itself.
  Tensor forward(const Tensor& x, bool apply_bias = true);
  // dy [s, b, out / tp] -> dx like x. *dx_ready: the compute stream must wait for it before
  // reading dx (CommScheduler::wait), so the collective overlaps the wgrad GEMM.
  Tensor backward(const Tensor& dy, Event* dx_ready, bool apply_bias = true);
  void collect(std::vector<Param*>& out);

  Param weight, bias;

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  TpOptions opt_;
  LinearSpec spec_;
  Tensor x_saved_;       // the local input (re-gathered in backward under SP)
  Tensor x_full_saved_;  // the gathered input when it is kept (no SP)
};

// RowwiseParallel: weight [in, out] sharded on in. Input Shard(-1); output Partial resolved by
// all-reduce (Replicate) or, under sequence parallel, reduce-scatter along the sequence.
class RowwiseLinear {
 public:
  RowwiseLinear(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const LinearSpec& s);
  // x [s, b, in / tp] -> y [s_local, b, out] (bias added after the reduction).
  Tensor forward(const Tensor& x);
  // dy [s_local, b, out] -> dx [s, b, in / tp] (sequence all-gather of dy first under SP).
  Tensor backward(const Tensor& dy);
  void collect(std::vector<Param*>& out);

  Param weight, bias;

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  TpOptions opt_;
  LinearSpec spec_;
  Tensor x_saved_;
};

// Adds sum over rows of dy ([..., n]) into grad ([n]) with a ones-vector GEMM.
void accumulate_row_sum(Context& ctx, Stream& s, const Tensor& dy, const Tensor& grad);

}  // namespace meshrt
