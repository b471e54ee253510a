// --metrics FILE: one JSON Lines record per step (schema in docs/training.md, "Metrics file"),
// and the straggler watch over the same per-step gather of every rank's times.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "train/train.h"

namespace meshrt {

class AppendOutputFile;

constexpr int kMetricsVersion = 1;

// Names a rank whose compute is over `threshold` x the median rank's (the lower median: an actual
// rank's value) for `steps` steps in a row; each rank is named at most once.
class StragglerWatch {
 public:
  StragglerWatch(double threshold, int steps) : threshold_(threshold), steps_(steps) {}
  // One step's compute per rank; the rank flagged now (its run reached `steps`, and it was not
  // flagged before), else -1. *ratio: that rank's compute / the median's.
  int observe(const std::vector<double>& compute_ms, double* ratio);
  // The ranks over the threshold for `steps` steps in a row right now (the latest check).
  const std::vector<int>& runs() const { return run_; }
  double median_ms() const { return median_; }

 private:
  double threshold_;
  int steps_;
  double median_ = 0;
  std::vector<int> run_;
  std::vector<bool> named_;
};

class TrainMetrics {
 public:
  // Collective over `world`. Rank 0 opens cfg.metrics: a fresh run (first_step 0) starts it
  // empty; a resumed one keeps its records of steps <= first_step and drops later ones (a run
  // resumed from an older checkpoint replays them), so steps stay unique and in order. A file
  // rank 0 cannot open fails every rank alike (dist/agree.h's AgreedError: no fault).
  // `model_flops`: the model FLOPs of one step over every rank (for tokens/s -> TFLOP/s, MFU).
  TrainMetrics(const TrainConfig& cfg, Context& ctx, Communicator& world, int first_step,
               double model_flops);
  ~TrainMetrics();
  bool enabled() const { return enabled_; }
  // Collective: gathers every rank's times; on rank 0 checks for stragglers (a warning on `log`,
  // once per rank; st's straggler fields) and appends the step's record. grad_norm < 0: not
  // measured (omitted). No-op without --metrics or a straggler watch. A record rank 0 could not
  // write (a full disk, the file size limit) fails every rank alike at the next step's gather,
  // which carries the failure (an AgreedError naming the file: not a fault, no flight record).
  void record(Context& ctx, StepStats* st, double grad_norm, int skipped_total, std::ostream* log);
  // Collective, after the last step with --metrics: fails every rank alike, as above, when the
  // last record could not be written.
  void finish(Context& ctx);
  // Rank 0, with --metrics: "metrics: N records -> FILE (writing C ms, P% of the step time;
  // gathering the ranks' times G ms, Q%, ...)": the cost of --metrics.
  void log_cost(const std::vector<StepStats>& steps, std::ostream& log) const;

 private:
  void write(const StepStats& st, const std::vector<double>& r, double grad_norm,
             int skipped_total);
  // Every rank: raises rank 0's write error alike (dist/agree.h).
  void fail_write(Context& ctx);
  const TrainConfig& cfg_;
  Communicator& world_;
  bool enabled_ = false;
  double model_flops_ = 0;
  std::string device_type_;  // "cpu" / "cuda": every rank's (one kind of device per run)
  StragglerWatch stragglers_;
  std::unique_ptr<AppendOutputFile> file_;
  std::string write_error_;  // rank 0: why a record could not be written ("": none)
  double cost_ms_ = 0;       // rank 0: formatting and writing the records
  double gather_ms_ = 0;  // the all-gather of the ranks' times (includes waiting for the slowest)
};

// The "step" of a metrics line, or -1 when it has none (for tests and the resume filter).
long long metrics_line_step(std::string_view line);

// Model FLOPs of one training step over every rank: 3 x the forward's matrix multiplies (layers
// at causal half, plus the LM head), as the planner counts them (plan/cost_model.h).
double train_step_flops(const TrainConfig& cfg);

}  // namespace meshrt
