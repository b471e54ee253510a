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
#include "runtime/env.h"
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
  const ModelSpec m = model_spec(p.cfg, p.kind, p.layers, p.seq);
  plan::PlanConfig c;
  c.dp = p.dp;
  c.tp = p.tp;
  c.cp = p.cp;
  c.cp_comm = p.cfg.cp_comm;
  c.sp = p.sp;
  c.micro_batch = p.batch;
  c.bucket_mb = o.bucket_mb;
  c.zero = o.zero;
  c.overlap = p.overlap;
  c.optimizer = false;
  plan::ClusterSpec cl;
  std::string source;
  try {
    if (!o.plan_cluster.empty()) {
      cl = plan::load_cluster(o.plan_cluster, dtype_name(m.dtype), "--plan-cluster");
      source = o.plan_cluster;
    } else if (p.cuda) {
      std::string preset;
      for (const char* g : {"H100", "H200", "A100"})
        if (gpu_name.find(g) != std::string::npos) preset = std::string(g) + "-sxm";
      if (preset.empty()) return json{{"note", "no cluster preset for " + gpu_name}};
      for (char& ch : preset) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      cl = plan::load_cluster(preset + ":" + std::to_string(std::min(p.world, 8)),
                              dtype_name(m.dtype));
      source = "preset " + cl.name;
    } else {
      cl = plan::cluster_preset("cpu");
      cl.devices_per_node = p.world;
      if (res.peak_tflops_per_rank > 0) cl.peaks[dtype_name(m.dtype)] = res.peak_tflops_per_rank;
      cl.select_dtype(dtype_name(m.dtype));
      source = "preset cpu, GEMM peak " + fmt("%.1f", cl.peak_tflops * 1e3) + " GFLOP/s";
    }
    if (cl.devices_per_node < p.tp) cl.devices_per_node = p.world;
    const plan::Prediction pr = plan::predict(m, cl, c);
    // The model counts a ring step once (a send, as many bytes arriving); the run times and
    // counts the send and the receive, each on its stream (comm.cp): predicted alike.
    const int ring_calls = p.cp > 1 && c.cp_comm == CpComm::Ring ? 2 : 1;
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
                  {"cp_comm_ms", pr.cp_comm_s * 1e3 * ring_calls},
                  {"cp_exposed_ms", pr.cp_exposed_s * 1e3},
                  // As the run counts them (comm.cp): the ring's sends and their receives.
                  {"cp_bytes_per_step_per_rank", pr.cp_bytes * ring_calls},
                  {"cp_collectives_per_step_per_rank", pr.cp_count * ring_calls},
                  {"memory_bytes", pr.mem.total()}}},
                {"step_error", res.step_ms > 0 ? pr.step_s * 1e3 / res.step_ms - 1 : 0.0}};
  } catch (const Error& e) {
    return json{{"note", "no prediction: " + e.message()}};
  }
}

// The figures of one run, reduced over ranks: per step (a step is done when its slowest rank
// is; communication and compute are means over ranks) and per rank (medians over steps).
struct BlockSummary {
  std::vector<double> step_ms, issue_ms, tpc, tpe, dpc, dpe, cpc, cpe, comp;  // per step
  json ranks = json::array();                       // per rank, for --json
  double slow = 0, fast = 0, cslow = 0, cfast = 0;  // step and compute medians of the extremes
  int slow_rank = 0, fast_rank = 0;
  double markers_per_step = 0;
  double tokens = 0;  // per step, over the dp replicas
  std::string peak_src, gpu_name;
};

const StepFigures& br_at(const std::vector<RankFigures>& figures, int rank, int step) {
  return figures[static_cast<size_t>(rank)].steps[static_cast<size_t>(step)];
}

