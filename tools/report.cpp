#include "tools/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "bench/common/gnuplot.h"
#include "bench/common/stats.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "tools/cli/cli_checks.h"

namespace meshrt::cli {

namespace {

using bench::gp_quote;

std::string rp_fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string rp_mib(double bytes) { return rp_fmt("%.1f MiB", bytes / (1024.0 * 1024.0)); }

// Median over the records of one value (NaN values left out; NaN when none).
template <class F>
double rp_median(const std::vector<MetricsRecord>& recs, F get) {
  std::vector<double> v;
  for (const MetricsRecord& r : recs)
    if (const double x = get(r); !std::isnan(x)) v.push_back(x);
  return v.empty() ? std::nan("") : bench::median(v);
}

double rp_exposed(const MetricsRank& k) { return k.tp_exposed_ms + k.dp_exposed_ms; }

void print_loss_lines(const std::vector<MetricsRecord>& recs, std::ostream& os) {
  const MetricsRecord* best = nullptr;
  const MetricsRecord* last_val = nullptr;
  for (const MetricsRecord& r : recs) {
    if (std::isfinite(r.loss) && (!best || r.loss < best->loss)) best = &r;
    if (!std::isnan(r.val_loss)) last_val = &r;
  }
  os << "  loss " << rp_fmt("%.6f", recs.front().loss) << " -> "
     << rp_fmt("%.6f", recs.back().loss);
  if (best) os << " (min " << rp_fmt("%.6f", best->loss) << " at step " << best->step << ")";
  if (last_val)
    os << "; val loss " << rp_fmt("%.6f", last_val->val_loss) << " at step " << last_val->step;
  os << "\n  lr " << rp_fmt("%.3g", recs.front().lr) << " -> " << rp_fmt("%.3g", recs.back().lr)
     << "\n";
  const double mfu = rp_median(recs, [](const MetricsRecord& r) { return r.mfu; });
  os << "  median step " << rp_fmt("%.1f", rp_median(recs, [](auto& r) { return r.step_ms; }))
     << " ms, " << rp_fmt("%.0f", rp_median(recs, [](auto& r) { return r.tokens_per_s; }))
     << " tokens/s" << (std::isnan(mfu) ? "" : ", MFU " + rp_fmt("%.2f%%", 100 * mfu)) << "\n";
}

// Per rank: median step, compute, exposed tp / dp, peak memory; then the slowest rank.
void print_rank_lines(const std::vector<MetricsRecord>& recs, std::ostream& os) {
  const size_t n = recs.front().ranks.size();
  std::vector<double> compute(n);
  os << "  rank  device   step ms  compute ms  tp exposed  dp exposed    peak mem\n";
  for (size_t i = 0; i < n; ++i) {
    auto of = [&](auto get) {
      return rp_median(recs, [&](const MetricsRecord& r) { return get(r.ranks[i]); });
    };
    compute[i] = of([](const MetricsRank& k) { return k.compute_ms; });
    double peak = 0;
    for (const MetricsRecord& r : recs) peak = std::max(peak, r.ranks[i].mem_peak_bytes);
    char line[160];
    std::snprintf(line, sizeof line, "  %4zu  %-7s %8.1f  %10.1f  %10.1f  %10.1f  %10s\n", i,
                  recs.back().ranks[i].device.empty() ? "?" : recs.back().ranks[i].device.c_str(),
                  of([](const MetricsRank& k) { return k.step_ms; }), compute[i],
                  of([](const MetricsRank& k) { return k.tp_exposed_ms; }),
                  of([](const MetricsRank& k) { return k.dp_exposed_ms; }), rp_mib(peak).c_str());
    os << line;
  }
  std::vector<double> sorted = compute;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[(n - 1) / 2];
  const size_t slow =
      static_cast<size_t>(std::max_element(compute.begin(), compute.end()) - compute.begin());
  os << "  slowest rank: " << slow << " (median compute " << rp_fmt("%.1f", compute[slow])
     << " ms, " << rp_fmt("%.2f", med > 0 ? compute[slow] / med : 1.0) << "x the median rank's "
     << rp_fmt("%.1f", med) << " ms)\n";
}

}  // namespace

void print_report_summary(const std::string& name, const std::vector<MetricsRecord>& recs,
                          int worst, std::ostream& os) {
  os << "report: " << name << ": " << recs.size() << " steps (" << recs.front().step << ".."
     << recs.back().step << "), " << recs.front().ranks.size() << " ranks, version "
     << recs.back().version << "\n";
  print_loss_lines(recs, os);
  print_rank_lines(recs, os);
  std::vector<size_t> order(recs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return recs[a].step_ms > recs[b].step_ms; });
  os << "  worst steps:";
  for (size_t i = 0; i < order.size() && i < static_cast<size_t>(worst); ++i)
    os << (i ? "," : "") << " " << recs[order[i]].step << " ("
       << rp_fmt("%.1f", recs[order[i]].step_ms) << " ms)";
  const MetricsRecord* flagged = nullptr;
  for (const MetricsRecord& r : recs)
    if (r.straggler_rank >= 0 && !flagged) flagged = &r;
  os << "\n  skipped steps: "
     << std::count_if(recs.begin(), recs.end(), [](auto& r) { return r.skipped; });
  if (flagged)
    os << "; straggler: rank " << flagged->straggler_rank << " from step " << flagged->step;
  os << "\n";
}

