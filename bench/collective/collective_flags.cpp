// `meshrt bench collective` and meshrt-bench-collective: the flags (nccl-tests' names) and checks.
#include "bench/collective/collective_bench.h"
#include "runtime/error.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"

namespace meshrt::bench {

namespace {

class CollectiveCommand : public Command {
 public:
  void add_flags(CLI::App& c) override {
    c.add_option("--op", o_.op, "all_reduce | all_gather | reduce_scatter | broadcast | all_to_all")
        ->capture_default_str();
    devices_ =
        c.add_option("--devices", o_.devices, "ranks: cpu:N, cuda:0-7 (under mpirun: cpu or cuda)")
            ->capture_default_str();
    add_backend_flag(c, o_.backend);
    c.add_option("-b,--minbytes", min_, "smallest size, bytes with optional K/M/G")
        ->capture_default_str();
    c.add_option("-e,--maxbytes", max_, "largest size")->capture_default_str();
    // A finite factor > 1: "inf" (or 1e400, read as inf) made 0 x inf a NaN size.
    factor_ = c.add_option("-f,--stepfactor", o_.step_factor, "multiply the size by this")
                  ->capture_default_str()
                  ->check(cli::at_least(1, false));
    c.add_option("-i,--stepbytes", step_, "add this many bytes instead of multiplying");
    c.add_option("-d,--datatype", o_.dtype, "f32 | bf16 | f16 | i32 | i64")->capture_default_str();
    redop_ = c.add_option("-o,--redop", o_.redop,
                          "sum | avg | max | min (all_reduce, "
                          "reduce_scatter)")
                 ->capture_default_str();
    root_ = c.add_option("-r,--root", o_.root, "broadcast root")->capture_default_str();
    c.add_option("-w,--warmup_iters", o_.warmup, "untimed iterations per size")
        ->capture_default_str()
        ->check(cli::int_at_least(0, o_.warmup));
    c.add_option("-n,--iters", o_.iters, "timed iterations per size")
        ->capture_default_str()
        ->check(cli::int_at_least(1, o_.iters));
    c.add_option("-c,--check", check_, "check results on fresh inputs (0/1)")
        ->capture_default_str()
        ->check(cli::int_in(0, 1));
    c.add_option("-a,--average", o_.average,
                 "time shown: 0 rank 0, 1 average, 2 minimum, 3 maximum over ranks")
        ->capture_default_str();
    c.add_option("--seed", o_.seed, "input pattern seed")
        ->capture_default_str()
        ->check(cli::int_at_least(0, o_.seed));
    c.add_flag("--memcpy-bound", o_.memcpy_bound,
               "also measure the memcpy bandwidth every rank gets while all copy at once");
    c.add_flag("--latency", o_.latency,
               "also time each of the -n iterations alone (issue, wait): median and p99 latency "
               "of the slowest rank");
    c.add_option("--json", o_.json_path, "write the figures to this JSON file")
        ->check(cli::kNonEmpty);
  }

  void validate() override {
    o_.devices_defaulted = devices_->count() == 0;
    o_.min_bytes = parse_bench_size(min_);
    o_.max_bytes = parse_bench_size(max_);
    if (!step_.empty()) {
      o_.step_bytes = parse_bench_size(step_);
      // 0 would silently mean "multiply by -f" instead.
      MESHRT_CHECK(o_.step_bytes > 0, "-i " << step_
                                            << ": the step must be at least 1 byte (or leave -i "
                                               "out to multiply the size by -f)");
    }
    o_.check = check_ != 0;
    check_collective_options(o_);
    check_ignored_flags();
  }

  int run(const RunInfo&, std::ostream& out) override { return run_collective_bench(o_, out); }

 private:
  // Flags this run would ignore (nccl-tests takes them silently): refused, saying why.
  void check_ignored_flags() const {
    const CommOp op = parse_comm_op(o_.op);
    MESHRT_CHECK(root_->count() == 0 || op == CommOp::Broadcast,
                 "-r " << o_.root << " would be ignored: only broadcast has a root, and --op is "
                       << o_.op << "; drop -r or use --op broadcast");
    MESHRT_CHECK(redop_->count() == 0 || op == CommOp::AllReduce || op == CommOp::ReduceScatter,
                 "-o " << o_.redop << " would be ignored: " << o_.op
                       << " reduces nothing (all_reduce and reduce_scatter do); drop -o");
    MESHRT_CHECK(factor_->count() == 0 || step_.empty(),
                 "-f " << o_.step_factor << " would be ignored: -i " << step_
                       << " adds a fixed step to the size instead of multiplying it; give -f or "
                          "-i, not both");
  }

  CollBenchOptions o_;
  CLI::Option* devices_ = nullptr;
  CLI::Option *factor_ = nullptr, *redop_ = nullptr, *root_ = nullptr;
  std::string min_ = "32M", max_ = "32M", step_;  // sizes as typed ("64M")
  int check_ = 1;
};

}  // namespace

std::vector<Entry> collective_commands() {
  return {{"collective",
           "Collective microbenchmark in the style of nccl-tests (ranks as threads: --devices "
           "cpu:N or cuda:0-7; under mpirun / srun one process each)",
           false, [] { return std::make_unique<CollectiveCommand>(); }}};
}

}  // namespace meshrt::bench