void br_step_series(const BlockPlan& p, const std::vector<RankFigures>& figures, BlockSummary& s) {
  const int W = p.world;
  for (std::vector<double>* v :
       {&s.step_ms, &s.issue_ms, &s.tpc, &s.tpe, &s.dpc, &s.dpe, &s.cpc, &s.cpe, &s.comp})
    v->assign(static_cast<size_t>(p.steps), 0.0);
  for (int st = 0; st < p.steps; ++st) {
    const auto i = static_cast<size_t>(st);
    double mx = 0, imx = 0;
    for (int r = 0; r < W; ++r) {
      const StepFigures& f = br_at(figures, r, st);
      mx = std::max(mx, f.step_ms);
      imx = std::max(imx, f.issue_cpu_ms);
      s.tpc[i] += f.tp.comm_ms / W;
      s.tpe[i] += f.tp.exposed_ms / W;
      s.dpc[i] += f.dp.comm_ms / W;
      s.dpe[i] += f.dp.exposed_ms / W;
      s.cpc[i] += f.cp.comm_ms / W;
      s.cpe[i] += f.cp.exposed_ms / W;
      s.comp[i] += f.compute_ms() / W;
    }
    s.step_ms[i] = mx;  // a step is done when its slowest rank is
    s.issue_ms[i] = imx;
  }
}

void br_rank_skew(const BlockPlan& p, const std::vector<RankFigures>& figures, BlockSummary& s) {
  std::vector<double> rank_step, rank_comp;
  for (int r = 0; r < p.world; ++r) {
    std::vector<double> st, cp, te, de;
    for (int k = 0; k < p.steps; ++k) {
      const StepFigures& f = br_at(figures, r, k);
      st.push_back(f.step_ms);
      cp.push_back(f.compute_ms());
      te.push_back(f.tp.exposed_ms);
      de.push_back(f.dp.exposed_ms);
    }
    rank_step.push_back(median(st));
    rank_comp.push_back(median(cp));
    const RankFigures& rf = figures[static_cast<size_t>(r)];
    s.ranks.push_back({{"rank", r},
                       {"step_ms_median", median(st)},
                       {"compute_ms_median", median(cp)},
                       {"tp_exposed_ms_median", median(te)},
                       {"dp_exposed_ms_median", median(de)},
                       {"peak_allocated_bytes", rf.peak_bytes},
                       {"reserved_bytes", rf.reserved_bytes},
                       {"calibration_gflops", rf.calib_flops / 1e9},
                       {"device_index", rf.device_index}});
  }
  const auto slowest = std::max_element(rank_step.begin(), rank_step.end());
  const auto fastest = std::min_element(rank_step.begin(), rank_step.end());
  s.slow = *slowest;
  s.fast = *fastest;
  s.cslow = *std::max_element(rank_comp.begin(), rank_comp.end());
  s.cfast = *std::min_element(rank_comp.begin(), rank_comp.end());
  s.slow_rank = static_cast<int>(slowest - rank_step.begin());
  s.fast_rank = static_cast<int>(fastest - rank_step.begin());
  s.markers_per_step = static_cast<double>(figures.front().markers) / p.steps;
}

void br_fill_result(const BlockPlan& p, const std::vector<RankFigures>& figures,
                    const BlockSummary& s, BlockBenchResult& res) {
  res.valid = true;
  res.mesh = p.mesh;
  res.dp = p.dp;
  res.tp = p.tp;
  res.cp = p.cp;
  res.world = p.world;
  res.sp = p.sp;
  res.batch = p.batch;
  res.seq = p.seq;
  res.hidden = p.cfg.hidden;
  res.dtype = dtype_name(p.cfg.dtype);
  res.step_ms = median(s.step_ms);
  res.step_p10_ms = percentile(s.step_ms, 0.1);
  res.step_p90_ms = percentile(s.step_ms, 0.9);
  res.tokens_per_s = s.tokens / (res.step_ms * 1e-3);
  res.tflops = p.step_flops / (res.step_ms * 1e-3) / 1e12;
  res.tp_comm_ms = median(s.tpc);
  res.tp_exposed_ms = median(s.tpe);
  res.dp_comm_ms = median(s.dpc);
  res.dp_exposed_ms = median(s.dpe);
  res.cp_comm_ms = median(s.cpc);
  res.cp_exposed_ms = median(s.cpe);
  res.compute_ms = median(s.comp);
  for (int r = 0; r < p.world; ++r)
    res.peak_bytes = std::max(res.peak_bytes, figures[static_cast<size_t>(r)].peak_bytes);
  res.overhead_fraction = median(s.issue_ms) / res.step_ms;
}

