// `meshrt tune`: a tiny grid on a tiny model (seconds): the table sorted by validation loss with
// the best marked, --json, a trailing trial stopped early, and a resumed search (its state file
// cut back to fewer trials, as an interruption leaves it) giving the same table.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/common/files.h"
#include "tools/tune.h"

namespace fs = std::filesystem;

namespace {

fs::path tune_scratch() {
  static const fs::path d = meshrt::test::scratch_dir("tune");
  return d;
}

meshrt::test::Run tune_cli(const std::string& args) {
  return meshrt::test::run_program(MESHRT_CLI_BIN, args, tune_scratch());
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
  CHECK_THAT(other.err, Catch::Contains("is the state of another search (different "
                                        "--grid-micro-batches (the state: (not given), this run: "
                                        "1,2))"));
}

TEST_CASE("tune refuses flags that are its own and bad grids", "[tune][unit]") {
  const std::string base = "tune --devices cpu:1 --out " + (tune_scratch() / "bad").string();
  for (auto [flags, why] : std::vector<std::pair<std::string, std::string>>{
           {" --metrics m.jsonl", "--metrics, --save and --resume are tune's own"},
           {" --grid-lr 1e-3,x", "--grid-lr 1e-3,x: 'x' is not a number >= 0"},
           {" --grid-batch 0", "--grid-batch"},
           {" --grid-mesh 'dp=1;'", "an empty mesh"},
           {" --margin -1", "--margin -1 must be >= 0"},
           {" --samples -1", "--samples: '-1' is not an integer >= 0"},
           {" --search-seed -1", "--search-seed: '-1' is not an integer >= 0"}}) {
    const auto r = tune_cli(base + flags);
    INFO(flags << "\n" << r.err);
    CHECK(r.rc != 0);
    CHECK_THAT(r.err, Catch::Contains(why));
  }
  // A folder with the user's files and no state file is not a search to resume: refused, the
  // file left as it was.
  const fs::path foreign = tune_scratch() / "foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "trial-0.jsonl") << "notes\n";
  const auto r =
      tune_cli("tune --devices cpu:1 --grid-lr 1e-3 --steps 2 --out " + foreign.string());
  INFO(r.err);
  CHECK(r.rc != 0);
  CHECK_THAT(r.err, Catch::Contains("holds files but no tune-state.json"));
  CHECK(meshrt::test::slurp(foreign / "trial-0.jsonl") == "notes\n");
  // --json and --plot never replace the token files or the search's own files.
  const fs::path tok = tune_scratch() / "tok.u16";
  std::ofstream(tok, std::ios::binary) << std::string(512, '\1');
  const std::string out = (tune_scratch() / "outs").string();
  const std::string run = "tune --devices cpu:1 --steps 2 --data " + tok.string() + " --out " + out;
  for (auto [flags, why] : std::vector<std::pair<std::string, std::string>>{
           {" --json " + tok.string(), "--json " + tok.string() + " is the input --data"},
           {" --plot " + tok.string(), "--plot " + tok.string() + " is the input --data"},
           {" --json " + out + "/tune-state.json", "--json " + out +
                                                       "/tune-state.json lies inside --out " + out +
                                                       " (the search's state and trial metrics"},
           {" --plot " + out + "/trial-0.jsonl", "lies inside --out"}}) {
    const auto bad = tune_cli(run + flags);
    INFO(flags << "\n" << bad.err);
    CHECK(bad.rc == 1);
    CHECK_THAT(bad.err, Catch::Contains(why));
  }
  CHECK(meshrt::test::slurp(tok) == std::string(512, '\1'));
}

namespace {

// A loss curve of `steps` steps falling from 5 to `floor` (exponentially), times (1 + wobble x a
// fixed +-1 pattern), with a spike to `spike` every 37th step.
std::vector<double> tune_curve(int steps, double floor, double wobble, double spike) {
  std::vector<double> v;
  for (int i = 0; i < steps; ++i) {
    const double base = floor + (5 - floor) * std::exp(-i / 40.0);
    const double sign = (i * 7919 % 13) < 6 ? 1.0 : -1.0;
    v.push_back(i % 37 == 36 ? spike : base * (1 + wobble * sign));
  }
  return v;
}

}  // namespace

TEST_CASE("tune checks every trial of its grid before the first one runs", "[tune][unit]") {
  const fs::path out = tune_scratch() / "grid-check";
  fs::remove_all(out);
  const std::string args =
      "tune --devices cpu:2 --hidden 16 --heads 2 --seq 8 --vocab 256 --layers 1 --steps 1 "
      "--grid-lr 1e-3 --out " +
      out.string();
  const auto r = tune_cli(args + " --grid-batch 2,3");
  INFO(r.out << r.err);
  CHECK(r.rc == 1);
  CHECK(r.err ==
        "meshrt: error: tune: trial 1 of the grid (lr=0.001 b=3 mb=1) cannot run: train: global "
        "--batch 3 must divide by dp (2) x --micro-batches (1); change the grid flags (--grid-*) "
        "so that every trial can\n");
  CHECK(r.out.find("trial 0 (") == std::string::npos);
  CHECK_FALSE(fs::exists(out / "trial-0.jsonl"));
  // Nothing was finished: the same folder takes the corrected search.
  const auto fixed = tune_cli(args + " --grid-batch 2,4");
  INFO(fixed.out << fixed.err);
  CHECK(fixed.rc == 0);
  CHECK_THAT(fixed.out, Catch::Contains("tune: 2 trials, 1 steps each"));
}

TEST_CASE("tune's trailing rule compares windowed means, not one noisy step", "[tune][unit]") {
  using meshrt::cli::tune_rank_loss;
  using meshrt::cli::tune_trails;
  using meshrt::cli::tune_window_mean;
  CHECK(meshrt::cli::tune_loss_window(2000) == 50);
  CHECK(meshrt::cli::tune_loss_window(100) == 10);
  CHECK(meshrt::cli::tune_loss_window(6) == 1);
  const std::vector<double> l = {4, 2, 1, 3};
  CHECK(tune_window_mean(l, 4, 2) == 2.0);
  CHECK(tune_window_mean(l, 3, 10) == Approx(7.0 / 3));
  CHECK(std::isnan(tune_window_mean(l, 0, 2)));
  CHECK(std::isnan(tune_window_mean(l, 5, 2)));
  CHECK(std::isnan(tune_window_mean({1, NAN, 1}, 3, 2)));
  // As --steps 2000 --grid-lr 1e-3,2e-3,3e-3 at hidden 64 gave: the first trial (the best so
  // far) ends near 0.046; a later one ends near 0.0042 but spikes to 0.3 every 37 steps. Its
  // spikes are over 1.25 x the best's loss at those steps (the one-step rule stopped it as
  // trailing); its windowed mean is far below the best's at every step of its second half.
  const int steps = 2000;
  const std::vector<double> best = tune_curve(steps, 0.046, 0.05, 0.046);
  const std::vector<double> better = tune_curve(steps, 0.0042, 0.3, 0.3);
  REQUIRE(better[1997] > 1.25 * best[1997]);  // step 1998 spikes
  for (int k = 1; k <= steps; ++k) {
    INFO("step " << k);
    const std::vector<double> mine(better.begin(), better.begin() + k);
    REQUIRE_FALSE(tune_trails(mine, best, steps, 0.25));
  }
  // A clearly worse curve (2x the best, same noise) trails from the first step of the second
  // half on; not before it, and never with margin 0 or without a best.
  std::vector<double> worse = best;
  for (double& x : worse) x *= 2;
  auto upto = [&](int k) { return std::vector<double>(worse.begin(), worse.begin() + k); };
  CHECK_FALSE(tune_trails(upto(999), best, steps, 0.25));
  CHECK(tune_trails(upto(1000), best, steps, 0.25));
  CHECK(tune_trails(upto(steps), best, steps, 0.25));
  CHECK_FALSE(tune_trails(upto(steps), best, steps, 0.0));
  CHECK_FALSE(tune_trails(upto(steps), {}, steps, 0.25));
  // Within the margin (1.2 x the best) does not trail; a non-finite loss of its own does.
  std::vector<double> close = best;
  for (double& x : close) x *= 1.2;
  CHECK_FALSE(tune_trails(close, best, steps, 0.25));
  std::vector<double> nan_tail = best;
  nan_tail.back() = NAN;
  CHECK(tune_trails(nan_tail, best, steps, 0.25));
  // Ranking: the validation loss when there is one, else the mean of the last 50 steps: the
  // better curve ending on a spike (its last step set to 0.3) still ranks first.
  std::vector<double> spiky = better;
  spiky.back() = 0.3;
  CHECK(tune_rank_loss(spiky, NAN, 50) < tune_rank_loss(best, NAN, 50));
  CHECK(tune_rank_loss(spiky, NAN, 50) == Approx(tune_window_mean(spiky, steps, 50)));
  CHECK(tune_rank_loss(spiky, NAN, 1) == 0.3);  // one step: the spike
  CHECK(tune_rank_loss(spiky, 0.5, 50) == 0.5);
}

TEST_CASE("tune over micro-batches and meshes: a diverged trial is ranked last, --plot drawn",
          "[tune][multirank]") {
  const fs::path out = tune_scratch() / "grid2", js = tune_scratch() / "grid2.json",
                 png = tune_scratch() / "grid2.png";
  fs::remove_all(out);
  fs::remove(png);
  const bool gnuplot = std::system("gnuplot --version >/dev/null 2>&1") == 0;
  // lr 1e30 makes step 2 non-finite: those trials diverge (the finiteness guard).
  const auto r = tune_cli(
      "tune --devices cpu:2 --hidden 32 --heads 2 --seq 16 --batch 4 --vocab 256 --layers 1 "
      "--steps 3 --data " +
      tune_tokens("g2.u16", false).string() +
      " --grid-lr 1e-3,1e30 --grid-micro-batches 1,2 --grid-mesh 'dp=2;tp=2' --out " +
      out.string() + " --json " + js.string() + (gnuplot ? " --plot " + png.string() : ""));
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("tune: 8 trials, 3 steps each, sorted by training loss"));
  const nlohmann::json j = tune_json(js);
  REQUIRE(j["trials"].size() == 8);
  CHECK(j["sorted_by"] == "train_loss");
  // Grid order: lr slowest, then micro-batches, then the mesh.
  std::set<std::tuple<double, int, std::string>> seen;
  for (size_t i = 0; i < 8; ++i) {
    const auto& t = j["trials"][i];
    INFO(t.dump());
    const int index = t["index"].get<int>();
    CHECK(t["lr"].get<double>() == (index < 4 ? 1e-3 : 1e30));
    CHECK(t["micro_batches"].get<int>() == 1 + index / 2 % 2);
    CHECK(t["mesh"] == (index % 2 == 0 ? "dp=2" : "tp=2"));
    seen.insert({t["lr"].get<double>(), t["micro_batches"].get<int>(), t["mesh"]});
    // The four lr 1e30 trials diverge at step 2 and come last; the others finish.
    CHECK(t["status"] == (i < 4 ? "ok" : "diverged"));
    CHECK(t["steps"] == (i < 4 ? 3 : 1));
    if (i >= 4) CHECK(t["lr"].get<double>() == 1e30);
    // The mesh is the trial's: dp=2 all-reduces gradients, tp=2 (dp=1) does not.
    const auto recs = meshrt::test::slurp(out / ("trial-" + std::to_string(index) + ".jsonl"));
    const auto first = nlohmann::json::parse(recs.substr(0, recs.find('\n')));
    CHECK((first["dp_bytes"]["all_reduce"].get<double>() > 0) == (index % 2 == 0));
  }
  CHECK(seen.size() == 8);
  CHECK(j["best_index"] == j["trials"][0]["index"]);
  if (!gnuplot) {
    WARN("gnuplot is not installed: tune --plot is not tested");
    return;
  }
  CHECK_THAT(r.out, Catch::Contains("wrote " + png.string()));
  const std::string img = meshrt::test::slurp(png);
  REQUIRE(img.size() > 1000);
  CHECK(img.substr(0, 4) == "\x89PNG");
}

