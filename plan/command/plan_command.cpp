#include "plan/command/plan_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "bench/common/stats.h"
#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/json_field.h"
#include "runtime/output_file.h"

namespace meshrt {

namespace {

using nlohmann::json;
using plan::ClusterSpec;
using plan::ModelSpec;
using plan::PlanConfig;
using plan::Prediction;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string gib(double bytes) { return fmt("%.1f", bytes / (1024.0 * 1024.0 * 1024.0)); }

json model_json(const ModelSpec& m) {
  return {{"hidden", m.hidden},
          {"heads", m.heads},
          {"ffn", m.ffn},
          {"layers", m.layers},
          {"seq", m.seq},
          {"vocab", m.vocab},
          {"dtype", dtype_name(m.dtype)},
          {"kind", layer_kind_name(m.kind)},
          {"params", m.params()}};
}

json prediction_json(const Prediction& p) {
  const PlanConfig& c = p.cfg;
  return {{"dp", c.dp},
          {"cp", c.cp},
          {"tp", c.tp},
          {"cp_comm", c.cp > 1 ? cp_comm_name(c.cp_comm) : "none"},
          {"sp", c.sp && c.tp > 1},
          {"micro_batch", c.micro_batch},
          {"accum", c.accum},
          {"bucket_mb", c.bucket_mb},
          {"overlap", overlap_name(c.overlap)},
          {"recompute", c.recompute},
          {"step_ms", p.step_s * 1e3},
          {"compute_ms", p.compute_s * 1e3},
          {"tp_comm_ms", p.tp_comm_s * 1e3},
          {"tp_exposed_ms", p.tp_exposed_s * 1e3},
          {"dp_comm_ms", p.dp_comm_s * 1e3},
          {"dp_exposed_ms", p.dp_exposed_s * 1e3},
          {"optimizer_ms", p.optimizer_s * 1e3},
          {"tp_bytes_per_step", p.tp_bytes},
          {"tp_collectives_per_step", p.tp_count},
          {"dp_bytes_per_step", p.dp_bytes},
          {"dp_collectives_per_step", p.dp_count},
          {"dp_inter_node", p.inter_node_dp},
          {"cp_comm_ms", p.cp_comm_s * 1e3},
          {"cp_exposed_ms", p.cp_exposed_s * 1e3},
          {"cp_bytes_per_step", p.cp_bytes},
          {"cp_imbalance", p.cp_imbalance},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"memory",
           {{"weights_bytes", p.mem.weights},
            {"grads_bytes", p.mem.grads},
            {"optimizer_bytes", p.mem.optimizer},
            {"activations_bytes", p.mem.activations},
            {"workspace_bytes", p.mem.workspace},
            {"total_bytes", p.mem.total()}}},
          {"fits", p.fits},
          {"overflow_bytes", p.overflow_bytes}};
}

// Through runtime/output_file.h like every other report: a temporary file renamed over the
// target, so a full disk or `ulimit -f` leaves the previous file whole; a non-regular target
// (/dev/null, a FIFO, a directory) is refused.
void write_file(const std::string& path, const std::string& text, const std::string& what,
                std::ostream& out) {
  write_output_file(path, text, what);
  out << "wrote " << path << "\n";
}

// 6.864B, 350.1M, 58.3K, 42: the model size as people write it, at any scale.
std::string params_text(int64_t n) {
  const double v = static_cast<double>(n);
  char b[32];
  if (v >= 1e9)
    std::snprintf(b, sizeof b, "%.4gB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(b, sizeof b, "%.4gM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(b, sizeof b, "%.4gK", v / 1e3);
  else
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(n));
  return b;
}

int run_table(const PlanOptions& o, std::ostream& out) {
  ModelSpec m = plan::parse_model_spec(o.model);
  m.dtype = parse_model_dtype(o.dtype);
  const ClusterSpec cl = plan::load_cluster(o.cluster, o.dtype);
  const Overlap ov = parse_overlap(o.overlap);
  std::vector<Prediction> all = plan::plan_all(m, cl, o.global_batch, o.buckets, ov, o.optimizer);
  if (o.recompute || o.zero > 0) {
    for (Prediction& p : all) {
      PlanConfig c = p.cfg;
      c.recompute = o.recompute;
      c.zero = o.zero;
      p = plan::predict(m, cl, c);
    }
    std::stable_sort(all.begin(), all.end(), [](const Prediction& a, const Prediction& b) {
      if (a.fits != b.fits) return a.fits;
      return a.tokens_per_s > b.tokens_per_s;
    });
  }
  MESHRT_CHECK(!all.empty(), "no layout of "
                                 << cl.world() << " devices reaches --global-batch "
                                 << o.global_batch << " with this model: the batch must divide by "
                                 << "dp = devices / (cp x tp) (try a multiple of " << cl.world()
                                 << ")");
  out << "meshrt plan: " << params_text(m.params()) << " parameters (hidden " << m.hidden
      << ", heads " << m.heads << ", ffn " << m.ffn << ", layers " << m.layers << ", seq " << m.seq
      << ", vocab " << m.vocab << ", " << dtype_name(m.dtype) << ") on " << cl.name << " ("
      << cl.world() << " x " << cl.device << ", " << cl.peak_tflops << " TFLOP/s, " << cl.memory_gib
      << " GiB), global batch " << o.global_batch << " sequences\n";
  out << "per step and device; mb = micro-batch per dp replica x accumulation steps; cp = the "
         "K/V exchange of context parallelism (cp ranks share each sequence); sorted by tokens/s, "
         "layouts that do not fit last\n\n";
  char line[400];
  std::snprintf(line, sizeof line,
                "%6s %-16s %9s %4s %9s %7s %10s %10s %9s %9s %9s %11s %6s %9s  %s\n", "", "mesh",
                "cp", "sp", "mb", "bucket", "step ms", "compute", "tp exp", "dp exp", "cp exp",
                "tokens/s", "MFU", "mem GiB", "fits");
  out << line;
  const size_t shown = o.top > 0 ? std::min(all.size(), static_cast<size_t>(o.top)) : all.size();
  for (size_t i = 0; i < shown; ++i) {
    const Prediction& p = all[i];
    const PlanConfig& c = p.cfg;
    const std::string mesh = plan::mesh_label(c);
    const std::string mb = std::to_string(c.micro_batch) + "x" + std::to_string(c.accum);
    const std::string fits = p.fits ? "yes" : "no, over by " + gib(p.overflow_bytes) + " GiB";
    std::snprintf(
        line, sizeof line,
        "%6s %-16s %9s %4s %9s %7s %10.1f %10.1f %9.1f %9.1f %9.1f %11.0f %5.1f%% %9s  %s\n",
        i == 0 && p.fits ? "best" : "", mesh.c_str(), c.cp > 1 ? cp_comm_name(c.cp_comm) : "-",
        c.tp > 1 ? (c.sp ? "on" : "off") : "-", mb.c_str(),
        c.dp * c.cp > 1 ? fmt("%g", c.bucket_mb).c_str() : "-", p.step_s * 1e3, p.compute_s * 1e3,
        p.tp_exposed_s * 1e3, p.dp_exposed_s * 1e3, p.cp_exposed_s * 1e3, p.tokens_per_s,
        100 * p.mfu, gib(p.mem.total()).c_str(), fits.c_str());
    out << line;
  }
  if (shown < all.size()) out << "(" << all.size() - shown << " more; --top 0 shows all)\n";
  const std::string why = plan::why_best(all);
  out << "\n" << why << "\n";
  if (!o.json_path.empty()) {
    json j;
    j["tool"] = "meshrt plan";
    j["format_version"] = 1;
    j["command_line"] = o.command_line;
    j["model"] = model_json(m);
    j["cluster"] = json::parse(plan::cluster_to_json(cl));
    j["global_batch"] = o.global_batch;
    j["configs"] = json::array();
    for (size_t i = 0; i < all.size(); ++i) {
      json c = prediction_json(all[i]);
      c["best"] = i == 0 && all[i].fits;
      j["configs"].push_back(c);
    }
    j["why"] = why;
    write_file(o.json_path, j.dump(2) + "\n", "--json", out);
  }
  return 0;
}

}  // namespace

