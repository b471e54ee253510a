// The environment table (runtime/env.cpp): MESHRT_ variables it does not know get one warning
// each, suggesting the closest known name, and docs/environment.md describes every name it knows.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/env.h"
#include "tests/common/env.h"

using namespace meshrt;
using meshrt::test::ScopedEnv;

namespace {

// The warnings about the names given, in order (ctest's own environment may hold others).
std::vector<std::string> warnings_about(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& w : unknown_environment_warnings())
    for (const std::string& n : names)
      if (w.rfind(n + " ", 0) == 0) out.push_back(w);
  return out;
}

}  // namespace

TEST_CASE("env: an unknown MESHRT_ variable is named, with the closest known name", "[unit]") {
  ScopedEnv a("MESHRT_LAUNCH_BLOCKNG", "1");
  ScopedEnv b("MESHRT_HOST_THREAD", "4");
  ScopedEnv c("MESHRT_ZZZZZZZZZZZZZZZZZZ", "1");
  ScopedEnv known("MESHRT_LAUNCH_BLOCKING", "0");
  CHECK(warnings_about({"MESHRT_LAUNCH_BLOCKNG", "MESHRT_HOST_THREAD", "MESHRT_ZZZZZZZZZZZZZZZZZZ",
                        "MESHRT_LAUNCH_BLOCKING"}) ==
        std::vector<std::string>{
            "MESHRT_HOST_THREAD is not a meshrt setting and is ignored: did you mean "
            "MESHRT_HOST_THREADS? (docs/environment.md lists every setting)",
            "MESHRT_LAUNCH_BLOCKNG is not a meshrt setting and is ignored: did you mean "
            "MESHRT_LAUNCH_BLOCKING? (docs/environment.md lists every setting)",
            // Nothing close: no guess.
            "MESHRT_ZZZZZZZZZZZZZZZZZZ is not a meshrt setting and is ignored (docs/environment.md "
            "lists every setting)"});
}

TEST_CASE("env: every name meshrt reads or sets for itself is known", "[unit]") {
  const std::vector<std::string> names = env_known_names();
  const std::set<std::string> known(names.begin(), names.end());
  // Free-form ones (read by their own parsers), the re-exec's own switch, the scripts' variables.
  for (const char* n :
       {"MESHRT_LOG_LEVEL", "MESHRT_HOST_ISA", "MESHRT_BACKEND_PATH", "MESHRT_COMM_TIMEOUT",
        "MESHRT_RENDEZVOUS", "MESHRT_FAULT", "MESHRT_FLIGHT_DIR", "MESHRT_RUN_ID",
        "MESHRT_CHECKPOINT_FAULT", "MESHRT_BLAS_REEXEC", "MESHRT_GPU_DEADLINE"}) {
    INFO(n);
    CHECK(known.count(n) == 1);
  }
  for (const char* n : {"MESHRT_BLAS_REEXEC", "MESHRT_FLIGHT_DIR", "MESHRT_HOST_ISA"}) {
    ScopedEnv e(n, "1");
    CHECK(warnings_about({n}).empty());
  }
}

TEST_CASE("env: docs/environment.md describes exactly the settings the table knows", "[unit]") {
  std::ifstream f(std::string(MESHRT_SOURCE_DIR) + "/docs/environment.md");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  std::set<std::string> in_doc;
  const std::regex name("MESHRT_[A-Z0-9_]*[A-Z0-9]");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), name); it != std::sregex_iterator();
       ++it)
    in_doc.insert(it->str());
  const std::vector<std::string> all = env_known_names();
  const std::set<std::string> known(all.begin(), all.end());
  for (const std::string& n : in_doc) {
    if (n == "MESHRT_LAUNCH_BLOCKNG") continue;  // the page's example of a misspelt name
    INFO(n << " is in docs/environment.md but not in runtime/env.cpp's table");
    CHECK(known.count(n) == 1);
  }
  for (const std::string& n : env_known_names(false)) {
    INFO(n << " is in runtime/env.cpp's table but not in docs/environment.md");
    CHECK(in_doc.count(n) == 1);
  }
}
