// `--mesh ...,cp=C` at the command line: bench block runs it (and reports the cp exchange), the
// layouts and options it cannot run are refused naming the values, and the commands that do not
// run context parallelism yet say so.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/allocator.h"
#include "runtime/safetensors.h"
#include "tests/common/files.h"

namespace {

using meshrt::test::Run;

std::filesystem::path cp_scratch() {
  static const std::filesystem::path d = meshrt::test::scratch_dir("cp-cli");
  std::filesystem::create_directories(d);
  return d;
}

Run cp_cli(const std::string& args) {
  return meshrt::test::run_program(MESHRT_CLI_BIN, args, cp_scratch());
}

void expect_refusal(const std::string& args, const std::string& message) {
  INFO("meshrt " << args);
  const Run r = cp_cli(args);
  INFO("stderr: " << r.err);
  CHECK_FALSE(r.signaled);
  CHECK(r.rc == 1);
  CHECK(r.err.find(message) != std::string::npos);
  CHECK(r.err.find("terminate called") == std::string::npos);
}

}  // namespace

TEST_CASE("cp meshes that cannot run are refused naming the values and the option", "[unit]") {
  const std::string bb = "bench block --devices cpu:2 --hidden 32 --heads 2 --steps 1 ";
  expect_refusal(bb + "--mesh cp=2 --seq 18",
                 "--seq 18 does not divide by 2 x cp = 4 (--mesh cp=2): context parallelism "
                 "cuts the sequence into 2 x cp equal chunks");
  expect_refusal(bb + "--mesh cp=2 --seq 16 --cp-comm tree",
                 "--cp-comm: cp exchange 'tree' must be ring or allgather");
  expect_refusal(bb + "--mesh cp=2 --seq 16 --deterministic",
                 "--deterministic with cp=2 (--mesh cp=2)");
  // 20 tokens over cp=2 leave 10 per cp rank; under SP tp=4 does not divide them.
  expect_refusal(
      "bench block --devices cpu:8 --hidden 32 --heads 4 --steps 1 --mesh cp=2,tp=4 "
      "--seq 20",
      "--seq 20 / cp=2 = 10 does not divide by tp=4 under sequence parallel");
  expect_refusal("train --devices cpu:2 --mesh cp=2 --steps 1 --deterministic",
                 "train: --deterministic is not supported with context parallelism (--mesh cp=2, "
                 "cp=2)");
  expect_refusal("train --devices cpu:2 --mesh dp=2 --steps 1 --cp-comm ring",
                 "--cp-comm ring would be ignored: it picks how context parallelism exchanges K/V "
                 "and --mesh dp=2 has cp=1");
  expect_refusal("sweep --devices cpu:2 --cp 1,3", "sweep: --cp 3 does not divide the 2 ranks");
}

TEST_CASE("bench block --mesh cp=2 runs and reports the cp exchange", "[multirank]") {
  for (const char* how : {"ring", "allgather"}) {
    INFO(how);
    const std::string json = (cp_scratch() / (std::string("cp-") + how + ".json")).string();
    const Run r = cp_cli(
        std::string("bench block --devices cpu:2 --mesh cp=2 --seq 32 --hidden 32 --heads 2 ") +
        "--steps 2 --warmup 1 --no-calibrate --cp-comm " + how + " --json " + json);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(r.out.find(std::string("cp exchange ") + how) != std::string::npos);
    CHECK(r.out.find("comm cp") != std::string::npos);
    // With the planner's line (it predicts cp runs) and no peak known: one MFU line, "n/a".
    CHECK(r.out.find("  planner ") != std::string::npos);
    const size_t mfu = r.out.find("  MFU ");
    CHECK(mfu != std::string::npos);
    CHECK(r.out.find("  MFU ", mfu + 1) == std::string::npos);
    CHECK(r.out.find("n/a (no peak known: pass --peak-tflops)") != std::string::npos);
    std::ifstream in(json);
    const nlohmann::json j = nlohmann::json::parse(in);
    CHECK(j["config"]["cp"] == 2);
    CHECK(j["config"]["cp_comm"] == how);
    const nlohmann::json& c = j["comm"]["cp"];
    CHECK(c["size"] == 2);
    // Forward and backward exchange K/V (and dK/dV): bytes move every step.
    CHECK(c["bytes_per_step_per_rank"].get<double>() > 0);
    CHECK(c["comm_ms_median"].get<double>() > 0);
    CHECK(c["exposed_ms_median"].get<double>() >= 0);
  }
}

