// The collective bench as a library: every op runs, checks its results, prints the nccl-tests
// columns, and reports busbw with nccl-tests' factors in its JSON.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/collective/collective_bench.h"
#include "runtime/error.h"

using namespace meshrt;

TEST_CASE("collective bench: sizes parse like nccl-tests", "[multirank]") {
  CHECK(parse_bench_size("8") == 8);
  CHECK(parse_bench_size("512K") == 512 * 1024);
  CHECK(parse_bench_size("64M") == 64ll << 20);
  CHECK(parse_bench_size("1G") == 1ll << 30);
  CHECK_THROWS_WITH(parse_bench_size("12X"), Catch::Contains("use e.g. 8, 512K, 64M or 1G"));
  CHECK_THROWS_WITH(parse_bench_size(""), Catch::Contains("empty size"));
}

TEST_CASE("collective bench: every op checks its results and uses nccl-tests' busbw factors",
          "[multirank]") {
  const int n = 3;
  struct Case {
    const char* op;
    double factor;
  };
  const Case cases[] = {{"all_reduce", 2.0 * (n - 1) / n},
                        {"all_gather", double(n - 1) / n},
                        {"reduce_scatter", double(n - 1) / n},
                        {"all_to_all", double(n - 1) / n},
                        {"broadcast", 1.0}};
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("meshrt-bench-" + std::to_string(getpid()) + ".json"))
                               .string();
  for (const Case& c : cases) {
    for (const char* dt : {"f32", "bf16", "i64"}) {
      CollBenchOptions o;
      o.op = c.op;
      o.devices = "cpu:" + std::to_string(n);
      o.backend = "host";
      o.min_bytes = 1024;
      o.max_bytes = 64 * 1024;
      o.step_factor = 8;
      o.dtype = dt;
      o.redop = "avg";
      o.root = 2;
      o.warmup = 1;
      o.iters = 2;
      o.json_path = json;
      std::ostringstream out;
      INFO(c.op << " " << dt);
      REQUIRE(run_collective_bench(o, out) == 0);
      const std::string s = out.str();
      INFO(s);
      CHECK_THAT(s, Catch::Contains("size         count      type   redop    root     time   "
                                    "algbw   busbw #wrong     time   algbw   busbw #wrong"));
      CHECK_THAT(s, Catch::Contains("# Out of bounds values : 0 OK"));
      std::ifstream f(json);
      nlohmann::json j = nlohmann::json::parse(f);
      REQUIRE(j["results"].size() == 3);  // 1K, 8K, 64K
      for (auto& r : j["results"]) {
        for (const char* place : {"out_of_place", "in_place"}) {
          double alg = r[place]["algbw_gbps"], bus = r[place]["busbw_gbps"];
          CHECK(r[place]["wrong"] == 0);
          CHECK(bus == Approx(alg * c.factor));
          CHECK(r[place]["time_us"]["min"] <= r[place]["time_us"]["max"]);
        }
      }
    }
  }
  std::filesystem::remove(json);
}

TEST_CASE("collective bench: --memcpy-bound gives each op's fraction of the memcpy bound",
          "[multirank]") {
  // Traffic per rank (read + written) that each op needs at least, over 2 x the memcpy bandwidth:
  // all-reduce, broadcast 2S; reduce-scatter S (1 + 1/n); all-gather, all-to-all 2S out of place
  // and 2S (n-1)/n in place.
  const int n = 2;
  struct Case {
    const char* op;
    double out_traffic, in_traffic;  // per byte of the row's size
  };
  const Case cases[] = {{"all_reduce", 2, 2},
                        {"broadcast", 2, 2},
                        {"reduce_scatter", 1.5, 1.5},
                        {"all_gather", 2, 1},
                        {"all_to_all", 2, 1}};
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("meshrt-bench-bound-" + std::to_string(getpid()) + ".json"))
                               .string();
  for (const Case& c : cases) {
    CollBenchOptions o;
    o.op = c.op;
    o.devices = "cpu:" + std::to_string(n);
    o.backend = "host";
    o.min_bytes = 1 << 20;
    o.max_bytes = 1 << 20;
    o.warmup = 1;
    o.iters = 2;
    o.memcpy_bound = true;
    o.json_path = json;
    std::ostringstream out;
    INFO(c.op);
    REQUIRE(run_collective_bench(o, out) == 0);
    CHECK_THAT(out.str(), Catch::Contains("# vs the memcpy bound"));
    std::ifstream f(json);
    nlohmann::json j = nlohmann::json::parse(f);
    const double bw = j["memcpy_gbps_per_rank"];
    REQUIRE(bw > 0);
    const auto& r = j["results"][0];
    const double bytes = r["size_bytes"];
    for (const char* place : {"out_of_place", "in_place"}) {
      const double traffic = std::string(place) == "in_place" ? c.in_traffic : c.out_traffic;
      const double t = r[place]["time_us"]["avg"].get<double>() * 1e-6;
      CHECK(r[place]["memcpy_bound_fraction"].get<double>() ==
            Approx(traffic * bytes / 2 / (bw * 1e9) / t));
    }
  }
  std::filesystem::remove(json);
}

TEST_CASE("collective bench: --latency reports each placement's median and p99", "[multirank]") {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("meshrt-bench-lat-" + std::to_string(getpid()) + ".json"))
                               .string();
  CollBenchOptions o;
  o.op = "all_reduce";
  o.devices = "cpu:2";
  o.backend = "host";
  o.min_bytes = 8;
  o.max_bytes = 4096;
  o.step_factor = 512;
  o.warmup = 1;
  o.iters = 20;
  o.latency = true;
  o.json_path = json;
  std::ostringstream out;
  REQUIRE(run_collective_bench(o, out) == 0);
  INFO(out.str());
  CHECK_THAT(out.str(), Catch::Contains("# latency, each iteration alone, us (median / p99 of 20"));
  std::ifstream f(json);
  nlohmann::json j = nlohmann::json::parse(f);
  REQUIRE(j["results"].size() == 2);  // 8, 4096
  for (auto& r : j["results"]) {
    for (const char* place : {"out_of_place", "in_place"}) {
      INFO(place);
      const double med = r[place]["latency_us"]["median"], p99 = r[place]["latency_us"]["p99"];
      CHECK(med > 0);
      CHECK(p99 >= med);
      CHECK(r[place]["wrong"] == 0);
    }
  }
  // Without the flag there is no latency figure.
  o.latency = false;
  std::ostringstream out2;
  REQUIRE(run_collective_bench(o, out2) == 0);
  std::ifstream f2(json);
  nlohmann::json j2 = nlohmann::json::parse(f2);
  CHECK_FALSE(j2["results"][0]["out_of_place"].contains("latency_us"));
  std::filesystem::remove(json);
}

TEST_CASE("collective bench: invalid options say what to change", "[multirank]") {
  CollBenchOptions o;
  o.devices = "cpu:2";
  o.op = "all_gatherv";
  std::ostringstream out;
  CHECK_THROWS_WITH(run_collective_bench(o, out), Catch::Contains("use one of all_reduce"));
  o.op = "all_reduce";
  o.min_bytes = 100;
  o.max_bytes = 10;
  CHECK_THROWS_WITH(run_collective_bench(o, out), Catch::Contains("must be >= 0 and <= -e"));
  o.max_bytes = 1000;
  o.op = "broadcast";
  o.root = 5;
  CHECK_THROWS_WITH(run_collective_bench(o, out), Catch::Contains("--root 5 outside [0, 2)"));
}
