// The training loop: a DecoderModel on a dp x tp mesh with synchronous, staleness-aware delayed
// (async) or local-SGD gradient synchronisation over dp.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "mesh/checkpoint.h"
#include "mesh/model.h"
#include "mesh/optimizer.h"

namespace meshrt {

enum class GradSyncMode : uint8_t { Sync, Async, Local };
GradSyncMode parse_grad_sync(std::string_view s);
const char* grad_sync_name(GradSyncMode m);

struct TrainConfig {
  ModelConfig model;
  std::string mesh = "";  // default: dp=<world>
  TpOptions tp;
  int64_t batch = 8;  // global batch (samples per step over all dp replicas)
  int64_t seq = 64;
  int steps = 10;
  uint64_t seed = 1;
  int micro_batches = 1;
  OptimizerConfig optim;
  DpOptions dp;
  GradSyncMode grad_sync = GradSyncMode::Sync;
  int staleness = 1;   // async: gradients applied this many steps late, lr / staleness
  int sync_every = 4;  // local: parameters averaged over dp every this many steps
  // --save / --save-every / --keep / --resume (mesh/checkpoint.h, mesh/train_checkpoint.h).
  CheckpointOptions checkpoint;
  // When set and true after a step, the loop stops there (a checkpoint is written with --save).
  std::function<bool()> stop_requested;
};

struct StepStats {
  int step = 0;
  double loss = 0;           // mean over the global batch
  double step_ms = 0;        // wall time of the step on this rank
  double dp_comm_ms = 0;     // dp collectives' time on the dp stream
  double dp_exposed_ms = 0;  // time the compute stream waited for them
  double tp_comm_ms = 0, tp_exposed_ms = 0;
};

// Checks the configuration before anything is communicated; throws saying what to change.
void validate_train(const TrainConfig& cfg, int world_size);

// Runs the loop on this rank (every rank calls it with the same config). Rank 0 writes one line
// per step to `log` when given: "step N loss X.XXXXXX  time T ms  dp comm C ms (exposed E ms)".
std::vector<StepStats> train(const TrainConfig& cfg, Context& ctx, Communicator& world,
                             std::ostream* log);

}  // namespace meshrt
