#include <catch2/catch.hpp>

#include "runtime/backend.h"
#include "runtime/device.h"
#include "runtime/error.h"

using namespace meshrt;

TEST_CASE("device specs parse into one device per rank", "[device]") {
  auto d = parse_devices("cpu:4");
  REQUIRE(d.size() == 4);
  REQUIRE(d[3] == Device::cpu(3));
  REQUIRE(parse_devices("cpu").size() == 1);
  auto g = parse_devices("cuda:0-7");
  REQUIRE(g.size() == 8);
  REQUIRE(g[7] == Device::cuda(7));
  auto h = parse_devices("cuda:0,2,5");
  REQUIRE(h.size() == 3);
  REQUIRE(h[2].index == 5);
  REQUIRE(Device::cuda(3).str() == "cuda:3");
}

TEST_CASE("bad device specs are rejected with what to write", "[device]") {
  REQUIRE_THROWS_WITH(parse_devices("gpu:1"), Catch::Contains("unknown device kind 'gpu'"));
  REQUIRE_THROWS_WITH(parse_devices("cpu:0"), Catch::Contains("must be in [1,"));
  REQUIRE_THROWS_WITH(parse_devices("cpu:x"), Catch::Contains("'x' is not a non-negative integer"));
  REQUIRE_THROWS_WITH(parse_devices("cpu:"), Catch::Contains("nothing after ':'"));
  REQUIRE_THROWS_WITH(parse_devices("cuda:3-1"), Catch::Contains("range 3-1 is empty"));
  REQUIRE_THROWS_WITH(parse_devices("cuda:1,1"), Catch::Contains("names cuda:1 twice"));
  REQUIRE_THROWS_WITH(parse_devices("cuda:1,,2"), Catch::Contains("empty entry"));
  // Ranges add up to the per-process limit (found by fuzzing: many disjoint ranges made the old
  // pairwise duplicate check quadratic in millions of devices).
  REQUIRE(parse_devices("cuda:0-511,512-1023").size() == 1024);
  REQUIRE_THROWS_WITH(parse_devices("cuda:0-1000,1001-2000"),
                      Catch::Contains("names more than 1024 devices"));
  REQUIRE_THROWS_WITH(parse_devices("cuda:0-3,2"), Catch::Contains("names cuda:2 twice"));
  std::string why;
  if (!cuda_available(&why)) {
    REQUIRE(!why.empty());
    REQUIRE_THROWS_WITH(parse_devices("cuda:all"), Catch::Contains("CUDA unavailable"));
    REQUIRE_THROWS_WITH(backend_for(Device::cuda(0)), Catch::Contains("CUDA is unavailable"));
  }
}