TEST_CASE("bench block --dump under cp writes cp=1's whole tensors", "[multirank][dump]") {
  // Each cp rank holds chunks i and 2cp-1-i of the sequence (and under SP its tp part of them):
  // the dump gathers them back into sequence order, so it holds cp=1's tensors.
  const std::string shape =
      "bench block --hidden 32 --heads 2 --seq 32 --steps 1 --warmup 0 --no-calibrate --seed 3 ";
  const auto dump = [&](const std::string& name, const std::string& launch) {
    const std::filesystem::path f = cp_scratch() / (name + ".safetensors");
    const Run r = cp_cli(shape + launch + " --dump " + f.string());
    INFO(launch << ": " << r.err);
    REQUIRE(r.rc == 0);
    return meshrt::load_safetensors(f.string(), meshrt::make_host_caching_allocator());
  };
  const meshrt::SafetensorsFile ref = dump("cp1", "--devices cpu:1 --mesh tp=1");
  REQUIRE(ref.at("output").shape() == meshrt::Shape({32, 1, 32}));
  for (const char* launch :
       {"--devices cpu:2 --mesh cp=2 --cp-comm ring",
        "--devices cpu:2 --mesh cp=2 --cp-comm allgather", "--devices cpu:4 --mesh cp=2,tp=2"}) {
    INFO(launch);
    const meshrt::SafetensorsFile got = dump("cp2", launch);
    REQUIRE(got.tensors.size() == ref.tensors.size());
    for (const auto& [name, t] : ref.tensors) {
      INFO(name);
      REQUIRE(got.at(name).shape() == t.shape());
      const std::vector<double> a = got.at(name).to_vector(), b = t.to_vector();
      double err = 0, norm = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        err = std::max(err, std::abs(a[i] - b[i]));
        norm = std::max(norm, std::abs(b[i]));
      }
      CHECK(err <= 2e-5 * std::max(norm, 1.0));
    }
  }
}

TEST_CASE("sweep --cp 1,2 runs and reports cp=1 and cp=2 meshes", "[multirank]") {
  const std::string json = (cp_scratch() / "sweep-cp.json").string();
  const Run r = cp_cli(
      "sweep --devices cpu:2 --cp 1,2 --cp-comm allgather --kind attn --seq 16 --hidden 32 "
      "--heads 2 --batches 1 --sp-modes on --steps 1 --warmup 0 --no-progress --json " +
      json);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  for (const char* mesh : {"dp=2,tp=1", "dp=1,tp=2", "dp=1,cp=2,tp=1"}) {
    INFO(mesh);
    CHECK(r.out.find(mesh) != std::string::npos);
  }
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  int cp2 = 0;
  for (const nlohmann::json& run : j["results"])
    if (run["config"]["cp"] == 2) {
      ++cp2;
      CHECK(run["config"]["cp_comm"] == "allgather");
    }
  CHECK(cp2 == 1);
  CHECK(j["results"].size() == 3);
}

TEST_CASE("train --doc-mask refuses what cannot mark documents, naming the flag and the values",
          "[unit]") {
  const std::string path = (cp_scratch() / "docs.u16").string();
  {
    const uint16_t t[] = {1, 2, 0, 3, 4, 5, 0, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2};
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(t), sizeof(t));
  }
  const std::string tr = "train --devices cpu:1 --steps 1 --seq 8 --batch 2 ";
  expect_refusal(tr + "--doc-mask",
                 "--doc-mask on synthetic tokens needs --eot-token ID (the synthetic walk has no "
                 "end-of-text token of its own)");
  expect_refusal(tr + "--eot-token 3",
                 "--eot-token 3 would be ignored: it is the token that ends each document under "
                 "--doc-mask");
  expect_refusal(tr + "--vocab 8 --doc-mask --data " + path,
                 "--doc-mask: --data " + path + " (raw u16) has no end-of-text token of its own");
  expect_refusal(tr + "--vocab 8 --doc-mask --eot-token 9 --data " + path,
                 "the end-of-text token 9 never occurs in the file (20 tokens, the largest 7)");
  expect_refusal(tr + "--doc-mask --eot-token 600",
                 "--doc-mask's end-of-text token 600 is >= --vocab 512");
  expect_refusal("train --devices cpu:2 --mesh cp=2 --steps 1 --seq 18 --doc-mask --eot-token 5",
                 "sequence 18 does not divide by 2 x cp = 4 (cp=2)");
  expect_refusal("train --devices cpu:2 --mesh cp=2 --steps 1 --seq 8 --cp-chunks 4",
                 "--cp-chunks 4 sets the chunks per cp rank of --doc-mask's balanced layout; it "
                 "needs --doc-mask");
  expect_refusal(
      "train --devices cpu:2 --mesh cp=2 --steps 1 --seq 12 --doc-mask --eot-token 5 "
      "--cp-chunks 4",
      "--cp-chunks 4 with --seq 12: context parallelism: sequence length 12 is not "
      "divisible by 4 x cp = 8");
  // And one that runs: the packed file at cp=1, documents of 3, 4, 3 and 8 tokens.
  const meshrt::test::Run ok = cp_cli(tr + "--vocab 8 --doc-mask --eot-token 0 --data " + path);
  INFO(ok.out << ok.err);
  CHECK(ok.rc == 0);
  CHECK(ok.out.find("step 1 loss") != std::string::npos);
}
