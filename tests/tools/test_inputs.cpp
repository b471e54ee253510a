// What meshrt's readers of user files do with hostile input, as a user meets it through `meshrt`:
// JSON nested ~100k levels deep (each reader refuses it naming the file, none crashes), and error
// messages that show at most the start of a value.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/json_field.h"
#include "runtime/safetensors.h"
#include "tests/common/files.h"

namespace fs = std::filesystem;

namespace {

using meshrt::test::Run;

fs::path inputs_scratch() {
  static const fs::path d = meshrt::test::scratch_dir("inputs");
  return d;
}

Run inputs_cli(const std::string& args) {
  return meshrt::test::run_program(MESHRT_CLI_BIN, args, inputs_scratch());
}

// `levels` arrays nested in each other: 2 x levels bytes.
std::string deep_json(size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); }

fs::path write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

constexpr const char* kTooDeep = "arrays and objects nest more than 64 levels deep";

}  // namespace

TEST_CASE("JSON nested past 64 levels is refused while parsing, naming where", "[unit]") {
  // 64 levels are read; 65 are not; 100k are refused the same way (no stack overflow).
  CHECK(meshrt::parse_json_text(deep_json(64), "f.json").is_array());
  for (size_t levels : {size_t{65}, size_t{100000}}) {
    INFO(levels);
    CHECK_THROWS_WITH(
        meshrt::parse_json_text(deep_json(levels), "f.json"),
        Catch::StartsWith("f.json: not valid JSON here: ") && Catch::Contains(kTooDeep));
    CHECK_THROWS_WITH(meshrt::parse_ordered_json_text("{\"a\":" + deep_json(levels) + "}", "g"),
                      Catch::StartsWith("g: not valid JSON here") && Catch::Contains(kTooDeep));
    CHECK_THROWS_WITH(meshrt::parse_json_or_discarded(deep_json(levels), "h"),
                      Catch::Contains(kTooDeep));
  }
  // Text that is not JSON stays a discarded value for the caller to name.
  CHECK(meshrt::parse_json_or_discarded("[1,", "h").is_discarded());
}

TEST_CASE("an error shows at most the first 60 characters of a value", "[unit]") {
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string shown = meshrt::json_value_text(big);
  CHECK(shown == "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,...");
  CHECK(meshrt::json_value_text(nlohmann::json(std::string(1000, 'x'))) ==
        "\"" + std::string(56, 'x') + "...");
  CHECK(meshrt::json_value_text(nlohmann::json{{"a", 1}}) == "{\"a\":1}");
  CHECK(meshrt::json_value_text(nlohmann::json(-1)) == "-1");
  const nlohmann::json deep = meshrt::parse_json_text(deep_json(64), "");
  CHECK(meshrt::json_value_text(deep) == std::string(57, '[') + "...");
  // The fields' errors use it.
  nlohmann::json obj = {{"hidden", big}};
  CHECK_THROWS_WITH(
      meshrt::JsonFields<nlohmann::json>(obj, "c.json").integer("hidden", 1, 9),
      Catch::StartsWith("c.json: field 'hidden' is " + shown + ", not an integer in [1, 9]"));
}

TEST_CASE("every reader of a JSON file refuses one nested 100k levels deep, naming it", "[unit]") {
  const std::string deep = deep_json(100000);
  const fs::path d = inputs_scratch();
  const fs::path cluster = write_file(d / "cluster.json", deep);
  const fs::path sweep = write_file(d / "sweep.json", "{\"results\":" + deep + "}");
  const fs::path metrics = write_file(d / "metrics.jsonl", deep + "\n");
  const fs::path flight = write_file(d / "flight-rank0.json", deep);
  const fs::path tune = d / "tune-out";
  write_file(tune / "tune-state.json", deep);
  const fs::path step = d / "ckpt" / "step-00000002";
  write_file(step / "index.json", "{\"format\":" + deep + "}");
  const std::string model = "--hidden 64 --heads 4 --seq 16 --batch 2 --vocab 64 --layers 1";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --model hidden=256,heads=4,ffn=1024,layers=2,seq=128 --global-batch 16 --cluster " +
           cluster.string(),
       cluster.string()},
      {"plan --cluster h100-sxm:8 --compare " + sweep.string(), sweep.string()},
      {"report " + metrics.string(), metrics.string() + ":1"},
      {"doctor " + flight.string(), flight.string()},
      {"tune --devices cpu:1 --steps 2 " + model + " --grid-lr 1e-3 --out " + tune.string(),
       (tune / "tune-state.json").string()},
      {"train --devices cpu:1 --steps 3 " + model + " --resume " + step.string(),
       (step / "index.json").string()},
  };
  for (const auto& [args, file] : cases) {
    const Run r = inputs_cli(args);
    INFO(args << "\n" << r.err);
    CHECK_FALSE(r.signaled);
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains(file) && Catch::Contains(kTooDeep));
    CHECK(r.err.size() < 2000);  // the value is never echoed back
  }
}

