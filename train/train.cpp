#include "train/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "dist/context_parallel.h"
#include "kernels/deterministic.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "train/token_data.h"
#include "train/train_checkpoint.h"
#include "train/train_deterministic.h"
#include "train/train_guard.h"
#include "train/train_metrics.h"

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
  m.append("=").append(std::to_string(world_size));
  return m;
}

// Samples from the token file when there is one, else the synthetic walk; both keyed by the global
// sample index only. Under cp (a cp dim of size > 1), ids and targets are this cp rank's CpLayout
// shard of the sequences (chunks i and 2cp-1-i; the model has no position input: the causal mask
// of cp attention is on global positions). --doc-mask: the batch's documents go to the model's
// attention, and under cp the shards follow their balanced layout.
// Returns the batch's documents (null without --doc-mask).
std::shared_ptr<const PackedDocs> make_batch(const TrainConfig& cfg, Context& ctx,
                                             const DeviceMesh& mesh, DecoderModel& model,
                                             const TokenFile* file, uint64_t stream, int64_t first,
                                             int64_t n, Tensor* ids, Tensor* targets) {
  if (file != nullptr)
    make_token_batch(ctx, *file, cfg.seed, stream, first, n, cfg.seq, ids, targets);
  else
    make_synthetic_batch(ctx, cfg.seed, first, n, cfg.seq, cfg.model.vocab, ids, targets);
  const int cp = mesh.size(kCpDim);
  std::shared_ptr<const PackedDocs> docs;
  if (cfg.doc_eot >= 0) docs = packed_documents(ctx, *ids, cfg.doc_eot, cp, cfg.cp_chunks);
  model.set_documents(docs);
  if (cp == 1) return docs;
  const CpLayout layout = docs ? docs->layout : CpLayout::make(cfg.seq, cp);
  for (Tensor* t : {ids, targets}) {
    Tensor shard = ctx.empty({layout.local_seq(), n}, t->dtype());
    cp_shard(layout, mesh.coord(kCpDim), *t, 0, shard, ctx.compute_stream());
    *t = shard;
  }
  return docs;
}

int local_stop_request(const TrainConfig& cfg) {
  return cfg.stop_requested ? std::max(0, cfg.stop_requested()) : 0;
}

// Mean loss over eval_batches fixed global batches of val_data (forward only). A stop request
// is agreed before each batch (a long validation must not delay it): then *stop is the verdict
// and the loss is not computed.
double evaluate(const TrainConfig& cfg, Context& ctx, Communicator& world, DeviceMesh& mesh,
                DecoderModel& model, GradSync& sync, CommScheduler& dp_loss, StepVerdict* stop) {
  Stream& cs = ctx.compute_stream();
  const int64_t local = cfg.batch / mesh.size(kDpDim), micro = local / cfg.micro_batches;
  const float w = 1.f / static_cast<float>(cfg.eval_batches * cfg.micro_batches);
  Tensor sum = ctx.zeros({1}, DType::f32);
  for (int b = 0; b < cfg.eval_batches; ++b) {
    ctx.synchronize();
    if (StepVerdict v = agree_stop(ctx, world, local_stop_request(cfg)); v.stop) {
      *stop = v;
      return std::numeric_limits<double>::quiet_NaN();
    }
    for (int mb = 0; mb < cfg.micro_batches; ++mb) {
      Tensor ids, targets;
      const int64_t first = b * cfg.batch + mesh.coord(kDpDim) * local + mb * micro;
      make_batch(cfg, ctx, mesh, model, cfg.val_data.get(), kValTokenStream, first, micro, &ids,
                 &targets);
      ops::add(ctx, cs, sum, model.forward(ids, targets, &sync, /*backward_follows=*/false), sum,
               1.f, w);
    }
  }
  dp_loss.all_reduce(sum, "val_loss", ReduceOp::Avg);
  Tensor h = sum.to(ctx.host_allocator(), cs);
  ctx.synchronize();
  return h.item(0);
}

