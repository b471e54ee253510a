#include "model/model.h"

#include "runtime/error.h"
#include "runtime/philox.h"

namespace meshrt {

DecoderModel::DecoderModel(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                           const ModelConfig& cfg)
    : cfg_(cfg),
      embed_((validate_block(cfg.block, tp.size(), opt), mesh), tp, opt, "embed", 1, cfg.vocab,
             cfg.block.hidden, cfg.block.dtype, cfg.block.seed, cfg.block.init_std),
      stack_(mesh, tp, opt, cfg.block, LayerKind::Transformer, cfg.layers),
      head_(mesh, tp, opt, cfg.block, "lm", 8, cfg.vocab) {}

std::vector<Param*> DecoderModel::params() {
  std::vector<Param*> p;
  embed_.collect(p);
  for (Param* q : stack_.params()) p.push_back(q);
  head_.collect(p);
  return p;
}

std::vector<std::vector<Param*>> DecoderModel::pieces() {
  std::vector<std::vector<Param*>> out(1);
  embed_.collect(out.front());
  for (const StackPiece& p : stack_.pieces()) out.push_back(p.params);
  out.emplace_back();
  head_.collect(out.back());
  return out;
}

StackHooks with_sync_hooks(GradSync* sync, const BlockStack& stack, StackHooks hooks,
                           int first_piece) {
  if (!sync) return hooks;
  const StackPiece* first = stack.pieces().data();
  auto begin = std::move(hooks.begin);
  auto end = std::move(hooks.end);
  hooks.begin = [sync, first, first_piece, begin](const StackPiece& p, Pass pass) {
    const int k = static_cast<int>(&p - first) + first_piece;
    const int next = pass == Pass::Forward ? k + 1 : k - 1;
    const bool prefetch =
        next < sync->num_pieces() && (pass == Pass::Forward || next >= first_piece);
    if (sync->zero() == 3) sync->gather_piece(k, prefetch ? next : -1);
    if (pass == Pass::Backward) sync->prepare_grads(p.params);
    if (begin) begin(p, pass);
  };
  hooks.end = [sync, first, first_piece, end](const StackPiece& p, Pass pass) {
    if (end) end(p, pass);
    if (sync->zero() == 3) sync->release_piece(static_cast<int>(&p - first) + first_piece);
  };
  return hooks;
}

Tensor DecoderModel::forward(const Tensor& ids, const Tensor& targets, GradSync* sync,
                             bool backward_follows) {
  const int head = static_cast<int>(stack_.pieces().size()) + 1;
  if (sync) sync->gather_piece(0, 1);
  Tensor x = embed_.forward(ids);
  if (sync) sync->release_piece(0);
  x = stack_.forward(x, with_sync_hooks(sync, stack_, {}, 1));
  if (sync) sync->gather_piece(head);
  Tensor loss = head_.forward(x, targets);
  if (sync && !backward_follows) sync->release_piece(head);  // else backward releases it
  return loss;
}

void DecoderModel::backward(float grad_scale, GradSync* sync) {
  std::vector<Param*> head, embed;
  head_.collect(head);
  embed_.collect(embed);
  const int head_piece = static_cast<int>(stack_.pieces().size()) + 1;
  if (sync) {
    sync->gather_piece(head_piece, head_piece - 1);  // the head's: still there from forward
    sync->prepare_grads(head);
  }
  Tensor d = head_.backward(grad_scale);
  if (sync) {
    sync->release_piece(head_piece);
    sync->mark_ready(head);
  }
  StackHooks hooks;
  if (sync) {
    hooks.grads_ready = [sync, tp = &stack_.tp()](const StackPiece& p) {
      sync->mark_ready(p.params, tp);
    };
  }
  d = stack_.backward(d, with_sync_hooks(sync, stack_, std::move(hooks), 1));
  if (sync) sync->prepare_grads(embed);  // a scatter-add of d: the weights are not read
  embed_.backward(d);
  if (sync) {
    sync->mark_ready(embed);
    sync->finish();
  }
}

void make_synthetic_batch(Context& ctx, uint64_t seed, int64_t first_sample, int64_t n, int64_t seq,
                          int64_t vocab, Tensor* ids, Tensor* targets) {
  MESHRT_CHECK(n >= 1 && seq >= 1 && vocab >= 2,
               "synthetic batch: n=" << n << ", seq=" << seq << ", vocab=" << vocab);
  auto host = ctx.host_allocator();
  Tensor hi = Tensor::empty({seq, n}, DType::i64, host),
         ht = Tensor::empty({seq, n}, DType::i64, host);
  int64_t* pi = hi.data<int64_t>();
  int64_t* pt = ht.data<int64_t>();
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t sample = static_cast<uint64_t>(first_sample + j);
    int64_t t = static_cast<int64_t>(philox_draw(seed, 0x5eed, sample).v[0] % vocab);
    for (int64_t k = 0; k < seq; ++k) {
      pi[k * n + j] = t;
      t = (5 * t + 3 + (k % 3)) % vocab;
      pt[k * n + j] = t;
    }
  }
  if (ctx.device().is_cpu()) {
    *ids = hi;
    *targets = ht;
  } else {
    *ids = hi.to(ctx.allocator_ptr(), ctx.compute_stream());
    *targets = ht.to(ctx.allocator_ptr(), ctx.compute_stream());
    ctx.compute_stream().synchronize();
  }
}

}  // namespace meshrt
