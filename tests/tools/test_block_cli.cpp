// `meshrt bench block|mlp` at the command line: overflowing default shapes blame the flag given,
// an MLP ignores heads, uneven ffn shards match the unsharded run, and --dump metadata holds what
// recomputing the block needs.
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/allocator.h"
#include "runtime/safetensors.h"
#include "tests/common/files.h"

using namespace meshrt;
namespace fs = std::filesystem;

namespace {

using meshrt::test::Run;
using meshrt::test::slurp;

fs::path block_scratch() {
  static const fs::path d = meshrt::test::scratch_dir("block-cli");
  fs::create_directories(d);  // again: a case removes it when done
  return d;
}

// Runs `meshrt <args>` (no shell quoting needed for the arguments used here).
Run block_cli(const std::string& args) {
  return meshrt::test::run_program(MESHRT_CLI_BIN, args, block_scratch());
}

double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double md = 0, mr = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::abs(got[i] - ref[i]));
    mr = std::max(mr, std::abs(ref[i]));
  }
  return md / mr;
}

}  // namespace

TEST_CASE("a --hidden whose default ffn overflows is blamed on --hidden", "[unit]") {
  // 4 x hidden > INT64_MAX.
  Run r = block_cli("bench block --devices cpu:1 --hidden 4611686018427387904 --heads 1");
  CHECK(r.rc != 0);
  INFO(r.err);
  CHECK(r.err.find("--hidden 4611686018427387904 is too large") != std::string::npos);
  CHECK(r.err.find("overflows") != std::string::npos);
  CHECK(r.err.find("--ffn 0") == std::string::npos);
}

TEST_CASE("bench mlp does not check heads but bench block does", "[multirank]") {
  // hidden 100 does not divide by the default 16 heads.
  const std::string shape = "--seq 32 --hidden 100 --steps 1 --warmup 0 --no-calibrate";
  Run mlp = block_cli("bench mlp --devices cpu:2 " + shape);
  INFO(mlp.err);
  CHECK(mlp.rc == 0);
  CHECK(mlp.out.find("tokens/s") != std::string::npos);
  Run block = block_cli("bench block --devices cpu:2 " + shape);
  CHECK(block.rc != 0);
  CHECK(block.err.find("hidden 100 does not divide by heads 16") != std::string::npos);
}

TEST_CASE(
    "bench mlp with an ffn tp does not divide dumps the tp=1 tensors, with the block's "
    "metadata",
    "[multirank][dump]") {
  // ffn 100 over tp=3: 34, 33, 33 columns; seq 48 divides by 3 for sequence parallel.
  const std::string shape =
      "--seq 48 --hidden 96 --ffn 100 --steps 1 --warmup 0 --no-calibrate --seed 5";
  const fs::path a = block_scratch() / "tp1.safetensors", b = block_scratch() / "tp3.safetensors";
  Run r1 = block_cli("bench mlp --devices cpu:1 " + shape + " --dump " + a.string());
  Run r3 = block_cli("bench mlp --devices cpu:3 " + shape + " --dump " + b.string());
  INFO(r1.err << r3.err);
  REQUIRE(r1.rc == 0);
  REQUIRE(r3.rc == 0);
  auto host = make_host_caching_allocator();
  SafetensorsFile f1 = load_safetensors(a.string(), host), f3 = load_safetensors(b.string(), host);
  REQUIRE(f3.metadata.at("meshrt.mesh") == "tp=3");
  REQUIRE(f1.tensors.size() == f3.tensors.size());
  REQUIRE(f3.at("layers.0.mlp.fc1.weight").shape() == Shape({96, 100}));
  for (auto& [name, t] : f1.tensors) {
    INFO(name);
    CHECK(rel_err(f3.at(name).to_vector(), t.to_vector()) < 2e-5);
  }
  // What recomputing the block needs besides the tensors.
  const auto& md = f3.metadata;
  CHECK(md.at("meshrt.heads") == "16");
  CHECK(md.at("meshrt.hidden") == "96");
  CHECK(md.at("meshrt.ffn") == "100");
  CHECK(md.at("meshrt.norm") == "layernorm");
  CHECK(std::stod(md.at("meshrt.norm_eps")) == Approx(1e-5));
  CHECK(md.at("meshrt.gelu") == "tanh");
  CHECK(md.at("meshrt.bias") == "1");
  CHECK(std::stof(md.at("meshrt.init_std")) == 0.02f);  // round-trips the float exactly
  CHECK(std::stod(md.at("meshrt.param_noise")) == 0.0);
  CHECK(md.at("meshrt.seed") == "5");
  CHECK(md.at("meshrt.dtype") == "f32");
  CHECK(md.at("meshrt.layers") == "1");
  fs::remove_all(block_scratch());
}

TEST_CASE("bench block --zero 3 gathers each piece and lowers the peak, and --zero 1 is refused",
          "[multirank][zero]") {
  const std::string base =
      "bench block --devices cpu:2 --mesh dp=2 --seq 32 --hidden 128 --heads 4 --layers 8 "
      "--steps 2 --warmup 1 --no-calibrate --zero ";
  auto peak = [&](const std::string& zero) {
    const fs::path json = block_scratch() / ("zero" + zero + ".json");
    Run r = block_cli(base + zero + " --json " + json.string());
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const auto j = nlohmann::json::parse(std::ifstream(json));
    CHECK(j.at("config").at("zero") == std::stoi(zero));
    return j.at("memory").at("peak_allocated_bytes_max").get<double>();
  };
  const double z0 = peak("0"), z3 = peak("3");
  // 8 layers of 0.79 MB (hidden 128, f32; 6.3 MB): stage 3 keeps half of the parameters and
  // gradients and at most three pieces' (and gradient buckets) whole; stage 0 all of both
  // (measured: 13.3 and 19.2 MB).
  CHECK(z3 < z0 - 3e6);
  Run r = block_cli(base + "1");
  CHECK(r.rc != 0);
  CHECK_THAT(r.err, Catch::Contains("--zero 1: the block benchmark runs ZeRO stage 0, 2 or 3"));
  r = block_cli(base + "3 --dump " + (block_scratch() / "z3.safetensors").string());
  CHECK(r.rc != 0);
  CHECK_THAT(r.err, Catch::Contains("--dump with --zero 3: the gradients are kept as dp shards"));
  // Forward only, the parameters are dumped whole: the same file as at --zero 0.
  const std::string fwd =
      "bench block --devices cpu:2 --mesh dp=2 --seq 32 --hidden 64 --heads 4 --layers 2 "
      "--steps 1 --warmup 0 --no-calibrate --fwd-only --dump ";
  const fs::path d0 = block_scratch() / "fwd0.safetensors",
                 d3 = block_scratch() / "fwd3.safetensors";
  REQUIRE(block_cli(fwd + d0.string() + " --zero 0").rc == 0);
  REQUIRE(block_cli(fwd + d3.string() + " --zero 3").rc == 0);
  auto host = make_host_caching_allocator();
  SafetensorsFile f0 = load_safetensors(d0.string(), host),
                  f3 = load_safetensors(d3.string(), host);
  REQUIRE(f0.tensors.size() == f3.tensors.size());
  for (auto& [name, t] : f0.tensors) {
    INFO(name);
    CHECK(f3.at(name).to_vector() == t.to_vector());
  }
  fs::remove_all(block_scratch());
}
