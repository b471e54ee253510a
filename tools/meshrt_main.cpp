// The `meshrt` command line: info, bench (block, mlp, attn, collective, gemm), sweep, train.
#include <CLI/CLI.hpp>

#include <iostream>

#include "runtime/error.h"
#include "tools/bench_cli.h"
#include "tools/blas_env.h"
#include "tools/info.h"
#include "tools/train.h"

int main(int argc, char** argv) {
  meshrt::cli::maybe_reexec_for_blas(argc, argv);
  CLI::App app{"meshrt: a runtime for mixed data + tensor parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshrt 0.1.0");
  auto* info = app.add_subcommand("info",
                                  "Devices found, why CUDA is unavailable if it is, "
                                  "library versions and build options");
  meshrt::cli::TrainCliOptions train_opts;
  auto* train = meshrt::cli::add_train_command(app, train_opts);
  meshrt::cli::BenchCli bench;
  meshrt::cli::add_bench_commands(app, bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (info->parsed()) return meshrt::cli::run_info(std::cout);
    if (train->parsed()) return meshrt::cli::run_train(train_opts, std::cout);
    std::string cmdline = "meshrt";
    for (int i = 1; i < argc; ++i) cmdline += std::string(" ") + argv[i];
    if (int rc = meshrt::cli::run_bench_commands(bench, cmdline, std::cout); rc >= 0) return rc;
  } catch (const meshrt::Error& e) {
    // The message says what to change; where it was raised only with MESHRT_LOG_LEVEL=debug.
    std::cerr << "meshrt: error: " << meshrt::error_message(e) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "meshrt: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
