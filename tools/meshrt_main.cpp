// The `meshrt` command line: info, train, doctor, and the benchmark registry's commands (`bench
// <name>`, `sweep`).
#include <CLI/CLI.hpp>

#include <iostream>

#include "bench/common/command.h"
#include "meshrt/version.h"
#include "tools/bench_cli.h"
#include "tools/blas_env.h"
#include "tools/doctor.h"
#include "tools/info.h"
#include "tools/train.h"

int main(int argc, char** argv) {
  meshrt::cli::maybe_reexec_for_blas(argc, argv);
  CLI::App app{"meshrt: a runtime for mixed data + tensor parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshrt " MESHRT_VERSION_STRING);
  auto* info = app.add_subcommand("info",
                                  "Devices found, why CUDA is unavailable if it is, "
                                  "library versions and build options");
  meshrt::cli::TrainCliOptions train_opts;
  auto* train = meshrt::cli::add_train_command(app, train_opts);
  meshrt::cli::DoctorCliOptions doctor_opts;
  auto* doctor = meshrt::cli::add_doctor_command(app, doctor_opts);
  meshrt::cli::BenchCommands bench;
  meshrt::cli::add_bench_commands(app, bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return meshrt::bench::exit_parse_error(app, e);
  }
  meshrt::bench::Command* cmd = meshrt::cli::parsed_bench_command(bench);
  if (cmd) {
    // Wrong options fail alike on every rank of an mpirun job: one process says so.
    try {
      cmd->validate();
    } catch (const std::exception& e) {
      return meshrt::bench::report_error("meshrt", e, false);
    }
  }
  try {
    if (info->parsed()) return meshrt::cli::run_info(std::cout);
    if (train->parsed()) return meshrt::cli::run_train(train_opts, std::cout);
    if (doctor->parsed()) return meshrt::cli::run_doctor(doctor_opts, std::cout);
    if (cmd)
      return cmd->run(
          {meshrt::bench::command_line("meshrt", argc, argv), &meshrt::cli::version_info},
          std::cout);
  } catch (const std::exception& e) {
    return meshrt::bench::report_error("meshrt", e, true);
  }
  return 0;
}
