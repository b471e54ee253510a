#include "mesh/optimizer.h"

#include <cmath>
#include <map>

#include "runtime/error.h"

namespace meshrt {

OptimizerKind parse_optimizer(std::string_view s) {
  if (s == "sgd") return OptimizerKind::Sgd;
  if (s == "adamw" || s == "adam") return OptimizerKind::AdamW;
  MESHRT_FAIL("unknown optimizer '" << s << "': use sgd or adamw");
}

Optimizer::Optimizer(DeviceMesh& mesh, std::vector<Param*> params, OptimizerConfig cfg)
    : mesh_(mesh), params_(std::move(params)), cfg_(cfg) {
  MESHRT_CHECK(cfg.lr >= 0 && std::isfinite(cfg.lr),
               "optimizer: learning rate " << cfg.lr << " is invalid");
  Context& ctx = mesh.ctx();
  for (Param* p : params_) {
    m_.push_back(ctx.zeros(p->value.shape(), DType::f32));
    if (cfg.kind == OptimizerKind::AdamW) v_.push_back(ctx.zeros(p->value.shape(), DType::f32));
  }
}

void Optimizer::update(const std::vector<Param*>& ps, float lr) {
  if (ps.empty()) return;
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  std::vector<Tensor> w, g, m, v;
  for (Param* p : ps) {
    size_t i = static_cast<size_t>(std::find(params_.begin(), params_.end(), p) - params_.begin());
    MESHRT_CHECK(i < params_.size(), "optimizer: parameter " << p->name << " is not managed here");
    w.push_back(p->value);
    g.push_back(p->grad);
    m.push_back(m_[i]);
    if (!v_.empty()) v.push_back(v_[i]);
  }
  if (cfg_.kind == OptimizerKind::AdamW) {
    ops::AdamWConfig c;
    c.lr = lr;
    c.beta1 = cfg_.beta1;
    c.beta2 = cfg_.beta2;
    c.eps = cfg_.eps;
    c.weight_decay = cfg_.weight_decay;
    c.step = step_;
    ops::adamw_update(ctx, cs, w, g, m, v, c);
  } else {
    ops::SgdConfig c;
    c.lr = lr;
    c.momentum = cfg_.momentum;
    c.weight_decay = cfg_.weight_decay;
    c.init_buffers = first_;
    ops::sgd_momentum_update(ctx, cs, w, g, m, c);
  }
}

void Optimizer::step(GradSync* sync, float lr_scale, int grad_set) {
  step_++;
  const float lr = cfg_.lr * lr_scale;
  if (cfg_.clip_norm > 0.f) {
    if (sync) sync->wait_all(grad_set);
    double n = grad_norm();
    if (n > cfg_.clip_norm) {
      float f = static_cast<float>(cfg_.clip_norm / (n + 1e-6));
      for (Param* p : params_)
        ops::scale(mesh_.ctx(), mesh_.ctx().compute_stream(), p->grad, p->grad, f);
    }
    update(params_, lr);
  } else if (sync) {
    for (int b = 0; b < sync->num_buckets(); ++b) {
      sync->wait_bucket(b, grad_set);
      update(sync->bucket(b), lr);
    }
  } else {
    update(params_, lr);
  }
  first_ = false;
}

NamedTensors Optimizer::state(size_t i) const {
  MESHRT_CHECK(i < params_.size(),
               "optimizer: state of parameter " << i << " of " << params_.size());
  if (cfg_.kind == OptimizerKind::AdamW) return {{"exp_avg", m_[i]}, {"exp_avg_sq", v_[i]}};
  return {{"momentum", m_[i]}};
}

void Optimizer::set_steps(int64_t n) {
  MESHRT_CHECK(n >= 0, "optimizer: step count " << n << " must be >= 0");
  step_ = n;
  first_ = n == 0;
}

double Optimizer::grad_norm() {
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  // [0]: tp-sharded parameters (summed over tp), [1]: replicated ones (already complete).
  Tensor acc_sharded = ctx.zeros({1, 1}, DType::f32), acc_repl = ctx.zeros({1, 1}, DType::f32);
  for (Param* p : params_) {
    const bool sharded = p->sharded_on(mesh_, kTpDim) && mesh_.size(kTpDim) > 1;
    ops::sum_squares(ctx, cs, p->grad.contiguous(cs), sharded ? acc_sharded : acc_repl);
  }
  if (mesh_.size(kTpDim) > 1) {
    CommScheduler tp(mesh_, kTpDim, Overlap::None);
    tp.all_reduce(acc_sharded, "grad_norm");
  }
  Tensor a = acc_sharded.to(ctx.host_allocator(), cs), r = acc_repl.to(ctx.host_allocator(), cs);
  cs.synchronize();
  return std::sqrt(a.item(0) + r.item(0));
}

}  // namespace meshrt
