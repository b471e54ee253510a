#include "bench/block/report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <string_view>
#include <thread>

#include "bench/block/flops.h"
#include "bench/common/host_gemm_report.h"
#include "bench/common/stats.h"
#include "plan/cost_model.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "runtime/stream.h"

namespace meshrt {

namespace {

using json = nlohmann::json;
using bench::fmt;
using bench::human_bytes;
using bench::human_flops;
using bench::median;
using bench::percentile;

// The GPU model name of cuda:<index> from the backend's version string ("; cuda:0 NAME (sm_").
std::string cuda_device_name(int index) {
  const std::string v = device_versions(DeviceType::CUDA);
  if (v.empty()) return "";
  const std::string key = "cuda:" + std::to_string(index) + " ";
  size_t p = v.find(key);
  if (p == std::string::npos) return "";
  p += key.size();
  size_t e = v.find(" (sm_", p);
  return v.substr(p, e == std::string::npos ? std::string::npos : e - p);
}

}  // namespace

namespace {

// The planner's prediction for this run's own configuration (plan/cost_model.h), next to
// the measurement: the cluster given by --plan-cluster, else the GPU's preset for this many
// devices, else the cpu preset with this run's calibrated GEMM peak. Null when no cluster fits.
nlohmann::json planner_json(const BlockPlan& p, const BlockBenchOptions& o,
                            const BlockBenchResult& res, const std::string& gpu_name) {
  using nlohmann::json;
  if (o.fwd_only) return json{{"note", "forward-only runs are not modelled"}};
  plan::ModelSpec m;
  m.hidden = p.cfg.hidden;
  m.heads = p.cfg.heads;
  m.ffn = p.cfg.ffn;
  m.seq = p.seq;
  m.layers = p.layers;
  m.dtype = dtype_name(p.cfg.dtype);
  m.kind = p.kind;
  plan::PlanConfig c;
  c.dp = p.dp;
  c.tp = p.tp;
  c.sp = p.sp;
  c.micro_batch = p.batch;
  c.bucket_mb = o.bucket_mb;
  c.overlap = p.overlap;
  c.optimizer = false;
  plan::ClusterSpec cl;
  std::string source;
  try {
    if (!o.plan_cluster.empty()) {
      cl = plan::load_cluster(o.plan_cluster, m.dtype);
      source = o.plan_cluster;
    } else if (p.cuda) {
      std::string preset;
      for (const char* g : {"H100", "H200", "A100"})
        if (gpu_name.find(g) != std::string::npos) preset = std::string(g) + "-sxm";
      if (preset.empty()) return json{{"note", "no cluster preset for " + gpu_name}};
      for (char& ch : preset) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      cl = plan::load_cluster(preset + ":" + std::to_string(std::min(p.world, 8)), m.dtype);
      source = "preset " + cl.name;
    } else {
      cl = plan::cluster_preset("cpu");
      cl.devices_per_node = p.world;
      if (res.peak_tflops_per_rank > 0) cl.peaks[m.dtype] = res.peak_tflops_per_rank;
      cl.select_dtype(m.dtype);
      source = "preset cpu, GEMM peak " + fmt("%.1f", cl.peak_tflops * 1e3) + " GFLOP/s";
    }
    if (cl.devices_per_node < p.tp) cl.devices_per_node = p.world;
    const plan::Prediction pr = plan::predict(m, cl, c);
    return json{{"cluster", source},
                {"predicted",
                 {{"step_ms", pr.step_s * 1e3},
                  {"compute_ms", pr.compute_s * 1e3},
                  {"tp_comm_ms", pr.tp_comm_s * 1e3},
                  {"tp_exposed_ms", pr.tp_exposed_s * 1e3},
                  {"dp_comm_ms", pr.dp_comm_s * 1e3},
                  {"dp_exposed_ms", pr.dp_exposed_s * 1e3},
                  {"tp_bytes_per_step_per_rank", pr.tp_bytes},
                  {"tp_collectives_per_step_per_rank", pr.tp_count},
                  {"dp_bytes_per_step_per_rank", pr.dp_bytes},
                  {"dp_collectives_per_step_per_rank", pr.dp_count},
                  {"memory_bytes", pr.mem.total()}}},
                {"step_error", res.step_ms > 0 ? pr.step_s * 1e3 / res.step_ms - 1 : 0.0}};
  } catch (const Error& e) {
    return json{{"note", "no prediction: " + e.message()}};
  }
}

}  // namespace

BlockBenchResult block_report(const BlockPlan& p, const BlockBenchOptions& o,
                              const std::vector<RankFigures>& figures,
                              const std::vector<std::string>& traces, int dumped, double wall_s,
                              std::ostream& os) {
  const Launch& launch = *p.launch;
  BlockBenchResult res;
  // ---- figures -------------------------------------------------------------------------------
  const int W = p.world, S = p.steps;
  auto at = [&](int rank, int step) -> const StepFigures& {
    return figures[static_cast<size_t>(rank)].steps[static_cast<size_t>(step)];
  };
  auto rank_of = [&](int rank) -> const RankFigures& { return figures[static_cast<size_t>(rank)]; };
  std::vector<double> step_ms(static_cast<size_t>(S)), issue_ms(static_cast<size_t>(S));
  // Per step: mean over ranks of the communication figures.
  std::vector<double> tpc(static_cast<size_t>(S)), tpe(static_cast<size_t>(S)),
      dpc(static_cast<size_t>(S)), dpe(static_cast<size_t>(S)), comp(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    double mx = 0, imx = 0;
    for (int r = 0; r < W; ++r) {
      mx = std::max(mx, at(r, s).step_ms);
      imx = std::max(imx, at(r, s).issue_cpu_ms);
      tpc[static_cast<size_t>(s)] += at(r, s).tp.comm_ms / W;
      tpe[static_cast<size_t>(s)] += at(r, s).tp.exposed_ms / W;
      dpc[static_cast<size_t>(s)] += at(r, s).dp.comm_ms / W;
      dpe[static_cast<size_t>(s)] += at(r, s).dp.exposed_ms / W;
      comp[static_cast<size_t>(s)] += at(r, s).compute_ms() / W;
    }
    step_ms[static_cast<size_t>(s)] = mx;  // a step is done when its slowest rank is
    issue_ms[static_cast<size_t>(s)] = imx;
  }
  res.valid = true;
  res.mesh = p.mesh;
  res.dp = p.dp;
  res.tp = p.tp;
  res.world = W;
  res.sp = p.sp;
  res.batch = p.batch;
  res.seq = p.seq;
  res.hidden = p.cfg.hidden;
  res.dtype = dtype_name(p.cfg.dtype);
  res.step_ms = median(step_ms);
  res.step_p10_ms = percentile(step_ms, 0.1);
  res.step_p90_ms = percentile(step_ms, 0.9);
  const double tokens = static_cast<double>(p.batch * p.dp * p.seq);
  res.tokens_per_s = tokens / (res.step_ms * 1e-3);
  res.tflops = p.step_flops / (res.step_ms * 1e-3) / 1e12;
  res.tp_comm_ms = median(tpc);
  res.tp_exposed_ms = median(tpe);
  res.dp_comm_ms = median(dpc);
  res.dp_exposed_ms = median(dpe);
  res.compute_ms = median(comp);
  for (int r = 0; r < W; ++r) res.peak_bytes = std::max(res.peak_bytes, rank_of(r).peak_bytes);
  res.overhead_fraction = median(issue_ms) / res.step_ms;

  // Peak for MFU: given, else the GPU table, else the calibration GEMM.
  std::string peak_src, gpu_name;
  if (o.peak_tflops > 0) {
    res.peak_tflops_per_rank = o.peak_tflops;
    res.peak_label = o.peak_label.empty() ? "given with --peak-tflops" : o.peak_label;
    peak_src = "given";
  } else {
    if (p.cuda) {
      gpu_name = cuda_device_name(static_cast<int>(rank_of(0).device_index));
      std::string matched;
      const double pk = gpu_peak_tflops(gpu_name, p.cfg.dtype, &matched);
      if (pk > 0) {
        res.peak_tflops_per_rank = pk;
        res.peak_label = gpu_name + " " + dtype_name(p.cfg.dtype) + " dense peak " +
                         fmt("%.1f", pk) + " TFLOP/s (datasheet)";
        peak_src = "gpu_table";
      }
    }
    if (peak_src.empty()) {
      double sum = 0;
      for (int r = 0; r < W; ++r) sum += rank_of(r).calib_flops;
      if (sum > 0) {
        res.peak_tflops_per_rank = sum / W / 1e12;
        const int n = p.cuda ? 8192 : 1024;
        res.peak_label = std::string("calibration GEMM (") + dtype_name(p.cfg.dtype) +
                         ", best of " + std::to_string(n) + "^3 and the block's fc1 shape " +
                         std::to_string(p.batch * p.seq) + "x" + std::to_string(p.cfg.ffn / p.tp) +
                         "x" + std::to_string(p.cfg.hidden) +
                         ", all ranks at once, fastest of 10 runs): " + fmt("%.1f", sum / W / 1e9) +
                         " GFLOP/s per rank" +
                         (p.cuda ? " (GPU not in the peak table)" : " (CPU: no datasheet peak)");
        peak_src = "calibration_gemm";
      }
    }
  }
  if (res.peak_tflops_per_rank > 0) res.mfu = res.tflops / (res.peak_tflops_per_rank * W);

  // Per-rank figures and skew.
  json ranks = json::array();
  std::vector<double> rank_step, rank_comp;
  for (int r = 0; r < W; ++r) {
    std::vector<double> st, cp, te, de;
    for (int s = 0; s < S; ++s) {
      st.push_back(at(r, s).step_ms);
      cp.push_back(at(r, s).compute_ms());
      te.push_back(at(r, s).tp.exposed_ms);
      de.push_back(at(r, s).dp.exposed_ms);
    }
    rank_step.push_back(median(st));
    rank_comp.push_back(median(cp));
    ranks.push_back({{"rank", r},
                     {"step_ms_median", median(st)},
                     {"compute_ms_median", median(cp)},
                     {"tp_exposed_ms_median", median(te)},
                     {"dp_exposed_ms_median", median(de)},
                     {"peak_allocated_bytes", rank_of(r).peak_bytes},
                     {"reserved_bytes", rank_of(r).reserved_bytes},
                     {"calibration_gflops", rank_of(r).calib_flops / 1e9},
                     {"device_index", rank_of(r).device_index}});
  }
  const double slow = *std::max_element(rank_step.begin(), rank_step.end()),
               fast = *std::min_element(rank_step.begin(), rank_step.end());
  const double cslow = *std::max_element(rank_comp.begin(), rank_comp.end()),
               cfast = *std::min_element(rank_comp.begin(), rank_comp.end());
  const int slow_rank =
      static_cast<int>(std::max_element(rank_step.begin(), rank_step.end()) - rank_step.begin());
  const int fast_rank =
      static_cast<int>(std::min_element(rank_step.begin(), rank_step.end()) - rank_step.begin());
  const double markers_per_step = static_cast<double>(rank_of(0).markers) / S;

  // ---- JSON -----------------------------------------------------------------------------------
  auto comm_json = [&](const std::vector<double>& c, const std::vector<double>& e,
                       const CommTimes& first, int size) {
    const double cm = median(c), em = median(e);
    return json{{"size", size},
                {"comm_ms_median", cm},
                {"exposed_ms_median", em},
                {"exposed_fraction", cm > 0 ? em / cm : 0.0},
                {"bytes_per_step_per_rank", static_cast<double>(first.bytes)},
                {"collectives_per_step_per_rank", static_cast<double>(first.count)},
                {"comm_ms", c},
                {"exposed_ms", e}};
  };
  json j;
  j["tool"] = std::string("meshrt bench ") + layer_kind_name(p.kind);
  j["command_line"] = o.command_line;
  j["versions"] = o.versions;
  if (!p.cuda) j["host_f32_gemm"] = bench::host_f32_gemm_json();
  j["config"] = {{"kind", layer_kind_name(p.kind)},
                 {"devices", p.devices},
                 {"launch", launch.describe()},
                 {"world_size", W},
                 {"device_type", p.cuda ? "cuda" : "cpu"},
                 {"gpu_name", gpu_name},
                 {"mesh", p.mesh},
                 {std::string(kDpDim), p.dp},
                 {std::string(kTpDim), p.tp},
                 {"sp", p.sp},
                 {"overlap", overlap_name(p.overlap)},
                 {"batch_per_replica", p.batch},
                 {"global_batch", p.batch * p.dp},
                 {"seq", p.seq},
                 {"hidden", p.cfg.hidden},
                 {"ffn", p.cfg.ffn},
                 {"heads", p.cfg.heads},
                 {"layers", p.layers},
                 {"dtype", dtype_name(p.cfg.dtype)},
                 {"steps", p.steps},
                 {"warmup", p.warmup},
                 {"fwd_only", o.fwd_only},
                 {"bucket_mb", o.bucket_mb},
                 {"seed", o.seed},
                 {"host_threads_per_rank",
                  p.cuda ? 0
                         : static_cast<int>(std::max(
                               1u, std::thread::hardware_concurrency() /
                                       static_cast<unsigned>(launch.local().front().local_size)))}};
  j["flops"] = {
      {"per_layer_forward",
       {{"qkv", p.flops.qkv},
        {"attention", p.flops.attn},
        {"attention_unmasked", p.flops.attn_full},
        {"out_proj", p.flops.proj},
        {"mlp", p.flops.mlp},
        {"total", p.flops.forward()}}},
      {"per_step", p.step_flops},
      {"backward_factor", o.fwd_only ? 0 : 2},
      {"causal_attention",
       "counted at half (2*B*s^2*h per layer): meshrt's fused attention skips key tiles "
       "above the diagonal"},
      {"convention",
       "matmul FLOPs only (2 per multiply-add); B = global batch; backward = 2 x forward"}};
  j["step_ms"] = {{"median", res.step_ms},
                  {"p10", res.step_p10_ms},
                  {"p90", res.step_p90_ms},
                  {"min", *std::min_element(step_ms.begin(), step_ms.end())},
                  {"max", *std::max_element(step_ms.begin(), step_ms.end())},
                  {"all", step_ms},
                  {"definition",
                   "per step, the slowest rank's wall time from a barrier to its "
                   "streams drained"}};
  j["tokens_per_step"] = tokens;
  j["tokens_per_s"] = res.tokens_per_s;
  j["tflops_model"] = res.tflops;
  j["tflops_per_rank"] = res.tflops / W;
  j["peak"] = {{"source", peak_src.empty() ? "none" : peak_src},
               {"tflops_per_rank", res.peak_tflops_per_rank},
               {"label", res.peak_label}};
  j["mfu"] = res.mfu >= 0 ? json(res.mfu) : json(nullptr);
  j["compute_ms_median"] = res.compute_ms;
  j["comm"] = {{std::string(kTpDim), comm_json(tpc, tpe, at(0, 0).tp, p.tp)},
               {std::string(kDpDim), comm_json(dpc, dpe, at(0, 0).dp, p.dp)}};
  // Host streams queue work: a tensor a queued task uses stays allocated until the task ran, so
  // the host peak is the program's plus what the queues hold, unless MESHRT_LAUNCH_BLOCKING=1.
  const bool blocking = !p.cuda && launch_blocking_from_env();
  j["memory"] = {
      {"peak_allocated_bytes_max", res.peak_bytes},
      {"launch_blocking", blocking},
      {"note", std::string("allocator peak over the timed steps (parameters, gradients, "
                           "activations, communication buffers)") +
                   (p.cuda || blocking ? ""
                                       : "; host streams queued work, so it includes tensors held "
                                         "by queued tasks (MESHRT_LAUNCH_BLOCKING=1 measures the "
                                         "program-order peak)")}};
  j["skew"] = {{"slowest_rank", slow_rank},
               {"fastest_rank", fast_rank},
               {"step_ms_slowest", slow},
               {"step_ms_fastest", fast},
               {"step_skew_fraction", fast > 0 ? slow / fast - 1 : 0.0},
               {"compute_ms_slowest", cslow},
               {"compute_ms_fastest", cfast},
               {"compute_skew_fraction", cfast > 0 ? cslow / cfast - 1 : 0.0}};
  j["overhead"] = {{"issue_cpu_ms_median", median(issue_ms)},
                   {"fraction_of_step", res.overhead_fraction},
                   {"trace_markers_per_step", markers_per_step},
                   {"definition",
                    "CPU time of the issuing thread per step (mesh layer, scheduler, allocator, "
                    "enqueueing, benchmark timers and trace markers), slowest rank; target <= "
                    "3% of the step"}};
  j["ranks"] = ranks;
  j["wall_s"] = wall_s;
  j["plan"] = planner_json(p, o, res, gpu_name);
  res.json = j.dump(2);

  // ---- report ---------------------------------------------------------------------------------
  if (!o.quiet) {
    const char* kname = p.kind == LayerKind::Transformer ? "transformer block (attention + MLP)"
                        : p.kind == LayerKind::Mlp       ? "MLP block"
                                                         : "attention block";
    os << "meshrt bench " << layer_kind_name(p.kind) << ": " << kname << " x" << p.layers
       << ", hidden " << p.cfg.hidden << ", heads " << p.cfg.heads << ", ffn " << p.cfg.ffn
       << ", seq " << p.seq << ", batch " << p.batch << (p.dp > 1 ? " per dp replica" : "") << ", "
       << dtype_name(p.cfg.dtype) << "\n";
    os << "mesh " << p.mesh << " (sp " << (p.sp ? "on" : (p.tp == 1 ? "n/a at tp=1" : "off"))
       << ", overlap " << overlap_name(p.overlap) << (p.dp > 1 ? ", dp bucket " : "")
       << (p.dp > 1 ? fmt("%g", o.bucket_mb) + " MiB" : "") << ") on " << launch.describe()
       << ", devices " << p.devices << "\n";
    os << "warmup " << p.warmup << ", timed steps " << p.steps << ", "
       << (o.fwd_only ? "forward only" : "forward + backward") << "\n\n";
    auto row = [&](const std::string& k, const std::string& v) {
      os << "  " << k;
      for (size_t i = k.size(); i < 14; ++i) os << ' ';
      os << v << "\n";
    };
    row("step time", "median " + fmt("%.2f", res.step_ms) + " ms   p10 " +
                         fmt("%.2f", res.step_p10_ms) + "   p90 " + fmt("%.2f", res.step_p90_ms) +
                         "   (slowest rank per step)");
    row("tokens/s",
        fmt("%.0f", res.tokens_per_s) + "   (" + fmt("%.0f", tokens) + " tokens per step)");
    row("model FLOPs", human_flops(p.step_flops) + " per step = fwd " +
                           human_flops(p.flops.forward() * p.layers) +
                           (o.fwd_only ? "" : " + bwd 2x fwd") +
                           "; causal attention counted at half (the kernel skips masked tiles)");
    row("TFLOP/s",
        fmt("%.3f", res.tflops) + " model total, " + fmt("%.3f", res.tflops / W) + " per rank");
    if (res.mfu >= 0) row("MFU", fmt("%.1f", 100 * res.mfu) + "% of " + res.peak_label);
    if (j["plan"].contains("predicted")) {
      const json& pr = j["plan"]["predicted"];
      row("planner", "predicts " + fmt("%.2f", pr["step_ms"].get<double>()) + " ms (" +
                         fmt("%+.1f", 100 * j["plan"]["step_error"].get<double>()) +
                         "% of measured), tp exposed " +
                         fmt("%.2f", pr["tp_exposed_ms"].get<double>()) + " ms, dp exposed " +
                         fmt("%.2f", pr["dp_exposed_ms"].get<double>()) + " ms  (" +
                         j["plan"]["cluster"].get<std::string>() + ")");
    } else
      row("MFU", "n/a (no peak known: pass --peak-tflops)");
    row("compute", fmt("%.2f", res.compute_ms) +
                       " ms per step (step minus exposed communication, mean over ranks)");
    auto comm_row = [&](std::string_view dim_name, int size, double c, double e,
                        const CommTimes& first) {
      const std::string dim(dim_name);
      if (size == 1) {
        row(std::string("comm ") + dim, std::string("- (") + dim + "=1)");
        return;
      }
      row(std::string("comm ") + dim,
          fmt("%.2f", c) + " ms on the " + dim + " stream, " + fmt("%.2f", e) + " ms exposed (" +
              fmt("%.0f", c > 0 ? 100 * e / c : 0) + "%), " +
              fmt("%.0f", static_cast<double>(first.count)) + " collectives, " +
              human_bytes(static_cast<double>(first.bytes)) + " per rank per step");
    };
    comm_row(kTpDim, p.tp, res.tp_comm_ms, res.tp_exposed_ms, at(0, 0).tp);
    comm_row(kDpDim, p.dp, res.dp_comm_ms, res.dp_exposed_ms, at(0, 0).dp);
    row("memory", "peak " + human_bytes(static_cast<double>(res.peak_bytes)) +
                      " allocated per rank (max over ranks)");
    if (W > 1)
      row("skew", "slowest rank " + std::to_string(slow_rank) + " " + fmt("%.2f", slow) +
                      " ms vs fastest rank " + std::to_string(fast_rank) + " " + fmt("%.2f", fast) +
                      " ms (+" + fmt("%.1f", 100 * (slow / fast - 1)) + "%); compute " +
                      fmt("%.2f", cslow) + " vs " + fmt("%.2f", cfast) + " ms");
    row("overhead",
        fmt("%.2f", median(issue_ms)) + " ms CPU per step issuing work (" +
            fmt("%.2f", 100 * res.overhead_fraction) + "% of the step; target <= 3%)" +
            (o.trace_path.empty() ? ""
                                  : ", with " + fmt("%.0f", markers_per_step) + " trace markers"));
    os << std::flush;
  }

  // ---- files ----------------------------------------------------------------------------------
  if (!o.json_path.empty()) {
    write_output_file(o.json_path, res.json + "\n", "--json");
    if (!o.quiet) os << "wrote " << o.json_path << "\n";
  }
  if (!o.trace_path.empty()) {
    std::ostringstream f;
    f << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << json(j["config"]).dump()
      << ",\n\"traceEvents\":[\n";
    bool first = true;
    for (const std::string& t : traces) {
      if (t.empty()) continue;
      if (!first) f << ",\n";
      f << t;
      first = false;
    }
    f << "\n]}\n";
    write_output_file(o.trace_path, f.str(), "--trace");
    if (!o.quiet)
      os << "wrote " << o.trace_path << " (" << fmt("%.0f", markers_per_step)
         << " markers per step on rank 0; open in ui.perfetto.dev or chrome://tracing)\n";
  }
  if (!o.dump_path.empty() && !o.quiet)
    os << "wrote " << o.dump_path << " (" << dumped << " tensors)\n";
  return res;
}

}  // namespace meshrt
