#include "train/train_guard.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "runtime/error.h"

namespace meshrt {

TrainMemory estimate_train_memory(const TrainConfig& cfg, int world_size) {
  int dp = 1, tp = 1, cp = 1;
  const std::string spec =
      cfg.mesh.empty() ? std::string(kDpDim) + "=" + std::to_string(world_size) : cfg.mesh;
  for (const MeshDim& d : parse_mesh_spec(spec, world_size))
    (d.name == kTpDim ? tp : d.name == kCpDim ? cp : dp) = d.size;
  // ZeRO shards over dp x cp (GradSync's group); a cp rank holds seq / cp of each sequence.
  const int shards = dp * cp;
  const BlockConfig& b = cfg.model.block;
  const double h = static_cast<double>(b.hidden), f = static_cast<double>(b.ffn);
  const double v = static_cast<double>(cfg.model.vocab), L = cfg.model.layers;
  const double es = static_cast<double>(dtype_size(b.dtype));
  // Sharded over tp: the block matrices, the embedding and the head; norms and biases are small.
  const double params = (L * (4 * h * h + 2 * h * f) + 2 * v * h) / tp + L * 9 * h + 2 * h;
  const int sets = cfg.grad_sync == GradSyncMode::Async ? cfg.staleness + 1 : 1;
  TrainMemory m;
  m.weights = params * es;
  m.grads = params * sets * (es + (cfg.dp.bf16_comm ? 2.0 : 0.0));
  m.optimizer = params * optimizer_state_bytes_per_element(cfg.optim.kind);
  // ZeRO (docs/zero.md): 1 keeps this rank's 1/dp of the state, 2 also of the gradients (and
  // at most three full buckets during backward), 3 also of the parameters (and the full buffers
  // of at most GradSync::kMaxGatheredPieces pieces: the embedding or head, or a layer's larger
  // piece).
  if (cfg.dp.zero >= 1) m.optimizer /= shards;
  if (cfg.dp.zero >= 2) {
    const double bucket = cfg.dp.bucket_mb * 1024.0 * 1024.0 / es;  // elements
    m.grads =
        (params / shards + std::min(params, 3 * bucket)) * (es + (cfg.dp.bf16_comm ? 2.0 : 0.0));
  }
  if (cfg.dp.zero == 3 && shards > 1) {
    const double piece =
        std::max({v * h / tp + 2 * h, 4 * h * h / tp + 5 * h, 2 * h * f / tp + 4 * h});
    m.weights = (params / shards + std::min(params, GradSync::kMaxGatheredPieces * piece)) * es;
  }
  // --deterministic (docs/training.md): the grains' stack of whole-gradient partial sums (at
  // most 2 log2(grains per rank) + 2 nodes: FixedOrderStack) and the reduction's all-to-all
  // send and receive slots (as many nodes per rank, one bucket at a time).
  if (cfg.deterministic) {
    const double grains =
        static_cast<double>(cfg.batch / dp / std::max<int64_t>(1, cfg.deterministic_grain));
    const double nodes = 2 * std::ceil(std::log2(std::max(1.0, grains))) + 2;
    const double bucket = cfg.dp.bucket_mb * 1024.0 * 1024.0 / es;
    m.grads += (nodes * params + 2 * nodes * std::min(params, bucket)) * es;
  }
  // Per layer, what the blocks save for backward (the bench block estimate) plus the attention
  // probabilities; the head keeps the logits, their gradient and a softmax-sized temporary.
  // (--deterministic: a micro-batch is one grain.)
  const double micro =
      static_cast<double>(cfg.deterministic ? std::max<int64_t>(1, cfg.deterministic_grain)
                                            : cfg.batch / dp / std::max(1, cfg.micro_batches));
  const double local_seq = static_cast<double>(cfg.seq) / cp;
  const double tok = micro * local_seq;
  const double per_layer = tok * (12 * h / tp + 3 * f / tp + 6 * h) +
                           micro * static_cast<double>(b.heads) / tp * local_seq * cfg.seq;
  m.activations = (L * per_layer + 3 * tok * v / tp) * std::max(es, 4.0) * 1.5;
  return m;
}

namespace {

// The agreement's layout: [loss, sumsq, ranks asking to stop, ranks per signal 1..31].
constexpr int kStopSlots = 32;

StepVerdict agree(Context& ctx, Communicator& world, float loss, float sumsq, int stop_local) {
  Stream& cs = ctx.compute_stream();
  Tensor h = Tensor::empty({3 + kStopSlots}, DType::f32, ctx.host_allocator());
  float* ph = h.data<float>();
  for (int i = 0; i < 3 + kStopSlots; ++i) ph[i] = 0.f;
  ph[0] = loss;
  ph[1] = sumsq;
  ph[2] = stop_local > 0 ? 1.f : 0.f;
  if (stop_local > 0 && stop_local < kStopSlots) ph[3 + stop_local] = 1.f;
  // Sum propagates NaN and infinities from any rank, and counts the ranks asking to stop.
  Tensor d = ctx.device().is_cpu() ? h : h.to(ctx.allocator_ptr(), cs);
  world.all_reduce(d, ReduceOp::Sum, cs).synchronize();
  Tensor r = ctx.device().is_cpu() ? d : d.to(ctx.host_allocator(), cs);
  cs.synchronize();
  StepVerdict v;
  v.loss_finite = std::isfinite(r.item(0));
  v.grads_finite = std::isfinite(r.item(1));
  v.stop = r.item(2) > 0;
  double most = 0;
  for (int sig = 1; sig < kStopSlots; ++sig)
    if (r.item(3 + sig) > most) {
      most = r.item(3 + sig);
      v.stop_signal = sig;
    }
  return v;
}

}  // namespace

StepVerdict agree_step(Context& ctx, Communicator& world, const Tensor& loss, const Tensor& sumsq,
                       int stop_local) {
  Stream& cs = ctx.compute_stream();
  Tensor l = loss.to(DType::f32, cs).to(ctx.host_allocator(), cs);
  Tensor a = sumsq.to(ctx.host_allocator(), cs);
  cs.synchronize();
  return agree(ctx, world, static_cast<float>(l.item(0)), static_cast<float>(a.item(0)),
               stop_local);
}

StepVerdict agree_stop(Context& ctx, Communicator& world, int stop_local) {
  return agree(ctx, world, 0.f, 0.f, stop_local);
}

std::string first_nonfinite_grad(Context& ctx, Communicator& world,
                                 const std::vector<Param*>& grads) {
  Stream& cs = ctx.compute_stream();
  // Only on the failure path: copying each gradient to the host is fine here.
  const auto n = static_cast<int64_t>(grads.size());
  int64_t first = n;
  for (int64_t i = 0; i < n && first == n; ++i) {
    if (!grads[static_cast<size_t>(i)]->grad.defined()) continue;  // ZeRO 2: freed once reduced
    Tensor g = grads[static_cast<size_t>(i)]->grad.to(DType::f32, cs).to(ctx.host_allocator(), cs);
    cs.synchronize();
    const float* p = g.data<float>();
    for (int64_t k = 0; k < g.numel(); ++k)
      if (!std::isfinite(p[k])) {
        first = i;
        break;
      }
  }
  Tensor h = Tensor::empty({1}, DType::f32, ctx.host_allocator());
  h.data<float>()[0] = static_cast<float>(first);
  Tensor d = ctx.device().is_cpu() ? h : h.to(ctx.allocator_ptr(), cs);
  world.all_reduce(d, ReduceOp::Min, cs).synchronize();
  Tensor r = ctx.device().is_cpu() ? d : d.to(ctx.host_allocator(), cs);
  cs.synchronize();
  const auto i = static_cast<int64_t>(r.item(0));
  return i < n ? grads[static_cast<size_t>(i)]->name : std::string();
}

}  // namespace meshrt
