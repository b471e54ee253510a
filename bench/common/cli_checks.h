// Validators for the command line's numeric flags whose messages say what is accepted (CLI11's
// range checks print the whole double range, which is no help).
#pragma once

#include <CLI/CLI.hpp>

namespace meshrt::cli {

// A finite number >= lo (integer: lo is 0 or 1) or > lo (not integer), e.g. "'-1' is not an
// integer >= 1", "'1' is not a number > 1"; integers also fit int64.
CLI::Validator at_least(double lo, bool integer);

inline const CLI::Validator kPositiveInt = at_least(1, true);
inline const CLI::Validator kNonNegativeInt = at_least(0, true);
inline const CLI::Validator kPositive = at_least(0, false);
// An integer in [lo, hi], e.g. "'3000000000' is not an integer from 1 to 1000000".
CLI::Validator int_in(int64_t lo, int64_t hi);
// Benchmark step counts: timed steps 1 to 10^6, untimed 0 to 10^6 (per-step records are kept,
// and a count past int's range would wrap).
inline const CLI::Validator kBenchSteps = int_in(1, 1000000);
inline const CLI::Validator kBenchWarmup = int_in(0, 1000000);
// A finite number >= 0, not necessarily an integer (learning rates, clipping norms).
CLI::Validator non_negative();
// Any value but "" (a mesh, a directory): an empty one would silently mean the default.
CLI::Validator non_empty();
inline const CLI::Validator kNonEmpty = non_empty();

}  // namespace meshrt::cli
