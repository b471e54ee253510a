#include "mesh/train.h"

#include <chrono>
#include <iomanip>

#include "mesh/train_checkpoint.h"
#include "runtime/error.h"

namespace meshrt {

GradSyncMode parse_grad_sync(std::string_view s) {
  if (s == "sync") return GradSyncMode::Sync;
  if (s == "async") return GradSyncMode::Async;
  if (s == "local") return GradSyncMode::Local;
  MESHRT_FAIL("unknown --grad-sync '" << s << "': use sync, async or local");
}

const char* grad_sync_name(GradSyncMode m) {
  switch (m) {
    case GradSyncMode::Sync:
      return "sync";
    case GradSyncMode::Async:
      return "async";
    case GradSyncMode::Local:
      return "local";
  }
  return "?";
}

namespace {
// The given mesh, else dp over every rank.
std::string default_mesh(const TrainConfig& cfg, int world_size) {
  if (!cfg.mesh.empty()) return cfg.mesh;
  std::string m(kDpDim);
  m += "=" + std::to_string(world_size);
  return m;
}
}  // namespace

void validate_train(const TrainConfig& cfg, int world_size) {
  auto dims = parse_mesh_spec(default_mesh(cfg, world_size), world_size);
  int dp = 1, tp = 1;
  for (auto& d : dims) {
    if (d.name == kDpDim)
      dp = d.size;
    else if (d.name == kTpDim)
      tp = d.size;
    else
      MESHRT_FAIL("train: mesh dim '" << d.name << "' is not supported; use " << kDpDim << " and "
                                      << kTpDim);
  }
  MESHRT_CHECK(cfg.steps >= 1, "train: --steps " << cfg.steps << " must be >= 1");
  MESHRT_CHECK(cfg.micro_batches >= 1,
               "train: --micro-batches " << cfg.micro_batches << " must be >= 1");
  MESHRT_CHECK(cfg.batch >= 1 && cfg.batch % (dp * cfg.micro_batches) == 0,
               "train: global --batch " << cfg.batch << " must divide by dp (" << dp
                                        << ") x --micro-batches (" << cfg.micro_batches << ")");
  MESHRT_CHECK(cfg.seq >= 1, "train: --seq " << cfg.seq << " must be >= 1");
  // A vocabulary that tp does not divide is sharded unevenly; every rank needs one entry.
  MESHRT_CHECK(cfg.model.vocab >= 2 && cfg.model.vocab >= tp,
               "train: --vocab " << cfg.model.vocab << " must be >= 2 and >= tp=" << tp);
  MESHRT_CHECK(cfg.staleness >= 0, "train: --staleness " << cfg.staleness << " must be >= 0");
  MESHRT_CHECK(cfg.sync_every >= 1, "train: --sync-every " << cfg.sync_every << " must be >= 1");
  validate_block(cfg.model.block, tp, cfg.tp, cfg.seq);
  validate_checkpointing(cfg);
}

std::vector<StepStats> train(const TrainConfig& cfg, Context& ctx, Communicator& world,
                             std::ostream* log) {
  validate_train(cfg, world.size());
  DeviceMesh mesh(ctx, world, default_mesh(cfg, world.size()));
  const int dp = mesh.size(kDpDim);
  CommScheduler tp(mesh, kTpDim, cfg.tp.overlap);
  DecoderModel model(mesh, tp, cfg.tp, cfg.model);
  const int sets = cfg.grad_sync == GradSyncMode::Async ? cfg.staleness + 1 : 1;
  GradSync sync(mesh, model.params(), cfg.dp, sets);
  // Every replica starts from dp rank 0's parameters.
  sync.broadcast_params();
  Optimizer opt(mesh, model.params(), cfg.optim);
  Stream& cs = ctx.compute_stream();
  // --- checkpoint: resume ---
  const int first_step = resume_training(cfg, mesh, model.params(), opt, log);

  const int64_t local_batch = cfg.batch / dp, micro = local_batch / cfg.micro_batches;
  const float grad_scale = 1.f / static_cast<float>(cfg.micro_batches);
  CommScheduler dp_loss(mesh, kDpDim, Overlap::None);
  std::vector<StepStats> out;
  for (int step = first_step; step < cfg.steps; ++step) {
    ctx.synchronize();
    sync.scheduler().reset_times();
    tp.reset_times();
    auto t0 = std::chrono::steady_clock::now();
    const int set = sets > 1 ? step % sets : 0;
    sync.set_active(set);
    sync.zero_grad();
    Tensor loss_sum = ctx.zeros({1}, DType::f32);
    for (int mb = 0; mb < cfg.micro_batches; ++mb) {
      const bool last = mb == cfg.micro_batches - 1;
      sync.enable_sync(last && cfg.grad_sync != GradSyncMode::Local);
      Tensor ids, targets;
      const int64_t first =
          static_cast<int64_t>(step) * cfg.batch + mesh.coord(kDpDim) * local_batch + mb * micro;
      make_synthetic_batch(ctx, cfg.seed, first, micro, cfg.seq, cfg.model.vocab, &ids, &targets);
      Tensor loss = model.forward(ids, targets);
      ops::add(ctx, cs, loss_sum, loss, loss_sum, 1.f, grad_scale);
      model.backward(grad_scale, &sync);
    }
    switch (cfg.grad_sync) {
      case GradSyncMode::Sync:
        opt.step(&sync, 1.f, set);
        break;
      case GradSyncMode::Async:
        // Step t's all-reduce overlaps the next K steps; it is applied K steps late, with the
        // learning rate divided by the staleness (Zhang et al. 2016).
        if (step >= cfg.staleness) {
          const int apply = (step - cfg.staleness) % sets;
          sync.bind(apply);
          opt.step(&sync, cfg.staleness > 0 ? 1.f / static_cast<float>(cfg.staleness) : 1.f, apply);
          sync.bind(set);
        }
        break;
      case GradSyncMode::Local:
        opt.step(nullptr);
        if ((step + 1) % cfg.sync_every == 0) sync.average_params();
        break;
    }
    // The reported loss is the global batch mean (equal micro-batch and dp shard sizes).
    dp_loss.all_reduce(loss_sum, "loss", ReduceOp::Avg);
    Tensor lh = loss_sum.to(ctx.host_allocator(), cs);
    ctx.synchronize();
    StepStats st;
    st.step = step + 1;
    st.loss = lh.item(0);
    st.step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CommTimes d = sync.scheduler().times(), t = tp.times();
    st.dp_comm_ms = d.comm_ms;
    st.dp_exposed_ms = d.exposed_ms;
    st.tp_comm_ms = t.comm_ms;
    st.tp_exposed_ms = t.exposed_ms;
    out.push_back(st);
    if (log && world.rank() == 0) {
      *log << "step " << st.step << " loss " << std::fixed << std::setprecision(6) << st.loss
           << std::setprecision(1) << "  time " << st.step_ms << " ms  dp comm " << st.dp_comm_ms
           << " ms (exposed " << st.dp_exposed_ms << " ms)  tp comm " << st.tp_comm_ms
           << " ms (exposed " << st.tp_exposed_ms << " ms)" << std::endl;
    }
    // --- checkpoint: save, then stop when asked ---
    const bool stopping = cfg.stop_requested && cfg.stop_requested();
    if (checkpoint_due(cfg.checkpoint, st.step, cfg.steps, stopping))
      save_training(cfg, st.step, mesh, model.params(), opt, log);
    if (stopping) break;
  }
  return out;
}

}  // namespace meshrt