TEST_CASE("tune --samples draws the same trials for the same --search-seed", "[tune][unit]") {
  const fs::path data = tune_tokens("samples.u16", false);
  auto drawn = [&](int seed, const std::string& name) {
    const fs::path out = tune_scratch() / name, js = tune_scratch() / (name + ".json");
    fs::remove_all(out);
    const auto r = tune_cli(
        "tune --devices cpu:1 --hidden 16 --heads 2 --seq 8 --batch 2 --vocab 256 --layers 1 "
        "--steps 1 --data " +
        data.string() + " --grid-lr 1e-4,2e-4,3e-4,4e-4,5e-4,6e-4 --samples 3 --search-seed " +
        std::to_string(seed) + " --out " + out.string() + " --json " + js.string());
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Catch::Contains("tune: 3 trials, 1 steps each"));
    std::set<int> idx;
    const nlohmann::json j = tune_json(js);
    for (const auto& t : j["trials"]) {
      // A drawn trial's lr is its grid point's: 1e-4 x (index + 1).
      CHECK(t["lr"].get<double>() == Approx(1e-4 * (t["index"].get<int>() + 1)));
      idx.insert(t["index"].get<int>());
    }
    CHECK(idx.size() == 3);
    return idx;
  };
  const std::set<int> a = drawn(1, "s1"), again = drawn(1, "s1b"), b = drawn(2, "s2");
  CHECK(a == again);
  CHECK(a != b);
}

