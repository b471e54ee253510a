// `meshrt tune`: a tiny grid on a tiny model (seconds): the table sorted by validation loss with
// the best marked, --json, a trailing trial stopped early, and a resumed search (its state file
// cut back to fewer trials, as an interruption leaves it) giving the same table.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/files.h"

namespace fs = std::filesystem;

namespace {

fs::path tune_scratch() {
  static const fs::path d = meshrt::test::scratch_dir("tune");
  return d;
}

meshrt::test::Run tune_cli(const std::string& args) {
  return meshrt::test::run_shell(std::string(MESHRT_CLI_BIN) + " " + args, tune_scratch());
}

// Byte-level tokens (raw u16) of a repeated sentence, forward or reversed.
fs::path tune_tokens(const std::string& name, bool reversed) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "It was the best of times, it was the worst of times. ";
  if (reversed) text = std::string(text.rbegin(), text.rend());
  std::string out;
  for (char c : text) out += c, out += '\0';
  const fs::path p = tune_scratch() / name;
  std::ofstream(p, std::ios::binary) << out;
  return p;
}

nlohmann::json tune_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// The fields of a trial that do not depend on timing.
nlohmann::json tune_untimed(const nlohmann::json& trials) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : trials) {
    nlohmann::json u = t;
    u.erase("tokens_per_s");
    out.push_back(u);
  }
  return out;
}

}  // namespace

TEST_CASE("tune runs a grid, sorts it by validation loss and resumes an interrupted search",
          "[tune][multirank]") {
  const fs::path out = tune_scratch() / "out", js = tune_scratch() / "tune.json";
  fs::remove_all(out);
  const std::string args =
      "tune --devices cpu:2 --hidden 32 --heads 2 --seq 16 --batch 4 --vocab 256 --layers 1 "
      "--steps 6 --data " +
      tune_tokens("train.u16", false).string() + " --val-data " +
      tune_tokens("val.u16", true).string() + " --grid-lr 1e-3,1e-2,0.3 --grid-batch 2,4 --out " +
      out.string() + " --json " + js.string();
  const auto r = tune_cli(args);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("tune: 6 trials, 6 steps each, sorted by validation loss"));
  const nlohmann::json j = tune_json(js);
  REQUIRE(j["trials"].size() == 6);
  CHECK(j["sorted_by"] == "val_loss");
  // Sorted: finished trials by validation loss, the best first and marked.
  double prev = -1;
  for (const auto& t : j["trials"]) {
    if (t["status"] != "ok") continue;
    CHECK(t["val_loss"].get<double>() >= prev);
    prev = t["val_loss"].get<double>();
    CHECK(t["steps"] == 6);
  }
  CHECK(j["best_index"] == j["trials"][0]["index"]);
  CHECK(j["trials"][0]["status"] == "ok");
  CHECK_THAT(r.out,
             Catch::Matches("[\\s\\S]*\\n \\* +" + j["trials"][0]["index"].dump() + " +[\\s\\S]*"));
  // lr 0.3 trails the best by far more than the 25% margin: stopped in its second half.
  for (const auto& t : j["trials"])
    if (t["lr"].get<double>() > 0.2) {
      CHECK(t["status"] != "ok");
      CHECK(t["steps"].get<int>() < 6);
      CHECK(t["val_loss"].is_null());
    }
  // An interruption after four trials leaves four in the state file: the rerun does the last two
  // and gives the same table (the losses are the trials' seeds' own, bit for bit).
  const fs::path state = out / "tune-state.json";
  nlohmann::json st = tune_json(state);
  REQUIRE(st["trials"].size() == 6);
  st["trials"].erase(st["trials"].begin() + 4, st["trials"].end());
  std::ofstream(state) << st.dump();
  const auto again = tune_cli(args);
  INFO(again.out << again.err);
  REQUIRE(again.rc == 0);
  CHECK_THAT(again.out, Catch::Contains("resuming from " + out.string() + ": 4 of 6 trials done"));
  CHECK_THAT(again.out, Catch::Contains("trial 4 (") && Catch::Contains("trial 5 (") &&
                            !Catch::Contains("trial 0 ("));
  CHECK(tune_untimed(tune_json(js)["trials"]) == tune_untimed(j["trials"]));
  // A finished search reruns nothing; another grid in the same folder is refused.
  const auto done = tune_cli(args);
  CHECK_THAT(done.out, Catch::Contains("6 of 6 trials done") && !Catch::Contains("trial 0 ("));
  const auto other = tune_cli(args + " --grid-micro-batches 1,2");
  CHECK(other.rc != 0);
  CHECK_THAT(other.err, Catch::Contains("is the state of another search"));
}

TEST_CASE("tune refuses flags that are its own and bad grids", "[tune][unit]") {
  const std::string base = "tune --devices cpu:1 --out " + (tune_scratch() / "bad").string();
  for (auto [flags, why] : std::vector<std::pair<std::string, std::string>>{
           {" --metrics m.jsonl", "--metrics, --save and --resume are tune's own"},
           {" --grid-lr 1e-3,x", "--grid-lr 1e-3,x: 'x' is not a number >= 0"},
           {" --grid-batch 0", "--grid-batch"},
           {" --grid-mesh 'dp=1;'", "an empty mesh"},
           {" --margin -1", "--margin -1 must be >= 0"}}) {
    const auto r = tune_cli(base + flags);
    INFO(flags << "\n" << r.err);
    CHECK(r.rc != 0);
    CHECK_THAT(r.err, Catch::Contains(why));
  }
}
