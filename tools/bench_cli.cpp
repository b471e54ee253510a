#include "tools/bench_cli.h"

#include <string>

namespace meshrt::cli {

void add_bench_commands(CLI::App& app, BenchCommands& b) {
  std::string names;
  for (const bench::Entry& e : bench::registry())
    if (!e.top_level) names += (names.empty() ? "" : ", ") + e.name;
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: " + names);
  bench->require_subcommand(1);
  for (const bench::Entry& e : bench::registry()) {
    CLI::App* c = (e.top_level ? app : *bench).add_subcommand(e.name, e.description);
    std::unique_ptr<bench::Command> cmd = e.make();
    bench::bind_flags(*c, *cmd);
    b.commands.emplace_back(c, std::move(cmd));
  }
}

bench::Command* parsed_bench_command(const BenchCommands& b) {
  for (const auto& [app, cmd] : b.commands)
    if (app->parsed()) return cmd.get();
  return nullptr;
}

}  // namespace meshrt::cli
