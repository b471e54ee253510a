#include "train/train_deterministic.h"

#include <algorithm>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

Tensor deterministic_step(Context& ctx, DeviceMesh& mesh, DecoderModel& model, GradSync& sync,
                          int64_t batch, int64_t grain, int step, const BatchFn& make_batch) {
  MESHRT_CHECK(sync.deterministic(), "train: deterministic_step needs a deterministic GradSync");
  Stream& cs = ctx.compute_stream();
  const int dp = mesh.size(kDpDim), r = dp > 1 ? mesh.coord(kDpDim) : 0;
  const int64_t leaves = batch / grain, lo = leaves * r / dp, hi = leaves * (r + 1) / dp;
  const FixedOrderOps fo = sync.fixed_order_ops();
  // The grains' losses in the same tree, padded to dp elements (the reduction's chunks).
  FixedOrderStack losses(fo);
  sync.enable_sync(false);
  for (int64_t g = lo; g < hi; ++g) {
    sync.zero_grad(/*first_write=*/true);
    Tensor ids, targets;
    make_batch(static_cast<int64_t>(step) * batch + g * grain, grain, &ids, &targets);
    Tensor loss = model.forward(ids, targets, &sync);
    model.backward(1.f, &sync);
    sync.push_grain(g);
    Tensor leaf = ctx.zeros({dp}, DType::f32);
    leaf.narrow(0, 0, 1).copy_(loss, cs);
    losses.push_leaf(g, leaf, cs);
  }
  sync.reduce_grains(leaves);
  std::vector<Tensor> blocks;
  for (const auto& nt : losses.nodes()) blocks.push_back(nt.second);
  Tensor root = ctx.empty({dp}, DType::f32), loss = ctx.empty({1}, DType::f32);
  fixed_order_sum(sync.scheduler(), blocks, leaves, root, /*all=*/true, fo);
  ops::scale(ctx, cs, root.narrow(0, 0, 1), loss, 1.f / static_cast<float>(leaves));
  return loss;
}

int64_t default_deterministic_grain(int64_t batch, int64_t seq) {
  int64_t best = 1;
  for (int64_t g = 2; g * std::max<int64_t>(seq, 1) <= kDeterministicGrainTokens; ++g) {
    bool ok = true;
    for (int64_t dp = 1; dp <= 4; ++dp)
      if (batch % dp == 0 && batch % (dp * g) != 0) ok = false;
    if (ok) best = g;
  }
  return best;
}

uint64_t train_state_digest(Context& ctx, const std::vector<Param*>& params, Optimizer& opt) {
  opt.gather_state();  // ZeRO: whole state (stage 3: whole parameters); no-op otherwise
  Stream& cs = ctx.compute_stream();
  std::vector<Tensor> host;
  for (size_t i = 0; i < params.size(); ++i) {
    host.push_back(params[i]->value.contiguous(cs).to(ctx.host_allocator(), cs));
    for (const auto& [name, t] : opt.state(i))
      if (t.defined()) host.push_back(t.contiguous(cs).to(ctx.host_allocator(), cs));
  }
  cs.synchronize();
  opt.scatter_state();
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : host) {
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = t.nbytes();  // not per byte: Shape::numel was most of the digest's time
    for (size_t k = 0; k < n; ++k) h = (h ^ b[k]) * 1099511628211ull;
  }
  return h;
}

}  // namespace meshrt