void check_plan_options(const PlanOptions& o) {
  const int modes = !o.calibrate_path.empty() + !o.compare_path.empty();
  MESHRT_CHECK(modes <= 1, "--calibrate and --compare are separate runs: give one of them");
  MESHRT_CHECK(o.compare_memory_path.empty() || !o.compare_path.empty(),
               "--compare-memory " << o.compare_memory_path << " goes with --compare SWEEP_JSON");
  if (modes == 0) {
    MESHRT_CHECK(!o.model.empty(),
                 "--model is required (e.g. --model hidden=4096,heads=32,"
                 "ffn=11008,layers=32,seq=4096,vocab=32000)");
    MESHRT_CHECK(o.global_batch >= 1, "--global-batch is required (sequences per step, >= 1)");
    plan::parse_model_spec(o.model);
  }
  parse_model_dtype(o.dtype);
  parse_overlap(o.overlap);
  MESHRT_CHECK(o.top >= 0, "--top " << o.top << " must be >= 0");
  MESHRT_CHECK(!o.buckets.empty(), "--bucket-mb needs at least one size");
  for (double b : o.buckets) MESHRT_CHECK(b > 0, "--bucket-mb " << b << " must be positive");
  check_output_path(o.json_path, "--json");
  check_output_path(o.calibrate_path, "--calibrate");
  check_distinct_outputs({{"--json", o.json_path}, {"--calibrate", o.calibrate_path}});
  check_outputs_spare_inputs({{"--json", o.json_path}, {"--calibrate", o.calibrate_path}},
                             {{"--cluster", o.cluster},
                              {"--compare", o.compare_path},
                              {"--compare-memory", o.compare_memory_path}});
}

