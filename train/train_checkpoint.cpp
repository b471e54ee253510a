#include "train/train_checkpoint.h"

#include <chrono>
#include <iomanip>
#include <sstream>

#include "runtime/error.h"
#include "runtime/logging.h"
#include "train/token_data.h"

namespace meshrt {

void validate_checkpointing(const TrainConfig& cfg) {
  const CheckpointOptions& o = cfg.checkpoint;
  MESHRT_CHECK(!o.overwrite || !o.save.empty(),
               "train: --overwrite goes with --save DIR (it lets a run write into a folder "
               "holding another run's checkpoints)");
  MESHRT_CHECK(!o.resume_other_data || (!o.resume.empty() && cfg.data),
               "train: --resume-other-data goes with --resume DIR and --data FILE (it lets a "
               "resume train on another token stream than the checkpoint's)");
  if (o.save.empty() && o.resume.empty()) return;
  // Delayed gradients and unsynchronised replicas are state a checkpoint does not hold.
  MESHRT_CHECK(cfg.grad_sync == GradSyncMode::Sync,
               "train: --save / --resume need --grad-sync sync (got "
                   << grad_sync_name(cfg.grad_sync)
                   << ": its in-flight gradients or diverged replicas are not checkpointed)");
  MESHRT_CHECK(o.save_every >= 0, "train: --save-every " << o.save_every << " must be >= 0");
  MESHRT_CHECK(o.keep >= 0, "train: --keep " << o.keep << " must be >= 0");
}

CheckpointMeta train_checkpoint_meta(const TrainConfig& cfg, int64_t step) {
  CheckpointMeta m;
  m.step = step;
  m.seed = cfg.seed;
  const BlockConfig& b = cfg.model.block;
  auto num = [](auto v) {
    std::ostringstream s;
    s << std::setprecision(9) << v;
    return s.str();
  };
  m.config = {
      {"hidden", num(b.hidden)},
      {"ffn", num(b.ffn)},
      {"heads", num(b.heads)},
      {"layers", num(cfg.model.layers)},
      {"vocab", num(cfg.model.vocab)},
      {"dtype", dtype_name(b.dtype)},
      {"norm", b.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm"},
      {"gelu", ops::gelu_kind_name(b.gelu)},
      {"bias", b.bias ? "true" : "false"},
      {"eps", num(b.eps)},
      {"optimizer", cfg.optim.kind == OptimizerKind::AdamW ? "adamw" : "sgd"},
      {"seed", num(cfg.seed)},
      // The data position is the step: samples are drawn by (seed, step, dp rank) from
      // global batches of `batch` sequences of `seq` tokens of this token stream.
      {"batch", num(cfg.batch)},
      {"seq", num(cfg.seq)},
      {"data",
       cfg.data ? cfg.data->format() + ", " + num(cfg.data->size()) + " tokens" : "synthetic"},
      // The learning-rate schedule is a function of the step and these: a resumed run
      // continues it exactly (the decay ends at --steps, so a decaying one fixes it).
      {"lr", num(cfg.optim.lr)},
      {"lr_schedule", lr_schedule_name(cfg.lr_schedule)},
      {"warmup_steps", num(cfg.warmup_steps)},
      {"min_lr", num(cfg.min_lr)},
      {"lr_decay_steps", cfg.lr_schedule == LrScheduleKind::Constant ? "none" : num(cfg.steps)},
      {"weight_decay", num(cfg.optim.weight_decay)},
      // --deterministic's grain sets the order of the gradients' sums: a resume that changes
      // it (or drops the flag) would continue on other bits.
      {"deterministic", cfg.deterministic ? "grain " + num(cfg.deterministic_grain) : "off"}};
  // Which tokens: the format and length above, the stream's digest here (older checkpoints
  // have none and resume on any stream of that format and length).
  if (cfg.data) m.data_digest = cfg.data->digest();
  m.other_data_ok = cfg.checkpoint.resume_other_data;
  return m;
}

CheckpointSession open_checkpointing(const TrainConfig& cfg, DeviceMesh& mesh) {
  CheckpointSession s;
  const CheckpointOptions& o = cfg.checkpoint;
  if (o.save.empty()) return s;
  std::string resumed;
  if (mesh.rank() == 0 && !o.resume.empty()) {
    // A resumed run continues its checkpoint's lineage. A checkpoint that cannot be read is
    // refused by resume_training, with the reason.
    try {
      resumed = resolve_checkpoint(o.resume);
      s.run = read_checkpoint_meta(resumed, {}).run;
    } catch (const std::exception&) {
    }
  }
  if (s.run.empty()) s.run = new_checkpoint_run_id();
  s.lock = open_checkpoint_root(o.save, s.run, o.overwrite, resumed, mesh);
  return s;
}

int resume_training(const TrainConfig& cfg, DeviceMesh& mesh, const std::vector<Param*>& params,
                    Optimizer& opt, std::ostream* log, int* skipped_steps) {
  *skipped_steps = 0;
  if (cfg.checkpoint.resume.empty()) return 0;
  const std::string dir = resolve_checkpoint(cfg.checkpoint.resume);
  // ZeRO: each rank loads its dp shard of the state (and at stage 3 of the parameters) from
  // either format, on any layout.
  CheckpointMeta got = load_checkpoint(dir, train_checkpoint_meta(cfg, 0), mesh, params, &opt);
  *skipped_steps = static_cast<int>(got.skipped_steps);
  if (log && mesh.rank() == 0)
    print_line(*log,
               "resumed from " + dir + " (step " + std::to_string(got.step) + ", saved on " +
                   got.mesh + ", now on " + mesh.str() + ")" +
                   (got.step >= cfg.steps ? "; it is at or past --steps, nothing to train" : "") +
                   "\n");
  return static_cast<int>(got.step);
}

void save_training(const TrainConfig& cfg, const CheckpointSession& session, int step,
                   int skipped_steps, DeviceMesh& mesh, const std::vector<Param*>& params,
                   Optimizer& opt, std::ostream* log) {
  auto t0 = std::chrono::steady_clock::now();
  CheckpointMeta meta = train_checkpoint_meta(cfg, step);
  meta.run = session.run;
  meta.skipped_steps = skipped_steps;
  // ZeRO on dp > 1: each rank writes its dp shards as they are (nothing gathered). Otherwise
  // (dp = 1) the state is gathered into whole tensors for the save and freed after.
  const bool gather = !checkpoint_saves_shards(mesh, &opt);
  if (gather) opt.gather_state();
  std::string dir;
  try {
    dir = save_checkpoint(cfg.checkpoint.save, meta, mesh, params, &opt, cfg.checkpoint.keep);
  } catch (...) {
    if (gather) opt.scatter_state();
    throw;
  }
  if (gather) opt.scatter_state();
  if (log && mesh.rank() == 0) {
    std::ostringstream line;
    line << "checkpoint step " << step << " -> " << dir << " (" << std::fixed
         << std::setprecision(1)
         << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
         << " ms)\n";
    print_line(*log, line.str());
  }
}

}  // namespace meshrt