// Peak for MFU: given, else the GPU table, else the calibration GEMM. Sets the result's peak
// and label, and the summary's peak source and GPU name.
void br_peak(const BlockPlan& p, const BlockBenchOptions& o,
             const std::vector<RankFigures>& figures, BlockSummary& s, BlockBenchResult& res) {
  const int W = p.world;
  if (o.peak_tflops > 0) {
    res.peak_tflops_per_rank = o.peak_tflops;
    res.peak_label = o.peak_label.empty() ? "given with --peak-tflops" : o.peak_label;
    s.peak_src = "given";
  } else {
    if (p.cuda) {
      s.gpu_name = cuda_device_name(figures.front().device_index);
      std::string matched;
      const double pk = gpu_peak_tflops(s.gpu_name, p.cfg.dtype, &matched);
      if (pk > 0) {
        res.peak_tflops_per_rank = pk;
        res.peak_label = s.gpu_name + " " + dtype_name(p.cfg.dtype) + " dense peak " +
                         fmt("%.1f", pk) + " TFLOP/s (datasheet)";
        s.peak_src = "gpu_table";
      }
    }
    if (s.peak_src.empty()) {
      double sum = 0;
      for (int r = 0; r < W; ++r) sum += figures[static_cast<size_t>(r)].calib_flops;
      if (sum > 0) {
        res.peak_tflops_per_rank = sum / W / 1e12;
        const int n = p.cuda ? 8192 : 1024;
        // MESHRT_HOST_F32_GEMM=bf16: the calibration GEMM runs in that mode too.
        const std::string mode = !p.cuda && p.cfg.dtype == DType::f32
                                     ? bench::host_f32_gemm_calibration_note()
                                     : std::string();
        res.peak_label = std::string("calibration GEMM (") + dtype_name(p.cfg.dtype) + mode +
                         ", best of " + std::to_string(n) + "^3 and the block's fc1 shape " +
                         std::to_string(p.batch * p.seq) + "x" + std::to_string(p.cfg.ffn / p.tp) +
                         "x" + std::to_string(p.cfg.hidden) +
                         ", all ranks at once, fastest of 10 runs): " + fmt("%.1f", sum / W / 1e9) +
                         " GFLOP/s per rank" +
                         (p.cuda ? " (GPU not in the peak table)" : " (CPU: no datasheet peak)");
        s.peak_src = "calibration_gemm";
      }
    }
  }
  if (res.peak_tflops_per_rank > 0) res.mfu = res.tflops / (res.peak_tflops_per_rank * W);
}

json br_config_json(const BlockPlan& p, const BlockBenchOptions& o, const std::string& gpu_name) {
  const Launch& launch = *p.launch;
  return {{"kind", layer_kind_name(p.kind)},
          {"devices", p.devices},
          {"launch", launch.describe()},
          {"world_size", p.world},
          {"device_type", p.cuda ? "cuda" : "cpu"},
          {"gpu_name", gpu_name},
          {"mesh", p.mesh},
          {std::string(kDpDim), p.dp},
          {std::string(kTpDim), p.tp},
          {std::string(kCpDim), p.cp},
          {"cp_comm", cp_comm_name(p.cfg.cp_comm)},
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
          {"deterministic", o.deterministic},
          {"deterministic_grain", o.deterministic_grain},
          {"zero", o.zero},
          {"seed", o.seed},
          {"host_threads_per_rank",
           p.cuda ? 0
                  : static_cast<int>(std::max(
                        1u, std::thread::hardware_concurrency() /
                                static_cast<unsigned>(launch.local().front().local_size)))}};
}

