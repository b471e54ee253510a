// `meshrt bench <name>` and the top-level benchmark commands (`meshrt sweep`), one per entry of
// the benchmark registry (tools/cli/command.h).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <utility>
#include <vector>

#include "tools/cli/command.h"

namespace meshrt::cli {

struct BenchCommands {
  std::vector<std::pair<CLI::App*, std::unique_ptr<bench::Command>>> commands;
};

// Registers `bench` with a subcommand per registry entry, and the top-level entries, on `app`.
void add_bench_commands(CLI::App& app, BenchCommands& b);
// The command that was parsed, or nullptr when none was.
bench::Command* parsed_bench_command(const BenchCommands& b);

}  // namespace meshrt::cli
