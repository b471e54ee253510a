// The `meshrt` command line: info, train, doctor, report, tune, and the benchmark registry's
// commands
// (`bench <name>`, `sweep`). tools/cli.h parses and validates; this runs.
#include <iostream>

#include "runtime/logging.h"
#include "tools/blas_env.h"
#include "tools/cli.h"
#include "tools/cli/command.h"

int main(int argc, char** argv) {
  meshrt::cli::maybe_reexec_for_blas(argc, argv);
  meshrt::cli::MeshrtCli cli;
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return meshrt::bench::exit_parse_error(cli.app(), e);
  }
  // Wrong options fail alike on every rank of an mpirun job: one process says so.
  try {
    cli.validate();
  } catch (const std::exception& e) {
    return meshrt::bench::report_error("meshrt", e, false);
  }
  int rc = 0;
  try {
    rc = cli.run(argc, argv, std::cout);
  } catch (const std::exception& e) {
    return meshrt::bench::report_error("meshrt", e, true);
  }
  // A report nobody received is a failure: standard output on a full disk or /dev/full (written
  // through std::cout, or line by line through print_line as train and tune write).
  if (!std::cout.flush() || meshrt::output_write_error(std::cout) != 0) {
    std::cerr << "meshrt: error: writing standard output failed (disk full, or the reader closed "
                 "it); the command's report is lost: write it somewhere with room\n";
    return rc != 0 ? rc : 1;
  }
  return rc;
}
