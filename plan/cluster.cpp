// Cluster presets and the cluster file (JSON) the planner reads and `--calibrate` writes.
#include <nlohmann/json.hpp>

#include <filesystem>

#include "plan/cost_model.h"
#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/json_field.h"

namespace meshrt::plan {

namespace {

namespace fs = std::filesystem;

// Far above any cluster file (a few KiB), far below what would hurt to read.
constexpr uint64_t kMaxClusterFileBytes = 16ull << 20;

using nlohmann::json;

// The link tables' keys, by link_index (the CommOp's name).
const char* op_key(int i) { return comm_op_name(static_cast<CommOp>(i)); }

struct Gpu {
  const char* name;
  const char* device;
  double bf16, f32;  // dense TFLOP/s (f32: CUDA cores, no TF32)
  double mem_gib;    // usable: the HBM nvidia-smi reports less 4 GiB (context, NCCL buffers)
  double hbm_gbps;   // datasheet
  double nvlink_busbw, nic_gbps;  // NCCL all-reduce busbw over NVSwitch; NIC per GPU, GB/s
  const char* sources;
};

// Datasheet figures; busbw from published nccl-tests runs (see docs/plan.md, "Planning a run").
constexpr Gpu kGpus[] = {
    {"h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 66.9, 79.6 - 4, 3350, 470, 50,
     "NVIDIA H100 datasheet (989.4 TFLOP/s dense BF16, 80 GB HBM3, 3.35 TB/s, NVLink 900 GB/s); "
     "8x H100 NCCL all_reduce busbw 460-480 GB/s (docs.alayanew.com NCCL-tests reference table); "
     "ConnectX-7 400 Gb/s InfiniBand per GPU (DGX H100)"},
    {"h200-sxm", "NVIDIA H200 SXM 141GB", 989.4, 66.9, 140.4 - 4, 4800, 470, 50,
     "NVIDIA H200 datasheet (989.4 TFLOP/s dense BF16, 141 GB HBM3e, 4.8 TB/s, NVLink 900 GB/s); "
     "NVLink busbw as H100 (same NVLink 4 / NVSwitch); ConnectX-7 400 Gb/s per GPU (DGX H200)"},
    {"a100-sxm", "NVIDIA A100 SXM4 80GB", 312, 19.5, 80 - 4, 2039, 240, 25,
     "NVIDIA A100 datasheet (312 TFLOP/s dense BF16, 80 GB HBM2e, 2.04 TB/s, NVLink 600 GB/s); "
     "8x A100 NCCL all_reduce busbw 230-250 GB/s (docs.alayanew.com NCCL-tests reference table); "
     "HDR 200 Gb/s InfiniBand per GPU (DGX A100 / Selene)"},
};

ClusterSpec gpu_cluster(const Gpu& g, int per_node, int nodes) {
  ClusterSpec c;
  c.device = g.device;
  c.devices_per_node = per_node;
  c.nodes = nodes;
  c.peaks = {{"bf16", g.bf16}, {"f16", g.bf16}, {"f32", g.f32}};
  c.memory_gib = g.mem_gib;
  // Assumptions (docs/plan.md, "Planning a run"): elementwise kernels reach 80% of HBM bandwidth, a
  // fused attention kernel 50% of peak forward and 40% backward, large bf16 GEMMs 80%.
  c.mem_bw_gbps = 0.8 * g.hbm_gbps;
  c.attention_eff = 0.5;
  c.attention_bwd_efficiency = 0.4;
  c.gemm_eff = {{1e8, 0.15}, {1e9, 0.45}, {1e10, 0.7}, {1e11, 0.8}};
  // Collectives use SMs and HBM bandwidth the GEMMs also need: 90% of overlapped time hidden.
  c.overlap_eff = 0.9;
  for (int i = 0; i < kLinkOps; ++i) {
    c.intra[i] = {g.nvlink_busbw, 15};
    c.inter[i] = {0.9 * g.nic_gbps, 30};  // 90% of the NIC's line rate
  }
  c.sources = g.sources;
  return c;
}

ClusterSpec cpu_cluster() {
  // This 2-core VM's order of magnitude (bench/results/data/sweep-cpu2.txt: 160 GFLOP/s per rank
  // for f32 GEMMs; collectives-host.md: host all-reduce near memcpy speed). `--calibrate` measures
  // it.
  ClusterSpec c;
  c.device = "host CPU (2 ranks as threads)";
  c.devices_per_node = 2;
  c.nodes = 1;
  c.peaks = {{"f32", 0.16}, {"bf16", 0.04}, {"f16", 0.04}};
  c.memory_gib = 20;
  c.mem_bw_gbps = 5;
  c.attention_eff = 0.3;
  c.gemm_eff = {{1e8, 0.7}, {1e9, 0.9}, {1e10, 1.0}};
  c.overlap_eff = 0.3;
  for (int i = 0; i < kLinkOps; ++i) c.intra[i] = c.inter[i] = {4, 20};
  c.sources = "order of magnitude of the development VM; use --calibrate for this machine";
  return c;
}

using ClusterFields = JsonFields<json>;

LinkSpec link(const ClusterFields& f) {
  return {f.number("busbw_gbps", json_positive()), f.number("latency_us", json_at_least(0))};
}

// [[GEMM FLOPs, fraction of peak], ...], FLOPs rising.
std::vector<std::pair<double, double>> gemm_points(const ClusterFields& f) {
  const json& pts = f.array("gemm_efficiency");
  MESHRT_CHECK(!pts.empty(), f.where() << ": field 'gemm_efficiency' is [], not a list of "
                                       << "[GEMM FLOPs > 0, fraction of peak in (0, 1]]");
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < pts.size(); ++i) {
    const json& pt = pts[i];
    const JsonRange frac{0, 1, true, false};
    const bool ok = pt.is_array() && pt.size() == 2 && pt[0].is_number() && pt[1].is_number() &&
                    json_positive().holds(pt[0].get<double>()) && frac.holds(pt[1].get<double>());
    if (!ok)
      json_field_fail(f.where(), "gemm_efficiency[" + std::to_string(i) + "]", json_value_text(pt),
                      "[GEMM FLOPs > 0, fraction of peak in (0, 1]]");
    if (!out.empty() && pt[0].get<double>() <= out.back().first)
      json_field_fail(f.where(), "gemm_efficiency[" + std::to_string(i) + "]", json_value_text(pt),
                      "above the FLOPs of the entry before (sort the entries by FLOPs)");
    out.push_back({pt[0].get<double>(), pt[1].get<double>()});
  }
  return out;
}

}  // namespace

