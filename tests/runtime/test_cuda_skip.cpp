// The skip rule of the suites with GPU cases (tests/common/cuda_skip.h): a run whose every
// selected case needs more GPUs than there are exits 77 with the reason; any runnable case runs.
#include <catch2/catch.hpp>

#include "tests/common/cuda_skip.h"

using meshrt::test::cannot_run;
using meshrt::test::skip_reason;

TEST_CASE("cuda skip rule: what each tag needs", "[unit]") {
  CHECK(cannot_run({"cuda"}, 0, "driver too old") == "no usable CUDA device: driver too old");
  CHECK(cannot_run({"cuda"}, 1, "").empty());
  CHECK(cannot_run({"cuda", "multigpu"}, 1, "") == "needs at least two GPUs, this machine has 1");
  CHECK(cannot_run({"cuda", "multigpu"}, 2, "").empty());
  CHECK(cannot_run({"unit"}, 0, "x").empty());
}

TEST_CASE("cuda skip rule: skip only when no selected case can run", "[unit]") {
  using Tags = std::vector<std::vector<std::string>>;
  CHECK(skip_reason(Tags{{"cuda"}}, 0, "no driver") == "no usable CUDA device: no driver");
  CHECK(skip_reason(Tags{{"cuda"}, {"cuda", "multigpu"}}, 0, "w") == "no usable CUDA device: w");
  CHECK(skip_reason(Tags{{"cuda"}, {"unit"}}, 0, "w").empty());  // the unit case runs
  CHECK(skip_reason(Tags{{"cuda", "multigpu"}}, 1, "") ==
        "needs at least two GPUs, this machine has 1");
  CHECK(skip_reason(Tags{{"cuda"}, {"cuda", "multigpu"}}, 1, "").empty());
  CHECK(skip_reason(Tags{}, 0, "w").empty());  // nothing selected: Catch2 reports that itself
}

TEST_CASE("cuda skip rule: a [cuda] case run alone here exits 77 when no GPU is usable", "[unit]") {
  std::string why;
  if (meshrt::cuda_available(&why)) {
    WARN("a GPU is usable here: the 77 path is checked by ctest -L cuda on machines without");
    return;
  }
  const int gpus = meshrt::test::usable_gpus(&why);
  CHECK(gpus == 0);
  CHECK_FALSE(why.empty());
  CHECK_FALSE(skip_reason({{"cuda"}}, gpus, why).empty());
}
