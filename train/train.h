// The training loop: a DecoderModel on a dp x tp mesh with synchronous, staleness-aware delayed
// (async) or local-SGD gradient synchronisation over dp.
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/error.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace meshrt {

class TokenFile;

enum class GradSyncMode : uint8_t { Sync, Async, Local };
GradSyncMode parse_grad_sync(std::string_view s);
const char* grad_sync_name(GradSyncMode m);

struct StepStats;

struct TrainConfig {
  ModelConfig model;
  std::string mesh = "";  // default: dp=<world>
  TpOptions tp;
  int64_t batch = 8;  // global batch (samples per step over all dp replicas)
  int64_t seq = 64;
  int steps = 10;
  uint64_t seed = 1;
  int micro_batches = 1;
  OptimizerConfig optim;  // optim.lr: the peak learning rate of the schedule
  // --lr-schedule, --warmup-steps, --min-lr (train/optimizer.h); the decay ends at `steps`.
  LrScheduleKind lr_schedule = LrScheduleKind::Constant;
  int warmup_steps = 0;
  float min_lr = 0.f;
  DpOptions dp;
  // --deterministic (docs/training.md): bitwise identical results on any dp size, micro-batching,
  // bucket size, overlap, ZeRO stage and backend (train/train_deterministic.h).
  bool deterministic = false;
  // Sequences per grain (one forward / backward each, a leaf of the fixed tree): the promise
  // holds across the layouts whose local batch divides by it.
  int64_t deterministic_grain = 1;
  // Steps (1-based) after which StepStats::state_digest is computed (train_state_digest); with
  // --deterministic also the last step, and rank 0 prints "state digest ..." at the end.
  std::vector<int> digest_steps;
  GradSyncMode grad_sync = GradSyncMode::Sync;
  int staleness = 1;   // async: gradients applied this many steps late, lr / staleness
  int sync_every = 4;  // local: parameters averaged over dp every this many steps
  // --save / --save-every / --keep / --resume (train/checkpoint.h, train/train_checkpoint.h).
  CheckpointOptions checkpoint;
  // Real data (train/token_data.h) instead of the synthetic walk; with val_data, a validation
  // loss over eval_batches global batches every eval_every steps (0: after the last step only).
  std::shared_ptr<const TokenFile> data, val_data;
  // --doc-mask (docs/training.md, "Packed documents"): >= 0, the token that ends each document of
  // the packed sequences (included in it); attention then stays inside each document, causal
  // within it, under any cp. -1: one causal mask over the whole sequence.
  int64_t doc_eot = -1;
  // --cp-chunks: with doc_eot under cp, the chunks per cp rank of the balanced layout (even;
  // seq divisible by cp_chunks x cp): finer chunks balance packed documents better.
  int cp_chunks = 2;
  int eval_every = 0;
  int eval_batches = 4;
  // A non-finite loss or gradient stops the run (NonFiniteError) unless skipped: no update.
  bool skip_nonfinite = false;
  // Each step line also gives rank 0's allocator statistics: "  mem alloc A peak P reserved R"
  // (bytes currently allocated, peak allocated, reserved), for soak runs checking for growth.
  bool mem_stats = false;
  // --metrics FILE: one JSON Lines record per step on rank 0 (train/train_metrics.h).
  std::string metrics;
  // --peak-tflops: the dense peak of one device (TFLOP/s); > 0 adds MFU to the metrics.
  double peak_tflops = 0;
  // Stragglers (train/train_metrics.h): a rank whose compute is over straggler_threshold x the
  // median rank's for straggler_steps steps in a row is named once. Watched when --metrics is
  // written or watch_stragglers is set (both gather every rank's times once a step).
  bool watch_stragglers = false;
  double straggler_threshold = 1.2;
  int straggler_steps = 3;
  // Polled once a step (and once per validation batch) on every rank: the signal number asking
  // to stop (any value > 0 asks; 0: go on). When it asks on any rank, all stop after that step
  // (a validation under way is abandoned; a checkpoint is written first with --save), and agree
  // on the signal (StepStats::stop_signal).
  std::function<int()> stop_requested;
  // Called on every rank after each step (its loss is the global batch's, alike on every rank),
  // e.g. to ask for a stop through stop_requested at the next step (meshrt tune).
  std::function<void(const StepStats&)> on_step;
};

// A non-finite loss or gradient stopped the run; every rank raises it alike, after the same
// collective (the step's verdict).
class NonFiniteError : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

struct StepStats {
  int step = 0;
  double loss = 0;           // mean over the global batch
  double lr = 0;             // the learning rate of this step's update (the schedule's value)
  double step_ms = 0;        // wall time of the step on this rank
  double dp_comm_ms = 0;     // dp collectives' time on the dp stream
  double dp_exposed_ms = 0;  // time the compute stream waited for them
  double tp_comm_ms = 0, tp_exposed_ms = 0;
  // Time to the end of forward + backward (when the step's guard starts), less the exposed tp
  // communication (and exposed dp for async/local, which wait before the guard): this rank's
  // compute, without the time it waits for slower ranks at the guard and the loss.
  double compute_ms = 0;
  // Rank 0, with stragglers watched: the rank flagged at this step (-1: none), its device, and
  // its compute over the median rank's.
  int straggler_rank = -1;
  std::string straggler_device;
  double straggler_ratio = 0;
  // This rank's dp bytes by kind (ZeRO: reduce-scatters of gradients, all-gathers of parameters).
  int64_t dp_all_reduce_bytes = 0, dp_reduce_scatter_bytes = 0, dp_all_gather_bytes = 0;
  // train_state_digest after this step (TrainConfig::digest_steps); 0 when not computed.
  uint64_t state_digest = 0;
  double grad_norm = -1;  // the optimizer's last_grad_norm() (-1: not measured)
  // --doc-mask under cp: the causal attention work's max / mean over the cp ranks of rank 0's
  // replica under the balanced layout the loader used, and under the standard one (mean over
  // the micro-batches); 0 otherwise.
  double cp_imbalance = 0, cp_standard_imbalance = 0;
  bool skipped = false;  // non-finite and skip_nonfinite: no update this step
  // Skipped steps so far in the run, this one included (a resumed run continues its checkpoint's
  // count).
  int skipped_steps = 0;
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // when evaluated after this step
  // The run stopped after this step on a stop request: the signal most ranks reported (ties: the
  // smaller number), equal on every rank; 0 when not stopped (or asked without a signal in 1..31).
  int stop_signal = 0;
  bool stopped = false;
};

// The run's learning-rate schedule (its total steps are cfg.steps).
LrSchedule train_lr_schedule(const TrainConfig& cfg);

// Checks the configuration before anything is communicated; throws saying what to change.
void validate_train(const TrainConfig& cfg, int world_size);

// Runs the loop on this rank (every rank calls it with the same config). Rank 0 writes one line
// per step to `log` when given: "step N loss X.XXXXXX  time T ms  dp comm C ms (exposed E ms)"
// (with --zero also "  dp MiB all-reduce A reduce-scatter R all-gather G"),
// and "val step N loss X.XXXXXX" after evaluations. Returns fewer than cfg.steps entries when
// stop_requested ended the run early.
std::vector<StepStats> train(const TrainConfig& cfg, Context& ctx, Communicator& world,
                             std::ostream* log);

}  // namespace meshrt
