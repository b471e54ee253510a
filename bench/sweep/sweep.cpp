#include "bench/sweep/sweep.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench/common/gnuplot.h"
#include "bench/common/stats.h"
#include "runtime/error.h"
#include "runtime/output_file.h"

namespace meshrt {

namespace {

using bench::Clock;
using json = nlohmann::json;

std::string clock_str(double s) {
  const long t = static_cast<long>(s + 0.5);
  char b[32];
  std::snprintf(b, sizeof(b), "%ld:%02ld", t / 60, t % 60);
  return b;
}

struct Config {
  int dp = 1, tp = 1;
  bool sp = false;
  int64_t batch = 1;
  int cp = 1;
  std::string label() const {
    return sweep_mesh(dp, cp, tp) + (sp ? " sp" : "") + " b" + std::to_string(batch);
  }
};

struct Outcome {
  Config c;
  bool ok = false;
  std::string why;  // when skipped
  BlockBenchResult r;
  std::vector<double> step_ms_runs;  // one per repeat
};

// Bar chart of tokens/s per configuration (best first, the best one highlighted) with gnuplot.
void write_plot(const std::string& path, const std::vector<Outcome>& ok, const std::string& title) {
  using bench::gp_quote;
  std::ostringstream d;
  for (size_t i = 0; i < ok.size(); ++i)
    d << i << " \"" << ok[i].c.label() << "\" " << ok[i].r.tokens_per_s << " " << (i == 0 ? 1 : 0)
      << "\n";
  double ymax = 1;
  for (const auto& oc : ok) ymax = std::max(ymax, oc.r.tokens_per_s);
  bench::GnuplotJob job;
  job.data = {{"sweep.dat", d.str()}};
  job.body = [&](const std::string& dir) {
    std::ostringstream g;
    g << "set title " << gp_quote(title) << " noenhanced\n"
      << "set ylabel \"tokens / s\"\n"
      << "set style fill solid 0.8 border -1\n"
      << "set boxwidth 0.7\n"
      << "set grid ytics\n"
      << "set yrange [0:" << ymax * 1.12 << "]\n"
      << "set xtics rotate by -35 left noenhanced\n"
      << "set key off\n"
      << "set lmargin 10\nset bmargin 8\n"
      << "plot " << gp_quote(dir + "sweep.dat")
      << " using 1:3:($4 > 0 ? 0x2ca02c : 0x1f77b4):xtic(2) with boxes lc rgb variable, \\\n"
      << "     \"\" using 1:3:(sprintf(\"%.0f\", $3)) with labels offset 0,0.8 font \",8\"\n";
    return g.str();
  };
  bench::render_gnuplot(path, job);
}

}  // namespace

std::vector<int64_t> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  size_t pos = 0;
  MESHRT_CHECK(!s.empty(), flag << " is empty; give sizes like 1,2,4");
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int64_t x = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    MESHRT_CHECK(
        ec == std::errc() && p == item.data() + item.size() && x >= 1,
        flag << " " << s << ": '" << item << "' is not an integer >= 1; give sizes like 1,2,4");
    v.push_back(x);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

std::vector<std::pair<int, int>> mesh_factorisations(int world) {
  std::vector<std::pair<int, int>> f;
  for (int tp = 1; tp <= world; ++tp)
    if (world % tp == 0) f.emplace_back(world / tp, tp);
  return f;
}

std::string sweep_mesh(int dp, int cp, int tp) {
  return "dp=" + std::to_string(dp) + (cp > 1 ? ",cp=" + std::to_string(cp) : "") +
         ",tp=" + std::to_string(tp);
}

void check_sweep_options(const SweepOptions& o) {
  MESHRT_CHECK(!o.batches.empty(), "--batches is empty; give sizes like 1,2,4");
  MESHRT_CHECK(o.repeats >= 1, "--repeats " << o.repeats << " must be >= 1");
  for (int64_t b : o.batches) MESHRT_CHECK(b >= 1, "--batches: " << b << " must be >= 1");
  MESHRT_CHECK(!o.cps.empty(), "--cp is empty; give cp sizes like 1,2");
  for (int64_t c : o.cps)
    MESHRT_CHECK(c >= 1 && c <= 1 << 20, "--cp: " << c << " must be in [1, 1048576]");
  MESHRT_CHECK(o.sp == "both" || o.sp == "on" || o.sp == "off",
               "--sp-modes " << o.sp << ": use both, on or off");
  MESHRT_CHECK(o.base.mesh.empty(),
               "sweep: --mesh is swept; leave it out (every dp x tp factorisation of the "
               "devices runs, for each cp of --cp: e.g. --cp 1,2)");
  // chunked splits the sequence collectives: without them no tp layout would run.
  MESHRT_CHECK(!(o.base.overlap == "chunked" && o.sp == "off"),
               "sweep: --overlap chunked runs only with sequence parallelism, which --sp-modes "
               "off leaves out (every tp > 1 layout would be skipped): use --sp-modes on or "
               "both, or --overlap async");
  check_output_path(o.json_path, "--json");
  check_output_path(o.plot_path, "--plot");
  check_distinct_outputs({{"--json", o.json_path}, {"--plot", o.plot_path}});
}

namespace {

// Every run's options: --devices resolved (world: its rank count), 5 timed steps after 1
// warm-up unless given, and no run's own report or files.
BlockBenchOptions sweep_base_options(const SweepOptions& o, int* world) {
  BlockBenchOptions base = o.base;
  base.devices = resolve_bench_devices(o.base, world);
  if (base.steps == 0) base.steps = 5;
  if (base.warmup < 0) base.warmup = 1;
  base.quiet = true;
  base.json_path.clear();
  base.trace_path.clear();
  base.dump_path.clear();
  return base;
}

// Every dp x tp factorisation of the world, with the --sp settings that apply (tp=1 has no
// sequence parallelism) and every --batch.
std::vector<Config> sweep_configs(const SweepOptions& o, int world) {
  std::vector<Config> cfgs;
  for (int64_t c : o.cps)
    MESHRT_CHECK(world % c == 0, "sweep: --cp " << c << " does not divide the " << world
                                                << " ranks of --devices; give cp sizes that do");
  for (int64_t cp64 : o.cps)
    for (auto [dp, tp] : mesh_factorisations(world / static_cast<int>(cp64))) {
      const int cp = static_cast<int>(cp64);
      std::vector<bool> sps;
      if (tp == 1)
        sps = {false};
      else if (o.sp == "both")
        sps = {false, true};
      else
        sps = {o.sp == "on"};
      for (bool sp : sps)
        for (int64_t b : o.batches) cfgs.push_back({dp, tp, sp, b, cp});
    }
  return cfgs;
}

// What the runs gave: per configuration its results (one per repeat) or why it cannot run.
struct SweepRuns {
  std::vector<std::vector<BlockBenchResult>> runs;
  std::vector<std::string> why;
  size_t done = 0;      // runs attempted
  double total_s = 0;   // wall time of them all
  bool printer = true;  // this process reports (rank 0; every process runs every one)
};

void sweep_progress(const Config& c, int rep, int repeats, size_t done, size_t total, double el,
                    bool tty) {
  std::string eta =
      done == 0 ? "--:--"
                : clock_str(el / static_cast<double>(done) * static_cast<double>(total - done));
  std::cerr << (tty ? "\r\033[K" : "") << "sweep [" << done + 1 << "/" << total << "] " << c.label()
            << (repeats > 1 ? " (repeat " + std::to_string(rep + 1) + ")" : "") << "  elapsed "
            << clock_str(el) << ", ETA " << eta << (tty ? "" : "\n") << std::flush;
}

// Repeats go round-robin over the configurations, so a burst of load on a shared machine hits
// one run of several configurations rather than every run of one.
SweepRuns sweep_run_all(const SweepOptions& o, const BlockBenchOptions& base,
                        const std::vector<Config>& cfgs, std::ostream& os) {
  const int R = o.repeats;
  SweepRuns sr;
  sr.runs.resize(cfgs.size());
  sr.why.resize(cfgs.size());
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = Clock::now();
  const size_t total = cfgs.size() * static_cast<size_t>(R);
  for (int rep = 0; rep < R; ++rep) {
    for (size_t i = 0; i < cfgs.size(); ++i) {
      const Config& c = cfgs[i];
      if (!sr.why[i].empty()) continue;  // cannot run: do not try again
      if (o.progress && sr.printer)
        sweep_progress(c, rep, R, sr.done, total, bench::ms_since(t0, Clock::now()) / 1e3, tty);
      BlockBenchOptions bo = base;
      bo.mesh = sweep_mesh(c.dp, c.cp, c.tp);
      bo.sp = c.sp ? 1 : 0;
      bo.batch = c.batch;
      try {
        BlockBenchResult r = run_block_bench_result(bo, os);
        sr.printer = r.valid;
        sr.runs[i].push_back(std::move(r));
      } catch (const Error& e) {
        sr.why[i] = e.message();
      }
      ++sr.done;
    }
  }
  sr.total_s = bench::ms_since(t0, Clock::now()) / 1e3;
  if (o.progress && sr.printer)
    std::cerr << (tty ? "\r\033[K" : "") << "sweep: " << sr.done << " runs of " << cfgs.size()
              << " configurations in " << clock_str(sr.total_s) << "\n"
              << std::flush;
  return sr;
}

// One outcome per configuration: the run with the median step time stands for it, its MFU
// against one denominator for the whole table: the given peak, else the fastest calibration
// any run measured (each run calibrates; the machine's best moment is the fairest estimate).
std::vector<Outcome> sweep_outcomes(const std::vector<Config>& cfgs, const SweepRuns& sr) {
  double peak = 0;
  std::string peak_label;
  for (auto& rs : sr.runs)
    for (auto& r : rs)
      if (r.peak_tflops_per_rank > peak) {
        peak = r.peak_tflops_per_rank;
        peak_label = r.peak_label;
      }
  std::vector<Outcome> out;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    Outcome oc;
    oc.c = cfgs[i];
    oc.why = sr.why[i];
    if (!sr.runs[i].empty()) {
      std::vector<BlockBenchResult> rs = sr.runs[i];
      std::sort(rs.begin(), rs.end(), [](const BlockBenchResult& a, const BlockBenchResult& b) {
        return a.step_ms < b.step_ms;
      });
      oc.r = rs[(rs.size() - 1) / 2];
      for (auto& r : sr.runs[i]) oc.step_ms_runs.push_back(r.step_ms);
      oc.r.mfu = peak > 0 ? oc.r.tflops / (peak * oc.r.world) : -1;
      oc.r.peak_tflops_per_rank = peak;
      oc.r.peak_label = peak_label;
      oc.ok = true;
    }
    out.push_back(std::move(oc));
  }
  return out;
}

// The table, best first (ok: sorted by tokens/s), then the configurations skipped.
void sweep_print_table(const SweepOptions& o, const BlockBenchOptions& base, int world,
                       const std::vector<Outcome>& ok, const std::vector<Outcome>& skipped,
                       const SweepRuns& sr, std::ostream& os) {
  const BlockBenchResult* any = ok.empty() ? nullptr : &ok.front().r;
  os << "meshrt sweep: " << o.base.kind << " on " << base.devices << " (" << world << " ranks)";
  if (any)
    os << ", hidden " << any->hidden << ", seq " << any->seq << ", " << any->dtype << ", "
       << base.steps << " timed steps after " << base.warmup << " warm-up per run, " << o.repeats
       << (o.repeats == 1 ? " run" : " runs (median shown)") << " per configuration";
  os << "\n";
  os << "batch = micro-batch per dp replica; tokens/s over all replicas; sorted by tokens/s\n\n";
  char line[512];
  int mw = 12;  // the mesh column: wider for cp meshes ("dp=1,cp=2,tp=1")
  for (const auto& oc : ok) mw = std::max(mw, static_cast<int>(oc.r.mesh.size()));
  std::snprintf(line, sizeof(line), "  %-4s %-*s %-4s %6s %10s %10s %9s %7s %10s %10s %10s\n", "",
                mw, "mesh", "sp", "batch", "step ms", "tokens/s", "TFLOP/s", "MFU", "tp exp ms",
                "dp exp ms", "peak MiB");
  os << line;
  for (size_t i = 0; i < ok.size(); ++i) {
    const auto& r = ok[i].r;
    std::snprintf(
        line, sizeof(line), "  %-4s %-*s %-4s %6lld %10.2f %10.0f %9.3f %7s %10.2f %10.2f %10.1f\n",
        i == 0 ? "best" : "", mw, r.mesh.c_str(), r.tp == 1 ? "-" : (r.sp ? "on" : "off"),
        static_cast<long long>(r.batch), r.step_ms, r.tokens_per_s, r.tflops,
        r.mfu >= 0 ? (bench::fmt("%.1f", 100 * r.mfu) + "%").c_str() : "n/a", r.tp_exposed_ms,
        r.dp_exposed_ms, static_cast<double>(r.peak_bytes) / (1024.0 * 1024.0));
    os << line;
  }
  for (const auto& s : skipped)
    os << "  skipped " << s.c.label() << ": " << (s.why.empty() ? "no result" : s.why) << "\n";
  if (any && any->mfu >= 0) os << "\nMFU against " << any->peak_label << "\n";
  os << "(" << clock_str(sr.total_s) << " for " << sr.done << " runs)\n";
}

void sweep_write_json(const SweepOptions& o, const BlockBenchOptions& base, int world,
                      const std::vector<Outcome>& ok, const std::vector<Outcome>& skipped,
                      double total_s) {
  json j;
  j["tool"] = "meshrt sweep";
  j["command_line"] = o.base.command_line;
  j["versions"] = o.base.versions;
  j["devices"] = base.devices;
  j["world_size"] = world;
  j["batches"] = o.batches;
  j["repeats"] = o.repeats;
  j["wall_s"] = total_s;
  j["results"] = json::array();
  for (size_t i = 0; i < ok.size(); ++i) {
    json r = json::parse(ok[i].r.json);
    r["best"] = i == 0;
    r["mfu"] = ok[i].r.mfu >= 0 ? json(ok[i].r.mfu) : json(nullptr);
    r["peak"]["tflops_per_rank"] = ok[i].r.peak_tflops_per_rank;
    r["peak"]["label"] = ok[i].r.peak_label + " (best calibration of the sweep)";
    r["sweep_step_ms_per_repeat"] = ok[i].step_ms_runs;
    j["results"].push_back(r);
  }
  j["skipped"] = json::array();
  for (const auto& s : skipped) j["skipped"].push_back({{"config", s.c.label()}, {"why", s.why}});
  write_output_file(o.json_path, j.dump(2) + "\n", "--json");
}

}  // namespace