namespace {

const std::string kTiny = "--hidden 32 --heads 2 --layers 1 --seq 16 --batch 4 --vocab 64";

// `n` raw u16 tokens below 64 drawn from `seed` (a different seed: another stream of the same
// length).
fs::path token_file(const std::string& name, size_t n, unsigned seed) {
  std::string out;
  unsigned x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    out += static_cast<char>((x >> 16) % 64);
    out += '\0';
  }
  return write_file(inputs_scratch() / name, out);
}

// The entries of `dir` whose names start with `prefix`.
std::vector<std::string> entries_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0)
      found.push_back(e.path().filename().string());
  return found;
}

}  // namespace

TEST_CASE("train --resume refuses another token stream of the same length unless told",
          "[train][unit]") {
  const fs::path a = token_file("a.u16", 4096, 1), b = token_file("b.u16", 4096, 2);
  const fs::path ck = inputs_scratch() / "ck-data";
  fs::remove_all(ck);
  const std::string base = "train --devices cpu:1 " + kTiny;
  Run r = inputs_cli(base + " --steps 2 --data " + a.string() + " --save " + ck.string());
  REQUIRE(r.rc == 0);
  const fs::path index = ck / "step-00000002" / "index.json";
  const nlohmann::json idx = nlohmann::json::parse(meshrt::test::slurp(index));
  REQUIRE(idx["data"].contains("tokens_digest"));
  const std::string digest = idx["data"]["tokens_digest"];
  CHECK(digest.rfind("crc32c:", 0) == 0);
  // Another file of the same length: refused, naming both digests and the override.
  r = inputs_cli(base + " --steps 3 --data " + b.string() + " --resume " + ck.string());
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("was saved training on tokens whose digest is " + digest) &&
                        Catch::Contains("pass --resume-other-data"));
  CHECK(r.out.find("step 3") == std::string::npos);
  // The same file rewritten in place: refused alike.
  const std::string original = meshrt::test::slurp(a);
  fs::copy_file(b, a, fs::copy_options::overwrite_existing);
  r = inputs_cli(base + " --steps 3 --data " + a.string() + " --resume " + ck.string());
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("was saved training on tokens whose digest is " + digest));
  write_file(a, original);
  // The same data resumes; --resume-other-data continues on another.
  r = inputs_cli(base + " --steps 3 --data " + a.string() + " --resume " + ck.string() +
                 "/step-00000002");
  INFO(r.err);
  CHECK(r.rc == 0);
  r = inputs_cli(base + " --steps 3 --data " + b.string() + " --resume " + ck.string() +
                 "/step-00000002 --resume-other-data");
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("step 3"));
  // A checkpoint written before the digest existed resumes on any stream of its length.
  nlohmann::json old = idx;
  old["data"].erase("tokens_digest");
  write_file(index, old.dump(2));
  r = inputs_cli(base + " --steps 3 --data " + b.string() + " --resume " + ck.string() +
                 "/step-00000002");
  INFO(r.err);
  CHECK(r.rc == 0);
  // The override goes with --resume.
  r = inputs_cli(base + " --steps 3 --data " + b.string() + " --resume-other-data");
  CHECK(r.rc != 0);
  CHECK_THAT(r.err, Catch::Contains("--resume-other-data requires --resume"));
}

TEST_CASE("a --metrics write error mid-run is one error about the file, not a fault",
          "[train][multirank]") {
  const fs::path tmp = inputs_scratch() / "tmp-metrics";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const fs::path m = inputs_scratch() / "limited.jsonl", err = inputs_scratch() / "limited.err";
  // 2 ranks, records of ~700 bytes: the second one passes the 1024-byte limit.
  const std::string cmd = "TMPDIR=" + tmp.string() + " bash -c 'ulimit -f 1; exec \"$0\" train " +
                          "--devices cpu:2 " + kTiny + " --steps 6 --metrics " + m.string() + "' " +
                          meshrt::test::sh_quote(MESHRT_CLI_BIN) + " >/dev/null 2>" + err.string();
  const int st = std::system(cmd.c_str());
  const std::string e = meshrt::test::slurp(err);
  INFO(e);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 1);
  CHECK_THAT(e, Catch::Contains("meshrt: error: ") && Catch::Contains("train: step ") &&
                    Catch::Contains("--metrics " + m.string() + ": write failed after ") &&
                    Catch::Contains("File too large"));
  size_t errors = 0;
  for (size_t at = e.find("meshrt: error"); at != std::string::npos;
       at = e.find("meshrt: error", at + 1))
    ++errors;
  CHECK(errors == 1);
  CHECK(e.find("flight") == std::string::npos);
  CHECK(entries_starting(tmp, "meshrt-flight").empty());
}

