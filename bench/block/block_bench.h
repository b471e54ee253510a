// Block benchmark: a transformer / MLP / attention block stack, forward + backward, on a dp x tp
// mesh; per-step time distribution, tokens/s, model TFLOP/s and MFU, communication and exposed
// communication per mesh dim, memory, skew, bookkeeping overhead; JSON, Chrome trace and
// safetensors dumps. A library for the `meshrt bench block|mlp|attn` and `meshrt sweep` commands.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>

namespace meshrt {

struct BlockBenchOptions {
  std::string kind = "block";  // block (attention + MLP) | mlp | attn
  // Empty: what this machine has (cuda:all when CUDA works, else cpu:N host ranks); under
  // mpirun: the device kind per process ("cpu" or "cuda").
  std::string devices;
  std::string mesh;              // "dp=2,cp=2,tp=2"; empty: tp=<world size>
  std::string cp_comm = "ring";  // --cp-comm: the cp attention's K/V exchange (ring | allgather)
  std::string backend = "auto";  // --backend: the collective backend (as bench collective's)
  int sp = -1;                   // sequence parallel: -1 auto (on when tp > 1), 0 off, 1 on
  // Zero / empty: the default for the device (CPU: 1 x 512 tokens, hidden 1024, 16 heads, f32;
  // CUDA: 4 x 2048 tokens, hidden 4096, 32 heads, bf16). batch is per dp replica.
  int64_t batch = 0, seq = 0, hidden = 0, ffn = 0, heads = 0;
  int layers = 0;
  std::string dtype;  // f32 | bf16 | f16
  int steps = 0;      // timed steps (0: 10 on CPU, 20 on CUDA)
  int warmup = -1;    // untimed steps first (-1: 2 on CPU, 5 on CUDA)
  bool fwd_only = false;
  std::string overlap = "async";  // none | async | chunked (tp); dp buckets: none or async
  double bucket_mb = 25.0;        // dp gradient bucket size
  // ZeRO stage over dp (docs/zero.md): 2 reduce-scatters the gradients into shards, 3 also keeps
  // only a shard of the parameters and gathers each piece's before its forward and backward. 1
  // is refused: the benchmark runs no optimizer, whose state is all stage 1 shards.
  int zero = 0;
  // --deterministic (docs/training.md): each sequence forward and backward alone, the gradients
  // summed in the fixed tree and reduced over dp in fixed order (GradSync::push_grain).
  bool deterministic = false;
  // --deterministic-grain: sequences per forward / backward (divides --batch; docs/training.md).
  int64_t deterministic_grain = 1;
  uint64_t seed = 1;
  std::string json_path, trace_path, dump_path;
  // Cluster (preset or file) of the planner's prediction in the JSON's "plan" (default: the GPU's
  // preset, or the cpu preset with this run's calibrated peak).
  std::string plan_cluster;
  // MFU denominator per rank in TFLOP/s; 0: the GPU table, else a calibration GEMM at start.
  double peak_tflops = 0;
  std::string peak_label;  // how peak_tflops was obtained (shown when set)
  bool calibrate = true;   // false: no calibration GEMM (MFU shown only with a known peak)
  bool quiet = false;      // no report on the output stream (the sweep prints its own table)
  // Library / build versions and the command line, written into the JSON (the CLI fills them).
  std::map<std::string, std::string> versions;
  std::string command_line;
};

// The headline figures of one run (complete on the process hosting rank 0; `valid` is false in
// the other processes of an mpirun job).
struct BlockBenchResult {
  bool valid = false;
  std::string mesh;  // "dp=1,tp=2"
  int dp = 1, tp = 1, world = 1, cp = 1;
  bool sp = false;
  int64_t batch = 0, seq = 0, hidden = 0;
  std::string dtype;
  double step_ms = 0, step_p10_ms = 0, step_p90_ms = 0;
  double tokens_per_s = 0, tflops = 0;
  double mfu = -1;  // fraction; < 0 when no peak is known
  double peak_tflops_per_rank = 0;
  std::string peak_label;
  double tp_comm_ms = 0, tp_exposed_ms = 0, dp_comm_ms = 0, dp_exposed_ms = 0, compute_ms = 0;
  // cp > 1: the cp attention's K/V exchange on the cp streams, the compute stream's waits for it
  // (exposed) and the cp attention itself on the compute stream (its kernels and those waits).
  double cp_comm_ms = 0, cp_exposed_ms = 0, cp_attn_ms = 0;
  int64_t peak_bytes = 0;
  double overhead_fraction = 0;
  std::string json;  // everything, as --json writes it
};

// Validates the options (before any rank starts; errors say what to change), runs the benchmark
// on every rank of the launch the environment describes, prints the report on `out` (unless
// quiet) and writes the requested files. Throws meshrt::Error on invalid options.
BlockBenchResult run_block_bench_result(const BlockBenchOptions& opts, std::ostream& out);

// The devices spec a run with these options uses (the given one, or what this machine has) and
// the world size it launches (bootstraps from the environment; under mpirun: the job's size).
std::string resolve_bench_devices(const BlockBenchOptions& opts, int* world_size);

// The same, returning 0 (the CLI's exit status).
int run_block_bench(const BlockBenchOptions& opts, std::ostream& out);

}  // namespace meshrt