ClusterSpec cluster_preset(const std::string& spec, const std::string& flag) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  MESHRT_CHECK(!name.empty(), flag << " " << spec
                                   << ": no device before ':'; give a preset such as "
                                      "h100-sxm:8, h200-sxm:8, a100-sxm:8 (':8xN' for N nodes) or "
                                      "cpu, or a cluster JSON file");
  if (name == "cpu") {
    MESHRT_CHECK(colon == std::string::npos, flag << " " << spec
                                                  << ": the cpu preset takes no "
                                                     "size (it is this machine)");
    ClusterSpec c = cpu_cluster();
    c.name = spec;
    return c;
  }
  for (const Gpu& g : kGpus) {
    if (name != g.name) continue;
    int per = 8, nodes = 1;
    if (colon != std::string::npos) {
      const std::string sz = spec.substr(colon + 1);
      char tail = 0;
      int n = 0;
      if (std::sscanf(sz.c_str(), "%dx%d%c", &per, &nodes, &tail) == 2) {
        n = 2;
      } else if (std::sscanf(sz.c_str(), "%d%c", &per, &tail) == 1) {
        nodes = 1;
        n = 1;
      }
      MESHRT_CHECK(n > 0 && per >= 1 && per <= 8 && nodes >= 1 && nodes <= 100000,
                   flag << " " << spec << ": give <gpu>:G (1-8 GPUs per node) or <gpu>:GxN (N "
                        << "= 1 to 100000 nodes), e.g. " << g.name << ":8x4 (got '" << sz
                        << "' after ':')");
    }
    ClusterSpec c = gpu_cluster(g, per, nodes);
    c.name = spec;
    return c;
  }
  MESHRT_FAIL(flag << " " << spec << ": unknown preset '" << name
                   << "'; use h100-sxm:8, h200-sxm:8, a100-sxm:8 (':8xN' for N nodes), cpu, "
                      "or a cluster JSON file (meshrt plan --calibrate writes one)");
}

