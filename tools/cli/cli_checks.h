// Validators for the command line's numeric flags whose messages say what is accepted (CLI11's
// range checks print the whole double range, which is no help).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace meshrt::cli {

// A finite number >= lo (integer: lo is 0 or 1) or > lo (not integer), e.g. "'-1' is not an
// integer >= 1", "'1' is not a number > 1"; integers also at most `hi` ("'3000000000' is not an
// integer >= 1 of at most 2147483647").
CLI::Validator at_least(double lo, bool integer, int64_t hi = std::numeric_limits<int64_t>::max());

// An integer >= lo (0 or 1) that the option's variable `v` (or a vector's elements) can hold:
// checked here, CLI11's own conversion would print only "Could not convert".
template <typename T>
CLI::Validator int_at_least(int64_t lo, const T& v) {
  if constexpr (std::is_integral_v<T>) {
    constexpr uint64_t max = static_cast<uint64_t>(std::numeric_limits<T>::max());
    constexpr auto i64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    return at_least(static_cast<double>(lo), true, static_cast<int64_t>(max < i64 ? max : i64));
  } else {
    return int_at_least(lo, typename T::value_type{});
  }
}

inline const CLI::Validator kPositive = at_least(0, false);
// An integer in [lo, hi], e.g. "'3000000000' is not an integer from 1 to 1000000".
CLI::Validator int_in(int64_t lo, int64_t hi);
// Benchmark step counts: timed steps 1 to 10^6, untimed 0 to 10^6 (per-step records are kept,
// and a count past int's range would wrap).
inline const CLI::Validator kBenchSteps = int_in(1, 1000000);
inline const CLI::Validator kBenchWarmup = int_in(0, 1000000);
// A finite number >= 0, not necessarily an integer (learning rates, clipping norms).
CLI::Validator non_negative();
// A peak in TFLOP/s per device for MFU: 0.001 (one GFLOP/s) to 10^6, and 0 where the flag gives
// 0 a meaning (no MFU). Outside that an MFU would print as a 60-digit figure.
CLI::Validator peak_tflops(bool zero_allowed);
// Any value but "" (a mesh, a directory): an empty one would silently mean the default.
CLI::Validator non_empty();
inline const CLI::Validator kNonEmpty = non_empty();

// ZeRO shards over dp: --zero 1|2|3 on a mesh with dp=1 would be ignored. Refused alike by
// `bench block` and `train` / `tune` ("--zero 3 would be ignored: ... has dp=1; ...").
void check_zero_has_dp(int zero, int dp, const std::string& mesh);
// --ffn, or its default 4 x hidden when not given (ffn <= 0); a --hidden whose default would
// overflow int64 is refused, blamed on --hidden (bench block, train, tune).
int64_t ffn_or_default(int64_t hidden, int64_t ffn);

// The model flags (--seq, --hidden, --ffn, --heads, --layers, --vocab, --dtype) of every command
// that builds or models blocks: `bench block|mlp|attn`, `sweep`, `train` and `plan` (its --dtype;
// its --model keys parse into the same ModelSpec, model/model_spec.h). add_model_flags registers
// the ones a command has (a null target: it has none) with one set of checks, so each command
// accepts and refuses the same values with the same message: every size an integer >= 1 that its
// variable holds (0 is no size: leave the flag out for its default, as 4 x hidden for --ffn), and
// --dtype one of f32, bf16, f16 (docs/cli.md, "Model flags").
struct ModelFlags {
  struct Size {
    int64_t* value = nullptr;
    std::string help;
  };
  Size seq, hidden, ffn, heads, vocab;
  int* layers = nullptr;
  std::string layers_help;
  std::string* dtype = nullptr;
  std::string dtype_help = "f32 | bf16 | f16";
  bool show_defaults = false;  // the help shows the flags' default values (train, plan)
};
void add_model_flags(CLI::App& c, const ModelFlags& f);
// The dtypes --dtype takes, in the order the help lists them.
inline const std::vector<std::string> kModelDtypes = {"f32", "bf16", "f16"};

}  // namespace meshrt::cli
