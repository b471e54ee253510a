// `meshrt train`: trains the small decoder model on a dp x tp mesh and prints one line per step.
#pragma once

#include <CLI/CLI.hpp>

#include "tools/cli/command.h"
#include "train/train.h"

#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace meshrt::cli {

struct TrainCliOptions {
  std::string devices = "cpu:2";
  bool devices_given = false;    // --devices was on the command line (else the default)
  std::set<std::string> given;   // the long names of the flags on the command line ("sp", ...)
  std::string backend = "auto";  // --backend: the collective backend (bench collective's flag)
  std::string mesh;              // default dp=<world>
  bool sp = false;
  std::string cp_comm = "ring";  // --cp-comm: cp attention's K/V exchange (ring | allgather)
  int64_t batch = 8, seq = 64, hidden = 256, heads = 8, ffn = 0, vocab = 512;
  int layers = 2, steps = 20, micro_batches = 1, staleness = 1, sync_every = 4;
  uint64_t seed = 1;
  float lr = 1e-3f, clip = 0.f;
  std::string dtype = "f32", optimizer = "adamw", grad_sync = "sync", overlap = "async";
  double bucket_mb = 25.0;
  bool bf16_grads = false;
  bool deterministic = false;
  int64_t deterministic_grain = 1;
  int zero = 0;              // ZeRO stage over dp (docs/zero.md)
  bool compare = true;       // async / local: also run synchronous DP and print the trade
  std::string save, resume;  // checkpoints (train/checkpoint.h)
  int save_every = 0, keep = 0;
  bool overwrite = false;  // --overwrite: write into a folder holding another run's checkpoints
  bool resume_other_data = false;  // --resume-other-data: resume on another token stream
  // Real data and validation (train/token_data.h), non-finite steps.
  std::string data, val_data, data_dtype = "u16";
  // --doc-mask: attention within each packed document; --eot-token: the id ending each (-1: the
  // token file's own).
  bool doc_mask = false;
  int64_t eot_token = -1;
  int cp_chunks = 2;  // --cp-chunks: chunks per cp rank of --doc-mask's balanced layout
  int eval_every = 0, eval_batches = 4;
  bool skip_nonfinite = false;
  bool mem_stats = false;
  double mem_limit_mb = 0;  // --mem-limit-mb: the precheck's per-host limit; 0: physical memory
  // Learning-rate schedule and weight decay (train/optimizer.h, docs/training.md).
  std::string lr_schedule = "constant";
  int warmup_steps = 0;
  float min_lr = 0.f, weight_decay = 0.f;
  std::string metrics;     // --metrics FILE (JSON Lines, docs/training.md)
  double peak_tflops = 0;  // --peak-tflops: per device; > 0 adds MFU to the metrics
  // --straggler-threshold / --straggler-steps; 0: not given (1.2 and 3, watched with --metrics).
  double straggler_threshold = 0;
  int straggler_steps = 0;
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
// The train flags on `c` (train's own, and those `tune` shares with it); returns c.
CLI::App* add_train_flags(CLI::App* c, TrainCliOptions& o);
// `train`'s flags that this run would ignore, refused before anything runs (as bench block and
// bench collective refuse theirs): "--staleness 2 would be ignored: ...; drop --staleness or ...".
// The checks that need the mesh (--sp, --overlap, --bucket-mb, --bf16-grads) come with the world
// size, before any step (run_train). Not for tune, whose grid gives the flags their meaning.
void check_train_flags(const TrainCliOptions& o);
// The run's configuration from the flags (token files opened; stop_requested: the signals).
TrainConfig train_config(const TrainCliOptions& o, GradSyncMode mode);
// Every check of a run's configuration that needs the world size (train/train.h's validate_train,
// and --zero refused on a mesh with dp=1).
void check_train_config(const TrainConfig& cfg, int world);
// A run stopped by the finiteness guard (NonFiniteError), raised alike on every rank.
class TrainDivergedError : public bench::UniformError {
 public:
  using bench::UniformError::UniformError;
};
struct RunResult {
  std::vector<StepStats> stats;  // of this process's first rank (every rank runs as many steps)
  bool has_rank0 = false;
};
// One run in this process: the launch from the environment (threads from --devices, or this
// mpirun rank), every check before it, and train() on each local rank. A non-finite stop is
// raised as one TrainDivergedError. `precheck` (when set) runs with the checks, given the world
// size: what it raises fails the run before any step, as they do (tune: every trial of its grid).
RunResult run_train_once(const TrainConfig& cfg, const TrainCliOptions& o, std::ostream* os,
                         const std::function<void(int world)>& precheck = {});
// Runs it (launch from the environment: threads from --devices, or mpirun processes). SIGINT /
// SIGTERM stop every rank after the same step: a one-line summary, and 128 + the signal's number
// as the exit status (a second signal exits at once).
int run_train(const TrainCliOptions& o, std::ostream& os);

}  // namespace meshrt::cli
