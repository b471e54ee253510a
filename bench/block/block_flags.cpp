// `meshrt bench block|mlp|attn`: the block benchmark's flags and checks.
#include "bench/block/block_bench.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"

namespace meshrt::bench {

namespace {

using cli::kBenchSteps;
using cli::kBenchWarmup;
using cli::kPositive;

class BlockCommand : public Command {
 public:
  explicit BlockCommand(std::string kind) { o_.kind = std::move(kind); }

  void add_flags(CLI::App& c) override {
    c.add_option("--devices", o_.devices,
                 "Ranks: cpu:N (N host ranks as threads) | cuda:all | cuda:0-3 | cuda:0,2; under "
                 "mpirun: cpu or cuda (one rank per process). Default: cuda:all when CUDA works, "
                 "else cpu:<cores, at most 8>")
        ->check(cli::kNonEmpty);
    c.add_option("--mesh", o_.mesh,
                 "Mesh over the ranks, dims dp, cp and tp, e.g. dp=2,tp=2 or cp=2,tp=2 "
                 "(default tp=<world size>; cp: context parallel, the sequence sharded through "
                 "the block, --seq divisible by 2 x cp)")
        ->check(cli::kNonEmpty);
    c.add_option("--cp-comm", o_.cp_comm,
                 "cp attention's K/V exchange: ring (send/recv overlapped with attention) | "
                 "allgather (gathered once per layer)")
        ->capture_default_str();
    add_backend_flag(c, o_.backend);
    c.add_flag("--sp", sp_, "Sequence parallel (default: on when tp > 1)");
    c.add_flag("--no-sp", no_sp_, "No sequence parallel")->excludes("--sp");
    c.add_option("--batch", o_.batch,
                 "Micro-batch per dp replica, sequences (default 1 on CPU, 4 on CUDA)")
        ->check(cli::int_at_least(1, o_.batch));
    cli::ModelFlags m;
    m.seq = {&o_.seq, "Sequence length (default 512 on CPU, 2048 on CUDA)"};
    m.hidden = {&o_.hidden, "Hidden size (default 1024 on CPU, 4096 on CUDA)"};
    m.ffn = {&o_.ffn, "MLP inner size (default 4 x hidden)"};
    m.heads = {&o_.heads, "Attention heads (default 16 on CPU, 32 on CUDA)"};
    m.layers = &o_.layers;
    m.layers_help = "Blocks stacked (default 1 on CPU, 2 on CUDA)";
    m.dtype = &o_.dtype;
    m.dtype_help = "f32 | bf16 | f16 (default f32 on CPU, bf16 on CUDA)";
    cli::add_model_flags(c, m);
    c.add_option("--steps", o_.steps, "Timed steps (default 10 on CPU, 20 on CUDA)")
        ->check(kBenchSteps);
    c.add_option("--warmup", o_.warmup, "Untimed steps first (default 2 on CPU, 5 on CUDA)")
        ->check(kBenchWarmup);
    c.add_flag("--fwd-only", o_.fwd_only, "Forward only (no backward, no gradient sync)");
    c.add_option("--overlap", o_.overlap,
                 "tp collectives: none (wait at once) | async (wait where needed) | chunked "
                 "(split sequence all-gather / reduce-scatter, needs --sp)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "async", "chunked"}));
    c.add_option("--bucket-mb", o_.bucket_mb, "dp gradient bucket size, MiB")
        ->capture_default_str()
        ->check(kPositive);
    c.add_option("--zero", o_.zero,
                 "ZeRO stage over dp: 0, 2 (gradient shards) or 3 (also parameter shards, "
                 "gathered per piece; docs/zero.md)")
        ->capture_default_str();
    c.add_flag("--deterministic", o_.deterministic,
               "Layout-independent gradients: one sequence per forward / backward, a fixed-order "
               "dp reduction (docs/training.md#deterministic-training)");
    c.add_option("--deterministic-grain", o_.deterministic_grain,
                 "--deterministic: sequences per grain (one forward / backward each); divides "
                 "--batch")
        ->capture_default_str()
        ->check(cli::int_at_least(1, o_.deterministic_grain));
    c.add_option("--seed", o_.seed, "Seed of weights and inputs")
        ->capture_default_str()
        ->check(cli::int_at_least(0, o_.seed));
    c.add_option("--json", o_.json_path, "Write every figure, the config and versions as JSON")
        ->check(cli::kNonEmpty);
    c.add_option("--plan-cluster", o_.plan_cluster,
                 "Cluster of the planner's prediction (the planner row and --json; preset or "
                 "`meshrt plan --calibrate` file; default: the GPU's preset, else this run's "
                 "calibration)")
        ->check(cli::kNonEmpty);
    c.add_option("--trace", o_.trace_path,
                 "Write a Chrome / Perfetto trace of the timed steps (one track per rank and "
                 "stream)")
        ->check(cli::kNonEmpty);
    c.add_option("--dump", o_.dump_path,
                 "Write inputs, gathered weights, outputs and gradients of the last step to a "
                 "safetensors file")
        ->check(cli::kNonEmpty);
    c.add_option("--peak-tflops", o_.peak_tflops,
                 "Per-device peak for MFU, TFLOP/s (default: GPU datasheet table, else a "
                 "calibration GEMM)")
        ->check(cli::peak_tflops(false));
    c.add_flag("--no-calibrate", no_calibrate_, "Skip the calibration GEMM (no MFU on CPU)");
  }

  void validate() override {
    o_.sp = sp_ ? 1 : (no_sp_ ? 0 : -1);
    o_.calibrate = !no_calibrate_;
  }

  int run(const RunInfo& info, std::ostream& out) override {
    if (info.versions) o_.versions = info.versions();
    o_.command_line = info.command_line;
    return run_block_bench(o_, out);
  }

 private:
  BlockBenchOptions o_;
  bool sp_ = false, no_sp_ = false, no_calibrate_ = false;
};

Entry block_entry(const char* kind, const char* description) {
  return {kind, description, false, [kind] { return std::make_unique<BlockCommand>(kind); }};
}

}  // namespace

std::vector<Entry> block_commands() {
  return {
      block_entry("block",
                  "Transformer block (attention + MLP) forward + backward on a dp x tp mesh: "
                  "step time, tokens/s, model TFLOP/s and MFU, communication and exposed "
                  "communication per mesh dim, memory, skew"),
      block_entry("mlp", "The MLP block alone (norm, fc1 colwise, GeLU, fc2 rowwise, residual)"),
      block_entry("attn",
                  "The attention block alone (norm, fused QKV colwise, causal attention, "
                  "out-proj rowwise, residual)")};
}

}  // namespace meshrt::bench
