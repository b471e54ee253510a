// `meshrt sweep`: the sweep's flags and checks.
#include "bench/sweep/sweep.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"

namespace meshrt::bench {

namespace {

using cli::kBenchSteps;
using cli::kBenchWarmup;
using cli::kPositive;

class SweepCommand : public Command {
 public:
  void add_flags(CLI::App& c) override {
    BlockBenchOptions& o = s_.base;
    c.add_option("--kind", o.kind, "block | mlp | attn")
        ->capture_default_str()
        ->check(CLI::IsMember({"block", "mlp", "attn"}));
    c.add_option("--devices", o.devices,
                 "Ranks: cpu:N | cuda:all | cuda:0-3 (default: as for bench block)");
    // Accepted only to say why it is not (the sweep runs every factorisation).
    c.add_option("--mesh", o.mesh, "")->group("");
    c.add_option("--batches", batches_, "Micro-batch sizes per dp replica, comma-separated")
        ->capture_default_str();
    c.add_option("--cp", cps_,
                 "Context-parallel sizes to sweep, comma-separated (each divides "
                 "the ranks; dp x tp factorise the rest)")
        ->capture_default_str();
    c.add_option("--cp-comm", o.cp_comm, "K/V exchange of the cp > 1 runs: ring | allgather")
        ->capture_default_str()
        ->check(CLI::IsMember({"ring", "allgather"}));
    c.add_option("--sp-modes", s_.sp, "Sequence parallel runs for tp > 1: both | on | off")
        ->capture_default_str()
        ->check(CLI::IsMember({"both", "on", "off"}));
    cli::ModelFlags m;
    m.seq = {&o.seq, "Sequence length (default as for bench block)"};
    m.hidden = {&o.hidden, "Hidden size (default as for bench block)"};
    m.ffn = {&o.ffn, "MLP inner size (default 4 x hidden)"};
    m.heads = {&o.heads, "Attention heads"};
    m.layers = &o.layers;
    m.layers_help = "Blocks stacked";
    m.dtype = &o.dtype;
    cli::add_model_flags(c, m);
    c.add_option("--steps", o.steps, "Timed steps per configuration (default 5)")
        ->check(kBenchSteps);
    c.add_option("--warmup", o.warmup, "Untimed steps per configuration (default 1)")
        ->check(kBenchWarmup);
    c.add_flag("--fwd-only", o.fwd_only, "Forward only");
    c.add_option("--overlap", o.overlap, "none | async | chunked (chunked runs only with sp)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "async", "chunked"}));
    c.add_option("--bucket-mb", o.bucket_mb, "dp gradient bucket size, MiB")
        ->capture_default_str()
        ->check(kPositive);
    c.add_option("--peak-tflops", o.peak_tflops, "Per-device peak for MFU, TFLOP/s")
        ->check(cli::peak_tflops(false));
    c.add_option("--repeats", s_.repeats,
                 "Runs per configuration, round-robin over the configurations; the run with the "
                 "median step time is reported")
        ->capture_default_str()
        ->check(cli::int_at_least(1, s_.repeats));
    c.add_option("--json", s_.json_path, "Write every run's figures as JSON")
        ->check(cli::kNonEmpty);
    c.add_option("--plot", s_.plot_path, "Write a PNG bar chart of tokens/s (gnuplot)")
        ->check(cli::kNonEmpty);
    c.add_flag("--no-progress", no_progress_, "No progress line on stderr");
  }

  void validate() override {
    s_.batches = parse_int_list(batches_, "--batches");
    s_.cps = parse_int_list(cps_, "--cp");
    s_.progress = !no_progress_;
    check_sweep_options(s_);
  }

  int run(const RunInfo& info, std::ostream& out) override {
    if (info.versions) s_.base.versions = info.versions();
    s_.base.command_line = info.command_line;
    return run_sweep(s_, out);
  }

 private:
  SweepOptions s_;
  std::string batches_ = "1,2,4";
  std::string cps_ = "1";
  bool no_progress_ = false;
};

}  // namespace

std::vector<Entry> sweep_commands() {
  return {{"sweep",
           "Block benchmark over every dp x tp factorisation of the devices, sequence parallel off "
           "and on, and a list of micro-batch sizes: a table sorted by tokens/s with the best "
           "marked",
           true, [] { return std::make_unique<SweepCommand>(); }}};
}

}  // namespace meshrt::bench