json br_flops_json(const BlockPlan& p, const BlockBenchOptions& o) {
  return {{"per_layer_forward",
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
}

json br_comm_json(const std::vector<double>& c, const std::vector<double>& e,
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
}

// The --json document (the result's `json` is its dump).
json br_json(const BlockPlan& p, const BlockBenchOptions& o,
             const std::vector<RankFigures>& figures, const BlockSummary& s,
             const BlockBenchResult& res, double wall_s) {
  json j;
  j["tool"] = std::string("meshrt bench ") + layer_kind_name(p.kind);
  j["command_line"] = o.command_line;
  j["versions"] = o.versions;
  if (!p.cuda) j["host_f32_gemm"] = bench::host_f32_gemm_json();
  j["config"] = br_config_json(p, o, s.gpu_name);
  j["flops"] = br_flops_json(p, o);
  j["step_ms"] = {{"median", res.step_ms},
                  {"p10", res.step_p10_ms},
                  {"p90", res.step_p90_ms},
                  {"min", *std::min_element(s.step_ms.begin(), s.step_ms.end())},
                  {"max", *std::max_element(s.step_ms.begin(), s.step_ms.end())},
                  {"all", s.step_ms},
                  {"definition",
                   "per step, the slowest rank's wall time from a barrier to its "
                   "streams drained"}};
  j["tokens_per_step"] = s.tokens;
  j["tokens_per_s"] = res.tokens_per_s;
  j["tflops_model"] = res.tflops;
  j["tflops_per_rank"] = res.tflops / p.world;
  j["peak"] = {{"source", s.peak_src.empty() ? "none" : s.peak_src},
               {"tflops_per_rank", res.peak_tflops_per_rank},
               {"label", res.peak_label}};
  j["mfu"] = res.mfu >= 0 ? json(res.mfu) : json(nullptr);
  j["compute_ms_median"] = res.compute_ms;
  const StepFigures& first = br_at(figures, 0, 0);
  j["comm"] = {{std::string(kTpDim), br_comm_json(s.tpc, s.tpe, first.tp, p.tp)},
               {std::string(kDpDim), br_comm_json(s.dpc, s.dpe, first.dp, p.dp * p.cp)},
               {std::string(kCpDim), br_comm_json(s.cpc, s.cpe, first.cp, p.cp)}};
  // Host streams queue work. With the host pool's stream-ordered reuse (the default) queued
  // tasks hold blocks as CUDA kernels do, and the peak is the program's; with
  // MESHRT_HOST_STREAM_REUSE=0 every queued task holds its tensors until it ran
  // (MESHRT_LAUNCH_BLOCKING=1 measures the program-order peak either way).
  const bool blocking = !p.cuda && launch_blocking_from_env();
  const bool reuse = p.cuda || env_switch("MESHRT_HOST_STREAM_REUSE");
  j["memory"] = {
      {"peak_allocated_bytes_max", res.peak_bytes},
      {"launch_blocking", blocking},
      {"host_stream_reuse", reuse},
      {"note", std::string("allocator peak over the timed steps (parameters, gradients, "
                           "activations, communication buffers)") +
                   (p.cuda || blocking || reuse
                        ? ""
                        : "; host streams queued work, so it includes tensors held by queued "
                          "tasks (MESHRT_LAUNCH_BLOCKING=1 measures the program-order peak)")}};
  j["skew"] = {{"slowest_rank", s.slow_rank},
               {"fastest_rank", s.fast_rank},
               {"step_ms_slowest", s.slow},
               {"step_ms_fastest", s.fast},
               {"step_skew_fraction", s.fast > 0 ? s.slow / s.fast - 1 : 0.0},
               {"compute_ms_slowest", s.cslow},
               {"compute_ms_fastest", s.cfast},
               {"compute_skew_fraction", s.cfast > 0 ? s.cslow / s.cfast - 1 : 0.0}};
  j["overhead"] = {{"issue_cpu_ms_median", median(s.issue_ms)},
                   {"fraction_of_step", res.overhead_fraction},
                   {"trace_markers_per_step", s.markers_per_step},
                   {"definition",
                    "CPU time of the issuing thread per step (mesh layer, scheduler, allocator, "
                    "enqueueing, benchmark timers and trace markers), slowest rank; target <= "
                    "3% of the step"}};
  j["ranks"] = s.ranks;
  j["wall_s"] = wall_s;
  j["plan"] = planner_json(p, o, res, s.gpu_name);
  return j;
}

// One "  key           value" line of the text report.
void br_row(std::ostream& os, const std::string& k, const std::string& v) {
  os << "  " << k;
  for (size_t i = k.size(); i < 14; ++i) os << ' ';
  os << v << "\n";
}

void br_print_heading(const BlockPlan& p, const BlockBenchOptions& o, std::ostream& os) {
  const char* kname = p.kind == LayerKind::Transformer ? "transformer block (attention + MLP)"
                      : p.kind == LayerKind::Mlp       ? "MLP block"
                                                       : "attention block";
  os << "meshrt bench " << layer_kind_name(p.kind) << ": " << kname << " x" << p.layers
     << ", hidden " << p.cfg.hidden << ", heads " << p.cfg.heads << ", ffn " << p.cfg.ffn
     << ", seq " << p.seq << ", batch " << p.batch << (p.dp > 1 ? " per dp replica" : "") << ", "
     << dtype_name(p.cfg.dtype) << "\n";
  os << "mesh " << p.mesh << " (sp " << (p.sp ? "on" : (p.tp == 1 ? "n/a at tp=1" : "off"))
     << ", overlap " << overlap_name(p.overlap)
     << (p.cp > 1 ? std::string(", cp exchange ") + cp_comm_name(p.cfg.cp_comm) : "")
     << (p.dp > 1 ? ", dp bucket " : "") << (p.dp > 1 ? fmt("%g", o.bucket_mb) + " MiB" : "")
     << ") on " << p.launch->describe() << ", devices " << p.devices << "\n";
  os << "warmup " << p.warmup << ", timed steps " << p.steps << ", "
     << (o.fwd_only ? "forward only" : "forward + backward")
     << (o.deterministic ? ", deterministic (" + std::to_string(o.deterministic_grain) +
                               " sequence(s) per pass, fixed-order dp sum)"
                         : "")
     << "\n\n";
}

void br_comm_row(std::ostream& os, std::string_view dim_name, int size, double c, double e,
                 const CommTimes& first) {
  const std::string dim(dim_name);
  if (size == 1) {
    br_row(os, std::string("comm ") + dim, std::string("- (") + dim + "=1)");
    return;
  }
  br_row(os, std::string("comm ") + dim,
         fmt("%.2f", c) + " ms on the " + dim + " stream, " + fmt("%.2f", e) + " ms exposed (" +
             fmt("%.0f", c > 0 ? 100 * e / c : 0) + "%), " +
             fmt("%.0f", static_cast<double>(first.count)) + " collectives, " +
             human_bytes(static_cast<double>(first.bytes)) + " per rank per step");
}

// The text report (unless --quiet).
void br_print(const BlockPlan& p, const BlockBenchOptions& o,
              const std::vector<RankFigures>& figures, const BlockSummary& s,
              const BlockBenchResult& res, const json& j, std::ostream& os) {
  const int W = p.world;
  br_print_heading(p, o, os);
  br_row(os, "step time",
         "median " + fmt("%.2f", res.step_ms) + " ms   p10 " + fmt("%.2f", res.step_p10_ms) +
             "   p90 " + fmt("%.2f", res.step_p90_ms) + "   (slowest rank per step)");
  br_row(os, "tokens/s",
         fmt("%.0f", res.tokens_per_s) + "   (" + fmt("%.0f", s.tokens) + " tokens per step)");
  br_row(os, "model FLOPs",
         human_flops(p.step_flops) + " per step = fwd " +
             human_flops(p.flops.forward() * p.layers) + (o.fwd_only ? "" : " + bwd 2x fwd") +
             "; causal attention counted at half (the kernel skips masked tiles)");
  br_row(os, "TFLOP/s",
         fmt("%.3f", res.tflops) + " model total, " + fmt("%.3f", res.tflops / W) + " per rank");
  if (res.mfu >= 0)
    br_row(os, "MFU", fmt("%.1f", 100 * res.mfu) + "% of " + res.peak_label);
  else
    br_row(os, "MFU", "n/a (no peak known: pass --peak-tflops)");
  if (j["plan"].contains("predicted")) {
    const json& pr = j["plan"]["predicted"];
    br_row(os, "planner",
           "predicts " + fmt("%.2f", pr["step_ms"].get<double>()) + " ms (" +
               fmt("%+.1f", 100 * j["plan"]["step_error"].get<double>()) +
               "% of measured), tp exposed " + fmt("%.2f", pr["tp_exposed_ms"].get<double>()) +
               " ms, dp exposed " + fmt("%.2f", pr["dp_exposed_ms"].get<double>()) + " ms" +
               (p.cp > 1 ? ", cp exposed " + fmt("%.2f", pr["cp_exposed_ms"].get<double>()) + " ms"
                         : std::string()) +
               "  (" + j["plan"]["cluster"].get<std::string>() + ")");
  }
  br_row(os, "compute",
         fmt("%.2f", res.compute_ms) +
             " ms per step (step minus exposed communication, mean over ranks)");
  const StepFigures& first = br_at(figures, 0, 0);
  br_comm_row(os, kTpDim, p.tp, res.tp_comm_ms, res.tp_exposed_ms, first.tp);
  if (p.cp > 1) br_comm_row(os, kCpDim, p.cp, res.cp_comm_ms, res.cp_exposed_ms, first.cp);
  // Under cp the gradients reduce over dp x cp (DeviceMesh::grad_dim).
  br_comm_row(os, p.cp > 1 ? kDpCpDim : kDpDim, p.dp * p.cp, res.dp_comm_ms, res.dp_exposed_ms,
              first.dp);
  br_row(os, "memory",
         "peak " + human_bytes(static_cast<double>(res.peak_bytes)) +
             " allocated per rank (max over ranks)");
  if (W > 1)
    br_row(os, "skew",
           "slowest rank " + std::to_string(s.slow_rank) + " " + fmt("%.2f", s.slow) +
               " ms vs fastest rank " + std::to_string(s.fast_rank) + " " + fmt("%.2f", s.fast) +
               " ms (+" + fmt("%.1f", 100 * (s.slow / s.fast - 1)) + "%); compute " +
               fmt("%.2f", s.cslow) + " vs " + fmt("%.2f", s.cfast) + " ms");
  br_row(
      os, "overhead",
      fmt("%.2f", median(s.issue_ms)) + " ms CPU per step issuing work (" +
          fmt("%.2f", 100 * res.overhead_fraction) + "% of the step; target <= 3%)" +
          (o.trace_path.empty() ? ""
                                : ", with " + fmt("%.0f", s.markers_per_step) + " trace markers"));
  os << std::flush;
}

// --json, --trace, and the note on what --dump wrote.
void br_write_files(const BlockBenchOptions& o, const BlockBenchResult& res, const json& j,
                    const std::vector<std::string>& traces, int dumped, double markers_per_step,
                    std::ostream& os) {
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
}

}  // namespace

BlockBenchResult block_report(const BlockPlan& p, const BlockBenchOptions& o,
                              const std::vector<RankFigures>& figures,
                              const std::vector<std::string>& traces, int dumped, double wall_s,
                              std::ostream& os) {
  BlockBenchResult res;
  BlockSummary s;
  s.tokens = static_cast<double>(p.batch * p.dp * p.seq);
  br_step_series(p, figures, s);
  br_fill_result(p, figures, s, res);
  br_peak(p, o, figures, s, res);
  br_rank_skew(p, figures, s);
  const json j = br_json(p, o, figures, s, res, wall_s);
  res.json = j.dump(2);
  if (!o.quiet) br_print(p, o, figures, s, res, j, os);
  br_write_files(o, res, j, traces, dumped, s.markers_per_step, os);
  return res;
}

}  // namespace meshrt
