// `meshrt doctor`: merges the ranks' flight records (collectives/flight.h) and says where they
// diverge; converts them to a Perfetto (Chrome JSON) trace. Plain C++ (no JSON types).
#pragma once

#include <string>
#include <vector>

namespace meshrt::detail {

struct FlightFile {
  std::string path;  // for messages
  std::string text;  // the JSON record
};

struct DoctorReport {
  std::string text;           // what `meshrt doctor` prints
  std::vector<int> culprits;  // global ranks blamed (empty: no divergence found)
  std::string culprit_call;   // "all_reduce seq 3 on group 'world'" where they diverged, or ""
};

// Reads every record (throws meshrt::Error naming the file when one is not a flight record) and
// reports: the ranks without a record, for each group the first sequence number some member
// never reached (who did, who did not), mismatched call signatures at one sequence number, the
// collectives still open when each rank wrote its record, the arrival skew between ranks, the
// injected faults the records mention, and a verdict naming the culprit ranks.
DoctorReport flight_diagnose(const std::vector<FlightFile>& files);

// The records as one Chrome / Perfetto JSON trace: a process per rank, a track per group,
// a slice per collective (open ones end at the record's dump time).
std::string flight_trace(const std::vector<FlightFile>& files);

}  // namespace meshrt::detail
