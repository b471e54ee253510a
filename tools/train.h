// `meshrt train`: trains the small decoder model on a dp x tp mesh and prints one line per step.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace meshrt::cli {

struct TrainCliOptions {
  std::string devices = "cpu:2";
  bool devices_given = false;  // --devices was on the command line (else the default)
  std::string mesh;            // default dp=<world>
  bool sp = false;
  int64_t batch = 8, seq = 64, hidden = 256, heads = 8, ffn = 0, vocab = 512;
  int layers = 2, steps = 20, micro_batches = 1, staleness = 1, sync_every = 4;
  uint64_t seed = 1;
  float lr = 1e-3f, clip = 0.f;
  std::string dtype = "f32", optimizer = "adamw", grad_sync = "sync", overlap = "async";
  double bucket_mb = 25.0;
  bool bf16_grads = false;
  int zero = 0;              // ZeRO stage over dp (docs/zero.md)
  bool compare = true;       // async / local: also run synchronous DP and print the trade
  std::string save, resume;  // checkpoints (mesh/checkpoint.h)
  int save_every = 0, keep = 0;
  bool overwrite = false;  // --overwrite: write into a folder holding another run's checkpoints
  // Real data and validation (mesh/token_data.h), non-finite steps.
  std::string data, val_data, data_dtype = "u16";
  int eval_every = 0, eval_batches = 4;
  bool skip_nonfinite = false;
  bool mem_stats = false;
  // Learning-rate schedule and weight decay (mesh/optimizer.h, docs/training.md).
  std::string lr_schedule = "constant";
  int warmup_steps = 0;
  float min_lr = 0.f, weight_decay = 0.f;
  std::string metrics;  // --metrics FILE (JSON Lines, docs/training.md)
};

// Registers the `train` subcommand and its flags on `app`.
CLI::App* add_train_command(CLI::App& app, TrainCliOptions& o);

// The options every rank of a process launch (mpirun, srun) must be started with alike, each with
// its parsed value in `o` (so `--lr 1e-3` and `--lr 0.001` agree, and so does a default given
// explicitly): (name without dashes, value). run_train refuses ranks that differ in any of them
// before any step, naming the option and every rank's value (collectives/config_check.h).
std::vector<std::pair<std::string, std::string>> train_shared_options(const TrainCliOptions& o);
// The train options that may differ between ranks: they change nothing the ranks compute or
// exchange. Every option of `train` is in exactly one of the two lists (tests/tools checks it).
std::vector<std::string> train_local_options();
// Runs it (launch from the environment: threads from --devices, or mpirun processes). SIGINT /
// SIGTERM stop every rank after the same step: a one-line summary, and 128 + the signal's number
// as the exit status (a second signal exits at once).
int run_train(const TrainCliOptions& o, std::ostream& os);

}  // namespace meshrt::cli
