#include "tools/train.h"

#include <algorithm>
#include <iomanip>
#include <mutex>

#include "bench/common/cli_checks.h"
#include "collectives/bootstrap.h"
#include "mesh/train.h"
#include "mesh/train_checkpoint.h"
#include "runtime/error.h"

namespace meshrt::cli {

CLI::App* add_train_command(CLI::App& app, TrainCliOptions& o) {
  auto* c = app.add_subcommand(
      "train",
      "Train the small decoder model (embedding, N transformer blocks, LM head with loss "
      "parallel) on synthetic tokens over a dp x tp mesh; one line per step");
  c->add_option("--devices", o.devices, "Ranks: cpu:N (threads) | cuda:all | cuda:0-3")
      ->capture_default_str();
  c->add_option("--mesh", o.mesh, "Mesh, e.g. dp=2,tp=2 (default dp=<world size>)");
  c->add_flag("--sp", o.sp, "Sequence parallel in the tp blocks");
  c->add_option("--batch", o.batch, "Global batch (samples per step, all dp replicas)")
      ->capture_default_str()
      ->check(kPositiveInt);
  c->add_option("--seq", o.seq, "Sequence length")->capture_default_str()->check(kPositiveInt);
  c->add_option("--hidden", o.hidden, "Hidden size")->capture_default_str()->check(kPositiveInt);
  c->add_option("--heads", o.heads, "Attention heads")->capture_default_str()->check(kPositiveInt);
  c->add_option("--ffn", o.ffn, "MLP inner size (default 4 x hidden)")->check(kNonNegativeInt);
  c->add_option("--layers", o.layers, "Transformer blocks")
      ->capture_default_str()
      ->check(kPositiveInt);
  c->add_option("--vocab", o.vocab, "Vocabulary size")->capture_default_str()->check(kPositiveInt);
  c->add_option("--dtype", o.dtype, "f32 | bf16 | f16")->capture_default_str();
  c->add_option("--steps", o.steps, "Training steps")->capture_default_str()->check(kPositiveInt);
  c->add_option("--seed", o.seed, "Seed of weights and data")
      ->capture_default_str()
      ->check(kNonNegativeInt);
  c->add_option("--lr", o.lr, "Learning rate")->capture_default_str()->check(non_negative());
  c->add_option("--optimizer", o.optimizer, "sgd | adamw")->capture_default_str();
  c->add_option("--clip", o.clip, "Clip gradients to this global norm (0: off)")
      ->capture_default_str()
      ->check(non_negative());
  c->add_option("--micro-batches", o.micro_batches, "Gradient accumulation micro-batches per step")
      ->capture_default_str()
      ->check(kPositiveInt);
  c->add_option("--grad-sync", o.grad_sync,
                "sync | async (staleness-aware delayed gradients) | local (local SGD)")
      ->capture_default_str();
  c->add_option("--staleness", o.staleness, "async: apply gradients K steps late, lr / K")
      ->capture_default_str()
      ->check(kNonNegativeInt);
  c->add_option("--sync-every", o.sync_every, "local: average parameters every H steps")
      ->capture_default_str()
      ->check(kPositiveInt);
  c->add_option("--bucket-mb", o.bucket_mb, "Gradient bucket size in MiB")
      ->capture_default_str()
      ->check(kPositive);
  c->add_flag("--bf16-grads", o.bf16_grads, "Communicate f32 gradients as bf16");
  c->add_option("--overlap", o.overlap, "tp overlap: none | async | chunked")
      ->capture_default_str();
  c->add_flag("--compare,!--no-compare", o.compare,
              "async/local: also run synchronous DP and print the trade (default on)");
  c->add_option("--save", o.save,
                "Checkpoint directory: step-N/ per checkpoint (a safetensors file per rank and "
                "index.json) and a 'latest' pointer; written at the last step");
  c->add_option("--save-every", o.save_every, "Also write a checkpoint every N steps")
      ->check(kPositiveInt);
  c->add_option("--keep", o.keep, "Keep only the newest N checkpoints (default all)")
      ->check(kPositiveInt);
  c->add_option("--resume", o.resume,
                "Continue from a checkpoint (a --save directory or one step-N/ in it), on any "
                "mesh; --steps counts from the start of the original run");
  return c;
}

namespace {

TrainConfig to_config(const TrainCliOptions& o, GradSyncMode mode) {
  TrainConfig c;
  c.model.block.hidden = o.hidden;
  c.model.block.heads = o.heads;
  c.model.block.ffn = o.ffn > 0 ? o.ffn : 4 * o.hidden;
  c.model.block.dtype = parse_dtype(o.dtype);
  c.model.block.seed = o.seed;
  c.model.layers = o.layers;
  c.model.vocab = o.vocab;
  c.mesh = o.mesh;
  c.tp.sequence_parallel = o.sp;
  c.tp.overlap = parse_overlap(o.overlap);
  c.batch = o.batch;
  c.seq = o.seq;
  c.steps = o.steps;
  c.seed = o.seed;
  c.micro_batches = o.micro_batches;
  c.optim.kind = parse_optimizer(o.optimizer);
  c.optim.lr = o.lr;
  c.optim.clip_norm = o.clip;
  c.dp.bucket_mb = o.bucket_mb;
  c.dp.bf16_comm = o.bf16_grads;
  c.grad_sync = mode;
  c.staleness = o.staleness;
  c.sync_every = o.sync_every;
  c.checkpoint.save = o.save;
  c.checkpoint.save_every = o.save_every;
  c.checkpoint.keep = o.keep;
  c.checkpoint.resume = o.resume;
  MESHRT_CHECK(o.bucket_mb > 0, "--bucket-mb " << o.bucket_mb << " must be positive");
  return c;
}

struct Summary {
  double median_ms = 0, dp_comm = 0, dp_exposed = 0, final_loss = 0;
};

Summary summarize(const std::vector<StepStats>& st) {
  Summary s;
  std::vector<double> t;
  // Skip the first step (allocator and thread warm-up) when there are others.
  for (size_t i = st.size() > 1 ? 1 : 0; i < st.size(); ++i) {
    t.push_back(st[i].step_ms);
    s.dp_comm += st[i].dp_comm_ms;
    s.dp_exposed += st[i].dp_exposed_ms;
  }
  std::sort(t.begin(), t.end());
  s.median_ms = t[t.size() / 2];
  s.final_loss = st.back().loss;
  return s;
}

// Runs on every rank of this process; returns rank 0's stats (empty in processes without rank 0).
std::vector<StepStats> run_once(const TrainConfig& cfg, const TrainCliOptions& o,
                                std::ostream* os) {
  LaunchOptions lo;
  lo.devices = o.devices;
  auto launch = bootstrap(lo);
  validate_train(cfg, launch->world_size());  // before any rank starts
  if (!cfg.checkpoint.save.empty()) prepare_checkpoint_root(cfg.checkpoint.save);
  if (!cfg.checkpoint.resume.empty())
    read_checkpoint_meta(cfg.checkpoint.resume, train_checkpoint_meta(cfg, 0));
  std::vector<StepStats> out;
  std::mutex mu;
  launch->run([&](const RankPlacement& rp, Communicator& world) {
    ContextOptions co;
    co.rank = rp.rank;
    co.world_size = rp.world_size;
    co.local_ranks = rp.local_size;
    Context ctx(rp.device, co);
    auto st = train(cfg, ctx, world, os);
    if (rp.rank == 0) {
      std::lock_guard<std::mutex> lk(mu);
      out = std::move(st);
    }
  });
  return out;
}

}  // namespace

int run_train(const TrainCliOptions& o, std::ostream& os) {
  const GradSyncMode mode = parse_grad_sync(o.grad_sync);
  TrainConfig cfg = to_config(o, mode);
  auto st = run_once(cfg, o, &os);
  const bool compare = mode != GradSyncMode::Sync && o.compare;
  // Every process runs the comparison (it is collective); only rank 0's process prints.
  std::vector<StepStats> ss;
  if (compare) ss = run_once(to_config(o, GradSyncMode::Sync), o, nullptr);
  if (st.empty()) return 0;
  Summary a = summarize(st);
  auto line = [&](const char* name, const Summary& s) {
    os << std::left << std::setw(22) << name << std::right << std::fixed << std::setprecision(2)
       << std::setw(10) << s.median_ms << std::setw(14) << s.dp_comm << std::setw(14)
       << s.dp_exposed << std::setw(12) << std::setprecision(6) << s.final_loss << "\n";
  };
  os << "\n"
     << std::left << std::setw(22) << "grad sync" << std::right << std::setw(10) << "step ms"
     << std::setw(14) << "dp comm ms" << std::setw(14) << "exposed ms" << std::setw(12)
     << "loss@" + std::to_string(o.steps) << "\n";
  std::string name = grad_sync_name(mode);
  if (mode == GradSyncMode::Async) name += " (K=" + std::to_string(o.staleness) + ")";
  if (mode == GradSyncMode::Local) name += " (H=" + std::to_string(o.sync_every) + ")";
  line(name.c_str(), a);
  if (compare) line("sync", summarize(ss));
  os << "(step ms: median over steps 2..N; comm and exposed: sums over steps 2..N; exposed = time "
        "the compute stream waited for dp communication)\n";
  return 0;
}

}  // namespace meshrt::cli
