// The benchmark registry: each benchmark's command line (name, help, flags, checks, run), defined
// once and used by both the `meshrt` CLI and the benchmark's own program.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"

namespace meshrt::bench {

// What a run may record besides its options (block and sweep write both into their JSON).
struct RunInfo {
  std::string command_line;
  // Library / build versions, asked for only by the commands that record them (it queries CUDA,
  // BLAS and MPI); null outside the CLI.
  std::map<std::string, std::string> (*versions)() = nullptr;
};

// One invocation of a benchmark: owns the values its flags are parsed into.
class Command {
 public:
  virtual ~Command() = default;
  // Adds the flags to `app` (a `meshrt bench` subcommand or a standalone program).
  virtual void add_flags(CLI::App& app) = 0;
  // After parsing, before any output: completes the options and checks what can be checked
  // without running. Throws meshrt::Error saying what to change.
  virtual void validate() {}
  // Runs with the validated options; returns the exit status.
  virtual int run(const RunInfo& info, std::ostream& out) = 0;
  // After validate(): why `--fault` (bind_flags adds it to every command) would be ignored by this
  // run, "" when it acts (the run issues collectives, where faults are injected). A --fault given
  // where it would be ignored is refused with this reason (validate_command).
  virtual std::string fault_ignored() const { return ""; }
};

struct Entry {
  std::string name;         // `meshrt bench <name>`, or `meshrt <name>` when top_level
  std::string description;  // the command's help line
  bool top_level = false;
  std::function<std::unique_ptr<Command>()> make;
};

// Every registered benchmark's entries, by benchmark name (each in the order its
// <name>_commands() returns them). Generated from the meshrt_benchmark() lines of
// bench/*/CMakeLists.txt and plan/command/CMakeLists.txt (`meshrt plan`).
const std::vector<Entry>& registry();

// `--fault SPEC`: validates the spec and sets MESHRT_FAULT (collectives/fault.h) before the
// command bootstraps its ranks. bind_flags adds it to every command; `meshrt train` too.
void add_fault_flag(CLI::App& app);

// `--backend NAME` into `backend` (default auto): the collective backend of the commands that run
// collectives (bench collective, bench block, train, tune). One flag, one help text; the name and
// whether the backend can run the launch are checked when the ranks start (collectives/
// bootstrap.h: "--backend host cannot run rank 0 of 2 as mpi-processes on cpu: ...").
CLI::Option* add_backend_flag(CLI::App& app, std::string& backend);

// Adds `cmd`'s flags to `app`, where repeating a flag keeps the last value (as most command lines
// do) instead of an error. The CLI and the standalone programs both add flags through this.
void bind_flags(CLI::App& app, Command& cmd);

// The checks of a parsed command (`app`: the command's own CLI::App, whose flags bind_flags added):
// cmd.validate(), then a --fault the run would ignore is refused (Command::fault_ignored). Throws
// meshrt::Error saying what to change. The CLI and the standalone programs both validate through
// this.
void validate_command(Command& cmd, const CLI::App& app);

// The rank of this process in an MPI / srun launch, from the launcher's environment (readable
// before MPI starts); 0 when not launched that way.
int launcher_rank();

// How a parse error (or --help) ends: CLI11's message and exit status, printed by the process with
// launcher rank 0 only (the others would print the same text, and exit 0 so the launcher cannot
// kill rank 0 before it prints: the job's status is rank 0's).
int exit_parse_error(CLI::App& app, const CLI::ParseError& e);

// An error that every rank of a launch raises alike, such as options that do not fit the world
// size: report_error prints it once (launcher rank 0) even when raised during run(), as it does
// every AgreedError (runtime/error.h), which this is.
class UniformError : public AgreedError {
 public:
  explicit UniformError(const Error& e) : AgreedError(e) {}
};

// How a failure ends: "<program>: error: <message>" and status 1 for meshrt::Error, "<program>:
// internal error: ..." and status 2 otherwise. `every_rank` false: printed by launcher rank 0
// only (the others exit 0, as above), for errors that every rank raises alike (wrong options;
// always so for an AgreedError, a UniformError among them).
int report_error(std::string_view program, const std::exception& e, bool every_rank);

// "<program> <args...>", as recorded in JSON.
std::string command_line(std::string_view program, int argc, char** argv);

// Records the options `app` was parsed with as this process's configuration (collectives/
// config_check.h): under mpirun / srun, ranks started with different ones are refused at start-up
// ("--hidden: rank 0 has 64, rank 1 has 128"; an option not given shows its default, or
// "(default)"). `what` names the command in that message. Call it before anything that can fail
// by rank (validation, the environment checks): report_error compares the configurations before
// it reports an error every rank raises alike.
void set_process_config(const CLI::App& app, const std::string& what);

// The environment checks every command runs before anything else: dist/environment.h's
// validate_environment, the one check the C API's init runs too. Throws naming the variable and
// the accepted values.
void check_process_environment();

// A standalone benchmark program: `entry`'s flags on a program named `program`, then validate and
// run as `meshrt bench <name>` does.
int program_main(const Entry& entry, std::string_view program, int argc, char** argv);

}  // namespace meshrt::bench
