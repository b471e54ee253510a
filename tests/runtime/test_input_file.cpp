// runtime/input_file.h: regular files are read whole; FIFOs, devices and directories are refused
// before any byte is read (never a wait for a writer, never an endless read); the size cap holds.
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "tests/common/files.h"

namespace fs = std::filesystem;

namespace {

fs::path input_scratch() { return meshrt::test::scratch_dir("input-file"); }

}  // namespace

TEST_CASE("input files: a regular file is read whole, within its cap", "[unit]") {
  const fs::path p = input_scratch() / "a.txt";
  std::ofstream(p) << "hello";
  CHECK(meshrt::read_input_file(p.string(), "--x", 0) == "hello");
  CHECK(meshrt::read_input_file(p.string(), "--x", 5) == "hello");
  CHECK_THROWS_WITH(meshrt::read_input_file(p.string(), "--x", 4),
                    Catch::StartsWith("--x " + p.string() +
                                      ": 5 bytes is more than the 4 bytes such a file may have; "
                                      "is it the right file?"));
  meshrt::InputFile f(p.string(), "--x");
  CHECK(f.size() == 5);
  CHECK(f.fd() >= 0);
}

TEST_CASE("input files: FIFOs, devices, directories and missing files are refused", "[unit]") {
  const fs::path fifo = input_scratch() / "f.fifo";
  fs::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Without O_NONBLOCK this open would wait for a writer for ever.
  CHECK_THROWS_WITH(meshrt::InputFile(fifo.string(), "--data"),
                    Catch::StartsWith("--data " + fifo.string() +
                                      ": is a FIFO (named pipe), not a regular file; give a "
                                      "regular file (copy a stream to a file first)"));
  CHECK_THROWS_WITH(meshrt::read_input_file("/dev/zero", "--cluster", 1 << 20),
                    Catch::StartsWith("--cluster /dev/zero: is a character device, not a regular "
                                      "file"));
  CHECK_THROWS_WITH(meshrt::InputFile(input_scratch().string(), "--data"),
                    Catch::Contains(": is a directory, not a regular file"));
  CHECK_THROWS_WITH(meshrt::InputFile((input_scratch() / "none").string(), "--data"),
                    Catch::Contains("none: cannot open (No such file or directory)"));
}
