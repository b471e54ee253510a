// The planner's cost model: pure functions from a model, a cluster and a layout to the collectives
// meshrt issues, the memory a device needs and the predicted step time (compute, tp and dp
// communication and the exposed part of each). No runtime: it is plain arithmetic over the
// blocks' description (model/block_desc.h: pieces, linears, GEMM shapes, parameters, FLOPs) and
// model/blocks.cpp's collectives (the same byte counts and group sizes, the same overlap rules),
// simulated on three streams per rank. `meshrt plan` and `meshrt bench block` both use it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "dist/context_parallel.h"
#include "model/block_desc.h"
#include "model/model_spec.h"

namespace meshrt::plan {

// The model: model/model_spec.h's ModelSpec (the one the command line and the C API fill).
using meshrt::ModelSpec;
using meshrt::parse_model_spec;

// The collectives a link is described for, indexed by CommOp (all_reduce, all_gather,
// reduce_scatter: the first kLinkOps values); link_index throws for another op.
constexpr int kLinkOps = 3;
int link_index(CommOp op);

// One collective as meshrt counts it (dist/parallel.cpp CommScheduler): bytes are the output of
// an all-gather, the input of a reduce-scatter, the tensor of an all-reduce.
// A cp exchange (cp = true) is a ring step (op Send: `bytes` to the next rank while as many
// arrive from the previous one), or the all-gather of K/V / reduce-scatter of dK/dV over cp.
struct Collective {
  CommOp op = CommOp::AllReduce;
  bool dp = false;  // over the dp x cp group (the gradients), else tp
  double bytes = 0;
  int group = 1;
  bool cp = false;  // over the cp group (the attention's K/V exchange)
};

// Time of a collective of `bytes` over `group` ranks on one link: latency + bytes x factor /
// busbw, factor 2(n-1)/n for all-reduce and (n-1)/n for all-gather / reduce-scatter (the
// nccl-tests bus bandwidth convention, which `meshrt bench collective` prints).
struct LinkSpec {
  double busbw_gbps = 0;  // GB/s (1e9 bytes/s)
  double latency_us = 0;
};

struct ClusterSpec {
  std::string name;    // "h100-sxm:8x4"
  std::string device;  // "NVIDIA H100 SXM5 80GB"
  int devices_per_node = 8, nodes = 1;
  double peak_tflops = 0;  // dense, for the model's dtype, per device (select_dtype sets it)
  std::map<std::string, double> peaks;  // by dtype name (f32, bf16, f16), TFLOP/s
  double memory_gib = 0;                // usable device memory
  double mem_bw_gbps = 0;               // elementwise kernels' achieved bandwidth
  double attention_eff = 0.5;           // fused attention forward: fraction of peak (model FLOPs)
  double attention_bwd_efficiency = 0;  // its backward (0: attention_eff)
  double attention_bwd_eff() const;
  // Per op: intra-node (the tp group and a dp group within a node) and inter-node (a dp group
  // spanning nodes).
  LinkSpec intra[kLinkOps], inter[kLinkOps];  // indexed by link_index(op)
  // GEMM efficiency against peak by GEMM size (FLOPs), interpolated in log(FLOPs); constant
  // beyond the ends.
  std::vector<std::pair<double, double>> gemm_eff;
  // Fraction of a collective's overlapped time that is really hidden (1: an idle copy engine /
  // NIC; lower where communication takes the compute cores, as host ranks on a CPU).
  double overlap_eff = 1.0;
  std::string sources;  // where the numbers come from
  int world() const { return devices_per_node * nodes; }
  // Sets peak_tflops for `dtype`; throws when the cluster has no peak for it.
  void select_dtype(const std::string& dtype);
  double gemm_efficiency(double flops) const;
  double gemm_seconds(double m, double n, double k) const;
  // A dp group spanning nodes uses `per_node` NICs at once (its members on one node): its bus
  // bandwidth is inter x per_node, at most the intra-node one.
  double collective_seconds(const Collective& c, bool inter_node, int per_node = 1) const;
  // One ring step of `bytes` to a neighbour: latency + bytes / the all-gather link's bus bandwidth
  // (a ring all-gather moves (n-1)/n of its output over each link at that rate).
  double p2p_seconds(double bytes, bool inter_node) const;
};

// Presets: h100-sxm, h200-sxm, a100-sxm with ":G" devices per node or ":GxN" for N nodes, and
// "cpu" (this machine's order of magnitude; measure it with `meshrt plan --calibrate`). Throws
// listing the presets; `flag` is the option the user gave `spec` with, named in the messages.
ClusterSpec cluster_preset(const std::string& spec, const std::string& flag = "--cluster");
// A preset name, else a cluster JSON file (as --calibrate writes and docs/plan.md describes), with
// peak_tflops selected for `dtype` ("": none selected, the file or preset only checked). `flag`
// as for cluster_preset (`meshrt bench block` passes "--plan-cluster").
ClusterSpec load_cluster(const std::string& spec, const std::string& dtype,
                         const std::string& flag = "--cluster");
ClusterSpec cluster_from_json(const std::string& text, const std::string& origin);
std::string cluster_to_json(const ClusterSpec& c);

struct PlanConfig {
  // The mesh dp x cp x tp (tp innermost, then cp: a cp group stays within a node while
  // cp x tp <= devices per node). cp ranks share each sequence (dist/context_parallel.h's
  // layout: 2 x cp chunks, rank i holds chunks i and 2cp-1-i) and exchange K/V in attention by
  // `cp_comm`; the gradients are reduced, and ZeRO shards, over dp x cp.
  int dp = 1, tp = 1, cp = 1;
  CpComm cp_comm = CpComm::Ring;
  bool sp = false;
  int64_t micro_batch = 1;  // sequences per dp replica per micro-batch
  int accum = 1;            // micro-batches per step (dp all-reduce after the last one)
  double bucket_mb = 25;
  Overlap overlap = Overlap::Async;
  bool optimizer = true;  // AdamW state and step (the block benchmark runs none)
  // Full activation recomputation: each layer's forward runs again before its backward. meshrt
  // does not implement it; the planner models it to compare with published Megatron runs.
  bool recompute = false;
  // ZeRO stage over dp (docs/zero.md): 1 shards the AdamW state, 2 also the gradients (a rank
  // keeps its shard and at most three full buckets at a time), 3 also the parameters (its shard
  // and at most three pieces gathered at a time; buckets follow piece boundaries).
  int zero = 0;
};

struct Memory {
  double weights = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0;
  double total() const { return weights + grads + optimizer + activations + workspace; }
};

struct Prediction {
  PlanConfig cfg;
  // Per step, per rank.
  double step_s = 0, compute_s = 0;
  double tp_comm_s = 0, tp_exposed_s = 0, dp_comm_s = 0, dp_exposed_s = 0, optimizer_s = 0;
  double tp_bytes = 0, dp_bytes = 0;
  int64_t tp_count = 0, dp_count = 0;
  // cp's K/V exchange (ring steps, or all-gathers and reduce-scatters), and the causal
  // imbalance: the busiest cp rank's attention work over the mean (causal_imbalance).
  double cp_comm_s = 0, cp_exposed_s = 0, cp_bytes = 0;
  int64_t cp_count = 0;
  double cp_imbalance = 1;
  double model_flops = 0;  // per step, all ranks (3 x forward matmul FLOPs, causal at half)
  double tokens_per_s = 0, mfu = 0;
  Memory mem;
  bool fits = true;
  double overflow_bytes = 0;
  bool inter_node_dp = false;
};

// The collectives of one micro-batch's forward + backward on one rank, in issue order (tp) and the
// dp buckets of one step (one all-reduce per bucket), as meshrt issues them.
std::vector<Collective> tp_collectives(const ModelSpec& m, const PlanConfig& c);
std::vector<Collective> dp_collectives(const ModelSpec& m, const PlanConfig& c);
// The dp buckets' sizes in bytes, in launch order (dist/data_parallel.cpp's packing).
std::vector<double> dp_bucket_bytes(const ModelSpec& m, const PlanConfig& c);

Memory memory_per_device(const ModelSpec& m, const PlanConfig& c);
// Causal attention work of the busiest of `cp` ranks over the mean, for a sequence of `seq` tokens
// cut into 2 x cp chunks: `balanced` as CpLayout lays them out (rank i holds chunks i and
// 2cp-1-i: every rank does the same work, 1.0 exactly when seq divides by 2 x cp), else
// contiguously (rank i holds chunks 2i and 2i+1: the last rank does the most). Work counts the
// (query, key) pairs under the causal mask.
double causal_imbalance(int64_t seq, int cp, bool balanced = true);

// Model FLOPs of one step over all ranks (layer_flops of model/block_desc.h, causal at half, plus
// the LM head).
double model_flops_per_step(const ModelSpec& m, int64_t global_batch);

// Throws meshrt::Error when the layout cannot run the model (divisibility, tp > node).
void check_config(const ModelSpec& m, const ClusterSpec& cl, const PlanConfig& c);
Prediction predict(const ModelSpec& m, const ClusterSpec& cl, const PlanConfig& c);

// Every layout reaching `global_batch` sequences on the cluster's devices: dp x cp x tp (tp within
// a node, dividing heads; cp with seq divisible by 2 x cp, each cp > 1 with the ring and the
// all-gather exchange), sp off / on, micro-batches dividing global_batch / dp, `buckets` (MiB).
// Sorted by tokens/s, fitting layouts first. Layouts the model cannot take are skipped.
std::vector<Prediction> plan_all(const ModelSpec& m, const ClusterSpec& cl, int64_t global_batch,
                                 const std::vector<double>& buckets, Overlap overlap,
                                 bool optimizer = true);

// "dp=2,tp=4 sp=on mb=2 x4 bucket=25MiB"; with cp: "dp=1,cp=4,tp=2 ring sp=on ..."
std::string mesh_label(const PlanConfig& c);  // "dp=2,tp=4", "dp=1,cp=4,tp=2"
std::string config_label(const PlanConfig& c);

// One line on why the first of plan_all's layouts wins: the terms (compute, exposed tp / dp
// communication, optimizer) in which it differs from the runner-up with another mesh or sequence
// parallelism, and the fastest layout that does not fit, if any.
std::string why_best(const std::vector<Prediction>& sorted);

}  // namespace meshrt::plan
