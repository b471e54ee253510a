// The `meshrt` command line (tools/cli.h): the input split at NUL bytes is an argument vector,
// parsed and validated by the real CLI11 setup; nothing runs. CLI11's parse errors and meshrt's
// validation errors are the expected outcomes; a crash, a hang or another exception is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"meshrt"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  if (args.size() > 64) return 0;
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  meshrt::cli::MeshrtCli cli;
  try {
    cli.parse(static_cast<int>(argv.size()), argv.data());
    cli.validate();
  } catch (const CLI::Error&) {
  } catch (const meshrt::Error&) {
  }
  return 0;
}
