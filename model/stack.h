// A stack of transformer / MLP / attention layers driven piece by piece (a transformer layer is
// two pieces, attention then MLP), with hooks around each piece's forward and backward and when
// a piece's gradients are final: the one loop the benchmark, `meshrt train` and the C API share.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/block_desc.h"
#include "model/blocks.h"

namespace meshrt {

enum class Pass : uint8_t { Forward, Backward };

// One piece of the stack: an attention or MLP block of layer `layer`.
struct StackPiece {
  int layer = 0;
  bool attention = false;  // else MLP
  std::string name;        // "L<layer>.attn" / "L<layer>.mlp": trace slices, profiler ranges
  Block* block = nullptr;
  std::vector<Param*> params;  // the block's, in forward order
};

// Hooks are optional; each runs on the issuing thread, in issue order (no stream is synchronised
// around them, so timers that need the device's view record events on the streams themselves).
struct StackHooks {
  // Around each piece's forward (in layer order) and backward (in reverse).
  std::function<void(const StackPiece&, Pass)> begin, end;
  // After a piece's backward (after `end`): its parameters' gradients are final for this step,
  // e.g. GradSync::mark_ready so their dp buckets launch while earlier pieces differentiate. The
  // sequence-parallel norms' may still be being written on the tp stream: a hook that reads
  // gradients settles them first (CommScheduler::settle_grad_writes; mark_ready takes the tp
  // scheduler for that). When backward returns every gradient is settled.
  std::function<void(const StackPiece&)> grads_ready;
};

class BlockStack {
 public:
  // `layers` layers of `kind`, layer l named "<prefix>.<l>" with parameter ids from
  // kBlockIdStride * (l + 1) (a transformer layer's MLP from 8 further), so a stack of any kind
  // and a DecoderModel name and initialise their parameters the same way.
  BlockStack(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const BlockConfig& cfg,
             LayerKind kind, int layers, const std::string& prefix = "layers");
  Tensor forward(const Tensor& x, const StackHooks& hooks = {});
  Tensor backward(const Tensor& dout, const StackHooks& hooks = {});
  // The packed documents of the batch the next forward runs (Block::set_documents), every block's.
  void set_documents(const std::shared_ptr<const PackedDocs>& docs);
  // Every parameter, in forward order.
  std::vector<Param*> params() const;
  const std::vector<StackPiece>& pieces() const { return pieces_; }
  LayerKind kind() const { return kind_; }
  int layers() const { return layers_; }
  CommScheduler& tp() const { return tp_; }

 private:
  CommScheduler& tp_;
  LayerKind kind_;
  int layers_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<StackPiece> pieces_;
};

}  // namespace meshrt
