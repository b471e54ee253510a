// The `meshrt` command line, parsed and validated without running anything: main() runs what it
// parsed, the CLI fuzz target (tests/fuzz/fuzz_cli.cpp) feeds it argument vectors.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>

#include "tools/bench_cli.h"
#include "tools/doctor.h"
#include "tools/report.h"
#include "tools/train.h"
#include "tools/tune.h"

namespace meshrt::cli {

class MeshrtCli {
 public:
  MeshrtCli();
  MeshrtCli(const MeshrtCli&) = delete;
  MeshrtCli& operator=(const MeshrtCli&) = delete;

  CLI::App& app() { return app_; }
  // Parses `argv` (argv[0] is the program). Throws CLI::ParseError as CLI11 does (also for --help
  // and --version, and for a command name that does not exist, naming the ones that do).
  void parse(int argc, const char* const* argv);
  // After parse: the chosen command's checks that need no run (meshrt::Error saying what to
  // change).
  void validate();
  // Runs the parsed command; returns its exit status. Throws as the command does.
  int run(int argc, char** argv, std::ostream& os);

 private:
  CLI::App app_;
  CLI::App* info_ = nullptr;
  CLI::App* train_ = nullptr;
  TrainCliOptions train_opts_;
  CLI::App* doctor_ = nullptr;
  DoctorCliOptions doctor_opts_;
  CLI::App* report_ = nullptr;
  ReportCliOptions report_opts_;
  CLI::App* tune_ = nullptr;
  TuneCliOptions tune_opts_;
  BenchCommands bench_;
};

}  // namespace meshrt::cli
