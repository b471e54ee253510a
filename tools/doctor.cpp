#include "tools/doctor.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "collectives/flight_doctor.h"
#include "runtime/error.h"

namespace meshrt::cli {

CLI::App* add_doctor_command(CLI::App& app, DoctorCliOptions& o) {
  auto* c = app.add_subcommand(
      "doctor",
      "Merge the ranks' flight records (meshrt-flight-<rank>.json, written on a watchdog "
      "timeout, an abort, a fatal signal or SIGUSR1) and say where the ranks diverged and "
      "which rank is to blame");
  c->add_option("files", o.files, "The records, one per rank")->required();
  c->add_option("--trace", o.trace, "Also write the records as a Perfetto / Chrome JSON trace");
  return c;
}

int run_doctor(const DoctorCliOptions& o, std::ostream& os) {
  std::vector<detail::FlightFile> files;
  for (const std::string& p : o.files) {
    std::ifstream f(p, std::ios::binary);
    MESHRT_CHECK(f.good(), "cannot read " << p << ": " << std::strerror(errno));
    std::ostringstream s;
    s << f.rdbuf();
    MESHRT_CHECK(!f.bad(), "reading " << p << " failed: " << std::strerror(errno));
    files.push_back({p, s.str()});
  }
  const detail::DoctorReport rep = detail::flight_diagnose(files);
  os << rep.text;
  if (!o.trace.empty()) {
    const std::string t = detail::flight_trace(files);
    std::ofstream f(o.trace, std::ios::binary | std::ios::trunc);
    MESHRT_CHECK(f.good(), "cannot write " << o.trace << ": " << std::strerror(errno));
    f.write(t.data(), static_cast<std::streamsize>(t.size()));
    f.close();
    MESHRT_CHECK(f.good(), "writing " << o.trace << " failed: " << std::strerror(errno));
    os << "wrote " << o.trace << " (open it in ui.perfetto.dev)\n";
  }
  return 0;
}

}  // namespace meshrt::cli
