// Vocab-parallel embedding and LM head with loss parallel (cross-entropy without gathering the
// logits: max and sum-exp are all-reduced over tp), so a small model can be built and trained.
#pragma once

#include "model/blocks.h"

namespace meshrt {

// Embedding in the vocab-parallel style: weight [vocab, hidden] sharded on vocab over tp (unevenly
// when tp does not divide vocab). ids are [seq, batch] i64 (the full sequence on every tp rank);
// the output is [seq, batch, hidden] replicated, or its sequence shard under sequence parallel
// (the partial lookups are all-reduced / reduce-scattered over tp).
class VocabEmbedding {
 public:
  VocabEmbedding(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, std::string name,
                 uint64_t id, int64_t vocab, int64_t hidden, DType dtype, uint64_t seed,
                 float init_std = 0.02f);
  Tensor forward(const Tensor& ids);
  void backward(const Tensor& dout);
  void collect(std::vector<Param*>& out) { out.push_back(&weight); }
  Param weight;

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  ParallelStyle style_;
  Tensor ids_;
};

// Final norm, then logits = x @ W (W [hidden, vocab] in the loss-parallel head style: colwise over
// tp, uneven when tp does not divide vocab, no bias), then the mean cross-entropy over all tokens
// against targets [seq, batch] (global ids).
class LmHead {
 public:
  LmHead(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const BlockConfig& cfg,
         std::string name, uint64_t id, int64_t vocab);
  // Returns the mean loss as a [1] f32 tensor on the device (ready on the compute stream).
  Tensor forward(const Tensor& x, const Tensor& targets);
  // Gradient of the mean loss (times grad_scale) with respect to x.
  Tensor backward(float grad_scale = 1.f);
  void collect(std::vector<Param*>& out);

  Norm norm;
  Linear head;

 private:
  DeviceMesh& mesh_;
  CommScheduler& tp_;
  [[maybe_unused]] int64_t vocab_;  // clang -Wunused-private-field (sanitizer builds)
  int64_t seq_ = 0, batch_ = 0;
  Tensor logits_, row_max_, sumexp_, targets_;
};

}  // namespace meshrt
