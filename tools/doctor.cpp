#include "tools/doctor.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "collectives/flight_doctor.h"
#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/output_file.h"
#include "tools/cli/cli_checks.h"

namespace meshrt::cli {

namespace {

// A flight record holds a ring of a few thousand entries (a few MB); anything far larger is not
// one, and reading it whole would only grow memory.
constexpr uint64_t kMaxRecordBytes = 256ull << 20;

// Reads a record through the one input-file reader (runtime/input_file.h): a regular file of at
// most kMaxRecordBytes (a FIFO, a device such as /dev/zero or a directory is refused before any
// read). Fills `id` with the file's device and inode (to refuse --trace over an input).
std::string read_record(const std::string& p, struct stat* id) {
  InputFile in(p, "meshrt doctor: flight record", kMaxRecordBytes);
  MESHRT_CHECK(::fstat(in.fd(), id) == 0,
               "meshrt doctor: cannot stat " << p << ": " << std::strerror(errno));
  return in.read_all();
}

}  // namespace

CLI::App* add_doctor_command(CLI::App& app, DoctorCliOptions& o) {
  auto* c = app.add_subcommand(
      "doctor",
      "Merge the ranks' flight records (meshrt-flight-<rank>.json, written on a watchdog "
      "timeout, an abort, a fatal signal or SIGUSR1) and say where the ranks diverged and "
      "which rank is to blame");
  c->add_option("files", o.files, "The records, one per rank")->required();
  c->add_option("--trace", o.trace, "Also write the records as a Perfetto / Chrome JSON trace")
      ->check(kNonEmpty);
  return c;
}

int run_doctor(const DoctorCliOptions& o, std::ostream& os) {
  if (!o.trace.empty()) check_output_path(o.trace, "--trace");
  struct stat out {};
  const bool out_exists = !o.trace.empty() && ::stat(o.trace.c_str(), &out) == 0;
  std::vector<detail::FlightFile> files;
  for (const std::string& p : o.files) {
    struct stat in {};
    std::string text = read_record(p, &in);
    // By identity, not by name: a link or another spelling of the same file counts.
    MESHRT_CHECK(!out_exists || in.st_dev != out.st_dev || in.st_ino != out.st_ino,
                 "meshrt doctor: --trace " << o.trace << " is the input " << p
                                           << "; writing the trace would replace the record: "
                                              "give --trace another file");
    files.push_back({p, std::move(text)});
  }
  const detail::DoctorReport rep = detail::flight_diagnose(files);
  os << rep.text;
  if (!o.trace.empty()) {
    write_output_file(o.trace, detail::flight_trace(files), "--trace");
    os << "wrote " << o.trace << " (open it in ui.perfetto.dev)\n";
  }
  return 0;
}

}  // namespace meshrt::cli
