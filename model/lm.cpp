#include "model/lm.h"

#include "runtime/error.h"

namespace meshrt {

VocabEmbedding::VocabEmbedding(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt,
                               std::string name, uint64_t id, int64_t vocab, int64_t hidden,
                               DType dtype, uint64_t seed, float init_std)
    : mesh_(mesh),
      tp_(tp),
      style_(vocab_parallel_embedding(opt.sequence_parallel && tp.size() > 1)) {
  MESHRT_CHECK(vocab >= tp.size(), "embedding " << name << ": vocab " << vocab
                                                << " is smaller than tp=" << tp.size()
                                                << "; change --vocab or the mesh");
  PhiloxInit init{seed, 0, PhiloxInit::Dist::Normal, 0.f, init_std};
  weight = make_param(mesh, name + ".weight", id, {vocab, hidden},
                      placements_on(mesh, kTpDim, style_.weight), dtype, init);
}

Tensor VocabEmbedding::forward(const Tensor& ids) {
  MESHRT_CHECK(
      ids.ndim() == 2 && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32),
      "embedding " << weight.name << ": ids " << ids.str() << " must be [seq, batch] i32/i64");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int tp = tp_.size();
  const Redistribution rout = style_.out();
  const int64_t s = ids.size(0), b = ids.size(1), h = weight.full_shape[1];
  MESHRT_CHECK(!rout.to.is_shard() || s % tp == 0,
               "embedding: sequence " << s << " does not divide by tp=" << tp);
  const int64_t off = weight.offsets[0];
  Tensor partial = ctx.empty({s, b, h}, weight.value.dtype());
  ops::embedding_fwd(ctx, cs, ids, weight.value, partial, off);
  ids_ = ids;
  Tensor out = rout.to.is_replicate()
                   ? partial
                   : ctx.empty(rout.out_shape(partial.shape(), tp), partial.dtype());
  tp_.wait(redistribute(tp_, partial, out, rout, "embedding.out"));
  return out;
}

void VocabEmbedding::backward(const Tensor& dout) {
  MESHRT_CHECK(ids_.defined(), "embedding " << weight.name << ": backward without forward");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const Redistribution g = style_.out().grad();
  Tensor d = dout;
  if (!g.is_identity()) {
    d = ctx.empty(g.out_shape(dout.shape(), tp_.size()), dout.dtype());
    tp_.wait(redistribute(tp_, dout, d, g, "embedding.bwd.out"));
  }
  ops::embedding_bwd(ctx, cs, ids_, d, weight.grad, weight.offsets[0], /*accumulate=*/true);
  ids_ = Tensor();
}

// ---- LM head ------------------------------------------------------------------------------------

namespace {
LinearSpec head_spec(const BlockConfig& c, const std::string& name, uint64_t id, int64_t vocab,
                     int tp) {
  MESHRT_CHECK(vocab >= tp, "LM head: vocab " << vocab << " is smaller than tp=" << tp
                                              << "; change --vocab or the mesh");
  const LinearDesc d = lm_head_linear(c.hidden, vocab);  // model/block_desc.h
  LinearSpec s;
  s.name = name + "." + d.name;
  s.id = id;
  s.in = d.in;
  s.out = d.out;
  s.dtype = c.dtype;
  s.bias = false;
  s.init_std = c.init_std;
  s.seed = c.seed;
  return s;
}
}  // namespace

LmHead::LmHead(DeviceMesh& mesh, CommScheduler& tp, const TpOptions& opt, const BlockConfig& cfg,
               std::string name, uint64_t id, int64_t vocab)
    : norm(mesh, tp, opt, cfg.norm, name + ".norm", id, cfg.hidden, cfg.dtype, cfg.eps,
           cfg.param_noise, cfg.seed),
      head(mesh, tp, opt, head_spec(cfg, name, id + 2, vocab, tp.size()),
           loss_parallel_head(opt.sequence_parallel && tp.size() > 1)),
      mesh_(mesh),
      tp_(tp),
      vocab_(vocab) {}

void LmHead::collect(std::vector<Param*>& out) {
  norm.collect(out);
  head.collect(out);
}

Tensor LmHead::forward(const Tensor& x, const Tensor& targets) {
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  Tensor ln = norm.forward(x);
  Tensor logits = head.forward(ln);  // [s, b, v / tp]
  const int64_t s = logits.size(0), b = logits.size(1), rows = s * b;
  MESHRT_CHECK(targets.ndim() == 2 && targets.size(0) == s && targets.size(1) == b,
               "LM head: targets " << targets.str() << " must be [" << s << ", " << b << "]");
  seq_ = s;
  batch_ = b;
  logits_ = logits.view({rows, logits.size(2)});
  targets_ = targets.view({rows});
  const int64_t voff = head.weight.offsets[1];
  row_max_ = ctx.empty({rows}, DType::f32);
  sumexp_ = ctx.empty({rows}, DType::f32);
  Tensor tl = ctx.empty({rows}, DType::f32), loss = ctx.empty({rows}, DType::f32);
  ops::xent_row_max(ctx, cs, logits_, row_max_);
  // Loss parallel: per-row statistics of this vocabulary shard are partial (max / sum) and
  // reduced, never the logits themselves.
  const Placement R = Placement::replicate();
  tp_.wait(
      redistribute(tp_, row_max_, row_max_, {Placement::partial(ReduceOp::Max), R}, "xent.max"));
  ops::xent_row_sumexp(ctx, cs, logits_, row_max_, sumexp_);
  ops::xent_target_logit(ctx, cs, logits_, targets_, tl, voff);
  Event e1 = redistribute(tp_, sumexp_, sumexp_, {Placement::partial(), R}, "xent.sumexp");
  Event e2 = redistribute(tp_, tl, tl, {Placement::partial(), R}, "xent.target");
  tp_.wait(e1);
  tp_.wait(e2);
  ops::xent_loss(ctx, cs, row_max_, sumexp_, tl, targets_, loss);
  Tensor mean = ctx.zeros({1}, DType::f32);
  accumulate_row_sum(ctx, cs, loss.view({rows, 1}), mean);
  ops::scale(ctx, cs, mean, mean, 1.f / static_cast<float>(rows));
  return mean;
}

Tensor LmHead::backward(float grad_scale) {
  MESHRT_CHECK(logits_.defined(), "LM head: backward without forward");
  Context& ctx = mesh_.ctx();
  Stream& cs = tp_.compute();
  const int64_t rows = logits_.size(0);
  Tensor dlogits = ctx.empty({seq_, batch_, logits_.size(1)}, logits_.dtype());
  ops::xent_grad(ctx, cs, logits_, row_max_, sumexp_, targets_, dlogits.view(logits_.shape()),
                 head.weight.offsets[1], grad_scale / static_cast<float>(rows));
  InputGrad dln = head.backward(dlogits);
  tp_.wait(dln.ready);
  logits_ = row_max_ = sumexp_ = targets_ = Tensor();
  return norm.backward(dln.dx);
}

}  // namespace meshrt