namespace {

// Far above any sweep's file (a few KiB per run), far below what would hurt to read.
constexpr uint64_t kMaxSweepFileBytes = 256ull << 20;

// One run of a sweep as --compare reads it, every field type and range checked.
struct SweepRun {
  std::string label;  // as the table labels it: "dp=1,tp=2 sp=on b=2"
  ModelSpec m;
  PlanConfig pc;
  bool fwd_only = false, cuda = false, launch_blocking = false, host_stream_reuse = false;
  double global_batch = 0, step_ms = 0, tp_exposed_ms = 0, dp_exposed_ms = 0, peak_bytes = 0;
  double tp_bytes = 0, tp_count = 0, dp_bytes = 0, dp_count = 0;
};

using SweepFields = JsonFields<json>;

// The model and layout of a run (its "config" object).
void read_sweep_config(const SweepFields& c, SweepRun& s) {
  // What a parser of a name refuses, named as the field it came from.
  auto named = [&](const char* key, const auto& parse) {
    const std::string v = c.string(key);
    try {
      return parse(v);
    } catch (const Error& e) {
      MESHRT_FAIL(c.where() << ": field '" << c.name(key) << "': " << e.message());
    }
  };
  constexpr int64_t kBig = int64_t{1} << 40;
  s.m.hidden = c.integer("hidden", 1, kBig);
  s.m.heads = c.integer("heads", 1, kBig);
  if (s.m.hidden % s.m.heads != 0)
    c.fail("heads", c.raw().at("heads"),
           "a divisor of " + c.name("hidden") + " " + std::to_string(s.m.hidden));
  s.m.ffn = c.integer("ffn", 1, kBig);
  s.m.layers = static_cast<int>(c.integer("layers", 1, 100000));
  s.m.seq = c.integer("seq", 1, kBig);
  s.m.dtype = named("dtype", [](const std::string& v) { return parse_model_dtype(v); });
  s.m.kind = named("kind", [](const std::string& v) { return parse_layer_kind(v); });
  s.pc.dp = static_cast<int>(c.integer("dp", 1, 1 << 20));
  s.pc.tp = static_cast<int>(c.integer("tp", 1, 1 << 20));
  // The cp of the run and its K/V exchange (absent in sweeps before cp: 1, ring).
  s.pc.cp = c.has("cp") ? static_cast<int>(c.integer("cp", 1, 1 << 20)) : 1;
  if (c.has("cp_comm"))
    s.pc.cp_comm = named("cp_comm", [](const std::string& v) { return parse_cp_comm(v); });
  s.pc.sp = c.boolean("sp");
  s.pc.micro_batch = c.integer("batch_per_replica", 1, kBig);
  s.global_batch = static_cast<double>(c.integer("global_batch", 1, kBig));
  s.pc.bucket_mb = c.number("bucket_mb", json_positive());
  s.pc.overlap = named("overlap", [](const std::string& v) { return parse_overlap(v); });
  s.pc.optimizer = false;  // the block benchmark runs no optimizer step
  // The ZeRO stage the run sharded over dp (bench block --zero; absent in older sweeps: 0).
  s.pc.zero = c.has("zero") ? static_cast<int>(c.integer("zero", 0, 3)) : 0;
  s.fwd_only = c.boolean_or("fwd_only", false);
  s.cuda = c.string_or("device_type", "") == "cuda";
  s.label = c.string("mesh") + " sp=" + (s.pc.tp > 1 ? (s.pc.sp ? "on" : "off") : "-") +
            " b=" + std::to_string(s.pc.micro_batch);
}

SweepRun read_sweep_run(const json& r, const std::string& where) {
  const SweepFields f(r, where);
  SweepRun s;
  read_sweep_config(f.object("config"), s);
  s.step_ms = f.object("step_ms").number("median", json_positive());
  const SweepFields comm = f.object("comm");
  const SweepFields tp = comm.object("tp"), dp = comm.object("dp");
  s.tp_exposed_ms = tp.number("exposed_ms_median", json_at_least(0));
  s.dp_exposed_ms = dp.number("exposed_ms_median", json_at_least(0));
  s.tp_bytes = tp.number("bytes_per_step_per_rank", json_at_least(0));
  s.dp_bytes = dp.number("bytes_per_step_per_rank", json_at_least(0));
  s.tp_count = tp.number("collectives_per_step_per_rank", json_at_least(0));
  s.dp_count = dp.number("collectives_per_step_per_rank", json_at_least(0));
  const SweepFields mem = f.object("memory");
  s.peak_bytes = mem.number("peak_allocated_bytes_max", json_positive());
  s.launch_blocking = mem.boolean_or("launch_blocking", false);
  s.host_stream_reuse = mem.boolean_or("host_stream_reuse", false);
  return s;
}

// Every run of the `meshrt sweep --json` file `path`, given as `flag`.
std::vector<SweepRun> read_sweep(const std::string& flag, const std::string& path) {
  const std::string where = flag + " " + path;
  const json j = parse_json_text(read_input_file(path, flag, kMaxSweepFileBytes), where);
  const SweepFields f(j, where);
  const json& results = f.array("results");
  MESHRT_CHECK(!results.empty(), where << ": field 'results' is [], not a list of runs; give a "
                                       << "`meshrt sweep --json` file of a sweep that ran");
  std::vector<SweepRun> runs;
  for (size_t i = 0; i < results.size(); ++i)
    runs.push_back(read_sweep_run(results[i], where + ": results[" + std::to_string(i) + "]"));
  return runs;
}

// A host run whose queued tasks held their tensors until they ran (MESHRT_HOST_STREAM_REUSE=0,
// or a sweep written before the host pool reused blocks stream-ordered): its peak exceeds the
// program-order one that the model predicts.
bool queued_peak_run(const SweepRun& r) {
  return !r.launch_blocking && !r.cuda && !r.host_stream_reuse;
}

// Program-order peaks by configuration, from a launch-blocking sweep (--compare-memory).
std::map<std::string, double> program_order_peaks(const std::string& memory_path) {
  std::map<std::string, double> po_peak;
  for (const SweepRun& r : read_sweep("--compare-memory", memory_path)) {
    MESHRT_CHECK(r.launch_blocking, "--compare-memory "
                                        << memory_path << ": " << r.label
                                        << " ran with queueing host streams; run that sweep with "
                                           "MESHRT_LAUNCH_BLOCKING=1");
    po_peak[r.label] = r.peak_bytes;
  }
  return po_peak;
}

// One sweep configuration, measured and predicted.
struct CompareRow {
  std::string label;
  double meas_ms, pred_ms, meas_tp, pred_tp, meas_dp, pred_dp, meas_mem, pred_mem;
  double global_batch;
  bool bytes_equal;
};

// The planner's prediction for sweep run `r` (run `i` of `path`) on `cluster`, next to what the
// sweep measured (the peak memory is filled in by the caller).
CompareRow compare_row(const SweepRun& r, size_t i, const std::string& path,
                       const std::string& cluster) {
  MESHRT_CHECK(!r.fwd_only, "--compare " << path << ": forward-only sweeps are not modelled");
  const ClusterSpec cl = plan::load_cluster(cluster, dtype_name(r.m.dtype));
  const int ranks = r.pc.dp * r.pc.cp * r.pc.tp;
  MESHRT_CHECK(ranks <= cl.world(), "--compare: the sweep ran " << ranks << " ranks, cluster "
                                                                << cl.name << " has "
                                                                << cl.world());
  Prediction p;
  try {
    p = plan::predict(r.m, cl, r.pc);
  } catch (const Error& e) {
    MESHRT_FAIL("--compare " << path << ": results[" << i << "] (" << r.label
                             << "): " << e.message());
  }
  CompareRow row;
  row.label = r.label;
  row.meas_ms = r.step_ms;
  row.pred_ms = p.step_s * 1e3;
  row.meas_tp = r.tp_exposed_ms;
  row.pred_tp = p.tp_exposed_s * 1e3;
  row.meas_dp = r.dp_exposed_ms;
  row.pred_dp = p.dp_exposed_s * 1e3;
  row.meas_mem = r.peak_bytes;
  row.pred_mem = p.mem.total();
  row.global_batch = r.global_batch;
  row.bytes_equal = std::llround(r.tp_bytes) == std::llround(p.tp_bytes) &&
                    std::llround(r.tp_count) == p.tp_count &&
                    std::llround(r.dp_bytes) == std::llround(p.dp_bytes) &&
                    std::llround(r.dp_count) == p.dp_count;
  return row;
}

// The markdown table; returns each row's |error| of the step time and sets the measured and the
// predicted best (by time per sequence: the sweep's ranking by tokens/s, batches differ).
std::vector<double> print_compare_table(const std::vector<CompareRow>& rows, std::ostream& out,
                                        size_t* mbest, size_t* pbest) {
  out << "| configuration | measured step ms | predicted step ms | error | measured tp exposed ms "
         "| predicted | measured dp exposed ms | predicted | measured peak MiB | predicted MiB "
         "| collectives & bytes |\n";
  out << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  std::vector<double> errs;
  auto per = [&](size_t k, bool pred) {
    return (pred ? rows[k].pred_ms : rows[k].meas_ms) / rows[k].global_batch;
  };
  *mbest = *pbest = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const CompareRow& r = rows[i];
    const double err = (r.pred_ms - r.meas_ms) / r.meas_ms;
    errs.push_back(std::fabs(err));
    if (per(i, false) < per(*mbest, false)) *mbest = i;
    if (per(i, true) < per(*pbest, true)) *pbest = i;
    char b[400];
    std::snprintf(b, sizeof b,
                  "| %s | %.1f | %.1f | %+.1f%% | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %s |\n",
                  r.label.c_str(), r.meas_ms, r.pred_ms, 100 * err, r.meas_tp, r.pred_tp, r.meas_dp,
                  r.pred_dp, r.meas_mem / 1048576.0, r.pred_mem / 1048576.0,
                  r.bytes_equal ? "equal" : "DIFFER");
    out << b;
  }
  return errs;
}

}  // namespace

