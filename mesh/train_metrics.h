// --metrics FILE: one JSON Lines record per step (schema in docs/training.md, "Metrics file").
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "mesh/train.h"

namespace meshrt {

class AppendOutputFile;

constexpr int kMetricsVersion = 1;

class TrainMetrics {
 public:
  // Collective over `world`. Rank 0 opens cfg.metrics: a fresh run (first_step 0) starts it
  // empty; a resumed one keeps its records of steps <= first_step and drops later ones (a run
  // resumed from an older checkpoint replays them), so steps stay unique and in order.
  TrainMetrics(const TrainConfig& cfg, Communicator& world, int first_step);
  ~TrainMetrics();
  bool enabled() const { return enabled_; }
  // Collective: gathers every rank's times and, on rank 0, appends the step's record.
  // grad_norm < 0: not measured (omitted). No-op without --metrics.
  void record(Context& ctx, const StepStats& st, double grad_norm, int skipped_total);
  // Rank 0, when enabled: "metrics: N records -> FILE (writing C ms, P% of the step time;
  // gathering the ranks' times G ms, Q%, ...)": the cost of --metrics.
  void log_cost(const std::vector<StepStats>& steps, std::ostream& log) const;

 private:
  const TrainConfig& cfg_;
  Communicator& world_;
  bool enabled_ = false;
  std::unique_ptr<AppendOutputFile> file_;
  double cost_ms_ = 0;    // rank 0: formatting and writing the records
  double gather_ms_ = 0;  // the all-gather of the ranks' times (includes waiting for the slowest)
};

// The "step" of a metrics line, or -1 when it has none (for tests and the resume filter).
long long metrics_line_step(std::string_view line);

}  // namespace meshrt