// Rank 0's line per step: "step N loss X  time T ms  dp comm C ms (exposed E ms)  tp comm ...".
void print_step_line(const TrainConfig& cfg, Context& ctx, const StepStats& st, std::ostream& log) {
  std::ostringstream line;
  // A NaN prints as "nan" whatever its sign bit (iostreams print "-nan" for some).
  line << "step " << st.step << " loss " << std::fixed << std::setprecision(6)
       << (std::isnan(st.loss) ? std::fabs(st.loss) : st.loss) << std::setprecision(1) << "  time "
       << st.step_ms << " ms  dp comm " << st.dp_comm_ms << " ms (exposed " << st.dp_exposed_ms
       << " ms)  tp comm " << st.tp_comm_ms << " ms (exposed " << st.tp_exposed_ms << " ms)"
       << (st.skipped ? "  skipped: non-finite" : "");
  if (st.cp_imbalance > 0)
    line << std::setprecision(3) << "  cp work max/mean " << st.cp_imbalance << " (standard "
         << st.cp_standard_imbalance << ")";
  if (cfg.dp.zero > 0) {
    auto mib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
    line << std::setprecision(3) << "  dp MiB all-reduce " << mib(st.dp_all_reduce_bytes)
         << " reduce-scatter " << mib(st.dp_reduce_scatter_bytes) << " all-gather "
         << mib(st.dp_all_gather_bytes);
  }
  if (cfg.mem_stats) {
    const AllocatorStats m = ctx.allocator().stats();
    line << "  mem alloc " << m.allocated_bytes << " peak " << m.peak_allocated_bytes
         << " reserved " << m.reserved_bytes;
  }
  line << "\n";
  print_line(log, line.str());
}

// TrainConfig::digest_steps' digest, and --deterministic's at the last step with its line (on
// `log`, rank 0's): runs of any layout at the same tp print the same digest.
void digest_step(const TrainConfig& cfg, Context& ctx, DecoderModel& model, Optimizer& opt,
                 bool last, std::ostream* log, StepStats* st) {
  if (std::count(cfg.digest_steps.begin(), cfg.digest_steps.end(), st->step) > 0 ||
      (cfg.deterministic && last))
    st->state_digest = train_state_digest(ctx, model.params(), opt);
  if (!cfg.deterministic || !last || !log) return;
  std::ostringstream line;
  line << "state digest " << std::hex << std::setw(16) << std::setfill('0') << st->state_digest
       << std::dec << " after step " << st->step
       << " (parameters and optimizer state, this tp shard; --deterministic runs agree on it)\n";
  print_line(*log, line.str());
}

// The validation loss after step st->step (rank 0 prints "val step N loss X"); a stop agreed
// during it joins the step's verdict, and no loss is printed.
void validate_step(const TrainConfig& cfg, Context& ctx, Communicator& world, DeviceMesh& mesh,
                   DecoderModel& model, GradSync& sync, CommScheduler& dp_loss, std::ostream* log,
                   StepStats* st, StepVerdict* verdict) {
  StepVerdict stop;
  st->val_loss = evaluate(cfg, ctx, world, mesh, model, sync, dp_loss, &stop);
  if (stop.stop) {
    verdict->stop = true;
    verdict->stop_signal = stop.stop_signal;
    return;
  }
  if (log && world.rank() == 0) {
    std::ostringstream line;
    line << "val step " << st->step << " loss " << std::fixed << std::setprecision(6)
         << (std::isnan(st->val_loss) ? std::fabs(st->val_loss) : st->val_loss) << "\n";
    print_line(*log, line.str());
  }
}

