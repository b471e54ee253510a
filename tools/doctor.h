// `meshrt doctor FILES... [--trace OUT]`: reads the ranks' flight records and says where they
// diverge (collectives/flight_doctor.h holds the logic).
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>
#include <vector>

namespace meshrt::cli {

struct DoctorCliOptions {
  std::vector<std::string> files;
  std::string trace;
};

CLI::App* add_doctor_command(CLI::App& app, DoctorCliOptions& o);
int run_doctor(const DoctorCliOptions& o, std::ostream& os);

}  // namespace meshrt::cli
