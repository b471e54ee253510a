// `meshrt bench block|mlp|attn|collective|gemm` and `meshrt sweep`: flags and dispatch.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

#include "bench/block/block_bench.h"
#include "bench/collective/collective_bench.h"
#include "bench/gemm/gemm_bench.h"
#include "bench/sweep/sweep.h"

namespace meshrt::cli {

struct BenchCli {
  BlockBenchOptions block;
  CLI::App* bench = nullptr;
  CLI::App* block_cmds[3] = {nullptr, nullptr, nullptr};  // block, mlp, attn
  bool sp = false, no_sp = false, no_calibrate = false;

  CollBenchOptions coll;
  CLI::App* coll_cmd = nullptr;
  std::string coll_min = "32M", coll_max = "32M", coll_step;
  int coll_check = 1;

  GemmBenchOptions gemm;
  CLI::App* gemm_cmd = nullptr;
  bool no_gemm = false, no_elem = false, no_attn = false;

  SweepOptions sweep;
  CLI::App* sweep_cmd = nullptr;
  std::string batches = "1,2,4";
  bool sweep_no_progress = false;
};

// Registers `bench` (with its subcommands) and `sweep` on `app`.
void add_bench_commands(CLI::App& app, BenchCli& b);
// Runs whichever of them was parsed; returns its exit status, or -1 when none was.
int run_bench_commands(BenchCli& b, const std::string& command_line, std::ostream& os);

}  // namespace meshrt::cli