int run_sweep(const SweepOptions& o, std::ostream& os) {
  check_sweep_options(o);
  int world = 1;
  const BlockBenchOptions base = sweep_base_options(o, &world);
  const std::vector<Config> cfgs = sweep_configs(o, world);
  const SweepRuns sr = sweep_run_all(o, base, cfgs, os);
  if (!sr.printer) return 0;  // only the process with rank 0 reports

  std::vector<Outcome> ok, skipped;
  for (auto& oc : sweep_outcomes(cfgs, sr)) (oc.ok && oc.r.valid ? ok : skipped).push_back(oc);
  std::stable_sort(ok.begin(), ok.end(), [](const Outcome& a, const Outcome& b) {
    return a.r.tokens_per_s > b.r.tokens_per_s;
  });
  sweep_print_table(o, base, world, ok, skipped, sr, os);
  if (!o.json_path.empty()) {
    sweep_write_json(o, base, world, ok, skipped, sr.total_s);
    os << "wrote " << o.json_path << "\n";
  }
  if (!o.plot_path.empty() && !ok.empty()) {
    const BlockBenchResult& any = ok.front().r;
    std::string title = "meshrt sweep: " + o.base.kind + " on " + base.devices + ", hidden " +
                        std::to_string(any.hidden) + ", seq " + std::to_string(any.seq) + ", " +
                        any.dtype + " (best in green)";
    write_plot(o.plot_path, ok, title);
    os << "wrote " << o.plot_path << "\n";
  }
  return ok.empty() ? 1 : 0;
}

}  // namespace meshrt
