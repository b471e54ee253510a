#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

#include "runtime/error.h"

namespace meshrt {

OptimizerKind parse_optimizer(std::string_view s) {
  if (s == "sgd") return OptimizerKind::Sgd;
  if (s == "adamw" || s == "adam") return OptimizerKind::AdamW;
  MESHRT_FAIL("unknown optimizer '" << s << "': use sgd or adamw");
}

LrScheduleKind parse_lr_schedule(std::string_view s) {
  if (s == "constant") return LrScheduleKind::Constant;
  if (s == "cosine") return LrScheduleKind::Cosine;
  if (s == "linear") return LrScheduleKind::Linear;
  MESHRT_FAIL("unknown --lr-schedule '" << s << "': use constant, cosine or linear");
}

const char* lr_schedule_name(LrScheduleKind k) {
  switch (k) {
    case LrScheduleKind::Constant:
      return "constant";
    case LrScheduleKind::Cosine:
      return "cosine";
    case LrScheduleKind::Linear:
      return "linear";
  }
  return "?";
}

void validate_lr_schedule(const LrSchedule& s, float lr) {
  MESHRT_CHECK(s.total_steps >= 1, "train: --steps " << s.total_steps << " must be >= 1");
  MESHRT_CHECK(s.warmup_steps >= 0 && s.warmup_steps < s.total_steps,
               "train: --warmup-steps " << s.warmup_steps << " must be >= 0 and below --steps "
                                        << s.total_steps);
  MESHRT_CHECK(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= lr,
               "train: --min-lr " << s.min_lr << " must be >= 0 and <= --lr " << lr);
  MESHRT_CHECK(s.min_lr == 0.f || s.kind != LrScheduleKind::Constant,
               "train: --min-lr " << s.min_lr
                                  << " needs --lr-schedule cosine or linear (constant keeps --lr)");
}

double scheduled_lr_f64(const LrSchedule& s, double lr, int64_t it) {
  if (it < s.warmup_steps)
    return lr * static_cast<double>(it + 1) / static_cast<double>(s.warmup_steps);
  if (s.kind == LrScheduleKind::Constant) return lr;
  const double span = static_cast<double>(s.total_steps - s.warmup_steps);
  const double r = std::min(1.0, static_cast<double>(it - s.warmup_steps) / span);
  const double min_lr = s.min_lr;
  const double coeff =
      s.kind == LrScheduleKind::Cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * r)) : 1 - r;
  return min_lr + coeff * (lr - min_lr);
}

float scheduled_lr(const LrSchedule& s, float lr, int64_t it) {
  if (s.kind == LrScheduleKind::Constant && it >= s.warmup_steps) return lr;
  return static_cast<float>(scheduled_lr_f64(s, lr, it));
}

Optimizer::Optimizer(DeviceMesh& mesh, std::vector<Param*> params, OptimizerConfig cfg,
                     GradSync* zero)
    : mesh_(mesh), params_(std::move(params)), cfg_(cfg) {
  MESHRT_CHECK(cfg.lr >= 0 && std::isfinite(cfg.lr),
               "optimizer: learning rate " << cfg.lr << " is invalid");
  Context& ctx = mesh.ctx();
  if (zero && zero->zero() > 0) {
    zero_ = zero;
    for (int b = 0; b < zero->num_buckets(); ++b) {
      zm_.push_back(ctx.zeros({zero->shard_numel(b)}, DType::f32));
      if (cfg.kind == OptimizerKind::AdamW)
        zv_.push_back(ctx.zeros({zero->shard_numel(b)}, DType::f32));
    }
    m_.resize(params_.size());
    v_.resize(cfg.kind == OptimizerKind::AdamW ? params_.size() : 0);
    return;
  }
  for (Param* p : params_) {
    m_.push_back(ctx.zeros(p->value.shape(), DType::f32));
    if (cfg.kind == OptimizerKind::AdamW) v_.push_back(ctx.zeros(p->value.shape(), DType::f32));
  }
}

void Optimizer::update(const std::vector<Param*>& ps, float lr) {
  if (ps.empty()) return;
  // Weight decay as nanoGPT and llm.c apply it: to matrices (weights, embeddings), not to biases
  // and norm gains.
  if (cfg_.weight_decay > 0.f) {
    std::vector<Param*> mats, rest;
    for (Param* p : ps) (p->value.ndim() >= 2 ? mats : rest).push_back(p);
    update_group(mats, lr, cfg_.weight_decay);
    update_group(rest, lr, 0.f);
  } else {
    update_group(ps, lr, 0.f);
  }
}

