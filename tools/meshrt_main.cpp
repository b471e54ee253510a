// The `meshrt` command line: info, and (as the layers land) bench, sweep and train.
#include <CLI/CLI.hpp>

#include <iostream>

#include "runtime/error.h"
#include "tools/info.h"
#include "tools/train.h"

int main(int argc, char** argv) {
  CLI::App app{"meshrt: a runtime for mixed data + tensor parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshrt 0.1.0");
  auto* info = app.add_subcommand("info",
                                  "Devices found, why CUDA is unavailable if it is, "
                                  "library versions and build options");
  meshrt::cli::TrainCliOptions train_opts;
  auto* train = meshrt::cli::add_train_command(app, train_opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (info->parsed()) return meshrt::cli::run_info(std::cout);
    if (train->parsed()) return meshrt::cli::run_train(train_opts, std::cout);
  } catch (const meshrt::Error& e) {
    std::cerr << "meshrt: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "meshrt: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
