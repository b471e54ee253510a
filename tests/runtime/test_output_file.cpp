// OutputFile: unique temporary names, symlinks followed, non-regular targets refused, failures
// leave nothing behind, two outputs naming one file refused.
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/error.h"
#include "runtime/output_file.h"

using namespace meshrt;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("meshrt-outfile-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t entries(const fs::path& d) {
  size_t n = 0;
  for (auto it = fs::directory_iterator(d); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

}  // namespace

TEST_CASE("output files replace the target whole and leave no temporary", "[unit]") {
  const fs::path d = scratch("basic");
  const std::string p = (d / "out.json").string();
  write_output_file(p, "first\n", "--json");
  REQUIRE(read(p) == "first\n");
  write_output_file(p, "second\n", "--json");
  REQUIRE(read(p) == "second\n");
  REQUIRE(entries(d) == 1);
  // A name of 255 bytes (NAME_MAX): the temporary beside it shortens its copy of the name.
  const std::string longest = (d / (std::string(250, 'x') + ".json")).string();
  write_output_file(longest, "long\n", "--json");
  REQUIRE(read(longest) == "long\n");
  REQUIRE(entries(d) == 2);
  fs::remove_all(d);
}

TEST_CASE("two writers of one path use distinct temporaries and the last commit wins", "[unit]") {
  const fs::path d = scratch("two");
  const std::string p = (d / "same.txt").string();
  OutputFile a(p, "--dump"), b(p, "--dump");
  REQUIRE(a.temp_path() != b.temp_path());
  a.write("aaaa");
  b.write("bb");
  a.commit();
  REQUIRE(read(p) == "aaaa");
  b.commit();
  REQUIRE(read(p) == "bb");
  REQUIRE(entries(d) == 1);
  fs::remove_all(d);
}

TEST_CASE("an output file abandoned or failed leaves the target as it was", "[unit]") {
  const fs::path d = scratch("abandon");
  const std::string p = (d / "keep.txt").string();
  write_output_file(p, "old", "--trace");
  {
    OutputFile f(p, "--trace");
    f.write("half");
  }  // destroyed without commit (an exception on the way)
  REQUIRE(read(p) == "old");
  REQUIRE(entries(d) == 1);
  // The target turned into a directory after the file was opened: refused at commit.
  const std::string q = (d / "late").string();
  OutputFile g(q, "--trace");
  g.write("x");
  fs::create_directory(q);
  REQUIRE_THROWS_WITH(g.commit(), Catch::Contains("--trace " + q + " is a directory"));
  REQUIRE(entries(d) == 2);  // keep.txt and the directory: no temporary
  fs::remove_all(d);
}

TEST_CASE("a symlink is followed: the file it names is replaced, the link stays", "[unit]") {
  const fs::path d = scratch("link");
  fs::create_directories(d / "real");
  const fs::path target = d / "real" / "t.json";
  write_output_file(target.string(), "old", "--json");
  fs::create_symlink("real/t.json", d / "link.json");     // relative to the link's dir
  fs::create_symlink(d / "link.json", d / "link2.json");  // a chain, absolute
  write_output_file((d / "link2.json").string(), "new", "--json");
  REQUIRE(fs::is_symlink(d / "link.json"));
  REQUIRE(fs::is_symlink(d / "link2.json"));
  REQUIRE(read(target) == "new");
  REQUIRE(resolve_output_path((d / "link2.json").string(), "--json") ==
          (d / "real" / "t.json").string());
  // A dangling link creates the file it names.
  fs::create_symlink("real/new.json", d / "dangling.json");
  write_output_file((d / "dangling.json").string(), "made", "--json");
  REQUIRE(fs::is_symlink(d / "dangling.json"));
  REQUIRE(read(d / "real" / "new.json") == "made");
  // A loop is refused, naming the path.
  fs::create_symlink("loop-b", d / "loop-a");
  fs::create_symlink("loop-a", d / "loop-b");
  REQUIRE_THROWS_WITH(write_output_file((d / "loop-a").string(), "x", "--json"),
                      Catch::Contains("symbolic links"));
  fs::remove_all(d);
}

TEST_CASE("device nodes, directories and FIFOs are refused before anything is written", "[unit]") {
  REQUIRE_THROWS_WITH(write_output_file("/dev/null", "x", "--dump"),
                      Catch::Contains("--dump /dev/null is a character device"));
  REQUIRE_THROWS_WITH(check_output_path("/dev/full", "--json"),
                      Catch::Contains("--json /dev/full is a character device"));
  const fs::path d = scratch("kinds");
  REQUIRE_THROWS_WITH(write_output_file(d.string(), "x", "--trace"),
                      Catch::Contains("is a directory"));
  const fs::path fifo = d / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THROWS_WITH(write_output_file(fifo.string(), "x", "--json"),
                      Catch::Contains("is a FIFO"));
  fs::create_symlink("/dev/null", d / "null-link");
  REQUIRE_THROWS_WITH(
      write_output_file((d / "null-link").string(), "x", "--dump"),
      Catch::Contains("a link to /dev/null") && Catch::Contains("is a character device"));
  REQUIRE(fs::is_character_file("/dev/null"));
  REQUIRE_THROWS_WITH(check_output_path((d / "no-dir" / "x").string(), "--json"),
                      Catch::Contains("does not exist"));
  REQUIRE(entries(d) == 2);  // fifo and null-link
  fs::remove_all(d);
}

TEST_CASE("two outputs naming one file are refused", "[unit]") {
  const fs::path d = scratch("distinct");
  const std::string a = (d / "a.json").string();
  REQUIRE_NOTHROW(check_distinct_outputs({{"--json", a}, {"--trace", (d / "b").string()}}));
  REQUIRE_NOTHROW(check_distinct_outputs({{"--json", a}, {"--trace", ""}, {"--dump", ""}}));
  REQUIRE_THROWS_WITH(check_distinct_outputs({{"--json", a}, {"--trace", a}}),
                      Catch::Contains("--json " + a + " and --trace " + a + " name the same file"));
  REQUIRE_THROWS_WITH(
      check_distinct_outputs({{"--json", a}, {"--trace", (d / "." / "a.json").string()}}),
      Catch::Contains("name the same file"));
  fs::create_symlink("a.json", d / "alias.json");
  REQUIRE_THROWS_WITH(
      check_distinct_outputs({{"--json", a}, {"--dump", (d / "alias.json").string()}}),
      Catch::Contains("name the same file"));
  write_output_file(a, "x", "--json");
  fs::create_hard_link(a, d / "hard.json");
  REQUIRE_THROWS_WITH(
      check_distinct_outputs({{"--json", a}, {"--dump", (d / "hard.json").string()}}),
      Catch::Contains("name the same file"));
  fs::remove_all(d);
}

TEST_CASE("an output naming one of the run's inputs, or a file inside one, is refused", "[unit]") {
  const fs::path d = scratch("spare");
  const std::string data = (d / "tokens.u16").string(), ck = (d / "ck").string();
  write_output_file(data, "tokens", "test");
  fs::create_directories(d / "ck" / "step-00000004");
  write_output_file((d / "ck" / "step-00000004" / "index.json").string(), "{}", "test");
  const std::vector<std::pair<std::string, std::string>> in = {
      {"--data", data}, {"--resume", ck}, {"--cluster", "cpu"}};
  REQUIRE_NOTHROW(check_outputs_spare_inputs({{"--metrics", (d / "m.jsonl").string()}}, in));
  REQUIRE_NOTHROW(check_outputs_spare_inputs({{"--metrics", ""}}, in));
  REQUIRE_NOTHROW(check_outputs_spare_inputs({{"--json", (d / "ck2.json").string()}}, in));
  REQUIRE_THROWS_WITH(check_outputs_spare_inputs({{"--metrics", data}}, in),
                      Catch::Contains("--metrics " + data + " is the input --data " + data));
  fs::create_symlink("tokens.u16", d / "link.u16");
  REQUIRE_THROWS_WITH(check_outputs_spare_inputs({{"--json", (d / "link.u16").string()}}, in),
                      Catch::Contains("is the input --data"));
  const std::string index = (d / "ck" / "step-00000004" / "index.json").string();
  REQUIRE_THROWS_WITH(check_outputs_spare_inputs({{"--metrics", index}}, in),
                      Catch::Contains("lies inside the input --resume " + ck));
  REQUIRE_THROWS_WITH(
      check_outputs_spare_inputs({{"--metrics", (d / "ck" / "new.jsonl").string()}}, in),
      Catch::Contains("lies inside the input --resume"));
  CHECK(read(data) == "tokens");  // nothing was written
  fs::remove_all(d);
}
