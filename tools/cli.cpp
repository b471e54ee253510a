#include "tools/cli.h"

#include <iostream>
#include <string>
#include <vector>

#include "collectives/config_check.h"
#include "meshrt/version.h"
#include "tools/cli/command.h"
#include "tools/info.h"
#include "tools/signals.h"
#include "tools/train.h"

namespace meshrt::cli {

namespace {

// CLI11 answers an unknown command name with "A subcommand is required" (or, below a command,
// with the extra argument alone): name it and the commands that exist instead.
void check_command_names(CLI::App& top, int argc, const char* const* argv) {
  CLI::App* cur = &top;
  std::string where = "meshrt";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.empty() || a[0] == '-') return;  // flags: CLI11 checks them
    const std::vector<CLI::App*> subs = cur->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return;  // a command's own arguments
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* s : subs) {
      if (s->check_name(a)) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (next == nullptr)
      throw CLI::ExtrasError(
          where + ": unknown command '" + a + "': use one of " + names + " (--help lists them)",
          CLI::ExitCodes::ExtrasError);
    cur = next;
    where += " " + a;
  }
}

// The innermost parsed command ("collective" of `meshrt bench collective`).
const CLI::App* parsed_leaf(const CLI::App& top) {
  const CLI::App* leaf = &top;
  while (!leaf->get_subcommands().empty()) leaf = leaf->get_subcommands()[0];
  return leaf;
}

// The command's name as typed: "meshrt bench collective", "meshrt sweep".
std::string command_name(const CLI::App& top) {
  std::string name = "meshrt";
  for (const CLI::App* a = &top; !a->get_subcommands().empty();) {
    a = a->get_subcommands()[0];
    name += " " + a->get_name();
  }
  return name;
}

// `report`: with --plot, SIGINT / SIGTERM end the wait on gnuplot (which is stopped, and the
// plot's temporary folder removed) with 128 + the signal's number.
int run_report_command(const ReportCliOptions& o, std::ostream& os) {
  if (o.plot.empty()) return run_report(o, os);
  StopSignals signals(false);
  try {
    return run_report(o, os);
  } catch (const Error& e) {
    const int sig = StopSignals::received();
    if (sig == 0) throw;
    std::cerr << "meshrt: error: " << e.message() << "\n";
    return 128 + sig;
  }
}

}  // namespace

MeshrtCli::MeshrtCli() : app_("meshrt: a runtime for mixed data + tensor parallelism") {
  app_.require_subcommand(1);
  // A flag given twice takes its last value in every command (as the benchmarks' own programs
  // do), rather than CLI11's "At Most 1 required but received 2".
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app_.set_version_flag("--version", "meshrt " MESHRT_VERSION_STRING);
  info_ = app_.add_subcommand("info",
                              "Devices found, why CUDA is unavailable if it is, "
                              "library versions and build options");
  train_ = add_train_command(app_, train_opts_);
  doctor_ = add_doctor_command(app_, doctor_opts_);
  report_ = add_report_command(app_, report_opts_);
  tune_ = add_tune_command(app_, tune_opts_);
  add_bench_commands(app_, bench_);
}

void MeshrtCli::parse(int argc, const char* const* argv) {
  check_command_names(app_, argc, argv);
  app_.parse(argc, argv);
}

void MeshrtCli::validate() {
  // First: under mpirun a rank whose validation fails compares its options with the others'
  // before it reports (bench::report_error).
  if (train_->parsed())
    detail::set_process_config(train_shared_options(train_opts_), "meshrt train");
  bench::Command* cmd = parsed_bench_command(bench_);
  if (cmd) bench::set_process_config(*parsed_leaf(app_), command_name(app_));
  bench::check_process_environment();
  if (train_->parsed()) check_train_flags(train_opts_);
  if (cmd) bench::validate_command(*cmd, *parsed_leaf(app_));
}

int MeshrtCli::run(int argc, char** argv, std::ostream& os) {
  if (info_->parsed()) return run_info(os);
  if (train_->parsed()) return run_train(train_opts_, os);
  if (doctor_->parsed()) return run_doctor(doctor_opts_, os);
  if (report_->parsed()) return run_report_command(report_opts_, os);
  if (tune_->parsed()) return run_tune(tune_opts_, os);
  if (bench::Command* cmd = parsed_bench_command(bench_)) {
    const std::string name = command_name(app_);
    ExitOnSignal on_signal(name, bench::launcher_rank() == 0);
    return cmd->run({bench::command_line("meshrt", argc, argv), &version_info}, os);
  }
  return 0;
}

}  // namespace meshrt::cli