namespace {

// One data file per input: step loss val lr tokens/s mfu, then per rank compute, exposed comm,
// peak and current memory (MiB), skew; "?" for a missing value.
std::string rp_data(const std::vector<MetricsRecord>& recs) {
  std::ostringstream d;
  auto v = [&](double x) { d << ' ' << (std::isfinite(x) ? rp_fmt("%.9g", x) : "?"); };
  for (const MetricsRecord& r : recs) {
    d << r.step;
    v(r.loss), v(r.val_loss), v(r.lr), v(r.tokens_per_s), v(100 * r.mfu);
    for (const MetricsRank& k : r.ranks)
      v(k.compute_ms), v(rp_exposed(k)), v(k.mem_peak_bytes / 1048576.0),
          v(k.mem_current_bytes / 1048576.0), v(k.skew_ms);
    d << '\n';
  }
  return d.str();
}

// `plot` clauses for every input and rank of one field (column 7 + 5 k + field of rank k). The
// dash type is the quantity's (`dash`, as the panel's title says); the colour is the run and
// rank's: one per (input, rank), numbered through the inputs, alike in every per-rank panel.
std::string rp_rank_lines(const std::string& dir, const std::vector<ReportRun>& in, int field,
                          const char* what, int dash) {
  std::ostringstream p;
  size_t colour = 1;
  for (size_t f = 0; f < in.size(); ++f)
    for (size_t k = 0; k < in[f].recs.front().ranks.size(); ++k, ++colour)
      p << (p.tellp() > 0 ? ", " : "") << gp_quote(dir + "f" + std::to_string(f) + ".dat")
        << " using 1:" << 7 + 5 * k + static_cast<size_t>(field) << " with lines lc " << colour
        << " dt " << dash << " title "
        << gp_quote(in[f].label + " r" + std::to_string(k) + (what[0] ? " " : "") + what);
  return p.str();
}

std::string rp_series(const std::string& dir, const std::vector<ReportRun>& in, int col,
                      const char* style, const char* what, const char* axes = "x1y1") {
  std::ostringstream p;
  for (size_t f = 0; f < in.size(); ++f)
    p << (f ? ", " : "") << gp_quote(dir + "f" + std::to_string(f) + ".dat") << " using 1:" << col
      << " axes " << axes << " with " << style << " lc " << f + 1 << " title "
      << gp_quote(in[f].label + (what[0] ? " " : "") + what);
  return p.str();
}

}  // namespace

