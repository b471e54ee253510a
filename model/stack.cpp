#include "model/stack.h"

#include "runtime/error.h"

namespace meshrt {

namespace {
// "L<l>". (Appending, not "L" + to_string: GCC 12 at -O3 warns falsely about that
// concatenation, -Wrestrict, GCC bug 105329.)
std::string layer_tag(int l) {
  std::string s = "L";
  s += std::to_string(l);
  return s;
}
}  // namespace

BlockStack::BlockStack(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                       const BlockConfig& cfg, LayerKind kind, int layers,
                       const std::string& prefix)
    : tp_(tp), kind_(kind), layers_(layers) {
  MESHRT_CHECK(layers >= 1, "block stack: layers " << layers << " must be >= 1");
  auto add = [&](int l, bool attention, std::unique_ptr<Block> b) {
    StackPiece p;
    p.layer = l;
    p.attention = attention;
    p.name = layer_tag(l) + (attention ? ".attn" : ".mlp");
    p.block = b.get();
    p.params = b->params();
    blocks_.push_back(std::move(b));
    pieces_.push_back(std::move(p));
  };
  for (int l = 0; l < layers; ++l) {
    const std::string name = prefix + "." + std::to_string(l);
    const uint64_t id = kBlockIdStride * static_cast<uint64_t>(l + 1);
    // A transformer layer's MLP takes its ids from 8 further.
    const uint64_t mid = kind == LayerKind::Transformer ? id + 8 : id;
    for (PieceKind piece : layer_pieces(kind)) {
      if (piece == PieceKind::Attention)
        add(l, true, std::make_unique<AttentionBlock>(mesh, tp, opt, cfg, name + ".attn", id));
      else
        add(l, false, std::make_unique<MlpBlock>(mesh, tp, opt, cfg, name + ".mlp", mid));
    }
  }
}

Tensor BlockStack::forward(const Tensor& x, const StackHooks& hooks) {
  Tensor h = x;
  for (const StackPiece& p : pieces_) {
    if (hooks.begin) hooks.begin(p, Pass::Forward);
    h = p.block->forward(h);
    if (hooks.end) hooks.end(p, Pass::Forward);
  }
  return h;
}

Tensor BlockStack::backward(const Tensor& dout, const StackHooks& hooks) {
  Tensor d = dout;
  {
    CommScheduler::GradDeferral defer(tp_);
    for (size_t i = pieces_.size(); i-- > 0;) {
      const StackPiece& p = pieces_[i];
      if (hooks.begin) hooks.begin(p, Pass::Backward);
      d = p.block->backward(d);
      if (hooks.end) hooks.end(p, Pass::Backward);
      if (hooks.grads_ready) hooks.grads_ready(p);
    }
  }
  tp_.settle_grad_writes();
  return d;
}

void BlockStack::set_documents(const std::shared_ptr<const PackedDocs>& docs) {
  for (auto& b : blocks_) b->set_documents(docs);
}

std::vector<Param*> BlockStack::params() const {
  std::vector<Param*> out;
  for (const StackPiece& p : pieces_) out.insert(out.end(), p.params.begin(), p.params.end());
  return out;
}

}  // namespace meshrt
