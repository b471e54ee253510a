#include "tools/cli/command.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "collectives/config_check.h"
#include "collectives/fault.h"
#include "dist/environment.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt::bench {

void add_fault_flag(CLI::App& app) {
  app.add_option_function<std::string>(
         "--fault", [](const std::string& v) { setenv("MESHRT_FAULT", v.c_str(), 1); },
         "Inject a fault, as MESHRT_FAULT: kind@rank=R,step=S[,op=NAME][,ms=T], kind "
         "crash|hang|slow|skip|corrupt (docs/faults.md)")
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              detail::parse_fault_spec(v);
              return std::string();
            } catch (const std::exception& e) {
              return error_message(e);
            }
          },
          "SPEC"));
}

CLI::Option* add_backend_flag(CLI::App& app, std::string& backend) {
  return app
      .add_option("--backend", backend,
                  "host | mpi | shm | hier | nccl | auto (threads: host/nccl; processes of one "
                  "node: shm; across nodes: hier (shm in each node, mpi between) or mpi/nccl)")
      ->capture_default_str();
}

void bind_flags(CLI::App& app, Command& cmd) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_flags(app);
  add_fault_flag(app);
}

void validate_command(Command& cmd, const CLI::App& app) {
  cmd.validate();
  const CLI::Option* fault = app.get_option_no_throw("--fault");
  if (fault == nullptr || fault->count() == 0) return;
  const std::string why = cmd.fault_ignored();
  MESHRT_CHECK(why.empty(), "--fault " << fault->as<std::string>() << ": " << why
                                       << "; drop --fault (docs/faults.md lists where faults "
                                          "act)");
}

int launcher_rank() {
  // Open MPI, MPICH / Intel MPI (PMI), PMIx launchers, MVAPICH, and srun job steps.
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"}) {
    if (const char* x = std::getenv(v); x && *x) return std::atoi(x);
  }
  if (std::getenv("SLURM_STEP_ID"))
    if (const char* x = std::getenv("SLURM_PROCID"); x && *x) return std::atoi(x);
  return 0;
}

namespace {

// Before a process launch's ranks report an error that every rank raises alike, they compare the
// options they were started with (when the error came before the bootstrap did): a rank that
// failed because its options differ must not leave the others waiting for it. `error` (this
// rank's, "" for none) joins the comparison: the others then name it when their options agree.
void check_config_before_failing(const std::string& error = "") {
  if (!error.empty()) detail::set_process_failure(error);
  try {
    detail::check_process_config_early(CommConfig::from_env().timeout_s);
  } catch (const detail::ConfigMismatchError&) {
    throw;
  } catch (const std::exception& e) {
    MESHRT_LOG_DEBUG("the options could not be compared across ranks: " << error_message(e));
  }
}

// CLI11's "Could not convert: --steps = 99999999999" (a value its type cannot hold, where no
// validator checked the range first) as "--steps: '99999999999' is not an integer this option can
// hold (INT)"; other errors unchanged.
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e) {
  const std::string msg = e.what(), head = "Could not convert: ";
  const size_t eq = msg.find(" = ");
  if (dynamic_cast<const CLI::ConversionError*>(&e) == nullptr || msg.rfind(head, 0) != 0 ||
      eq == std::string::npos)
    return msg;
  const std::string name = msg.substr(head.size(), eq - head.size()), value = msg.substr(eq + 3);
  std::string type;
  for (const CLI::App* a = &app; a != nullptr;) {
    if (const CLI::Option* o = a->get_option_no_throw(name)) type = o->get_type_name();
    const std::vector<const CLI::App*> subs =
        a->get_subcommands([](const CLI::App* s) { return s->parsed(); });
    a = subs.empty() ? nullptr : subs[0];
  }
  const bool whole = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0;
  return name + ": '" + value + "' is not " + (whole ? "an integer" : "a value") +
         " this option can hold" + (type.empty() ? "" : " (" + type + ")") +
         "; give one in its range (--help lists the options)";
}

}  // namespace

// The ranks that stay quiet about an error every rank raised exit 0: OpenMPI aborts the whole job
// at the first non-zero exit, which could kill rank 0 before it prints. Rank 0's status is the
// job's.
int exit_parse_error(CLI::App& app, const CLI::ParseError& e) {
  std::ostringstream out, err;
  int rc = 0;
  if (e.get_exit_code() == 0) {  // --help, --version
    rc = app.exit(e, out, err);
  } else {
    const std::string program = app.get_name().empty()
                                    ? "meshrt"
                                    : std::filesystem::path(app.get_name()).filename().string();
    // A rank whose options do not parse still takes part in the start-up check (see
    // report_error), as "a command that refused its options".
    detail::set_process_config({}, program + " (refusing its options: " + e.what() + ")");
    try {
      check_config_before_failing();
    } catch (const detail::ConfigMismatchError& m) {
      return report_error(program, m, false);
    }
    // Like every other error: "<program>: error: ..." and status 1 (CLI11's own codes, 105 for
    // a failed check and so on, tell a script nothing more).
    err << program << ": error: " << parse_error_text(app, e)
        << "\nRun with --help for more information.\n";
    rc = 1;
  }
  if (launcher_rank() != 0) return 0;
  // Whole, in one write each: mpirun's merging of the ranks' output never splits a line.
  if (!out.str().empty()) print_line(std::cout, out.str());
  if (!err.str().empty()) print_line(std::cerr, err.str());
  return rc;
}

int report_error(std::string_view program, const std::exception& e, bool every_rank) {
  if (dynamic_cast<const AgreedError*>(&e) != nullptr) every_rank = false;
  if (!every_rank) {
    try {
      check_config_before_failing(error_message(e));
    } catch (const detail::ConfigMismatchError& m) {
      return report_error(program, m, false);
    }
  }
  const bool ours = dynamic_cast<const Error*>(&e) != nullptr;
  if (!every_rank && launcher_rank() != 0) return 0;  // rank 0 reports it (see above)
  // The message says what to change; where it was raised only with MESHRT_LOG_LEVEL=debug.
  print_line(std::cerr, std::string(program) + (ours ? ": error: " : ": internal error: ") +
                            error_message(e) + "\n");
  return ours ? 1 : 2;
}

std::string command_line(std::string_view program, int argc, char** argv) {
  std::string s(program);
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s;
}

void set_process_config(const CLI::App& app, const std::string& what) {
  detail::ConfigFields fields;
  for (const CLI::Option* o : app.get_options()) {
    const std::string name = o->get_name();  // "--hidden"
    if (name.empty() || name == "--help" || name == "-h") continue;
    std::string v;
    for (const std::string& r : o->results()) v += (v.empty() ? "" : ",") + r;
    if (o->count() == 0) v = o->get_default_str().empty() ? "(default)" : o->get_default_str();
    fields.emplace_back(name, v);
  }
  detail::set_process_config(std::move(fields), what);
}

void check_process_environment() { validate_environment(); }

int program_main(const Entry& entry, std::string_view program, int argc, char** argv) {
  CLI::App app{entry.description, std::string(program)};
  std::unique_ptr<Command> cmd = entry.make();
  bind_flags(app, *cmd);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return exit_parse_error(app, e);
  }
  set_process_config(app, std::string(program));
  try {
    check_process_environment();
    validate_command(*cmd, app);
  } catch (const std::exception& e) {
    return report_error(program, e, false);
  }
  try {
    return cmd->run({command_line(program, argc, argv)}, std::cout);
  } catch (const std::exception& e) {
    return report_error(program, e, true);
  }
}

}  // namespace meshrt::bench
