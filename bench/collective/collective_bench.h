// Collective microbenchmark in the style of nccl-tests, as a library function for the meshrt CLI.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace meshrt {

struct CollBenchOptions {
  std::string op =
      "all_reduce";  // all_reduce | all_gather | reduce_scatter | broadcast | all_to_all
  std::string devices = "cpu:2";   // ranks as threads; under mpirun: the device kind per process
  bool devices_defaulted = false;  // `devices` is the default (see LaunchOptions)
  std::string backend = "auto";    // auto | host | mpi | shm | nccl (auto: from the environment)
  int64_t min_bytes = 32 << 20;    // -b
  int64_t max_bytes = 32 << 20;    // -e
  double step_factor = 2.0;        // -f: multiply the size by this (when > 1)
  int64_t step_bytes = 0;          // -i: else add this many bytes
  std::string dtype = "f32";       // f32 | bf16 | f16 | i32 | i64
  std::string redop = "sum";       // sum | avg | max | min (reductions only)
  int root = 0;                    // broadcast root
  int warmup = 5;                  // untimed iterations per size
  int iters = 20;                  // timed iterations per size
  bool check = true;               // run once more on fresh inputs and count wrong elements
  int average = 1;  // time reported in the table: 0 rank 0, 1 average, 2 minimum, 3 maximum
  uint64_t seed = 1;
  bool memcpy_bound = false;  // also measure concurrent memcpy bandwidth (CPU devices)
  // Also time each of -n iterations alone (issue, then wait for it): median and p99 latency,
  // slowest rank, per size and placement.
  bool latency = false;
  std::string json_path;  // write every figure here as JSON
};

// "8", "512K", "64M", "1G" -> bytes (K, M, G are powers of 1024, as nccl-tests reads them).
// Throws meshrt::Error for anything else.
int64_t parse_bench_size(std::string_view s);

// Checks the options that need no launch (op, dtype, reduction, sizes, step, iterations, -a);
// throws meshrt::Error saying what to change. run_collective_bench checks them too.
void check_collective_options(const CollBenchOptions& opts);

// Runs the benchmark on every rank of the launch the environment describes (threads, or this
// process's rank under mpirun) and prints the nccl-tests table (rank 0 prints) to `out`.
// Returns 0 when every check passed, 1 when some element was wrong. Throws meshrt::Error on
// invalid options.
int run_collective_bench(const CollBenchOptions& opts, std::ostream& out);

}  // namespace meshrt