// What train does not run under cp > 1 (before anything is communicated).
void validate_train_cp(const TrainConfig& cfg, const std::string& mesh, int cp) {
  MESHRT_CHECK(cfg.cp_chunks == 2 || (cp > 1 && cfg.doc_eot >= 0),
               "train: --cp-chunks " << cfg.cp_chunks << " sets the chunks per cp rank of "
                                     << "--doc-mask's balanced layout; it needs --doc-mask and a "
                                        "mesh with cp > 1 (--mesh "
                                     << mesh << ")");
  if (cp == 1) return;
  if (cfg.cp_chunks != 2) {
    try {
      CpLayout::make(cfg.seq, cp, cfg.cp_chunks);
    } catch (const Error& e) {
      MESHRT_FAIL("train: --cp-chunks " << cfg.cp_chunks << " with --seq " << cfg.seq << ": "
                                        << e.message());
    }
  }
  MESHRT_CHECK(!cfg.deterministic,
               "train: --deterministic is not supported with context parallelism (--mesh "
                   << mesh << ", cp=" << cp
                   << "): its fixed-order sum does not split sequences over ranks; drop "
                      "--deterministic or use cp=1");
  MESHRT_CHECK(cfg.grad_sync == GradSyncMode::Sync,
               "train: --grad-sync " << grad_sync_name(cfg.grad_sync)
                                     << " is not supported with context parallelism (--mesh "
                                     << mesh << ", cp=" << cp
                                     << "): the cp ranks of a replica must apply the same summed "
                                        "gradient each step; use --grad-sync sync or cp=1");
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The step's communication times, and its compute: time to the guard less the exposed
// communication before it (all of tp's; dp's only for async and local, whose dp waits come
// before the guard, while synchronous DP's optimizer waits after it).
void set_comm_times(const TrainConfig& cfg, const CommTimes& d, const CommTimes& t,
                    double compute_end_ms, StepStats* st) {
  st->dp_comm_ms = d.comm_ms;
  st->dp_exposed_ms = d.exposed_ms;
  st->tp_comm_ms = t.comm_ms;
  st->tp_exposed_ms = t.exposed_ms;
  st->dp_all_reduce_bytes = d.all_reduce_bytes;
  st->dp_reduce_scatter_bytes = d.reduce_scatter_bytes;
  st->dp_all_gather_bytes = d.all_gather_bytes;
  const double dp_before = cfg.grad_sync == GradSyncMode::Sync ? 0.0 : d.exposed_ms;
  st->compute_ms = std::max(0.0, compute_end_ms - t.exposed_ms - dp_before);
}

// Every rank raises the same message: the verdict and the culprit search are collective.
// `resumed`: `step` is the first after --resume (whose weights loaded finite).
[[noreturn]] void throw_nonfinite(const TrainConfig& cfg, int step, const StepVerdict& v,
                                  const std::string& culprit, bool resumed) {
  std::ostringstream os;
  os << "step " << step << ": ";
  if (!v.loss_finite) os << "the loss is not finite";
  if (!v.loss_finite && !v.grads_finite) os << " and ";
  if (!v.grads_finite) {
    if (culprit.empty() && cfg.dp.zero >= 2)
      os << "a gradient is not finite or their norm overflows f32 (--zero " << cfg.dp.zero
         << " keeps gradient shards only: --zero 1 names the parameter)";
    else if (culprit.empty())
      os << "the gradient norm overflows f32";
    else
      os << "the gradient of " << culprit << " is not finite (the first such parameter)";
  }
  if (resumed)
    os << "; it is the first step after --resume " << cfg.checkpoint.resume
       << ", whose weights loaded finite: they or its optimizer state may already overflow (a run "
          "close to diverging when it was saved); resume an earlier checkpoint, or lower --lr ("
       << cfg.optim.lr << ") or set --clip";
  else if (const double shrink = double(cfg.optim.lr) * cfg.optim.weight_decay; shrink >= 1)
    // Decoupled decay multiplies the matrices by 1 - lr x wd each step: at or past 1 it flips
    // or zeroes them, whatever the gradients are.
    os << "; --weight-decay " << cfg.optim.weight_decay << " at --lr " << cfg.optim.lr
       << " multiplies the weights by 1 - lr x wd = " << 1 - shrink
       << " each step: lower --weight-decay so that lr x wd is well below 1";
  else
    os << "; lower --lr (" << cfg.optim.lr << "), set --clip, or pass --skip-nonfinite to skip "
       << "such steps";
  throw NonFiniteError(os.str());
}

// One step's micro-batches: forward and backward, the last one launching the buckets'
// reductions. Returns this rank's mean loss (the dp average is taken after the update). With
// --doc-mask under cp, st's cp imbalances are the micro-batches' means.
Tensor forward_backward(const TrainConfig& cfg, Context& ctx, DeviceMesh& mesh, DecoderModel& model,
                        GradSync& sync, int step, StepStats* st) {
  Stream& cs = ctx.compute_stream();
  const int64_t local_batch = cfg.batch / mesh.size(kDpDim),
                micro = local_batch / cfg.micro_batches;
  const float grad_scale = 1.f / static_cast<float>(cfg.micro_batches);
  sync.zero_grad(/*first_write=*/true);  // model.backward (each micro-batch) runs before reads
  Tensor loss_sum = ctx.zeros({1}, DType::f32);
  for (int mb = 0; mb < cfg.micro_batches; ++mb) {
    const bool last = mb == cfg.micro_batches - 1;
    sync.enable_sync(last && cfg.grad_sync != GradSyncMode::Local);
    Tensor ids, targets;
    const int64_t first =
        static_cast<int64_t>(step) * cfg.batch + mesh.coord(kDpDim) * local_batch + mb * micro;
    const auto docs = make_batch(cfg, ctx, mesh, model, cfg.data.get(), kTrainTokenStream, first,
                                 micro, &ids, &targets);
    if (docs && mesh.size(kCpDim) > 1) {
      st->cp_imbalance += docs->imbalance / cfg.micro_batches;
      st->cp_standard_imbalance += docs->standard_imbalance / cfg.micro_batches;
    }
    Tensor loss = model.forward(ids, targets, &sync);
    ops::add(ctx, cs, loss_sum, loss, loss_sum, 1.f, grad_scale);
    // The loss is the mean over this rank's tokens; GradSync sums the weight gradients over cp,
    // so each cp rank contributes 1 / cp of the replica's mean.
    model.backward(grad_scale / static_cast<float>(mesh.size(kCpDim)), &sync);
  }
  return loss_sum;
}

// The optimizer step of a finite step (`apply`: the async gradient set due now).
void apply_update(const TrainConfig& cfg, int step, bool updates, int set, int apply,
                  Optimizer& opt, GradSync& sync) {
  switch (cfg.grad_sync) {
    case GradSyncMode::Sync:
      opt.step(&sync, 1.f, set);
      break;
    case GradSyncMode::Async:
      // Step t's all-reduce overlaps the next K steps; it is applied K steps late, with the
      // learning rate divided by the staleness (Zhang et al. 2016).
      if (updates)
        opt.step(&sync, cfg.staleness > 0 ? 1.f / static_cast<float>(cfg.staleness) : 1.f, apply);
      break;
    case GradSyncMode::Local:
      opt.step(nullptr);
      if ((step + 1) % cfg.sync_every == 0) sync.average_params();
      break;
  }
}
}  // namespace