std::string report_gnuplot_script(const std::string& dir, const std::vector<ReportRun>& in) {
  bool mfu = false;
  for (const ReportRun& i : in)
    for (const MetricsRecord& r : i.recs) mfu = mfu || std::isfinite(r.mfu);
  std::ostringstream g;
  g << "set datafile missing '?'\nset multiplot layout 3,2 title 'meshrt report'\n"
    << "set grid\nset key top right noenhanced font ',8'\nset xlabel 'step'\n"
    // 5% of each panel's height above and below the data: a constant series (the LR without a
    // schedule, a flat memory peak) is drawn inside the panel, not on its border.
    << "set offsets 0, 0, graph 0.05, graph 0.05\n"
    << "set title 'loss (lines: train, points: validation)'\nplot "
    << rp_series(dir, in, 2, "lines", "train") << ", "
    << rp_series(dir, in, 3, "linespoints pt 7", "val")
    // Four significant digits: a narrow LR range (a constant LR) gets distinct tick labels.
    << "\nset title 'learning rate'\nset format y '%.4g'\nplot "
    << rp_series(dir, in, 4, "lines", "") << "\nset format y '% h'\nset title 'tokens / s"
    << (mfu ? " (dashed: MFU %, right axis)" : "") << "'\n";
  if (mfu) g << "set y2tics\nset ytics nomirror\n";
  g << "plot " << rp_series(dir, in, 5, "lines", "tokens/s");
  if (mfu) g << ", " << rp_series(dir, in, 6, "lines dt 2", "MFU %", "x1y2");
  g << "\nunset y2tics\nset ytics mirror\n"
    << "set title 'per rank (colour: run and rank): compute (solid) and exposed communication "
       "(dashed), ms'\nplot "
    << rp_rank_lines(dir, in, 0, "compute", 1) << ", " << rp_rank_lines(dir, in, 1, "exposed", 2)
    << "\nset title 'memory per rank, MiB (colour: run and rank; solid: peak, dashed: "
       "current)'\nplot "
    << rp_rank_lines(dir, in, 2, "peak", 1) << ", " << rp_rank_lines(dir, in, 3, "now", 2)
    << "\nset title 'skew: step time over the fastest rank, ms'\nplot "
    << rp_rank_lines(dir, in, 4, "", 1) << "\nunset multiplot\n";
  return g.str();
}

namespace {

void rp_check_outputs(const ReportCliOptions& o) {
  check_output_path(o.plot, "--plot");
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& f : o.files)
    MESHRT_CHECK(!fs::equivalent(f, o.plot, ec),
                 "--plot " << o.plot << " is the input " << f << ": name another output file");
}

}  // namespace

void plot_report_runs(const std::string& path, const std::vector<ReportRun>& in) {
  bench::GnuplotJob job;
  job.width = 1400;
  job.height = 1100;
  for (size_t f = 0; f < in.size(); ++f)
    job.data.emplace_back("f" + std::to_string(f) + ".dat", rp_data(in[f].recs));
  job.body = [&](const std::string& dir) { return report_gnuplot_script(dir, in); };
  bench::render_gnuplot(path, job);
}

CLI::App* add_report_command(CLI::App& app, ReportCliOptions& o) {
  auto* c = app.add_subcommand("report",
                               "Summarise train --metrics files (medians, the slowest rank, the "
                               "worst steps) or plot them on one picture");
  c->add_option("files", o.files, "Metrics files (JSON Lines of meshrt train --metrics)")
      ->required();
  c->add_option("--plot", o.plot,
                "Draw loss, lr, tokens/s and MFU, per-rank compute and exposed communication, "
                "memory and skew against steps into this PNG (gnuplot)")
      ->check(kNonEmpty);
  c->add_option("--worst", o.worst, "How many of the slowest steps the summary lists")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  return c;
}

int run_report(const ReportCliOptions& o, std::ostream& os) {
  if (!o.plot.empty()) rp_check_outputs(o);
  std::vector<ReportRun> in;
  for (const std::string& f : o.files)
    in.push_back({std::filesystem::path(f).filename().string(), read_metrics_file(f)});
  if (o.plot.empty()) {
    for (const ReportRun& i : in) print_report_summary(i.label, i.recs, o.worst, os);
    return 0;
  }
  plot_report_runs(o.plot, in);
  os << "wrote " << o.plot << " (" << in.size() << (in.size() == 1 ? " run" : " runs") << ")\n";
  return 0;
}

}  // namespace meshrt::cli