void Optimizer::update_group(const std::vector<Param*>& ps, float lr, float weight_decay) {
  if (ps.empty()) return;
  std::vector<Tensor> w, g, m, v;
  for (Param* p : ps) {
    size_t i = static_cast<size_t>(std::find(params_.begin(), params_.end(), p) - params_.begin());
    MESHRT_CHECK(i < params_.size(), "optimizer: parameter " << p->name << " is not managed here");
    w.push_back(p->value);
    g.push_back(p->grad);
    m.push_back(m_[i]);
    if (!v_.empty()) v.push_back(v_[i]);
  }
  apply(w, g, m, v, lr, weight_decay);
}

void Optimizer::apply(const std::vector<Tensor>& w, const std::vector<Tensor>& g,
                      const std::vector<Tensor>& m, const std::vector<Tensor>& v, float lr,
                      float weight_decay) {
  if (w.empty()) return;
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  if (cfg_.kind == OptimizerKind::AdamW) {
    // Decoupled: p *= 1 - lr * weight_decay before the Adam step (PyTorch's AdamW).
    ops::AdamWConfig c;
    c.lr = lr;
    c.beta1 = cfg_.beta1;
    c.beta2 = cfg_.beta2;
    c.eps = cfg_.eps;
    c.weight_decay = weight_decay;
    c.step = step_;
    ops::adamw_update(ctx, cs, w, g, m, v, c);
  } else {
    // SGD: L2 (g += weight_decay * p), as PyTorch's SGD.
    ops::SgdConfig c;
    c.lr = lr;
    c.momentum = cfg_.momentum;
    c.weight_decay = weight_decay;
    c.init_buffers = first_;
    ops::sgd_momentum_update(ctx, cs, w, g, m, c);
  }
}

void Optimizer::update_shard(int b, float lr) {
  // Elementwise updates: a shard's pieces get exactly the values the whole tensors would.
  std::vector<Tensor> w[2], g[2], m[2], v[2];  // [0]: matrices (decayed), [1]: the rest
  for (const ShardPiece& pc : zero_->shard_pieces(b)) {
    // The full shape's rank: at stage 3 the value is freed between uses.
    const int k = cfg_.weight_decay > 0.f && pc.param->full_shape.ndim() >= 2 ? 0 : 1;
    w[k].push_back(pc.value);
    g[k].push_back(pc.grad);
    m[k].push_back(zm_[static_cast<size_t>(b)].narrow(0, pc.at, pc.len));
    if (!zv_.empty()) v[k].push_back(zv_[static_cast<size_t>(b)].narrow(0, pc.at, pc.len));
  }
  apply(w[0], g[0], m[0], v[0], lr, cfg_.weight_decay);
  apply(w[1], g[1], m[1], v[1], lr, 0.f);
}

void Optimizer::scale_grads(float f) {
  Context& ctx = mesh_.ctx();
  if (zero_ && zero_->zero() >= 2) {
    for (int b = 0; b < zero_->num_buckets(); ++b)
      for (const ShardPiece& pc : zero_->shard_pieces(b))
        ops::scale(ctx, ctx.compute_stream(), pc.grad, pc.grad, f);
    return;
  }
  for (Param* p : params_) ops::scale(ctx, ctx.compute_stream(), p->grad, p->grad, f);
}

void Optimizer::step_sharded(float lr) {
  if (cfg_.clip_norm > 0.f) {
    zero_->wait_all();
    double n = grad_norm();
    last_norm_ = n;
    if (n > cfg_.clip_norm) scale_grads(static_cast<float>(cfg_.clip_norm / (n + 1e-6)));
  }
  // Each bucket's shard is updated as soon as its gradients are reduced, and its all-gather
  // overlaps the next bucket's update (stage 3 gathers nothing: the next forward does).
  for (int b = 0; b < zero_->num_buckets(); ++b) {
    zero_->wait_bucket(b);
    update_shard(b, lr);
    zero_->gather_params(b);
  }
  zero_->wait_gathers();
  // Without clipping the norm is measured after the update (it only reads the gradients), so
  // the updates still overlap the buckets' reductions.
  if (cfg_.clip_norm <= 0.f && cfg_.measure_grad_norm) last_norm_ = grad_norm();
  first_ = false;
}