TEST_CASE("train reports a write error on standard output like the other commands", "[unit]") {
  const fs::path script =
      write_file(inputs_scratch() / "full.sh",
                 meshrt::test::sh_quote(MESHRT_CLI_BIN) + " train --devices cpu:1 " + kTiny +
                     " --steps 2 >/dev/full\necho \"exit status $?\" >&2\n");
  const Run r = meshrt::test::run_shell("sh " + script.string(), inputs_scratch());
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("meshrt: error: writing standard output failed") &&
                        Catch::Contains("exit status 1"));
}

TEST_CASE("train refuses flags and settings it would ignore, naming what to change", "[unit]") {
  const fs::path tok = token_file("flags.u16", 2048, 3);
  const std::string base = "train --devices cpu:1 " + kTiny + " --steps 1 ";
  const std::string two = "train --devices cpu:2 " + kTiny + " --steps 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {base + "--data-dtype u32",
       "--data-dtype u32 would be ignored: it is the element type of a raw --data"},
      {base + "--staleness 2",
       "--staleness 2 would be ignored: it delays the gradients of --grad-sync async, and "
       "--grad-sync is sync; drop --staleness or use --grad-sync async"},
      {base + "--grad-sync async --sync-every 3", "--sync-every 3 would be ignored"},
      {base + "--eval-batches 2 --data " + tok.string(),
       "--eval-batches 2 would be ignored: it sizes the validation loss on --val-data"},
      {base + "--peak-tflops 10", "--peak-tflops 10 would be ignored: MFU goes into the --metrics"},
      {base + "--no-compare", "--no-compare would be ignored"},
      {base + "--compare", "--compare would be ignored"},
      {two + "--sp",
       "--sp would be ignored: sequence parallelism splits the tp blocks' "
       "activations and --mesh dp=2 (the default) has tp=1; drop --sp or give a "
       "mesh with tp > 1 (e.g. --mesh tp=2)"},
      {two + "--overlap chunked", "--overlap chunked would be ignored"},
      {two + "--mesh tp=2 --bucket-mb 4",
       "--bucket-mb 4 would be ignored: it sizes the dp gradient buckets and --mesh tp=2 has "
       "dp=1"},
      {base + "--bf16-grads", "--bf16-grads would be ignored"},
      {"tune --devices cpu:1 --grid-mesh '' --out " + (inputs_scratch() / "t").string(),
       "--grid-mesh: an empty value is not accepted"},
      {"tune --devices cpu:1 --grid-batch '' --out " + (inputs_scratch() / "t").string(),
       "--grid-batch: an empty value is not accepted"},
      {"tune --devices cpu:1 --grid-micro-batches '' --out " + (inputs_scratch() / "t").string(),
       "--grid-micro-batches: an empty value is not accepted"},
      {"train --devices cpu:1 --backend bogus " + kTiny + " --steps 1",
       "unknown collective backend 'bogus'"},
      {"bench block --devices cpu:2 --backend mpi --seq 16 --hidden 32 --heads 2 --steps 1 "
       "--warmup 0 --no-calibrate",
       "--backend mpi cannot run 2 ranks as threads on cpu"},
  };
  for (const auto& [args, why] : cases) {
    const Run r = inputs_cli(args);
    INFO(args << "\n" << r.err);
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains(why));
    CHECK(r.out.find("step 1") == std::string::npos);  // refused before any step
  }
  // What they act on, they are accepted with.
  for (const std::string& ok :
       {base + "--grad-sync async --staleness 1 --no-compare", two + "--mesh tp=2 --sp",
        two + "--bf16-grads --bucket-mb 4", two + "--backend host"}) {
    const Run r = inputs_cli(ok);
    INFO(ok << "\n" << r.err);
    CHECK(r.rc == 0);
  }
}