LrSchedule train_lr_schedule(const TrainConfig& cfg) {
  LrSchedule s;
  s.kind = cfg.lr_schedule;
  s.warmup_steps = cfg.warmup_steps;
  s.min_lr = cfg.min_lr;
  s.total_steps = cfg.steps;
  return s;
}

void validate_train(const TrainConfig& cfg, int world_size) {
  auto dims = parse_mesh_spec(default_mesh(cfg, world_size), world_size);
  int dp = 1, tp = 1, cp = 1;
  for (auto& d : dims) {
    if (d.name == kDpDim)
      dp = d.size;
    else if (d.name == kTpDim)
      tp = d.size;
    else if (d.name == kCpDim)
      cp = d.size;
    else
      MESHRT_FAIL("train: mesh dim '" << d.name << "' is not supported; use " << kDpDim << ", "
                                      << kCpDim << " and " << kTpDim);
  }
  validate_train_cp(cfg, default_mesh(cfg, world_size), cp);
  MESHRT_CHECK(cfg.steps >= 1, "train: --steps " << cfg.steps << " must be >= 1");
  MESHRT_CHECK(std::isfinite(cfg.optim.lr) && cfg.optim.lr >= 0,
               "train: --lr " << cfg.optim.lr << " must be finite and >= 0");
  MESHRT_CHECK(std::isfinite(cfg.optim.weight_decay) && cfg.optim.weight_decay >= 0,
               "train: --weight-decay " << cfg.optim.weight_decay << " must be finite and >= 0");
  validate_lr_schedule(train_lr_schedule(cfg), cfg.optim.lr);
  MESHRT_CHECK(cfg.micro_batches >= 1,
               "train: --micro-batches " << cfg.micro_batches << " must be >= 1");
  MESHRT_CHECK(cfg.batch >= 1 && cfg.batch % (int64_t{dp} * cfg.micro_batches) == 0,
               "train: global --batch " << cfg.batch << " must divide by dp (" << dp
                                        << ") x --micro-batches (" << cfg.micro_batches << ")");
  MESHRT_CHECK(cfg.seq >= 1, "train: --seq " << cfg.seq << " must be >= 1");
  // As bench block: without sequence parallelism there is no sequence collective to split.
  MESHRT_CHECK(!(cfg.tp.overlap == Overlap::Chunked && tp > 1 && !cfg.tp.sequence_parallel),
               "train: --overlap chunked splits the sequence all-gather / reduce-scatter into "
               "pieces and needs sequence parallelism: add --sp or use --overlap async");
  // A vocabulary that tp does not divide is sharded unevenly; every rank needs one entry.
  MESHRT_CHECK(cfg.model.vocab >= 2 && cfg.model.vocab >= tp,
               "train: --vocab " << cfg.model.vocab << " must be >= 2 and >= tp=" << tp);
  MESHRT_CHECK(cfg.staleness >= 0, "train: --staleness " << cfg.staleness << " must be >= 0");
  MESHRT_CHECK(cfg.sync_every >= 1, "train: --sync-every " << cfg.sync_every << " must be >= 1");
  validate_zero_stage(cfg.dp.zero);
  MESHRT_CHECK(!cfg.deterministic || cfg.grad_sync == GradSyncMode::Sync,
               "train: --deterministic needs --grad-sync sync (got "
                   << grad_sync_name(cfg.grad_sync) << "); drop --grad-sync or --deterministic");
  MESHRT_CHECK(!cfg.deterministic || cfg.model.block.dtype == DType::f32,
               "train: --deterministic sums f32 gradients in a fixed order; --dtype "
                   << dtype_name(cfg.model.block.dtype) << " is not supported with it: use f32");
  MESHRT_CHECK(!cfg.deterministic || (cfg.deterministic_grain >= 1 &&
                                      cfg.batch % (dp * cfg.deterministic_grain) == 0),
               "train: --deterministic-grain "
                   << cfg.deterministic_grain << " does not divide the " << cfg.batch / dp
                   << " sequences of a dp rank (--batch " << cfg.batch << " over dp=" << dp
                   << "); use a grain that divides it (1 always does)");
  MESHRT_CHECK(!cfg.deterministic || !cfg.dp.bf16_comm,
               "train: --bf16-grads rounds the gradients to bf16 before the dp sum, and "
               "--deterministic sums them in f32 in a fixed order; drop one of them");
  MESHRT_CHECK(cfg.dp.zero == 0 || cfg.grad_sync == GradSyncMode::Sync,
               "train: --zero " << cfg.dp.zero << " needs --grad-sync sync (got "
                                << grad_sync_name(cfg.grad_sync)
                                << ": its delayed gradients or diverging replicas are not sharded)"
                                   "; use --zero 0");
  MESHRT_CHECK(cfg.eval_every >= 0, "train: --eval-every " << cfg.eval_every << " must be >= 0");
  MESHRT_CHECK(cfg.eval_batches >= 1,
               "train: --eval-batches " << cfg.eval_batches << " must be >= 1");
  MESHRT_CHECK(cfg.eval_every == 0 || cfg.val_data,
               "train: --eval-every " << cfg.eval_every << " needs --val-data FILE");
  MESHRT_CHECK(std::isfinite(cfg.straggler_threshold) && cfg.straggler_threshold > 1,
               "train: --straggler-threshold " << cfg.straggler_threshold
                                               << " must be > 1 (1.2: 20% over the median rank)");
  MESHRT_CHECK(cfg.straggler_steps >= 1,
               "train: --straggler-steps " << cfg.straggler_steps << " must be >= 1");
  MESHRT_CHECK(std::isfinite(cfg.peak_tflops) && cfg.peak_tflops >= 0,
               "train: --peak-tflops " << cfg.peak_tflops << " must be finite and >= 0");
  MESHRT_CHECK(cfg.doc_eot < cfg.model.vocab, "train: --doc-mask's end-of-text token "
                                                  << cfg.doc_eot << " is >= --vocab "
                                                  << cfg.model.vocab
                                                  << ": no token could end a document; "
                                                     "give an id below --vocab");
  if (cfg.data) cfg.data->check(cfg.model.vocab, cfg.seq);
  if (cfg.val_data) cfg.val_data->check(cfg.model.vocab, cfg.seq);
  validate_block(cfg.model.block, tp, cfg.tp, cfg.seq, true, {}, cp);
  validate_checkpointing(cfg);
  check_checkpoint_fault_env(world_size);
}

