// A tensor-parallel linear layer with explicit forward / backward (Megatron semantics), laid out
// by a parallel style (colwise or rowwise, dist/style.h).
// Activations are sequence-first, [seq, batch, features] as in Megatron, so a sequence shard is a
// contiguous block and the sequence all-gather / reduce-scatter need no reshuffling.
#pragma once

#include "dist/style.h"
#include "meshrt/export.h"
#include "model/block_desc.h"

namespace meshrt {

// The style of one of the blocks' linears (model/block_desc.h): the ParallelStyle of the
// LinearStyle its style plan gave it (dist/style_plan.h: colwise_parallel, rowwise_parallel). A
// new LinearStyle gets its case here. The executors build their linears with it and the planner's
// cost model reads the same styles for the linears' collectives and buffers.
MESHRT_API ParallelStyle linear_style(const LinearDesc& d, bool sequence_parallel);

struct MESHRT_API LinearSpec {
  std::string name;
  uint64_t id = 0;  // parameter ids: weight id, bias id + 1
  int64_t in = 0, out = 0;
  DType dtype = DType::f32;
  bool bias = true;
  // The caller applies the bias (fused into its next op, e.g. bias + GeLU) and fills bias.grad.
  bool bias_in_epilogue = false;
  float init_std = 0.02f;
  float bias_std = 0.f;  // biases ~ N(0, bias_std); 0: zeros (the usual init)
  uint64_t seed = 0;
};

// What backward gives every module: the input gradient and the event it is complete at (invalid
// when it already is). The compute stream must wait for `ready` (CommScheduler::wait) before
// reading dx; deferring that wait lets the collective overlap the weight-gradient GEMM.
struct MESHRT_API InputGrad {
  Tensor dx;
  Event ready;
};

// y = x @ W (+ b), W [in, out] sharded per the style (uneven shards allowed: an out (colwise) or
// in (rowwise) that tp does not divide gives the first out % tp ranks one more column).
// Colwise: x [s_local, b, in] -> y [s, b, out_local]; backward all-reduces the input gradient
// (reduce-scatters it along the sequence under SP) while the wgrad GEMM runs.
// Rowwise: x [s, b, in_local] -> y [s_local, b, out]; backward all-gathers dy first under SP.
// Overlap::Async under SP computes a GEMM over the sequence all-gather (colwise forward, rowwise
// dgrad) one sequence shard at a time, the own shard's rows first while the gather runs, and a
// rowwise forward the rows the other ranks own first, exchanged while its own rows compute.
// Overlap::Chunked splits the sequence all-gather (colwise) / reduce-scatter (rowwise) into tp
// pieces so GEMM pieces start as their rows arrive (its backward is async's).
class MESHRT_API Linear {
 public:
  Linear(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const LinearSpec& s,
         ParallelStyle style);
  Tensor forward(const Tensor& x);
  InputGrad backward(const Tensor& dy);
  void collect(std::vector<Param*>& out);
  const ParallelStyle& style() const { return style_; }

  Param weight, bias;

 private:
  Tensor forward_chunked_gather(const Tensor& x, const Tensor& y, const Tensor* bptr);
  Tensor forward_chunked_scatter(const Tensor& x, const Tensor& y, const Tensor* bptr);
  void gemm_peer_rows_first(const Tensor& x, const Tensor& y, const Tensor* bptr);
  void gemm_local_first(const Tensor& local, const Tensor& gathered, const Event& done,
                        const Tensor& w, bool trans_w, const Tensor& out, const Tensor* bptr);

  DeviceMesh& mesh_;
  CommScheduler& tp_;
  TpOptions opt_;
  LinearSpec spec_;
  ParallelStyle style_;
  Tensor x_saved_;  // the local input (re-gathered in backward when the style gathers it)
};

// Adds sum over rows of dy ([..., n]) into grad ([n]) with a ones-vector GEMM.
MESHRT_API void accumulate_row_sum(Context& ctx, Stream& s, const Tensor& dy, const Tensor& grad);

}  // namespace meshrt