TEST_CASE("a rendezvous without RANK / WORLD_SIZE and a bad checkpoint fault hook are refused",
          "[unit]") {
  const std::string run = std::string(meshrt::test::sh_quote(MESHRT_CLI_BIN)) +
                          " train --devices cpu:1 " + kTiny + " --steps 1";
  Run r = meshrt::test::run_shell(
      "MESHRT_RENDEZVOUS=file://" + inputs_scratch().string() + "/rdv " + run, inputs_scratch());
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("would be ignored: it is the rendezvous of processes") &&
                        Catch::Contains("RANK / WORLD_SIZE are not set"));
  const std::string save = " --save " + (inputs_scratch() / "ck-fault").string();
  for (const auto& [hook, why] : std::vector<std::pair<std::string, std::string>>{
           {"rank=abc", "MESHRT_CHECKPOINT_FAULT='rank=abc': rank 'abc' is not a rank of this run"},
           {"rank=1",
            "rank '1' is not a rank of this run; use rank=R[,mode=kill|throw] with R in "
            "[0, 1)"},
           {"garbage", "'garbage' is not rank=R or mode=kill|throw"},
           {"rank=0,mode=boom", "'mode=boom' is not rank=R or mode=kill|throw"}}) {
    r = meshrt::test::run_shell("MESHRT_CHECKPOINT_FAULT=" + hook + " " + run + save,
                                inputs_scratch());
    INFO(hook << "\n" << r.err);
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains(why));
    CHECK(r.out.find("step 1") == std::string::npos);  // before training, not at the save
  }
}

TEST_CASE("report --plot bounds its wait on gnuplot and removes its folder however it ends",
          "[unit]") {
  const fs::path dir = inputs_scratch() / "plot";
  fs::remove_all(dir);
  fs::create_directories(dir / "bin");
  fs::create_directories(dir / "tmp");
  // A gnuplot that never exits (it says it started first).
  write_file(dir / "bin" / "gnuplot",
             "#!/bin/sh\ntouch " + (dir / "started").string() + "\nexec sleep 100000\n");
  fs::permissions(dir / "bin" / "gnuplot", fs::perms::owner_all);
  const fs::path m = dir / "m.jsonl";
  Run r = inputs_cli("train --devices cpu:1 " + kTiny + " --steps 2 --metrics " + m.string());
  REQUIRE(r.rc == 0);
  const std::string env =
      "PATH=" + (dir / "bin").string() + ":$PATH TMPDIR=" + (dir / "tmp").string() + " ";
  const std::string report = std::string(meshrt::test::sh_quote(MESHRT_CLI_BIN)) + " report " +
                             m.string() + " --plot " + (dir / "p.png").string();
  r = meshrt::test::run_shell(env + "MESHRT_PLOT_TIMEOUT=1 " + report, dir);
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("--plot: gnuplot did not finish within 1 s "
                                    "(MESHRT_PLOT_TIMEOUT) and was stopped"));
  CHECK(entries_starting(dir / "tmp", "meshrt-plot-").empty());
  CHECK_FALSE(fs::exists(dir / "p.png"));
  // SIGTERM while it waits: 128 + 15, the folder removed. The script waits for the fake gnuplot
  // to start (no timing assumed; the bound only keeps a broken run from hanging the test), then
  // signals meshrt.
  fs::remove(dir / "started");
  const fs::path script =
      write_file(dir / "term.sh", env + report + " &\npid=$!\nn=0\nwhile [ ! -e " +
                                      (dir / "started").string() +
                                      " ] && [ $n -lt 2400 ]; do sleep 0.05; n=$((n + 1)); done\n"
                                      "kill -TERM $pid\nwait $pid\necho \"exit status $?\" >&2\n");
  r = meshrt::test::run_shell("sh " + script.string(), dir);
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("--plot: stopped by SIGTERM while gnuplot drew the plot") &&
                        Catch::Contains("exit status 143"));
  CHECK(entries_starting(dir / "tmp", "meshrt-plot-").empty());
}

TEST_CASE("a safetensors header nested 100k levels deep is refused, not rendered", "[unit]") {
  // A tensor whose shape is 100k arrays deep: refused while the header is parsed, naming the file
  // (rendering the shape in an error recursed once per level).
  const std::string header =
      "{\"t\":{\"dtype\":\"F32\",\"shape\":" + deep_json(100000) + ",\"data_offsets\":[0,0]}}";
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  const fs::path p = write_file(inputs_scratch() / "deep.safetensors", bytes + header);
  CHECK_THROWS_WITH(meshrt::load_safetensors(p.string(), meshrt::make_host_caching_allocator()),
                    Catch::Contains(p.string()) && Catch::Contains("more than 64 levels deep"));
}
