// Sweep: the block benchmark over every dp x tp factorisation of the devices, sequence parallel
// off and on, and a list of micro-batch sizes; a table sorted by throughput, JSON and a PNG plot.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "bench/block/block_bench.h"

namespace meshrt {

struct SweepOptions {
  // Sizes, devices, dtype, steps, overlap... of every run; mesh and sp are swept. Steps default
  // to 5 timed after 1 warm-up (fewer than a single bench, there are many runs).
  BlockBenchOptions base;
  std::vector<int64_t> batches = {1, 2, 4};  // micro-batch per dp replica
  std::vector<int64_t> cps = {1};            // cp sizes swept (--cp; base.cp_comm passes through)
  std::string sp = "both";                   // both | on | off (tp = 1 runs once either way)
  int repeats = 1;  // runs per configuration, round-robin; the median-step run is reported
  std::string json_path;
  std::string plot_path;  // PNG via gnuplot
  bool progress = true;   // progress line with ETA on stderr
};

// "1,2,4" -> {1, 2, 4}; throws saying what is wrong.
std::vector<int64_t> parse_int_list(const std::string& s, const char* flag);

// Every (dp, tp) with dp * tp == world, tp outermost-last, in increasing tp.
std::vector<std::pair<int, int>> mesh_factorisations(int world);
// The --mesh of a run: "dp=D,tp=T", or "dp=D,cp=C,tp=T" when cp > 1.
std::string sweep_mesh(int dp, int cp, int tp);

// Checks the options that need no run (batches, repeats, sp modes, no --mesh, output folders);
// throws meshrt::Error saying what to change. run_sweep checks them too.
void check_sweep_options(const SweepOptions& opts);

// Runs the sweep (every process of an mpirun job runs it; the one with rank 0 prints). Returns 0,
// or 1 when no configuration could run. Throws meshrt::Error on invalid options.
int run_sweep(const SweepOptions& opts, std::ostream& out);

}  // namespace meshrt