std::string compare_with_sweep(const std::string& path, const std::string& cluster,
                               std::ostream& out, const std::string& memory_path) {
  const std::vector<SweepRun> runs = read_sweep("--compare", path);
  std::map<std::string, double> po_peak;
  if (!memory_path.empty()) po_peak = program_order_peaks(memory_path);
  bool queued_peaks = false;
  std::vector<CompareRow> rows;
  for (size_t i = 0; i < runs.size(); ++i) {
    CompareRow row = compare_row(runs[i], i, path, cluster);
    if (!memory_path.empty()) {
      auto it = po_peak.find(row.label);
      MESHRT_CHECK(it != po_peak.end(), "--compare-memory " << memory_path << ": no run of "
                                                            << row.label << ", which " << path
                                                            << " has; sweep the same layouts");
      row.meas_mem = it->second;
    } else if (queued_peak_run(runs[i])) {
      queued_peaks = true;
    }
    rows.push_back(row);
  }
  size_t mbest = 0, pbest = 0;
  const std::vector<double> errs = print_compare_table(rows, out, &mbest, &pbest);
  auto per_seq = [&](size_t k) { return rows[k].meas_ms / rows[k].global_batch; };
  const double loss = per_seq(pbest) / per_seq(mbest) - 1;
  const double med = bench::median(errs);
  double mem_err = 0;
  for (const CompareRow& r : rows)
    mem_err = std::max(mem_err, std::fabs(r.pred_mem / r.meas_mem - 1));
  out << "\nmedian |error| of the step time: " << fmt("%.1f", 100 * med) << "% over " << rows.size()
      << " configurations\n";
  out << "measured best: " << rows[mbest].label << "; predicted best: " << rows[pbest].label
      << " (measured " << fmt("%.1f", 100 * loss)
      << "% slower per sequence than the measured best)\n";
  out << "memory: largest |error| " << fmt("%.1f", 100 * mem_err) << "% against "
      << (memory_path.empty() ? (queued_peaks ? "the sweep's peaks, which include tensors held by "
                                                "queued host tasks (the model predicts the "
                                                "program-order peak: give a sweep run with "
                                                "MESHRT_LAUNCH_BLOCKING=1 as --compare-memory)"
                                              : "the sweep's peaks (stream-ordered host pool)")
                              : "the program-order peaks of " + memory_path)
      << "\n";
  json s = {{"median_abs_error", med},
            {"memory_max_abs_error", mem_err},
            {"memory_measured",
             memory_path.empty() ? (queued_peaks ? "queued" : "sweep") : "launch_blocking"},
            {"configurations", rows.size()},
            {"measured_best", rows[mbest].label},
            {"predicted_best", rows[pbest].label},
            {"predicted_best_loss", loss}};
  return s.dump();
}

int run_plan(const PlanOptions& o, std::ostream& out) {
  check_plan_options(o);
  if (!o.calibrate_path.empty()) {
    ModelSpec m;  // the CPU block benchmark's default shapes unless --model
    m.hidden = 1024;
    m.heads = 16;
    m.ffn = 4096;
    m.seq = 512;
    if (!o.model.empty()) m = plan::parse_model_spec(o.model);
    m.dtype = parse_model_dtype(o.dtype);
    ClusterSpec c = calibrate_cluster(m, o.devices, out);
    write_file(o.calibrate_path, plan::cluster_to_json(c), "--calibrate", out);
    return 0;
  }
  if (!o.compare_path.empty()) {
    const std::string summary =
        compare_with_sweep(o.compare_path, o.cluster, out, o.compare_memory_path);
    if (!o.json_path.empty()) write_file(o.json_path, summary + "\n", "--json", out);
    return 0;
  }
  return run_table(o, out);
}

}  // namespace meshrt
