// Reading `train --metrics` files back (the schema in docs/training.md, "Metrics file"): one
// record per JSON line, every field type-checked, for `meshrt report` and `meshrt tune`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshrt {

struct MetricsRank {
  int rank = 0;
  double step_ms = 0, compute_ms = 0, tp_exposed_ms = 0, dp_exposed_ms = 0;
  double mem_current_bytes = 0, mem_peak_bytes = 0, skew_ms = 0;
  std::string device;  // "" in records written before the field existed
};

// Absent optional numbers and JSON nulls (non-finite values) read as NaN.
struct MetricsRecord {
  int version = 0;
  long long step = 0;
  double loss = 0, val_loss = 0, lr = 0, grad_norm = 0;
  double step_ms = 0, tokens_per_s = 0, mfu = 0;
  bool skipped = false;
  long long skipped_steps = 0;
  int straggler_rank = -1;  // a rank flagged as a straggler at this step, else -1
  std::vector<MetricsRank> ranks;
};

// Parses one line; throws meshrt::Error naming the field and what is wrong (no location: the
// caller adds "FILE:LINE: ").
MetricsRecord parse_metrics_record(std::string_view line);

// Every record of `path` (read through runtime/input_file.h), refused as "PATH:LINE: ..." on the
// first malformed line, a step not above the one before, or an empty file. A last line without
// its newline (a run still writing) is ignored.
std::vector<MetricsRecord> read_metrics_file(const std::string& path);

}  // namespace meshrt