TEST_CASE("tune refuses a malformed state file, an --out it cannot use and a second tune there",
          "[tune][unit]") {
  const fs::path data = tune_tokens("state.u16", false), out = tune_scratch() / "state";
  fs::remove_all(out);
  const std::string args =
      "tune --devices cpu:1 --hidden 16 --heads 2 --seq 8 --batch 2 --vocab 256 --layers 1 "
      "--steps 2 --data " +
      data.string() + " --grid-lr 1e-4,2e-4 --out ";
  const auto first = tune_cli(args + out.string());
  INFO(first.out << first.err);
  REQUIRE(first.rc == 0);
  const fs::path state = out / "tune-state.json";
  const nlohmann::json good = tune_json(state);
  REQUIRE(good["trials"].size() == 2);
  // The error of resuming from the state with field `ptr` set to `v` (or removed).
  auto resume_with = [&](const std::string& ptr, const nlohmann::json& v, bool remove = false) {
    nlohmann::json j = good;
    const nlohmann::json::json_pointer p(ptr);
    if (remove)
      j[p.parent_pointer()].erase(p.back());
    else
      j[p] = v;
    std::ofstream(state) << j.dump();
    const auto r = tune_cli(args + out.string());
    return r.rc != 0 ? r.err : "(accepted)";
  };
  const std::string at = "meshrt: error: " + state.string() + ": ";
  CHECK(resume_with("/trials/0/steps", -1) ==
        at + "field 'trials[0].steps' is -1, not an integer in [0, 2]\n");
  CHECK(resume_with("/trials/0/steps", "2") ==
        at + "field 'trials[0].steps' is \"2\", not an integer in [0, 2]\n");
  CHECK(resume_with("/trials/0/index", 7) ==
        at + "field 'trials[0].index' is 7, not the index of a trial of this search's grid "
             "listed once (the file was edited?)\n");
  CHECK(resume_with("/trials/1/index", good["trials"][0]["index"]) ==
        at + "field 'trials[1].index' is " + good["trials"][0]["index"].dump() +
            ", not the index of a trial of this search's grid listed once (the file was "
            "edited?)\n");
  CHECK(resume_with("/trials/0/status", "great") ==
        at + "field 'trials[0].status' is \"great\", not \"ok\", \"diverged\" or \"trailing\"\n");
  CHECK(resume_with("/trials/0/tokens_per_s", -3) ==
        at + "field 'trials[0].tokens_per_s' is -3, not a number >= 0\n");
  CHECK(resume_with("/trials/0/last_loss", -1) ==
        at + "field 'trials[0].last_loss' is -1, not a number >= 0\n");
  CHECK(resume_with("/trials/0/val_loss", nullptr, /*remove=*/true) ==
        at + "field 'trials[0].val_loss' is missing; give a loss >= 0 (or null)\n");
  CHECK(resume_with("/trials/0/losses/1", -2) ==
        at + "field 'trials[0].losses[1]' is -2, not a loss >= 0 (or null)\n");
  CHECK(resume_with("/trials/0/losses", {1, 1, 1}) ==
        at + "field 'trials[0].losses' has 3 losses but field 'trials[0].steps' is 2 (one loss "
             "per step; the file was edited?)\n");
  CHECK(resume_with("/trials", "none") == at + "field 'trials' is \"none\", not an array\n");
  CHECK(resume_with("/version", 2) == at + "field 'version' is 2, not an integer in [1, 1]\n");
  CHECK(resume_with("/schema", "x") ==
        at + "field 'schema' is \"x\", not \"meshrt.tune.state\" (not a meshrt tune state file; "
             "use another --out folder)\n");
  std::ofstream(state) << "{\"trials\": [";
  CHECK_THAT(tune_cli(args + out.string()).err,
             Catch::StartsWith(at + "not valid JSON: parse error at line 1, column 13"));
  std::ofstream(state) << good.dump();
  // A rerun with other flags names each flag that differs, with both values.
  std::string changed = args;
  changed.replace(changed.find("--steps 2"), 9, "--steps 3");
  changed.replace(changed.find("1e-4,2e-4"), 9, "1e-4,3e-4");
  CHECK(tune_cli(changed + out.string()).err ==
        "meshrt: error: " + state.string() +
            " is the state of another search (different --steps (the state: 2, this run: 3), "
            "--grid-lr (the state: 1e-4,2e-4, this run: 1e-4,3e-4)); use the same flags to resume "
            "it, or another --out folder\n");
  CHECK(meshrt::test::slurp(state) == good.dump());

  // A second tune on the folder fails at once, naming the holder of the lock, and writes nothing.
  const fs::path lock = out / "tune.lock";
  REQUIRE(fs::exists(lock));  // the first search's, left in place
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  REQUIRE(::ftruncate(fd, 0) == 0);
  REQUIRE(::pwrite(fd, "pid 4242\n", 9, 0) == 9);
  const std::string before = meshrt::test::slurp(state);
  const auto held = tune_cli(args + out.string());
  CHECK(held.rc != 0);
  CHECK(held.err == "meshrt: error: tune: another meshrt tune is using --out " + out.string() +
                        " (pid 4242 holds " + lock.string() +
                        "); wait for it to end or give another --out folder\n");
  CHECK(meshrt::test::slurp(state) == before);
  ::close(fd);
  const auto resumed = tune_cli(args + out.string());
  INFO(resumed.out << resumed.err);
  CHECK(resumed.rc == 0);
  CHECK_THAT(resumed.out, Catch::Contains("2 of 2 trials done"));

  // An --out that cannot be a folder: a symlink loop, a file.
  const fs::path loop = tune_scratch() / "loop", file = tune_scratch() / "file";
  fs::remove(loop);
  fs::create_symlink("loop", loop);
  std::ofstream(file) << "x";
  CHECK(tune_cli(args + loop.string()).err ==
        "meshrt: error: tune: --out " + loop.string() +
            " is not a folder and cannot be made one: Too many levels of symbolic links; give a "
            "new or empty folder, or one a tune search made\n");
  CHECK(tune_cli(args + (loop / "sub").string()).err ==
        "meshrt: error: tune: --out " + (loop / "sub").string() +
            " is not a folder and cannot be made one: Too many levels of symbolic links; give a "
            "new or empty folder, or one a tune search made\n");
  CHECK(tune_cli(args + file.string()).err ==
        "meshrt: error: tune: --out " + file.string() +
            " is not a folder and cannot be made one: Not a directory; give a new or empty "
            "folder, or one a tune search made\n");
  CHECK(meshrt::test::slurp(file) == "x");
}

