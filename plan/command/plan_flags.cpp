// `meshrt plan`: the planner's flags and checks.
#include "bench/sweep/sweep.h"
#include "plan/command/plan_command.h"
#include "runtime/error.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"

namespace meshrt::bench {

namespace {

class PlanCommand : public Command {
 public:
  void add_flags(CLI::App& c) override {
    c.add_option("--model", o_.model,
                 "The model: hidden=..,heads=..,ffn=..,layers=..,seq=..,vocab=.. (ffn default 4 x "
                 "hidden, vocab 0: no embedding / LM head)");
    c.add_option("--global-batch", o_.global_batch, "Sequences per optimizer step, all replicas")
        ->check(cli::int_at_least(1, o_.global_batch));
    c.add_option("--cluster", o_.cluster,
                 "A preset (h100-sxm:8, h200-sxm:8, a100-sxm:8, ':8xN' for N nodes, cpu) or a "
                 "cluster JSON file (--calibrate writes one)")
        ->capture_default_str();
    cli::ModelFlags m;  // the model's shape comes with --model
    m.dtype = &o_.dtype;
    m.show_defaults = true;
    cli::add_model_flags(c, m);
    c.add_option("--top", o_.top, "Rows shown (0: all)")
        ->capture_default_str()
        ->check(cli::int_at_least(0, o_.top));
    c.add_option("--bucket-mb", buckets_, "dp gradient bucket sizes tried, MiB, comma-separated")
        ->capture_default_str();
    c.add_option("--overlap", o_.overlap, "tp overlap modelled: none | async | chunked")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "async", "chunked"}));
    c.add_flag("--no-optimizer", no_opt_,
               "No AdamW state or step (what `meshrt bench block` and `sweep` run)");
    c.add_option("--zero", o_.zero,
                 "Model every layout with ZeRO stage 0, 1, 2 or 3 over dp (docs/zero.md)")
        ->check(CLI::Range(0, 3));
    c.add_flag("--recompute", o_.recompute,
               "Model full activation recomputation (as Megatron runs; meshrt does not)");
    c.add_option("--json", o_.json_path, "Write every configuration's prediction as JSON")
        ->check(cli::kNonEmpty);
    c.add_option("--calibrate", o_.calibrate_path,
                 "Measure this machine (GEMMs on the model's shapes, attention, elementwise, "
                 "collectives, overlap) and write a cluster JSON file");
    devices_ = c.add_option("--devices", o_.devices,
                            "Ranks --calibrate measures (default as bench block)");
    c.add_option("--compare", o_.compare_path,
                 "Predicted vs measured for every run of a `meshrt sweep --json` file, on "
                 "--cluster");
    c.add_option("--compare-memory", o_.compare_memory_path,
                 "With --compare: the same sweep run with MESHRT_LAUNCH_BLOCKING=1, whose "
                 "program-order peaks the memory columns compare with");
  }

  void validate() override {
    o_.optimizer = !no_opt_;
    o_.buckets.clear();
    for (int64_t b : parse_int_list(buckets_, "--bucket-mb"))
      o_.buckets.push_back(static_cast<double>(b));
    // Only --calibrate runs anything on devices: elsewhere the flag would be ignored.
    MESHRT_CHECK(devices_->count() == 0 || !o_.calibrate_path.empty(),
                 "--devices " << o_.devices
                              << " chooses the ranks --calibrate measures, and this run only "
                                 "models (--cluster names the hardware): add --calibrate FILE or "
                                 "drop --devices");
    check_plan_options(o_);
  }

  std::string fault_ignored() const override {
    if (!o_.calibrate_path.empty()) return "";
    return "meshrt plan issues collectives only with --calibrate (which measures them), and this "
           "run only models";
  }

  int run(const RunInfo& info, std::ostream& out) override {
    o_.command_line = info.command_line;
    return run_plan(o_, out);
  }

 private:
  PlanOptions o_;
  std::string buckets_ = "25";
  CLI::Option* devices_ = nullptr;
  bool no_opt_ = false;
};

}  // namespace

std::vector<Entry> plan_commands() {
  return {{"plan",
           "Cost model: predicted step time (compute, tp / dp communication and their exposed "
           "part), memory, tokens/s and MFU of every dp x tp, sequence parallel, micro-batch and "
           "bucket layout of a model on a cluster; --calibrate measures this machine, --compare "
           "checks the model against a sweep",
           true, [] { return std::make_unique<PlanCommand>(); }}};
}

}  // namespace meshrt::bench
