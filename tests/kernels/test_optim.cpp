// Multi-tensor AdamW and SGD-with-momentum against per-element double references.
#include <cmath>

#include "helpers.h"

using namespace kt;
namespace ops = meshrt::ops;

namespace {
struct Group {
  std::vector<Tensor> p, g, s1, s2;
  std::vector<Vec> pv, s1v, s2v;
};

// Three tensors of odd sizes and mixed dtypes: f32/f32, bf16/bf16 and bf16 param with f32 grad.
Group make_group(Host& h, uint64_t seed) {
  Group G;
  const int64_t sizes[3] = {1, 37, 70001};
  const DType pd[3] = {DType::f32, DType::bf16, DType::bf16};
  const DType gd[3] = {DType::f32, DType::bf16, DType::f32};
  for (int i = 0; i < 3; ++i) {
    G.p.push_back(rand_tensor(h, {sizes[i]}, pd[i], seed + i));
    G.pv.push_back(read(h, G.p.back()));
    G.g.push_back(h.ctx.empty({sizes[i]}, gd[i]));
    G.s1.push_back(h.ctx.zeros({sizes[i]}, DType::f32));
    G.s2.push_back(h.ctx.zeros({sizes[i]}, DType::f32));
    G.s1v.emplace_back(static_cast<size_t>(sizes[i]), 0.0);
    G.s2v.emplace_back(static_cast<size_t>(sizes[i]), 0.0);
  }
  return G;
}
}  // namespace

TEST_CASE("adamw_update over many tensors matches PyTorch's AdamW in double", "[optim]") {
  Host h;
  Group G = make_group(h, 100);
  ops::AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.1f;
  cfg.grad_scale = 0.5f;
  for (int64_t step = 1; step <= 3; ++step) {
    cfg.step = step;
    std::vector<Vec> gv;
    for (size_t i = 0; i < G.g.size(); ++i) {
      write(h, G.g[i], uniform(G.g[i].numel(), 200 + step * 10 + i, -1, 1, G.g[i].dtype()));
      gv.push_back(read(h, G.g[i]));
    }
    ops::adamw_update(h.ctx, h.s(), G.p, G.g, G.s1, G.s2, cfg);
    const double b1 = cfg.beta1, b2 = cfg.beta2;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (size_t i = 0; i < G.p.size(); ++i) {
      for (size_t j = 0; j < G.pv[i].size(); ++j) {
        double g = gv[i][j] * cfg.grad_scale;
        double& m = G.s1v[i][j];
        double& v = G.s2v[i][j];
        double& p = G.pv[i][j];
        p *= 1 - cfg.lr * cfg.weight_decay;
        m = b1 * m + (1 - b1) * g;
        v = b2 * v + (1 - b2) * g * g;
        p -= cfg.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + cfg.eps);
        p = round_to(p, G.p[i].dtype());  // the reference keeps the parameter's storage rounding
      }
      std::string tag = "adamw step " + std::to_string(step) + " tensor " + std::to_string(i);
      // A bf16 parameter may round the other way after an f32-vs-double difference: one ulp.
      check_close(read(h, G.p[i]), G.pv[i], G.p[i].dtype() == DType::f32 ? 1e-5 : 8e-3, tag + " p");
      check_close(read(h, G.s1[i]), G.s1v[i], 1e-5, tag + " exp_avg");
      check_close(read(h, G.s2[i]), G.s2v[i], 1e-5, tag + " exp_avg_sq");
      G.pv[i] = read(h, G.p[i]);  // continue from the kernel's parameters
    }
  }
}

TEST_CASE("sgd_momentum_update matches PyTorch's SGD in double", "[optim]") {
  Host h;
  auto nesterov = GENERATE(false, true);
  Group G = make_group(h, 300);
  ops::SgdConfig cfg;
  cfg.lr = 0.05f;
  cfg.momentum = 0.8f;
  cfg.dampening = nesterov ? 0.f : 0.25f;
  cfg.weight_decay = 0.01f;
  cfg.nesterov = nesterov;
  cfg.grad_scale = 2.f;
  for (int step = 1; step <= 3; ++step) {
    cfg.init_buffers = step == 1;
    std::vector<Vec> gv;
    for (size_t i = 0; i < G.g.size(); ++i) {
      write(h, G.g[i], uniform(G.g[i].numel(), 400 + step * 10 + i, -1, 1, G.g[i].dtype()));
      gv.push_back(read(h, G.g[i]));
    }
    ops::sgd_momentum_update(h.ctx, h.s(), G.p, G.g, G.s1, cfg);
    for (size_t i = 0; i < G.p.size(); ++i) {
      for (size_t j = 0; j < G.pv[i].size(); ++j) {
        double& p = G.pv[i][j];
        double& b = G.s1v[i][j];
        double g = gv[i][j] * cfg.grad_scale + cfg.weight_decay * p;
        b = step == 1 ? g : cfg.momentum * b + (1 - cfg.dampening) * g;
        double d = nesterov ? g + cfg.momentum * b : b;
        p = round_to(p - cfg.lr * d, G.p[i].dtype());
      }
      std::string tag = "sgd step " + std::to_string(step) + " tensor " + std::to_string(i);
      check_close(read(h, G.p[i]), G.pv[i], G.p[i].dtype() == DType::f32 ? 1e-5 : 8e-3, tag + " p");
      check_close(read(h, G.s1[i]), G.s1v[i], 1e-5, tag + " buf");
      G.pv[i] = read(h, G.p[i]);
    }
  }
}
