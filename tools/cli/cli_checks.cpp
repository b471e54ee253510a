#include "tools/cli/cli_checks.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include "runtime/error.h"

namespace meshrt::cli {

namespace {

// A decimal number as the flags' help shows them ("3e-4", "-1", "0.5"): strtod alone also reads
// hexadecimal ("0x10" as 16), "inf" and "nan", which no flag means.
bool decimal(const std::string& in) {
  return !in.empty() && in.find_first_not_of("0123456789+-.eE") == std::string::npos;
}

}  // namespace

CLI::Validator at_least(double lo, bool integer, int64_t hi) {
  std::ostringstream bound;
  bound << lo;
  std::string desc = integer ? (lo > 0 ? "INT>=1" : "INT>=0") : "NUMBER>" + bound.str();
  return CLI::Validator(
      [lo, integer, hi, b = bound.str()](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        const bool ok_num = end && *end == '\0' && decimal(in) && std::isfinite(v);
        const bool ok_int = !integer || (ok_num && std::trunc(v) == v);
        const std::string what =
            integer ? (lo > 0 ? "an integer >= 1" : "an integer >= 0") : "a number > " + b;
        if (!ok_num || !ok_int || (integer ? v < lo : v <= lo))
          return "'" + in + "' is not " + what;
        if (integer) {  // beyond the variable's type the conversion would fail or wrap
          errno = 0;
          const long long n = std::strtoll(in.c_str(), &end, 10);
          if (errno == ERANGE || n > hi)
            return "'" + in + "' is not " + what + " of at most " + std::to_string(hi);
          if (*end != '\0') return "'" + in + "' is not " + what + " written in digits";
        }
        return std::string();
      },
      desc);
}

CLI::Validator int_in(int64_t lo, int64_t hi) {
  const std::string what = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, what](std::string& in) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(in.c_str(), &end, 10);
        if (in.empty() || !end || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return "'" + in + "' is not " + what;
        return std::string();
      },
      "INT:" + std::to_string(lo) + ".." + std::to_string(hi));
}

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (!decimal(in) || !end || *end != '\0' || !std::isfinite(v) || !(v >= 0))
          return "'" + in + "' is not a number >= 0";
        return std::string();
      },
      "NUMBER>=0");
}

CLI::Validator peak_tflops(bool zero_allowed) {
  const std::string what =
      std::string("a peak in TFLOP/s from 0.001 to 1000000") + (zero_allowed ? " (or 0)" : "");
  return CLI::Validator(
      [zero_allowed, what](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        const bool num = decimal(in) && end && *end == '\0' && std::isfinite(v);
        if (!num || !((v >= 1e-3 && v <= 1e6) || (zero_allowed && v == 0)))
          return "'" + in + "' is not " + what;
        return std::string();
      },
      zero_allowed ? "TFLOPS|0" : "TFLOPS");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        return in.empty() ? "an empty value is not accepted: give one, or leave the option out"
                          : std::string();
      },
      "");
}

void check_zero_has_dp(int zero, int dp, const std::string& mesh) {
  MESHRT_CHECK(zero == 0 || dp > 1,
               "--zero " << zero << " would be ignored: ZeRO shards over dp and --mesh " << mesh
                         << " has dp=1; give a mesh with dp > 1 "
                         << "(e.g. dp=2) or drop --zero");
}

int64_t ffn_or_default(int64_t hidden, int64_t ffn) {
  if (ffn > 0) return ffn;
  MESHRT_CHECK(hidden <= std::numeric_limits<int64_t>::max() / 4,
               "--hidden " << hidden << " is too large: the default --ffn (4 x hidden) "
                           << "overflows a 64-bit integer; reduce --hidden or give --ffn");
  return 4 * hidden;
}

void add_model_flags(CLI::App& c, const ModelFlags& f) {
  auto shown = [&](CLI::Option* o) { return f.show_defaults ? o->capture_default_str() : o; };
  auto size = [&](const char* name, const ModelFlags::Size& s) {
    if (!s.value) return;
    CLI::Option* o = c.add_option(name, *s.value, s.help);
    // A default of 0 is derived (--ffn: 4 x hidden), as the help says: no "[0]" shown.
    (*s.value != 0 ? shown(o) : o)->check(int_at_least(1, *s.value));
  };
  size("--seq", f.seq);
  size("--hidden", f.hidden);
  size("--ffn", f.ffn);
  size("--heads", f.heads);
  if (f.layers)
    shown(c.add_option("--layers", *f.layers, f.layers_help))->check(int_at_least(1, *f.layers));
  size("--vocab", f.vocab);
  if (f.dtype)
    shown(c.add_option("--dtype", *f.dtype, f.dtype_help))->check(CLI::IsMember(kModelDtypes));
}

}  // namespace meshrt::cli
