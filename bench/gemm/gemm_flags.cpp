// `meshrt bench gemm` and meshrt-bench-gemm: the flags and checks.
#include "bench/gemm/gemm_bench.h"
#include "runtime/error.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"

namespace meshrt::bench {

namespace {

class GemmCommand : public Command {
 public:
  void add_flags(CLI::App& c) override {
    // Sizes up to 2^31 per dimension: their products are checked against int64 again later.
    const CLI::Validator dim = cli::int_in(1, int64_t{1} << 31),
                         dim_or_default = cli::int_in(0, int64_t{1} << 31);
    gemm_flags_ = {
        c.add_option("-m", o_.m,
                     "GEMM rows of A and C (with -n and -k: one shape instead of the set)")
            ->check(dim),
        c.add_option("-n", o_.n, "GEMM columns of B and C")->check(dim),
        c.add_option("-k", o_.k, "GEMM inner dimension")->check(dim),
        c.add_flag("--trans-b", o_.trans_b, "B stored as [n, k]")};
    c.add_option("--dtype", o_.dtype, "f32 | bf16 | f16")->capture_default_str();
    c.add_option("--devices", o_.devices, "cpu | cpu:N (N ranks as threads) | cuda:N")
        ->capture_default_str();
    c.add_option("--warmup", o_.warmup, "untimed runs per measurement")
        ->capture_default_str()
        ->check(cli::kBenchWarmup);
    c.add_option("--repeats", o_.repeats, "timed runs (median reported)")
        ->capture_default_str()
        ->check(cli::kBenchSteps);
    shape_flags_ = {
        c.add_option("--tokens", o_.tokens,
                     "rows of the block shapes and elementwise tensors (0: 2048 on cpu, 8192 on "
                     "cuda)")
            ->check(dim_or_default),
        c.add_option("--hidden", o_.hidden, "hidden size (0: 768 on cpu, 4096 on cuda)")
            ->check(dim_or_default)};
    c.add_flag("--no-gemm", no_gemm_, "skip the GEMM table");
    c.add_flag("--no-elementwise", no_elem_, "skip the elementwise table");
    c.add_flag("--no-attention", no_attn_, "skip attention");
    attn_flags_ = {
        c.add_option("--attn-batch", o_.attn_batch, "attention batch (0: 1 on cpu, 4 on cuda)")
            ->check(dim_or_default),
        c.add_option("--attn-heads", o_.attn_heads, "attention heads (0: 8 on cpu, 16 on cuda)")
            ->check(dim_or_default),
        c.add_option("--attn-seq", o_.attn_seq, "attention sequence (0: 1024 on cpu, 2048 on cuda)")
            ->check(dim_or_default),
        c.add_option("--attn-head-dim", o_.attn_head_dim, "attention head dim")
            ->capture_default_str()
            ->check(dim)};
    c.add_option("--json", o_.json_path, "also write the figures to this JSON file")
        ->check(cli::kNonEmpty);
  }

  void validate() override {
    o_.gemm = !no_gemm_;
    o_.elementwise = !no_elem_;
    o_.attention = !no_attn_;
    MESHRT_CHECK(o_.gemm || o_.elementwise || o_.attention,
                 "--no-gemm, --no-elementwise and --no-attention together leave nothing to "
                 "measure; drop one of them");
    // A flag of a section that does not run would be ignored: refused instead.
    refuse_given(gemm_flags_, !o_.gemm, "--no-gemm", "skips the GEMM table it shapes");
    refuse_given(shape_flags_, !o_.gemm && !o_.elementwise, "--no-gemm and --no-elementwise",
                 "skip the tables it sizes");
    refuse_given(attn_flags_, !o_.attention, "--no-attention", "skips the attention it shapes");
    check_gemm_options(o_);
  }

  int run(const RunInfo&, std::ostream& out) override { return run_gemm_bench(o_, out); }

  std::string fault_ignored() const override {
    return "the gemm benchmark times kernels in this process and issues no collectives, where "
           "faults are injected";
  }

 private:
  // Refuses the first of `flags` given when `skipped`: the section it acts on does not run, as
  // `skip` (the --no-* flags) `does`.
  static void refuse_given(const std::vector<CLI::Option*>& flags, bool skipped,
                           const std::string& skip, const char* does) {
    if (!skipped) return;
    for (const CLI::Option* f : flags)
      MESHRT_CHECK(f->count() == 0, f->get_name() << " would be ignored: " << skip << " " << does
                                                  << "; drop " << f->get_name() << " or " << skip);
  }

  GemmBenchOptions o_;
  bool no_gemm_ = false, no_elem_ = false, no_attn_ = false;
  std::vector<CLI::Option*> gemm_flags_, shape_flags_, attn_flags_;
};

}  // namespace

std::vector<Entry> gemm_commands() {
  return {{"gemm",
           "Kernel microbenchmark: meshrt GEMM vs raw BLAS (host) or cuBLAS (CUDA), elementwise "
           "GB/s vs a memcpy of the same bytes, fused causal attention",
           false, [] { return std::make_unique<GemmCommand>(); }}};
}

}  // namespace meshrt::bench