void Optimizer::step(GradSync* sync, float lr_scale, int grad_set) {
  step_++;
  const float lr = cfg_.lr * lr_scale;
  if (zero_) {
    MESHRT_CHECK(sync == zero_ && grad_set <= 0,
                 "optimizer: a ZeRO optimizer steps with its own GradSync and gradient set 0");
    step_sharded(lr);
    return;
  }
  if (cfg_.clip_norm > 0.f) {
    if (sync) sync->wait_all(grad_set);
    double n = grad_norm();
    last_norm_ = n;
    if (n > cfg_.clip_norm) {
      scale_grads(static_cast<float>(cfg_.clip_norm / (n + 1e-6)));
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
  // Without clipping the norm is measured after the update (it only reads the gradients), so
  // the bucket-by-bucket updates above still overlap the reductions.
  if (cfg_.clip_norm <= 0.f && cfg_.measure_grad_norm) last_norm_ = grad_norm();
  first_ = false;
}

NamedTensors Optimizer::state(size_t i) const {
  MESHRT_CHECK(i < params_.size(),
               "optimizer: state of parameter " << i << " of " << params_.size());
  MESHRT_CHECK(m_[i].defined(), "optimizer: the ZeRO-sharded state of "
                                    << params_[i]->name << " is not gathered (gather_state())");
  if (cfg_.kind == OptimizerKind::AdamW) return {{"exp_avg", m_[i]}, {"exp_avg_sq", v_[i]}};
  return {{"momentum", m_[i]}};
}

std::vector<std::string> optimizer_state_names(OptimizerKind k) {
  if (k == OptimizerKind::AdamW) return {"exp_avg", "exp_avg_sq"};
  return {"momentum"};
}

double optimizer_state_bytes_per_element(OptimizerKind k) {
  return 4.0 * static_cast<double>(optimizer_state_names(k).size());  // f32 tensors
}

bool is_optimizer_state_name(std::string_view name) {
  for (OptimizerKind k : {OptimizerKind::Sgd, OptimizerKind::AdamW})
    for (const std::string& n : optimizer_state_names(k))
      if (n == name) return true;
  return false;
}

std::vector<std::string> Optimizer::state_names() const { return optimizer_state_names(cfg_.kind); }

const Tensor& Optimizer::shard_state(int b, size_t k) const {
  MESHRT_CHECK(zero_ && b >= 0 && b < zero_->num_buckets() && k < state_names().size(),
               "optimizer: no ZeRO state shard " << k << " of bucket " << b);
  return (k == 0 ? zm_ : zv_)[static_cast<size_t>(b)];
}

void Optimizer::gather_state() {
  if (!zero_) return;
  zero_->gather_all_params();  // stage 3: the parameters too
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  CommScheduler& dp = zero_->scheduler();
  auto where = [&](Param* p) {
    return static_cast<size_t>(std::find(params_.begin(), params_.end(), p) - params_.begin());
  };
  for (int b = 0; b < zero_->num_buckets(); ++b) {
    const int64_t s = zero_->shard_numel(b);
    for (int k = 0; k < (zv_.empty() ? 1 : 2); ++k) {
      const Tensor& shard = (k == 0 ? zm_ : zv_)[static_cast<size_t>(b)];
      Tensor full = ctx.empty({s * dp.size()}, DType::f32);
      dp.wait(dp.all_gather(shard, full, "dp.optim.gather"));
      const auto& ps = zero_->bucket(b);
      for (size_t slot = 0; slot < ps.size(); ++slot) {
        Tensor& dst = (k == 0 ? m_ : v_)[where(ps[slot])];
        dst = ctx.empty(ps[slot]->value.shape(), DType::f32);
        dst.view({dst.numel()})
            .copy_(full.narrow(0, zero_->bucket_offset(b, static_cast<int>(slot)), dst.numel()),
                   cs);
      }
    }
  }
  cs.synchronize();
}

void Optimizer::scatter_state() {
  if (!zero_) return;
  Stream& cs = mesh_.ctx().compute_stream();
  for (int b = 0; b < zero_->num_buckets(); ++b)
    for (const ShardPiece& pc : zero_->shard_pieces(b)) {
      const size_t i = static_cast<size_t>(std::find(params_.begin(), params_.end(), pc.param) -
                                           params_.begin());
      zm_[static_cast<size_t>(b)]
          .narrow(0, pc.at, pc.len)
          .copy_(m_[i].view({m_[i].numel()}).narrow(0, pc.offset, pc.len), cs);
      if (!zv_.empty())
        zv_[static_cast<size_t>(b)]
            .narrow(0, pc.at, pc.len)
            .copy_(v_[i].view({v_[i].numel()}).narrow(0, pc.offset, pc.len), cs);
    }
  cs.synchronize();
  for (auto& t : m_) t = Tensor();
  for (auto& t : v_) t = Tensor();
  zero_->shard_params();
}

void Optimizer::set_lr(float lr) {
  MESHRT_CHECK(lr >= 0 && std::isfinite(lr), "optimizer: learning rate " << lr << " is invalid");
  cfg_.lr = lr;
}

void Optimizer::set_steps(int64_t n) {
  MESHRT_CHECK(n >= 0, "optimizer: step count " << n << " must be >= 0");
  step_ = n;
  first_ = n == 0;
}

double Optimizer::grad_norm() {
  if (zero_ && zero_->zero() >= 2)
    return zero_->deterministic() ? grad_norm_gathered() : grad_norm_sharded();
  std::vector<Tensor> grads;
  for (Param* p : params_) grads.push_back(p->grad);
  return norm_of(grads);
}

double Optimizer::norm_of(const std::vector<Tensor>& grads) {
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  // [0]: tp-sharded parameters (summed over tp), [1]: replicated ones (already complete).
  Tensor acc_sharded = ctx.zeros({1, 1}, DType::f32), acc_repl = ctx.zeros({1, 1}, DType::f32);
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool sharded = params_[i]->sharded_on(mesh_, kTpDim) && mesh_.size(kTpDim) > 1;
    ops::sum_squares(ctx, cs, grads[i].contiguous(cs), sharded ? acc_sharded : acc_repl);
  }
  return norm_from_squares(acc_sharded, acc_repl);
}

// The shards are all-gathered bucket by bucket (the whole gradient exists for this moment): the
// same tensors, chunks and order as grad_norm() at stages 0 and 1, so the same bits on any dp.
double Optimizer::grad_norm_gathered() {
  Context& ctx = mesh_.ctx();
  CommScheduler dp(mesh_, mesh_.grad_dim(), Overlap::None);
  std::vector<Tensor> grads(params_.size());
  for (int b = 0; b < zero_->num_buckets(); ++b) {
    Tensor full = ctx.empty({zero_->padded_numel(b)}, DType::f32);
    dp.all_gather(zero_->grad_shard(b), full, "grad_norm.gather");
    const auto& ps = zero_->bucket(b);
    for (size_t slot = 0; slot < ps.size(); ++slot) {
      const int64_t at = zero_->bucket_offset(b, static_cast<int>(slot));
      const int64_t end = slot + 1 < ps.size() ? zero_->bucket_offset(b, static_cast<int>(slot) + 1)
                                               : zero_->bucket_numel(b);
      const size_t i = static_cast<size_t>(std::find(params_.begin(), params_.end(), ps[slot]) -
                                           params_.begin());
      grads[i] = full.narrow(0, at, end - at);
    }
  }
  return norm_of(grads);
}

// The norm from the summed squares of the tp-sharded parameters (summed over tp here) and of the
// replicated ones.
double Optimizer::norm_from_squares(const Tensor& acc_sharded, const Tensor& acc_repl) {
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  if (mesh_.size(kTpDim) > 1) {
    CommScheduler tp(mesh_, kTpDim, Overlap::None);
    tp.all_reduce(acc_sharded, "grad_norm");
  }
  Tensor a = acc_sharded.to(ctx.host_allocator(), cs), r = acc_repl.to(ctx.host_allocator(), cs);
  cs.synchronize();
  return std::sqrt(a.item(0) + r.item(0));
}

}  // namespace meshrt

namespace meshrt {

// Stages 2 and 3 hold only gradient shards: the squares are summed over dp (each rank its shard),
// and the tp-sharded parameters' also over tp.
double Optimizer::grad_norm_sharded() {
  Context& ctx = mesh_.ctx();
  Stream& cs = ctx.compute_stream();
  Tensor acc_sharded = ctx.zeros({1, 1}, DType::f32), acc_repl = ctx.zeros({1, 1}, DType::f32);
  for (int b = 0; b < zero_->num_buckets(); ++b)
    for (const ShardPiece& pc : zero_->shard_pieces(b)) {
      const bool sharded = pc.param->sharded_on(mesh_, kTpDim) && mesh_.size(kTpDim) > 1;
      ops::sum_squares(ctx, cs, pc.grad, sharded ? acc_sharded : acc_repl);
    }
  CommScheduler dp(mesh_, mesh_.grad_dim(), Overlap::None);
  dp.all_reduce(acc_sharded, "grad_norm");
  dp.all_reduce(acc_repl, "grad_norm");
  return norm_from_squares(acc_sharded, acc_repl);
}

}  // namespace meshrt