ClusterSpec cluster_from_json(const std::string& text, const std::string& origin) {
  const std::string where = "cluster " + origin;
  const json j = parse_json_text(text, where);
  const ClusterFields f(j, where);
  ClusterSpec c;
  c.name = f.string_or("name", origin);
  c.device = f.string_or("device", "");
  if (f.has("device") && c.device.empty())
    f.fail("device", j["device"],
           "a name of the device (e.g. \"NVIDIA H100 SXM5 80GB\"); drop "
           "the field if unknown");
  if (c.device.empty()) c.device = "device";
  c.devices_per_node = static_cast<int>(f.integer("devices_per_node", 1, 1 << 20));
  c.nodes = f.has("nodes") ? static_cast<int>(f.integer("nodes", 1, 1000000)) : 1;
  const ClusterFields peaks = f.object("peak_tflops");
  for (const auto& [k, v] : j["peak_tflops"].items())
    c.peaks[k] = peaks.number(k.c_str(), json_positive());
  c.memory_gib = f.number("memory_gib", json_at_least(0));
  c.mem_bw_gbps = f.number("mem_bw_gbps", json_positive());
  const JsonRange fraction{0, 1, true, false};
  c.attention_eff = f.number("attention_efficiency", fraction);
  c.attention_bwd_efficiency = f.number_or("attention_bwd_efficiency", json_between(0, 1), 0);
  c.overlap_eff = f.number_or("overlap_efficiency", json_between(0, 1), 1.0);
  c.gemm_eff = gemm_points(f);
  const ClusterFields col = f.object("collectives");
  for (int i = 0; i < kLinkOps; ++i) {
    c.intra[i] = link(col.object("intra").object(op_key(i)));
    c.inter[i] = link(col.object("inter").object(op_key(i)));
  }
  c.sources = f.string_or("sources", "");
  return c;
}

std::string cluster_to_json(const ClusterSpec& c) {
  json j;
  j["name"] = c.name;
  j["device"] = c.device;
  j["devices_per_node"] = c.devices_per_node;
  j["nodes"] = c.nodes;
  j["peak_tflops"] = c.peaks;
  j["memory_gib"] = c.memory_gib;
  j["mem_bw_gbps"] = c.mem_bw_gbps;
  j["attention_efficiency"] = c.attention_eff;
  j["attention_bwd_efficiency"] = c.attention_bwd_eff();
  j["overlap_efficiency"] = c.overlap_eff;
  j["gemm_efficiency"] = json::array();
  for (const auto& [f, e] : c.gemm_eff) j["gemm_efficiency"].push_back({f, e});
  for (int i = 0; i < kLinkOps; ++i) {
    j["collectives"]["intra"][op_key(i)] = {{"busbw_gbps", c.intra[i].busbw_gbps},
                                            {"latency_us", c.intra[i].latency_us}};
    j["collectives"]["inter"][op_key(i)] = {{"busbw_gbps", c.inter[i].busbw_gbps},
                                            {"latency_us", c.inter[i].latency_us}};
  }
  j["sources"] = c.sources;
  return j.dump(2) + "\n";
}

ClusterSpec load_cluster(const std::string& spec, const std::string& dtype,
                         const std::string& flag) {
  ClusterSpec c;
  std::error_code exists_ec;
  // A path, a .json name, or any existing file (not a preset name: those hold no '.').
  const bool file = spec.find('/') != std::string::npos ||
                    (spec.size() > 5 && spec.substr(spec.size() - 5) == ".json") ||
                    (spec.find('.') != std::string::npos && fs::exists(spec, exists_ec));
  if (file) {
    std::error_code ec;
    MESHRT_CHECK(fs::exists(spec, ec), flag << " " << spec
                                            << ": cannot read the file: it does not exist "
                                               "(a preset is h100-sxm:8, h200-sxm:8, "
                                               "a100-sxm:8, cpu)");
    // A cluster file is a few KiB: the cap stops a wrong path (a device, a huge log) early.
    c = cluster_from_json(read_input_file(spec, flag, kMaxClusterFileBytes), spec);
  } else {
    c = cluster_preset(spec, flag);
  }
  if (!dtype.empty()) c.select_dtype(dtype);
  return c;
}

}  // namespace meshrt::plan