namespace {

// Starts `meshrt <args>` with its stdout on a pipe (stderr to `err`), reads its lines until one
// starts with `until`, then sends it `sig`; returns its exit status (128 + signal if killed) and
// everything it printed. No timing: the signal follows a line the process wrote.
std::pair<int, std::string> tune_signal_after(const std::string& args, const std::string& until,
                                              int sig, const fs::path& err) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(e, 2);
    close(fds[0]);
    execl("/bin/sh", "sh", "-c",
          ("exec " + meshrt::test::sh_quote(MESHRT_CLI_BIN) + " " + args).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  FILE* f = fdopen(fds[0], "r");
  std::string all;
  bool sent = false;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) {
    all += buf;
    if (!sent && std::string(buf).rfind(until, 0) == 0) {
      kill(pid, sig);
      sent = true;
    }
  }
  std::fclose(f);
  int st = 0;
  waitpid(pid, &st, 0);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), all};
}

}  // namespace

TEST_CASE("tune stopped by a real SIGINT resumes where it stopped", "[tune][multirank]") {
  const fs::path out = tune_scratch() / "sigint", js = tune_scratch() / "sigint.json";
  fs::remove_all(out);
  const std::string args =
      "tune --devices cpu:2 --hidden 32 --heads 2 --seq 16 --batch 4 --vocab 256 --layers 1 "
      "--steps 4 --data " +
      tune_tokens("sigint.u16", false).string() +
      " --grid-lr 1e-3,2e-3,3e-3,4e-3,5e-3,6e-3 --out " + out.string() + " --json " + js.string();
  // SIGINT once trial 1 is reported: the trial then running stops gracefully, unrecorded.
  const auto [rc, text] =
      tune_signal_after(args, "trial 1 (", SIGINT, tune_scratch() / "sigint.err");
  INFO(text << meshrt::test::slurp(tune_scratch() / "sigint.err"));
  CHECK(rc == 128 + SIGINT);
  const size_t at = text.find("tune: stopped by SIGINT during trial ");
  REQUIRE(at != std::string::npos);
  const int stopped = std::stoi(text.substr(at + 37));
  // The trials before the stopped one are in the state file, and nothing after it.
  CHECK(stopped >= 2);
  CHECK(stopped <= 5);
  CHECK_THAT(text, Catch::Contains("; " + std::to_string(stopped) + " of 6 trials done"));
  CHECK(tune_json(out / "tune-state.json")["trials"].size() == static_cast<size_t>(stopped));
  CHECK(!fs::exists(js));
  // The same command finishes the rest, from the stopped trial on.
  const auto again = tune_cli(args);
  INFO(again.out << again.err);
  REQUIRE(again.rc == 0);
  CHECK_THAT(again.out, Catch::Contains("resuming from " + out.string() + ": " +
                                        std::to_string(stopped) + " of 6 trials done"));
  CHECK_THAT(again.out, Catch::Contains("trial " + std::to_string(stopped) + " (") &&
                            !Catch::Contains("trial 0 ("));
  const nlohmann::json j = tune_json(js);
  REQUIRE(j["trials"].size() == 6);
  std::set<int> indices;
  for (const auto& t : j["trials"]) {
    indices.insert(t["index"].get<int>());
    CHECK(t["steps"] == 4);
  }
  CHECK(indices == std::set<int>{0, 1, 2, 3, 4, 5});
}
