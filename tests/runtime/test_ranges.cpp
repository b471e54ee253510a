// Profiler ranges (runtime/ranges.h): pushes and pops reach the observer in order, with names and
// payloads, on the thread that made them; scoped ranges close on every exit path.
#include <catch2/catch.hpp>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/ranges.h"

using namespace meshrt;

namespace {

struct Seen {
  std::mutex mu;
  std::vector<std::string> log;  // "+name:payload" or "-"
  ranges::Observer observer() {
    return [this](bool push, const std::string& name, uint64_t payload) {
      std::lock_guard<std::mutex> lk(mu);
      log.push_back(push ? "+" + name + ":" + std::to_string(payload) : "-");
    };
  }
};

}  // namespace

TEST_CASE("ranges reach the observer in order with names and payloads", "[unit]") {
  Seen seen;
  {
    ranges::ObserverGuard guard(seen.observer());
    REQUIRE(ranges::enabled());
    ranges::push("outer", 7);
    {
      ranges::Scoped inner("inner", 4096);
      ranges::Scoped plain("plain");
    }
    ranges::pop();
    try {
      ranges::Scoped thrown("thrown", 1);
      throw std::runtime_error("leave the scope by an exception");
    } catch (const std::runtime_error&) {
    }
  }
  ranges::push("unobserved");  // NVTX only (CUDA build), or nothing
  ranges::pop();
  CHECK(seen.log == std::vector<std::string>{"+outer:7", "+inner:4096", "+plain:0", "-", "-", "-",
                                             "+thrown:1", "-"});
}

TEST_CASE("an observer installed or removed while ranges are open sees no unmatched pop",
          "[unit]") {
  Seen seen;
  ranges::push("before");  // opened before the observer: its pop is not shown
  {
    ranges::ObserverGuard guard(seen.observer());
    ranges::push("during", 3);
    ranges::pop();
    ranges::pop();  // closes "before"
    ranges::push("left open", 5);
  }
  ranges::pop();  // closes "left open" after the observer is gone
  ranges::push("after");
  ranges::pop();
  CHECK(seen.log == std::vector<std::string>{"+during:3", "-", "+left open:5"});
  // Without NVTX and without an observer, ranges are off: Scoped opens nothing.
  if (!ranges::detail::nvtx_built()) CHECK_FALSE(ranges::enabled());
}
