// A small decoder model (vocab-parallel embedding, N transformer blocks, LM head with loss
// parallel) and the deterministic synthetic token data it trains on.
#pragma once

#include <memory>
#include <vector>

#include "dist/data_parallel.h"
#include "model/lm.h"
#include "model/stack.h"

namespace meshrt {

struct ModelConfig {
  BlockConfig block;
  int layers = 2;
  int64_t vocab = 512;
};

class DecoderModel {
 public:
  DecoderModel(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const ModelConfig& cfg);
  // ids, targets [seq, batch] i64 -> mean loss over the tokens, a [1] f32 tensor. With `sync` at
  // ZeRO stage 3, each piece's parameters are gathered before its forward (the next piece's
  // prefetched) and freed after, except the LM head's when `backward_follows`: its backward runs
  // right after its forward, so they stay for it (as FSDP2 keeps the root module's).
  Tensor forward(const Tensor& ids, const Tensor& targets, GradSync* sync = nullptr,
                 bool backward_follows = true);
  // Backward of the loss times grad_scale; after each piece of the block stack tells `sync` its
  // gradients are final so their buckets' all-reduces start while earlier pieces are still
  // differentiating (stage 3: gathering each stack piece's parameters again, the previous
  // piece's prefetched; the embedding's backward reads no parameters, so it gathers none).
  void backward(float grad_scale, GradSync* sync);
  // The packed documents of the batch the next forward runs (null: none): its attention stays
  // inside each document (model/blocks.h PackedDocs; train --doc-mask).
  void set_documents(const std::shared_ptr<const PackedDocs>& docs) { stack_.set_documents(docs); }
  // Every parameter, in forward order.
  std::vector<Param*> params();
  // The parameters by piece, in forward order: the embedding, each stack piece, the LM head (the
  // units ZeRO stage 3 gathers).
  std::vector<std::vector<Param*>> pieces();
  const ModelConfig& config() const { return cfg_; }

 private:
  ModelConfig cfg_;
  VocabEmbedding embed_;
  BlockStack stack_;
  LmHead head_;
};

// `hooks` with `sync`'s work around each piece of `stack` added (none without sync): before a
// piece's backward its gradient buckets are allocated (ZeRO 2 and 3: prepare_grads); at ZeRO 3
// its parameters are gathered before each pass, the next piece in the pass's order prefetched
// (forward: the next, backward: the previous), and freed after. Stack piece k is GradSync piece
// k + first_piece (a DecoderModel's embedding is piece 0); the last stack piece prefetches piece
// k + first_piece + 1 only when `sync` has it, and backward prefetches no piece below
// first_piece (the embedding's backward needs no parameters).
StackHooks with_sync_hooks(GradSync* sync, const BlockStack& stack, StackHooks hooks,
                           int first_piece = 0);

// Synthetic next-token data, keyed by (seed, global sample index) only: sample i is a walk
// t[k+1] = (5 t[k] + 3 + (k % 3)) mod vocab from a random start, so the model can learn it and
// each dp rank draws its own slice of the same global batch. ids [seq, n], targets [seq, n].
void make_synthetic_batch(Context& ctx, uint64_t seed, int64_t first_sample, int64_t n, int64_t seq,
                          int64_t vocab, Tensor* ids, Tensor* targets);

}  // namespace meshrt
