#include "tools/bench_cli.h"

#include <cstdlib>

#include "runtime/error.h"
#include "tools/cli_checks.h"
#include "tools/info.h"

namespace meshrt::cli {

namespace {

// Repeating a flag keeps the last value (as most command lines do) instead of an error.
void last_wins(CLI::App* c) {
  c->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void add_block_flags(CLI::App* c, BenchCli& b) {
  BlockBenchOptions& o = b.block;
  last_wins(c);
  c->add_option("--devices", o.devices,
                "Ranks: cpu:N (N host ranks as threads) | cuda:all | cuda:0-3 | cuda:0,2; under "
                "mpirun: cpu or cuda (one rank per process). Default: cuda:all when CUDA works, "
                "else cpu:<cores, at most 8>");
  c->add_option("--mesh", o.mesh,
                "Mesh over the ranks, dims dp and tp, e.g. dp=2,tp=2 "
                "(default tp=<world size>)");
  c->add_flag("--sp", b.sp, "Sequence parallel (default: on when tp > 1)");
  c->add_flag("--no-sp", b.no_sp, "No sequence parallel")->excludes("--sp");
  c->add_option("--batch", o.batch,
                "Micro-batch per dp replica, sequences (default 1 on CPU, 4 on CUDA)")
      ->check(kPositiveInt);
  c->add_option("--seq", o.seq, "Sequence length (default 512 on CPU, 2048 on CUDA)")
      ->check(kPositiveInt);
  c->add_option("--hidden", o.hidden, "Hidden size (default 1024 on CPU, 4096 on CUDA)")
      ->check(kPositiveInt);
  c->add_option("--ffn", o.ffn, "MLP inner size (default 4 x hidden)")->check(kPositiveInt);
  c->add_option("--heads", o.heads, "Attention heads (default 16 on CPU, 32 on CUDA)")
      ->check(kPositiveInt);
  c->add_option("--layers", o.layers, "Blocks stacked (default 1 on CPU, 2 on CUDA)")
      ->check(kPositiveInt);
  c->add_option("--dtype", o.dtype, "f32 | bf16 | f16 (default f32 on CPU, bf16 on CUDA)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  c->add_option("--steps", o.steps, "Timed steps (default 10 on CPU, 20 on CUDA)")
      ->check(kPositiveInt);
  c->add_option("--warmup", o.warmup, "Untimed steps first (default 2 on CPU, 5 on CUDA)")
      ->check(kNonNegativeInt);
  c->add_flag("--fwd-only", o.fwd_only, "Forward only (no backward, no gradient sync)");
  c->add_option("--overlap", o.overlap,
                "tp collectives: none (wait at once) | async (wait where needed) | chunked "
                "(split sequence all-gather / reduce-scatter, needs --sp)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "async", "chunked"}));
  c->add_option("--bucket-mb", o.bucket_mb, "dp gradient bucket size, MiB")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--seed", o.seed, "Seed of weights and inputs")
      ->capture_default_str()
      ->check(kNonNegativeInt);
  c->add_option("--json", o.json_path, "Write every figure, the config and versions as JSON");
  c->add_option("--trace", o.trace_path,
                "Write a Chrome / Perfetto trace of the timed steps (one track per rank and "
                "stream)");
  c->add_option("--dump", o.dump_path,
                "Write inputs, gathered weights, outputs and gradients of the last step to a "
                "safetensors file");
  c->add_option("--peak-tflops", o.peak_tflops,
                "Per-device peak for MFU, TFLOP/s (default: GPU datasheet table, else a "
                "calibration GEMM)")
      ->check(kPositive);
  c->add_flag("--no-calibrate", b.no_calibrate, "Skip the calibration GEMM (no MFU on CPU)");
}

void add_collective(CLI::App* bench, BenchCli& b) {
  CollBenchOptions& o = b.coll;
  auto* c = bench->add_subcommand(
      "collective",
      "Collective microbenchmark in the style of nccl-tests (ranks as threads: --devices cpu:N "
      "or cuda:0-7; under mpirun / srun one process each)");
  b.coll_cmd = c;
  last_wins(c);
  c->add_option("--op", o.op, "all_reduce | all_gather | reduce_scatter | broadcast | all_to_all")
      ->capture_default_str();
  c->add_option("--devices", o.devices, "ranks: cpu:N, cuda:0-7 (under mpirun: cpu or cuda)")
      ->capture_default_str();
  c->add_option("--backend", o.backend,
                "host | mpi | nccl | auto (threads: host/nccl; under mpirun: mpi/nccl)")
      ->capture_default_str();
  c->add_option("-b,--minbytes", b.coll_min, "smallest size, bytes with optional K/M/G")
      ->capture_default_str();
  c->add_option("-e,--maxbytes", b.coll_max, "largest size")->capture_default_str();
  c->add_option("-f,--stepfactor", o.step_factor, "multiply the size by this")
      ->capture_default_str();
  c->add_option("-i,--stepbytes", b.coll_step, "add this many bytes instead of multiplying");
  c->add_option("-d,--datatype", o.dtype, "f32 | bf16 | f16 | i32 | i64")->capture_default_str();
  c->add_option("-o,--redop", o.redop, "sum | avg | max | min")->capture_default_str();
  c->add_option("-r,--root", o.root, "broadcast root")->capture_default_str();
  c->add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")
      ->capture_default_str();
  c->add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str();
  c->add_option("-c,--check", b.coll_check, "check results on fresh inputs (0/1)")
      ->capture_default_str();
  c->add_option("-a,--average", o.average,
                "time shown: 0 rank 0, 1 average, 2 minimum, 3 maximum over ranks")
      ->capture_default_str();
  c->add_option("--seed", o.seed, "input pattern seed")
      ->capture_default_str()
      ->check(kNonNegativeInt);
  c->add_flag("--memcpy-bound", o.memcpy_bound,
              "also measure the memcpy bandwidth every rank gets while all copy at once");
  c->add_option("--json", o.json_path, "write the figures to this JSON file");
}

void add_gemm(CLI::App* bench, BenchCli& b) {
  GemmBenchOptions& o = b.gemm;
  auto* c = bench->add_subcommand(
      "gemm",
      "Kernel microbenchmark: meshrt GEMM vs raw BLAS (host) or cuBLAS (CUDA), elementwise GB/s "
      "vs a memcpy of the same bytes, fused causal attention");
  b.gemm_cmd = c;
  last_wins(c);
  c->add_option("-m", o.m, "GEMM rows of A and C (with -n and -k: one shape instead of the set)");
  c->add_option("-n", o.n, "GEMM columns of B and C");
  c->add_option("-k", o.k, "GEMM inner dimension");
  c->add_flag("--trans-b", o.trans_b, "B stored as [n, k]");
  c->add_option("--dtype", o.dtype, "f32 | bf16 | f16")->capture_default_str();
  c->add_option("--devices", o.devices, "cpu | cpu:N (N ranks as threads) | cuda:N")
      ->capture_default_str();
  c->add_option("--warmup", o.warmup, "untimed runs per measurement")->capture_default_str();
  c->add_option("--repeats", o.repeats, "timed runs (median reported)")->capture_default_str();
  c->add_option("--tokens", o.tokens,
                "rows of the block shapes and elementwise tensors (0: 2048 on cpu, 8192 on cuda)");
  c->add_option("--hidden", o.hidden, "hidden size (0: 768 on cpu, 4096 on cuda)");
  c->add_flag("--no-gemm", b.no_gemm, "skip the GEMM table");
  c->add_flag("--no-elementwise", b.no_elem, "skip the elementwise table");
  c->add_flag("--no-attention", b.no_attn, "skip attention");
  c->add_option("--attn-batch", o.attn_batch, "attention batch (0: 1 on cpu, 4 on cuda)");
  c->add_option("--attn-heads", o.attn_heads, "attention heads (0: 8 on cpu, 16 on cuda)");
  c->add_option("--attn-seq", o.attn_seq, "attention sequence (0: 1024 on cpu, 2048 on cuda)");
  c->add_option("--attn-head-dim", o.attn_head_dim, "attention head dim")->capture_default_str();
  c->add_option("--json", o.json_path, "also write the figures to this JSON file");
}

void add_sweep(CLI::App& app, BenchCli& b) {
  auto* c = app.add_subcommand(
      "sweep",
      "Block benchmark over every dp x tp factorisation of the devices, sequence parallel off "
      "and on, and a list of micro-batch sizes: a table sorted by tokens/s with the best marked");
  b.sweep_cmd = c;
  last_wins(c);
  BlockBenchOptions& o = b.sweep.base;
  c->add_option("--kind", o.kind, "block | mlp | attn")
      ->capture_default_str()
      ->check(CLI::IsMember({"block", "mlp", "attn"}));
  c->add_option("--devices", o.devices,
                "Ranks: cpu:N | cuda:all | cuda:0-3 (default: as for bench block)");
  // Accepted only to say why it is not (the sweep runs every factorisation).
  c->add_option("--mesh", o.mesh, "")->group("");
  c->add_option("--batches", b.batches, "Micro-batch sizes per dp replica, comma-separated")
      ->capture_default_str();
  c->add_option("--sp-modes", b.sweep.sp, "Sequence parallel runs for tp > 1: both | on | off")
      ->capture_default_str()
      ->check(CLI::IsMember({"both", "on", "off"}));
  c->add_option("--seq", o.seq, "Sequence length (default as for bench block)")
      ->check(kPositiveInt);
  c->add_option("--hidden", o.hidden, "Hidden size (default as for bench block)")
      ->check(kPositiveInt);
  c->add_option("--ffn", o.ffn, "MLP inner size (default 4 x hidden)")->check(kPositiveInt);
  c->add_option("--heads", o.heads, "Attention heads")->check(kPositiveInt);
  c->add_option("--layers", o.layers, "Blocks stacked")->check(kPositiveInt);
  c->add_option("--dtype", o.dtype, "f32 | bf16 | f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  c->add_option("--steps", o.steps, "Timed steps per configuration (default 5)")
      ->check(kPositiveInt);
  c->add_option("--warmup", o.warmup, "Untimed steps per configuration (default 1)")
      ->check(kNonNegativeInt);
  c->add_flag("--fwd-only", o.fwd_only, "Forward only");
  c->add_option("--overlap", o.overlap, "none | async | chunked (chunked runs only with sp)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "async", "chunked"}));
  c->add_option("--bucket-mb", o.bucket_mb, "dp gradient bucket size, MiB")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--peak-tflops", o.peak_tflops, "Per-device peak for MFU, TFLOP/s")
      ->check(kPositive);
  c->add_option("--repeats", b.sweep.repeats,
                "Runs per configuration, round-robin over the configurations; the run with the "
                "median step time is reported")
      ->capture_default_str()
      ->check(kPositiveInt);
  c->add_option("--json", b.sweep.json_path, "Write every run's figures as JSON");
  c->add_option("--plot", b.sweep.plot_path, "Write a PNG bar chart of tokens/s (gnuplot)");
  c->add_flag("--no-progress", b.sweep_no_progress, "No progress line on stderr");
}

}  // namespace

void add_bench_commands(CLI::App& app, BenchCli& b) {
  b.bench = app.add_subcommand("bench",
                               "Benchmarks: block | mlp | attn (sharded blocks on a dp x "
                               "tp mesh), collective, gemm");
  b.bench->require_subcommand(1);
  const char* names[3] = {"block", "mlp", "attn"};
  const char* what[3] = {
      "Transformer block (attention + MLP) forward + backward on a dp x tp mesh: step time, "
      "tokens/s, model TFLOP/s and MFU, communication and exposed communication per mesh dim, "
      "memory, skew",
      "The MLP block alone (norm, fc1 colwise, GeLU, fc2 rowwise, residual)",
      "The attention block alone (norm, fused QKV colwise, causal attention, out-proj rowwise, "
      "residual)"};
  for (int i = 0; i < 3; ++i) {
    b.block_cmds[i] = b.bench->add_subcommand(names[i], what[i]);
    add_block_flags(b.block_cmds[i], b);
  }
  add_collective(b.bench, b);
  add_gemm(b.bench, b);
  add_sweep(app, b);
}

int run_bench_commands(BenchCli& b, const std::string& command_line, std::ostream& os) {
  for (int i = 0; i < 3; ++i) {
    if (!b.block_cmds[i]->parsed()) continue;
    BlockBenchOptions o = b.block;
    o.kind = b.block_cmds[i]->get_name();
    o.sp = b.sp ? 1 : (b.no_sp ? 0 : -1);
    o.calibrate = !b.no_calibrate;
    o.versions = version_info();
    o.command_line = command_line;
    return run_block_bench(o, os);
  }
  if (b.coll_cmd->parsed()) {
    CollBenchOptions o = b.coll;
    o.min_bytes = parse_bench_size(b.coll_min);
    o.max_bytes = parse_bench_size(b.coll_max);
    if (!b.coll_step.empty()) o.step_bytes = parse_bench_size(b.coll_step);
    o.check = b.coll_check != 0;
    return run_collective_bench(o, os);
  }
  if (b.gemm_cmd->parsed()) {
    GemmBenchOptions o = b.gemm;
    o.gemm = !b.no_gemm;
    o.elementwise = !b.no_elem;
    o.attention = !b.no_attn;
    return run_gemm_bench(o, os);
  }
  if (b.sweep_cmd->parsed()) {
    SweepOptions o = b.sweep;
    o.batches = parse_int_list(b.batches, "--batches");
    o.progress = !b.sweep_no_progress;
    o.base.versions = version_info();
    o.base.command_line = command_line;
    return run_sweep(o, os);
  }
  return -1;
}

}  // namespace meshrt::cli
