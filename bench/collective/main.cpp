// meshrt-bench-collective: nccl-tests-style collective microbenchmark (threads, MPI or NCCL).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "bench/collective/collective_bench.h"

int main(int argc, char** argv) {
  meshrt::CollBenchOptions o;
  CLI::App app{
      "Collective microbenchmark in the style of nccl-tests. Ranks are threads (--devices cpu:N "
      "or cuda:0-7) or, under mpirun / srun, one process each."};
  std::string minb = "32M", maxb = "32M", stepb;
  app.add_option("--op", o.op, "all_reduce | all_gather | reduce_scatter | broadcast | all_to_all")
      ->capture_default_str();
  app.add_option("--devices", o.devices, "ranks: cpu:N, cuda:0-7 (under mpirun: cpu or cuda)")
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "host | mpi | nccl | auto (threads: host/nccl; under mpirun: mpi/nccl)")
      ->capture_default_str();
  app.add_option("-b,--minbytes", minb, "smallest size, bytes with optional K/M/G")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", maxb, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor, "multiply the size by this")
      ->capture_default_str();
  app.add_option("-i,--stepbytes", stepb, "add this many bytes instead of multiplying");
  app.add_option("-d,--datatype", o.dtype, "f32 | bf16 | f16 | i32 | i64")->capture_default_str();
  app.add_option("-o,--redop", o.redop, "sum | avg | max | min")->capture_default_str();
  app.add_option("-r,--root", o.root, "broadcast root")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str();
  int check = 1;
  app.add_option("-c,--check", check, "check results on fresh inputs (0/1)")->capture_default_str();
  app.add_option("-a,--average", o.average,
                 "time shown: 0 rank 0, 1 average, 2 minimum, 3 maximum over ranks")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "input pattern seed")->capture_default_str();
  app.add_flag("--memcpy-bound", o.memcpy_bound,
               "also measure the memcpy bandwidth every rank gets while all copy at once");
  app.add_option("--json", o.json_path, "write the figures to this JSON file");
  CLI11_PARSE(app, argc, argv);
  try {
    o.min_bytes = meshrt::parse_bench_size(minb);
    o.max_bytes = meshrt::parse_bench_size(maxb);
    if (!stepb.empty()) o.step_bytes = meshrt::parse_bench_size(stepb);
    o.check = check != 0;
    return meshrt::run_collective_bench(o, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "meshrt-bench-collective: " << e.what() << "\n";
    return 2;
  }
}
