// Catch2 main for suites with GPU cases: exits 77 (ctest's SKIP_RETURN_CODE) when the run selects
// only cases the machine cannot run, so `ctest -L cuda` reports Skipped, never Passed, without a
// GPU.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace meshrt::test {

// What ctest's SKIP_RETURN_CODE is set to for every cuda-labelled test.
constexpr int kSkipReturnCode = 77;

// Why a case with these (lower-case) tags cannot run on a machine with `gpus` usable GPUs
// (`why_none` says why there are none); empty when it can. [cuda] needs one GPU, [multigpu] two.
inline std::string cannot_run(const std::vector<std::string>& tags, int gpus,
                              const std::string& why_none) {
  auto has = [&](const char* t) { return std::find(tags.begin(), tags.end(), t) != tags.end(); };
  if ((has("cuda") || has("multigpu")) && gpus == 0) return "no usable CUDA device: " + why_none;
  if (has("multigpu") && gpus < 2)
    return "needs at least two GPUs, this machine has " + std::to_string(gpus);
  return "";
}

// The reason to skip a run whose selected cases carry `tags` (one list per case): set when every
// selected case cannot run (a run that also selects runnable cases runs them); empty otherwise.
inline std::string skip_reason(const std::vector<std::vector<std::string>>& tags, int gpus,
                               const std::string& why_none) {
  if (tags.empty()) return "";
  std::string why;
  for (const auto& t : tags) {
    std::string w = cannot_run(t, gpus, why_none);
    if (w.empty()) return "";
    if (why.empty()) why = w;
  }
  return why;
}

// Number of usable GPUs; `why` says why there are none.
inline int usable_gpus(std::string* why) {
  if (!cuda_available(why)) return 0;
  return cuda_backend()->device_count(why);
}

// Guard at the top of a [cuda] case, for runs that mix it with runnable cases (ctest runs each case
// alone, and main() skips those with 77): says why and returns false when no GPU is usable.
inline bool gpu_or_warn() {
  std::string why;
  if (cuda_available(&why)) return true;
  WARN("SKIPPED (in a mixed run): no usable CUDA device: " << why);
  return false;
}

#if defined(CATCH_CONFIG_RUNNER)  // Catch2's Session exists only in the file defining main()
// main() of a suite with GPU cases: parses the command line, and when every selected case needs
// more GPUs than the machine has, prints "SKIPPED: <reason>" and returns 77; else runs Catch2.
inline int run_catch_or_skip(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& cd = session.configData();
  if (cd.showHelp || cd.listTests || cd.listTestNamesOnly || cd.listTags || cd.listReporters)
    return session.run();
  const Catch::Config& cfg = session.config();
  std::vector<std::vector<std::string>> tags;
  bool gpu_cases = false;
  for (const Catch::TestCase& tc :
       Catch::filterTests(Catch::getAllTestCasesSorted(cfg), cfg.testSpec(), cfg)) {
    tags.push_back(tc.lcaseTags);
    gpu_cases = gpu_cases || !cannot_run(tc.lcaseTags, 0, "").empty();
  }
  if (!gpu_cases) return session.run();  // CPU cases only: no need to probe for GPUs
  std::string why_none;
  const int gpus = usable_gpus(&why_none);
  if (const std::string why = skip_reason(tags, gpus, why_none); !why.empty()) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return kSkipReturnCode;
  }
  return session.run();
}
#endif

}  // namespace meshrt::test
