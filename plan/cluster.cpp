// Cluster presets and the cluster file (JSON) the planner reads and `--calibrate` writes.
#include <nlohmann/json.hpp>

#include <filesystem>

#include "plan/cost_model.h"
#include "runtime/error.h"
#include "runtime/input_file.h"

namespace meshrt::plan {

namespace {

namespace fs = std::filesystem;

// Far above any cluster file (a few KiB), far below what would hurt to read.
constexpr uint64_t kMaxClusterFileBytes = 16ull << 20;

using nlohmann::json;

constexpr const char* kOps[3] = {"all_gather", "reduce_scatter", "all_reduce"};

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
  for (int i = 0; i < 3; ++i) {
    c.intra[i] = {g.nvlink_busbw, 15};
    c.inter[i] = {0.9 * g.nic_gbps, 30};  // 90% of the NIC's line rate
  }
  c.sources = g.sources;
  return c;
}

ClusterSpec cpu_cluster() {
  // This 2-core VM's order of magnitude (bench/results/sweep-cpu2.txt: 160 GFLOP/s per rank for
  // f32 GEMMs; collectives-host.md: host all-reduce near memcpy speed). `--calibrate` measures it.
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
  for (int i = 0; i < 3; ++i) c.intra[i] = c.inter[i] = {4, 20};
  c.sources = "order of magnitude of the development VM; use --calibrate for this machine";
  return c;
}

double num(const json& j, const char* key, const std::string& origin) {
  MESHRT_CHECK(j.contains(key) && j.at(key).is_number(),
               "cluster " << origin << ": \"" << key << "\" must be a number");
  return j.at(key).get<double>();
}

LinkSpec link(const json& j, const std::string& origin, const std::string& where) {
  MESHRT_CHECK(j.is_object(), "cluster " << origin << ": " << where << " must be an object");
  LinkSpec l{num(j, "busbw_gbps", origin + " " + where),
             num(j, "latency_us", origin + " " + where)};
  MESHRT_CHECK(l.busbw_gbps > 0 && l.latency_us >= 0,
               "cluster " << origin << ": " << where << " needs busbw_gbps > 0, latency_us >= 0");
  return l;
}

}  // namespace

ClusterSpec cluster_preset(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  if (name == "cpu") {
    MESHRT_CHECK(colon == std::string::npos, "--cluster " << spec
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
                   "--cluster " << spec << ": give <gpu>:G (1-8 GPUs per node) or <gpu>:GxN (N "
                                << "nodes), e.g. " << g.name << ":8x4");
    }
    ClusterSpec c = gpu_cluster(g, per, nodes);
    c.name = spec;
    return c;
  }
  MESHRT_FAIL(
      "--cluster " << spec << ": unknown preset '" << name
                   << "'; use h100-sxm:8, h200-sxm:8, a100-sxm:8 (':8xN' for N nodes), cpu, "
                      "or a cluster JSON file (meshrt plan --calibrate writes one)");
}

