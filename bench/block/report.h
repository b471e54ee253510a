// The block benchmark's report: per-step figures of every rank in, headline figures, JSON, the
// text report and the --json / --trace files out.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "bench/block/plan.h"

namespace meshrt {

// One timed step on one rank.
struct StepFigures {
  double step_ms = 0;       // wall time from the step's barrier to its streams drained
  double issue_cpu_ms = 0;  // CPU time of the issuing thread
  CommTimes tp, dp;         // communication per mesh dim (dp: the gradient group, dp x cp)
  CommTimes cp;             // the cp attention's K/V exchange (cp > 1)
  double compute_ms() const { return step_ms - tp.exposed_ms - dp.exposed_ms - cp.exposed_ms; }
};

// One rank's run.
struct RankFigures {
  std::vector<StepFigures> steps;
  int64_t peak_bytes = 0, reserved_bytes = 0;
  double calib_flops = 0;  // calibration GEMM FLOP/s (0: not calibrated)
  int64_t markers = 0;     // trace markers recorded
  int device_index = 0;
};

// Builds the result (figures and JSON), prints the text report on `os` unless quiet, and writes
// --json and --trace. `traces`: every rank's serialised trace events (empty without --trace);
// `dumped`: tensors --dump wrote; `wall_s`: the whole run.
BlockBenchResult block_report(const BlockPlan& p, const BlockBenchOptions& o,
                              const std::vector<RankFigures>& figures,
                              const std::vector<std::string>& traces, int dumped, double wall_s,
                              std::ostream& os);

}  // namespace meshrt
