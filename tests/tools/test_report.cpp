// `meshrt report`: the summary of a synthetic metrics file (every number known), refusals of
// malformed records naming file:line, the plot, and a straggler (--fault slow) found by `train`
// and by the report of its metrics file.
#include <sys/stat.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tests/common/files.h"
#include "tools/report.h"
#include "train/metrics_record.h"

namespace fs = std::filesystem;

namespace {

fs::path report_scratch() {
  static const fs::path d = meshrt::test::scratch_dir("report");
  return d;
}

meshrt::test::Run report_cli(const std::string& args) {
  return meshrt::test::run_program(MESHRT_CLI_BIN, args, report_scratch());
}

// Five steps of two ranks: rank 1 computes 80 ms, rank 0 50 ms; step times 100 300 120 110 200.
std::string report_synthetic(double loss_shift = 0) {
  const double loss[] = {4.5, 4.0, 3.5, 3.0, 3.2}, step_ms[] = {100, 300, 120, 110, 200},
               tok[] = {1000, 333, 900, 950, 500}, lr[] = {1e-3, 1e-3, 8e-4, 5e-4, 2e-4};
  std::string out;
  for (int i = 0; i < 5; ++i) {
    nlohmann::json j = {{"schema", "meshrt.train.metrics"},
                        {"version", 1},
                        {"step", i + 1},
                        {"loss", loss[i] + loss_shift},
                        {"lr", lr[i]},
                        {"skipped", i == 3},
                        {"skipped_steps", i >= 3 ? 1 : 0},
                        {"step_ms", step_ms[i]},
                        {"tokens_per_s", tok[i]},
                        {"mfu", 0.01 * (i + 1)}};
    if (i == 4) j["val_loss"] = 3.4 + loss_shift;
    if (i >= 2) j["straggler_rank"] = 1;
    for (int k = 0; k < 2; ++k)
      j["ranks"].push_back({{"rank", k},
                            {"device", "cpu:" + std::to_string(k)},
                            {"step_ms", step_ms[i]},
                            {"compute_ms", k == 0 ? 50.0 : 80.0},
                            {"tp_exposed_ms", 5.0 * (k + 1)},
                            {"dp_exposed_ms", 20.0},
                            {"mem_current_bytes", 1048576.0},
                            {"mem_peak_bytes", 2097152.0 * (k + 1)},
                            {"skew_ms", 0.0}});
    out += j.dump() + "\n";
  }
  return out;
}

fs::path report_write(const std::string& name, const std::string& text) {
  const fs::path p = report_scratch() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

}  // namespace

TEST_CASE("report summarises a metrics file: medians, the slowest rank, the worst steps",
          "[report][unit]") {
  const fs::path f = report_write("run.jsonl", report_synthetic());
  const auto r = report_cli("report " + f.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("report: run.jsonl: 5 steps (1..5), 2 ranks, version 1"));
  CHECK_THAT(r.out, Catch::Contains("loss 4.500000 -> 3.200000 (min 3.000000 at step 4); val "
                                    "loss 3.400000 at step 5"));
  CHECK_THAT(r.out, Catch::Contains("lr 0.001 -> 0.0002"));
  // Medians: step 120 ms, tokens/s 900, MFU 3%.
  CHECK_THAT(r.out, Catch::Contains("median step 120.0 ms, 900 tokens/s, MFU 3.00%"));
  CHECK_THAT(r.out,
             Catch::Matches("[\\s\\S]*\\n +0 +cpu:0 +120.0 +50.0 +5.0 +20.0 +2.0 MiB\\n[\\s\\S]*"));
  CHECK_THAT(r.out, Catch::Matches(
                        "[\\s\\S]*\\n +1 +cpu:1 +120.0 +80.0 +10.0 +20.0 +4.0 MiB\\n[\\s\\S]*"));
  // The lower median of {50, 80} is rank 0's 50 ms: 80 / 50 = 1.6.
  CHECK_THAT(
      r.out,
      Catch::Contains("slowest rank: 1 (median compute 80.0 ms, 1.60x the median rank's 50.0 ms)"));
  CHECK_THAT(r.out, Catch::Contains("worst steps: 2 (300.0 ms), 5 (200.0 ms), 3 (120.0 ms)"));
  CHECK_THAT(r.out, Catch::Contains("skipped steps: 1; straggler: rank 1 from step 3"));
  // Two files: one summary each.
  const fs::path g = report_write("other.jsonl", report_synthetic(0.5));
  const auto two = report_cli("report " + f.string() + " " + g.string() + " --worst 1");
  REQUIRE(two.rc == 0);
  CHECK_THAT(two.out, Catch::Contains("report: other.jsonl: 5 steps") &&
                          Catch::Contains("loss 5.000000 -> 3.700000") &&
                          Catch::Contains("worst steps: 2 (300.0 ms)\n"));
}

TEST_CASE("report refuses malformed records naming the file and line", "[report][unit]") {
  const std::string good = report_synthetic();
  const std::string first = good.substr(0, good.find('\n') + 1);
  auto refused = [&](const std::string& name, const std::string& text, const std::string& why) {
    const fs::path p = report_write(name, text);
    const auto r = report_cli("report " + p.string());
    INFO(r.out << r.err);
    CHECK(r.rc != 0);
    CHECK_THAT(r.err, Catch::Contains(why));
  };
  nlohmann::json j = nlohmann::json::parse(first);
  j.erase("step");
  refused("nostep.jsonl", first + j.dump() + "\n", "nostep.jsonl:2: field 'step' is missing");
  const std::string two = good.substr(0, good.find('\n', first.size()) + 1);
  refused("notjson.jsonl", two + "{oops\n", "notjson.jsonl:3: not valid JSON");
  refused("twice.jsonl", first + first, "twice.jsonl:2: step 1 follows step 1: steps must rise");
  j = nlohmann::json::parse(first);
  j["ranks"][1]["compute_ms"] = "fast";
  refused("type.jsonl", j.dump() + "\n",
          "type.jsonl:1: field 'ranks[1].compute_ms' is \"fast\", not a number");
  j = nlohmann::json::parse(first);
  j["version"] = 99;
  refused("version.jsonl", j.dump() + "\n", "version.jsonl:1: version 99 is not one this meshrt");
  refused("schema.jsonl", "{\"step\": 1}\n", "schema.jsonl:1: field 'schema' is missing");
  refused("empty.jsonl", "", "empty.jsonl: no metrics record");
  const fs::path fifo = report_scratch() / "fifo.jsonl";
  fs::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const auto r = report_cli("report " + fifo.string());
  CHECK(r.rc != 0);
  CHECK_THAT(r.err, Catch::Contains("is a FIFO"));
  // A last line still being written (no newline yet) is left for later.
  const auto recs = meshrt::read_metrics_file(report_write("tail.jsonl", good + "{\"sch").string());
  CHECK(recs.size() == 5);
  CHECK(recs[4].val_loss == Approx(3.4));
  CHECK(std::isnan(recs[0].val_loss));
  // Blank lines hold no record; the line numbers of errors still count them.
  CHECK(
      meshrt::read_metrics_file(report_write("blank.jsonl", "\n" + good + " \n").string()).size() ==
      5);
  refused("blank2.jsonl", "\n\n{oops\n", "blank2.jsonl:3: not valid JSON");
}

TEST_CASE("report refuses negative numbers, and nulls where the schema has none",
          "[report][unit]") {
  const std::string good = report_synthetic();
  const nlohmann::json first = nlohmann::json::parse(good.substr(0, good.find('\n')));
  // The message of reading a file whose one record has field `ptr` set to `v` (or removed).
  auto refused = [&](const std::string& ptr, const nlohmann::json& v, bool remove = false) {
    nlohmann::json j = first;
    const nlohmann::json::json_pointer p(ptr);
    if (remove)
      j[p.parent_pointer()].erase(p.back());
    else
      j[p] = v;
    const fs::path file = report_write("fields.jsonl", j.dump() + "\n");
    try {
      meshrt::read_metrics_file(file.string());
    } catch (const meshrt::Error& e) {
      return e.message();
    }
    return std::string();
  };
  const std::string at = (report_scratch() / "fields.jsonl").string() + ":1: ";
  CHECK(refused("/step_ms", -5) == at + "field 'step_ms' is -5, not a number >= 0");
  CHECK(refused("/loss", -1.5) == at + "field 'loss' is -1.5, not a number >= 0");
  CHECK(refused("/lr", nullptr) == at + "field 'lr' is null, not a number >= 0");
  CHECK(refused("/loss", nullptr, /*remove=*/true) ==
        at + "field 'loss' is missing; give a number >= 0 (or null)");
  CHECK(refused("/tokens_per_s", "many") ==
        at + "field 'tokens_per_s' is \"many\", not a number >= 0");
  CHECK(refused("/mfu", -0.5) == at + "field 'mfu' is -0.5, not a number >= 0");
  CHECK(refused("/grad_norm", -1) == at + "field 'grad_norm' is -1, not a number >= 0");
  CHECK(refused("/skipped_steps", 3) ==
        at + "field 'skipped_steps' is 3, not an integer in [0, 1]");
  CHECK(refused("/skipped", "no") == at + "field 'skipped' is \"no\", not true or false");
  CHECK(refused("/step", 0) == at + "field 'step' is 0, not an integer >= 1");
  CHECK(refused("/straggler_rank", 2) ==
        at + "field 'straggler_rank' is 2, not an integer in [0, 1]");
  CHECK(refused("/ranks/1/mem_peak_bytes", -1) ==
        at + "field 'ranks[1].mem_peak_bytes' is -1, not a number >= 0");
  CHECK(refused("/ranks/0/skew_ms", nullptr) ==
        at + "field 'ranks[0].skew_ms' is null, not a number >= 0");
  CHECK(refused("/ranks/1/rank", 0) ==
        at + "field 'ranks[1].rank' is 0, not 1 (ranks are listed in rank order)");
  CHECK(refused("/ranks/1", 7) == at + "field 'ranks[1]' is 7, not an object");
  CHECK(refused("/ranks", nlohmann::json::array()) ==
        at + "field 'ranks' is [], not a list of one object per rank");
  // A loss or gradient norm that was not finite is written as null, and read as NaN.
  CHECK(refused("/loss", nullptr).empty());
  CHECK(refused("/grad_norm", nullptr).empty());
  // JSON has no NaN or Infinity: such a record is not JSON.
  const fs::path inf = report_write("inf.jsonl", "{\"loss\": 1e999}\n");
  const auto r = report_cli("report " + inf.string());
  CHECK(r.rc != 0);
  CHECK(r.err == "meshrt: error: " + inf.string() +
                     ":1: not valid JSON: number overflow parsing '1e999' (numbers must be finite: "
                     "JSON has no NaN or Infinity)\n");
}

TEST_CASE("report --plot draws one picture of several runs", "[report][unit]") {
  if (std::system("gnuplot --version >/dev/null 2>&1") != 0) {
    WARN("gnuplot is not installed: the plot is not tested");
    return;
  }
  const fs::path a = report_write("a.jsonl", report_synthetic()),
                 b = report_write("b.jsonl", report_synthetic(0.3)),
                 png = report_scratch() / "plot.png";
  fs::remove(png);
  const auto r = report_cli("report " + a.string() + " " + b.string() + " --plot " + png.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("wrote " + png.string() + " (2 runs)"));
  const std::string img = meshrt::test::slurp(png);
  REQUIRE(img.size() > 1000);
  CHECK(img.substr(0, 4) == "\x89PNG");
  // The plot may not replace an input.
  const auto same = report_cli("report " + a.string() + " --plot " + a.string());
  CHECK(same.rc != 0);
  CHECK_THAT(same.err, Catch::Contains("is the input"));
}

TEST_CASE("report's per-rank panels dash by quantity and colour by run and rank",
          "[report][unit]") {
  const fs::path a = report_write("dash-a.jsonl", report_synthetic()),
                 b = report_write("dash-b.jsonl", report_synthetic(0.3));
  const std::vector<meshrt::cli::ReportRun> runs = {{"A", meshrt::read_metrics_file(a.string())},
                                                    {"B", meshrt::read_metrics_file(b.string())}};
  const std::string script = meshrt::cli::report_gnuplot_script("/d/", runs);
  INFO(script);
  // Per-rank clauses: title "<run> r<rank> <what>" -> (column, colour, dash type).
  const std::regex clause(
      "'/d/f(\\d)\\.dat' using 1:(\\d+) with lines lc (\\d+) dt (\\d+) title '([AB]) r(\\d)"
      "( [a-z]+)?'");
  std::map<std::string, int> colour;
  int clauses = 0;
  for (auto it = std::sregex_iterator(script.begin(), script.end(), clause);
       it != std::sregex_iterator(); ++it, ++clauses) {
    const std::smatch& m = *it;
    const int file = std::stoi(m[1]), col = std::stoi(m[2]), rank = std::stoi(m[6]);
    const std::string what = m[7].length() ? m[7].str().substr(1) : "skew";
    INFO(m[0].str());
    CHECK(file == (m[5] == "A" ? 0 : 1));
    // Columns: step, 5 run series, then per rank compute, exposed, peak, current, skew.
    const std::map<std::string, int> field = {
        {"compute", 0}, {"exposed", 1}, {"peak", 2}, {"now", 3}, {"skew", 4}};
    REQUIRE(field.count(what) == 1);
    CHECK(col == 7 + 5 * rank + field.at(what));
    // The dash type is the quantity's, whatever the rank: solid compute and peak memory, dashed
    // exposed communication and current memory (as the panel titles say), solid skew.
    const int want_dash = what == "exposed" || what == "now" ? 2 : 1;
    CHECK(std::stoi(m[4]) == want_dash);
    // The colour is the (run, rank)'s: A r0 1, A r1 2, B r0 3, B r1 4, in every panel.
    CHECK(std::stoi(m[3]) == 1 + 2 * file + rank);
    colour[m[5].str() + std::to_string(rank)] = std::stoi(m[3]);
  }
  CHECK(clauses == 5 * 2 * 2);  // 5 quantities x 2 runs x 2 ranks
  CHECK(colour.size() == 4);
  CHECK_THAT(script, Catch::Contains("compute (solid) and exposed communication (dashed)") &&
                         Catch::Contains("solid: peak, dashed: current"));
  // Every panel pads its y range (a constant LR or memory peak is not drawn on the border), and
  // the LR panel alone labels its ticks with 4 significant digits.
  const size_t offsets = script.find("set offsets 0, 0, graph 0.05, graph 0.05\n"),
               first_plot = script.find("\nplot "), lr = script.find("set title 'learning rate'"),
               fmt = script.find("set format y '%.4g'\nplot "),
               reset = script.find("set format y '% h'\n");
  REQUIRE(offsets != std::string::npos);
  CHECK(offsets < first_plot);
  REQUIRE(fmt != std::string::npos);
  REQUIRE(reset != std::string::npos);
  CHECK(lr < fmt);
  CHECK(fmt < reset);
  CHECK(script.find("set title", lr + 1) > reset);
}

TEST_CASE("a rank slowed by --fault slow is named a straggler by train and by report",
          "[report][train][multirank]") {
  // Rank 1 sleeps 300 ms before each collective it issues (its dp all-reduces come during its
  // backward): its compute is many times rank 0's whatever the machine's load.
  const fs::path m = report_scratch() / "slow.jsonl";
  const auto r = report_cli(
      "train --devices cpu:2 --hidden 32 --heads 2 --seq 16 --batch 4 --vocab 64 --layers 1 "
      "--steps 4 --straggler-steps 2 --fault slow@rank=1,step=1,ms=300 --metrics " +
      m.string());
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("warning: straggler: rank 1 (cpu:1) computes "));
  // Rank 1 stays slow through steps 3 and 4: the warning still comes once.
  size_t warnings = 0;
  for (size_t at = r.out.find("warning: straggler"); at != std::string::npos;
       at = r.out.find("warning: straggler", at + 1))
    ++warnings;
  CHECK(warnings == 1);
  CHECK_THAT(r.out, Catch::Contains("for 2 steps in a row (to step 2; --straggler-threshold 1.2)"));
  CHECK_THAT(r.out, Catch::Contains("; straggler: rank 1 (cpu:1) "));
  CHECK_THAT(r.out, !Catch::Contains("straggler: rank 0"));
  const auto recs = meshrt::read_metrics_file(m.string());
  REQUIRE(recs.size() == 4);
  CHECK(recs[0].straggler_rank == -1);
  for (size_t i = 1; i < 4; ++i) CHECK(recs[i].straggler_rank == 1);
  for (const auto& rec : recs) CHECK(rec.ranks[1].compute_ms > 300);
  const auto rep = report_cli("report " + m.string());
  INFO(rep.out << rep.err);
  REQUIRE(rep.rc == 0);
  CHECK_THAT(rep.out, Catch::Contains("slowest rank: 1 ") &&
                          Catch::Contains("straggler: rank 1 from step 2"));
}

TEST_CASE("straggler flags that could not mean a straggler are refused", "[report][train][unit]") {
  for (auto [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"--straggler-threshold 0", "'0' is not a number > 1"},
           {"--straggler-threshold 1", "'1' is not a number > 1"},
           {"--straggler-threshold 0.5", "'0.5' is not a number > 1"},
           {"--straggler-threshold nan", "'nan' is not a number > 1"},
           {"--straggler-steps 0", "'0' is not an integer >= 1"}}) {
    const auto r = report_cli(
        "train --devices cpu:1 --hidden 32 --heads 2 --seq 16 --batch 4 "
        "--vocab 64 --layers 1 --steps 1 " +
        args);
    INFO(r.out << r.err);
    CHECK(r.rc != 0);
    CHECK_THAT(r.err, Catch::Contains(args.substr(0, args.find(' '))) && Catch::Contains(msg));
  }
}
