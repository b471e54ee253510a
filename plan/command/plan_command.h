// `meshrt plan`: the cost model's table for a model on a cluster, the measurement of this machine
// into a cluster file (--calibrate), and predicted vs measured for a `meshrt sweep` JSON
// (--compare). The cost model itself is plan/cost_model.h.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace meshrt {

struct PlanOptions {
  std::string model;  // "hidden=..,heads=..,ffn=..,layers=..,seq=..,vocab=.."
  int64_t global_batch = 0;
  std::string cluster = "cpu";  // preset or cluster JSON file
  std::string dtype = "bf16";
  int top = 20;                        // rows shown (0: all)
  std::vector<double> buckets = {25};  // dp bucket sizes tried, MiB
  std::string overlap = "async";
  bool optimizer = true;
  bool recompute = false;
  int zero = 0;  // ZeRO stage every layout is modelled with
  std::string json_path;
  // --calibrate FILE: measure this machine and write a cluster file (model: the shapes measured).
  std::string calibrate_path;
  std::string devices;  // ranks the calibration runs on (default as bench block)
  // --compare SWEEP_JSON: predicted vs measured for every run of a sweep (cluster: --cluster).
  std::string compare_path;
  // --compare-memory SWEEP_JSON: the same sweep run with MESHRT_LAUNCH_BLOCKING=1; its peaks (the
  // program-order peak, what the model predicts) replace the timed sweep's in the memory columns.
  std::string compare_memory_path;
  std::string command_line;
};

// Checks what needs no run; throws meshrt::Error saying what to change.
void check_plan_options(const PlanOptions& o);

// Runs the mode the options ask for; returns the exit status.
int run_plan(const PlanOptions& o, std::ostream& out);

// The measurement behind --calibrate: a cluster description of this machine for `dtype`, GEMMs on
// the shapes of `m` (tp = 1 and tp = world, micro-batches 1, 2, 4), attention, elementwise
// bandwidth, the overlap of a collective with a GEMM and (through `meshrt bench collective`'s
// engine) each collective at a few sizes. Progress lines go to `log`.
plan::ClusterSpec calibrate_cluster(const plan::ModelSpec& m, const std::string& devices,
                                    std::ostream& log);

// Predicted vs measured for every run of a sweep JSON; prints a Markdown table and returns the
// summary (median absolute step-time error, best configurations, memory error) as JSON text.
// `cluster`: a preset or cluster file (its peak is taken for each run's dtype). `memory_json_path`
// (may be empty): a sweep of the same configurations run with MESHRT_LAUNCH_BLOCKING=1 whose
// peaks the memory columns compare with.
std::string compare_with_sweep(const std::string& sweep_json_path, const std::string& cluster,
                               std::ostream& out, const std::string& memory_json_path = "");

}  // namespace meshrt