ClusterSpec cluster_from_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MESHRT_FAIL("cluster " << origin << ": not valid JSON (" << e.what() << ")");
  }
  MESHRT_CHECK(j.is_object(), "cluster " << origin << ": the top level must be an object");
  ClusterSpec c;
  c.name = j.value("name", origin);
  c.device = j.value("device", std::string());
  c.devices_per_node = static_cast<int>(num(j, "devices_per_node", origin));
  c.nodes = j.contains("nodes") ? static_cast<int>(num(j, "nodes", origin)) : 1;
  MESHRT_CHECK(c.devices_per_node >= 1 && c.nodes >= 1,
               "cluster " << origin << ": devices_per_node and nodes must be >= 1");
  MESHRT_CHECK(j.contains("peak_tflops") && j["peak_tflops"].is_object(),
               "cluster " << origin << ": \"peak_tflops\" must be an object {dtype: TFLOP/s}");
  for (const auto& [k, v] : j["peak_tflops"].items()) {
    MESHRT_CHECK(v.is_number() && v.get<double>() > 0,
                 "cluster " << origin << ": peak_tflops." << k << " must be a positive number");
    c.peaks[k] = v.get<double>();
  }
  c.memory_gib = num(j, "memory_gib", origin);
  c.mem_bw_gbps = num(j, "mem_bw_gbps", origin);
  c.attention_eff = num(j, "attention_efficiency", origin);
  c.attention_bwd_efficiency =
      j.contains("attention_bwd_efficiency") ? num(j, "attention_bwd_efficiency", origin) : 0;
  c.overlap_eff = j.contains("overlap_efficiency") ? num(j, "overlap_efficiency", origin) : 1.0;
  MESHRT_CHECK(c.mem_bw_gbps > 0 && c.attention_eff > 0 && c.overlap_eff >= 0 && c.overlap_eff <= 1,
               "cluster " << origin << ": mem_bw_gbps and attention_efficiency must be positive, "
                          << "overlap_efficiency in [0, 1]");
  MESHRT_CHECK(j.contains("gemm_efficiency") && j["gemm_efficiency"].is_array() &&
                   !j["gemm_efficiency"].empty(),
               "cluster " << origin << ": \"gemm_efficiency\" must be a list of [flops, fraction]");
  for (const json& pt : j["gemm_efficiency"]) {
    MESHRT_CHECK(pt.is_array() && pt.size() == 2 && pt[0].is_number() && pt[1].is_number() &&
                     pt[0].get<double>() > 0 && pt[1].get<double>() > 0,
                 "cluster " << origin << ": gemm_efficiency entry " << pt.dump()
                            << " must be [flops > 0, fraction > 0]");
    MESHRT_CHECK(c.gemm_eff.empty() || pt[0].get<double>() > c.gemm_eff.back().first,
                 "cluster " << origin << ": gemm_efficiency must be sorted by flops");
    c.gemm_eff.push_back({pt[0].get<double>(), pt[1].get<double>()});
  }
  MESHRT_CHECK(j.contains("collectives") && j["collectives"].is_object(),
               "cluster " << origin << ": \"collectives\" must be an object with intra and inter");
  const json& col = j["collectives"];
  for (int i = 0; i < 3; ++i) {
    for (const char* where : {"intra", "inter"}) {
      MESHRT_CHECK(
          col.contains(where) && col[where].contains(kOps[i]),
          "cluster " << origin << ": collectives." << where << "." << kOps[i] << " is missing");
      (std::string(where) == "intra" ? c.intra : c.inter)[i] =
          link(col[where][kOps[i]], origin, std::string("collectives.") + where + "." + kOps[i]);
    }
  }
  c.sources = j.value("sources", std::string());
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
  for (int i = 0; i < 3; ++i) {
    j["collectives"]["intra"][kOps[i]] = {{"busbw_gbps", c.intra[i].busbw_gbps},
                                          {"latency_us", c.intra[i].latency_us}};
    j["collectives"]["inter"][kOps[i]] = {{"busbw_gbps", c.inter[i].busbw_gbps},
                                          {"latency_us", c.inter[i].latency_us}};
  }
  j["sources"] = c.sources;
  return j.dump(2) + "\n";
}

ClusterSpec load_cluster(const std::string& spec, const std::string& dtype) {
  ClusterSpec c;
  const bool file = spec.find('/') != std::string::npos ||
                    (spec.size() > 5 && spec.substr(spec.size() - 5) == ".json");
  if (file) {
    std::error_code ec;
    MESHRT_CHECK(fs::exists(spec, ec), "--cluster " << spec
                                                    << ": cannot read the file: it does not exist "
                                                       "(a preset is h100-sxm:8, h200-sxm:8, "
                                                       "a100-sxm:8, cpu)");
    // A cluster file is a few KiB: the cap stops a wrong path (a device, a huge log) early.
    c = cluster_from_json(read_input_file(spec, "--cluster", kMaxClusterFileBytes), spec);
  } else {
    c = cluster_preset(spec);
  }
  c.select_dtype(dtype);
  return c;
}

}  // namespace meshrt::plan