std::vector<StepStats> train(const TrainConfig& cfg, Context& ctx, Communicator& world,
                             std::ostream* log) {
  validate_train(cfg, world.size());
  DeviceMesh mesh(ctx, world, default_mesh(cfg, world.size()));
  CommScheduler tp(mesh, kTpDim, cfg.tp.overlap);
  DecoderModel model(mesh, tp, cfg.tp, cfg.model);
  const int sets = cfg.grad_sync == GradSyncMode::Async ? cfg.staleness + 1 : 1;
  DpOptions dp_opts = cfg.dp;
  dp_opts.deterministic = cfg.deterministic;
  // --deterministic: GEMM panels that do not depend on the host thread count
  // (kernels/deterministic.h).
  if (cfg.deterministic) ops::set_deterministic_gemm(ctx, true);
  GradSync sync(mesh, model.params(), dp_opts, sets,
                cfg.dp.zero == 3 ? model.pieces() : std::vector<std::vector<Param*>>());
  // Every replica starts from dp rank 0's parameters (stage 3: then keeps its shard of them,
  // before the optimizer state is allocated).
  sync.broadcast_params();
  sync.shard_params();
  // --metrics records the gradient norm of every step (without it, it is measured only to clip).
  OptimizerConfig optim = cfg.optim;
  optim.measure_grad_norm = optim.measure_grad_norm || !cfg.metrics.empty();
  Optimizer opt(mesh, model.params(), optim, cfg.dp.zero > 0 ? &sync : nullptr);
  Stream& cs = ctx.compute_stream();
  // --- checkpoint: resume ---
  const CheckpointSession checkpoints = open_checkpointing(cfg, mesh);
  int skipped_total = 0;  // the run's: a resumed run continues its checkpoint's count
  const int first_step = resume_training(cfg, mesh, model.params(), opt, log, &skipped_total);

  const BatchFn batch_of = [&](int64_t first, int64_t n, Tensor* ids, Tensor* targets) {
    make_batch(cfg, ctx, mesh, model, cfg.data.get(), kTrainTokenStream, first, n, ids, targets);
  };
  const LrSchedule schedule = train_lr_schedule(cfg);
  // The loss averages over dp x cp (every cp rank holds as many tokens).
  CommScheduler dp_loss(mesh, mesh.grad_dim(), Overlap::None);
  TrainMetrics metrics(cfg, ctx, world, first_step, train_step_flops(cfg));
  std::vector<StepStats> out;
  for (int step = first_step; step < cfg.steps; ++step) {
    ctx.synchronize();
    sync.scheduler().reset_times();
    tp.reset_times();
    auto t0 = std::chrono::steady_clock::now();
    const int set = sets > 1 ? step % sets : 0;
    sync.set_active(set);
    // Sum of squares of the gradients this step applies, for the guard. Synchronous DP adds each
    // bucket's local gradients as it launches (overlapping backward; any non-finite local
    // gradient makes the reduced one non-finite), so the optimizer still waits bucket by bucket.
    Tensor sumsq = ctx.zeros({1, 1}, DType::f32);
    const bool probe = cfg.grad_sync == GradSyncMode::Sync && !cfg.deterministic;
    sync.set_sumsq_probe(probe ? sumsq : Tensor());
    StepStats work;  // what the step's batches say (the cp work balance)
    // --deterministic: the loss is the global batch's already, the gradients reduced.
    Tensor loss_sum = cfg.deterministic
                          ? deterministic_step(ctx, mesh, model, sync, cfg.batch,
                                               cfg.deterministic_grain, step, batch_of)
                          : forward_backward(cfg, ctx, mesh, model, sync, step, &work);
    if (cfg.deterministic) sync.sum_squares_reduced(sumsq);
    // --- guard: the gradients about to be applied, the loss and the stop request, agreed by
    // every rank before any parameter changes ---
    const bool updates = cfg.grad_sync != GradSyncMode::Async || step >= cfg.staleness;
    const int apply = cfg.grad_sync == GradSyncMode::Async ? (step - cfg.staleness) % sets : set;
    const bool dp_synced = updates && cfg.grad_sync != GradSyncMode::Local;
    if (dp_synced) sync.bind(apply);
    if (updates && !probe && !cfg.deterministic) {
      if (dp_synced) sync.wait_all(apply);
      for (Param* p : model.params()) ops::sum_squares(ctx, cs, p->grad, sumsq);
    }
    // The schedule is a function of the step: a resumed run continues it exactly. Async applies
    // step t - K's gradients at step t's rate.
    const float lr = scheduled_lr(schedule, cfg.optim.lr, step);
    opt.set_lr(lr);
    cs.synchronize();  // agree_step's own first wait: here it marks the end of this rank's compute
    const double compute_end_ms = ms_since(t0);
    StepVerdict verdict = agree_step(ctx, world, loss_sum, sumsq, local_stop_request(cfg));
    // A skipped or failing step applies nothing: its all-reduces still finish before the
    // gradients are named or zeroed.
    if (!verdict.finite() && dp_synced) sync.wait_all(apply);
    if (!verdict.finite() && !cfg.skip_nonfinite)
      throw_nonfinite(cfg, step + 1, verdict,
                      verdict.grads_finite ? "" : first_nonfinite_grad(ctx, world, model.params()),
                      first_step > 0 && step == first_step);
    if (verdict.finite()) apply_update(cfg, step, updates, set, apply, opt, sync);
    if (cfg.grad_sync == GradSyncMode::Async) sync.bind(set);
    // The reported loss is the global batch mean (equal micro-batch and dp shard sizes).
    if (!cfg.deterministic) dp_loss.all_reduce(loss_sum, "loss", ReduceOp::Avg);
    Tensor lh = loss_sum.to(ctx.host_allocator(), cs);
    ctx.synchronize();
    StepStats st = work;
    st.step = step + 1;
    st.loss = lh.item(0);
    st.lr = cfg.grad_sync == GradSyncMode::Async && cfg.staleness > 0
                ? static_cast<double>(lr) / cfg.staleness
                : static_cast<double>(lr);
    st.step_ms = ms_since(t0);
    set_comm_times(cfg, sync.scheduler().times(), tp.times(), compute_end_ms, &st);
    st.skipped = !verdict.finite();
    if (log && world.rank() == 0) print_step_line(cfg, ctx, st, *log);
    // --- validation ---
    if (cfg.val_data && !verdict.stop &&
        (step + 1 == cfg.steps || (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0)))
      validate_step(cfg, ctx, world, mesh, model, sync, dp_loss, log, &st, &verdict);
    st.stopped = verdict.stop;
    st.stop_signal = verdict.stop ? verdict.stop_signal : 0;
    skipped_total += st.skipped ? 1 : 0;
    st.skipped_steps = skipped_total;
    st.grad_norm = verdict.finite() ? opt.last_grad_norm() : -1.0;
    metrics.record(ctx, &st, st.grad_norm, skipped_total, world.rank() == 0 ? log : nullptr);
    digest_step(cfg, ctx, model, opt, st.step == cfg.steps || verdict.stop,
                world.rank() == 0 ? log : nullptr, &st);
    if (cfg.on_step) cfg.on_step(st);
    out.push_back(st);
    // --- checkpoint: save, then stop; every rank leaves after the same step (agreed by the
    // guard above) ---
    if (checkpoint_due(cfg.checkpoint, st.step, cfg.steps, verdict.stop))
      save_training(cfg, checkpoints, st.step, skipped_total, mesh, model.params(), opt, log);
    if (verdict.stop) break;
  }
  metrics.finish(ctx);
  if (log && world.rank() == 0) metrics.log_cost(out, *log);
  return out;
}

}  // namespace meshrt
