// `meshrt report FILE [FILE2 ...] [--plot out.png]`: reads `train --metrics` files
// (train/metrics_record.h) and prints a summary of each (medians, the slowest rank, the worst
// steps), or draws them on one picture with gnuplot (bench/common/gnuplot.h).
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>
#include <vector>

#include "train/metrics_record.h"

namespace meshrt::cli {

struct ReportCliOptions {
  std::vector<std::string> files;
  std::string plot;
  int worst = 3;  // --worst N: the slowest steps listed
};

CLI::App* add_report_command(CLI::App& app, ReportCliOptions& o);
int run_report(const ReportCliOptions& o, std::ostream& os);

// One run to plot: its label in the key and its records.
struct ReportRun {
  std::string label;
  std::vector<MetricsRecord> recs;
};
// The gnuplot script plot_report_runs runs: its data files are dir + "f<i>.dat" (input i). In the
// per-rank panels the dash type is the quantity (compute, memory peak: solid; exposed
// communication, current memory: dashed) and the colour the (run, rank).
std::string report_gnuplot_script(const std::string& dir, const std::vector<ReportRun>& runs);
// Draws runs on one picture (what run_report does with --plot; meshrt tune's --plot).
void plot_report_runs(const std::string& path, const std::vector<ReportRun>& runs);

// The summary of one file's records (what run_report prints without --plot).
void print_report_summary(const std::string& name, const std::vector<MetricsRecord>& recs,
                          int worst, std::ostream& os);

}  // namespace meshrt::cli
