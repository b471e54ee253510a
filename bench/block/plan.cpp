#include "bench/block/plan.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <thread>

#include "bench/common/stats.h"
#include "dist/context_parallel.h"
#include "plan/cost_model.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "tools/cli/cli_checks.h"
#include "tools/cli/command.h"

namespace meshrt {

std::unique_ptr<Launch> launch_for(const BlockBenchOptions& o, std::string* devices) {
  LaunchOptions lo;
  std::string why;
  const bool have_cuda = cuda_available(&why);
  MESHRT_CHECK(
      o.devices.rfind("cuda", 0) != 0 || have_cuda,
      "--devices " << o.devices << ": CUDA is unavailable (" << why << "); use --devices cpu:N");
  lo.devices = o.devices.empty() ? (have_cuda ? "cuda:all" : "cpu") : o.devices;
  lo.backend = o.backend;
  std::unique_ptr<Launch> l = bootstrap(lo);
  if (o.devices.empty() && l->kind() == LaunchKind::Threads && !have_cuda) {
    // Host ranks as threads: one per core up to 8 (a power of two, so tp divides the defaults).
    const unsigned hc = std::max(1u, std::thread::hardware_concurrency());
    lo.devices = "cpu:" + std::to_string(std::bit_floor(std::min(hc, 8u)));
    l = bootstrap(lo);
  }
  *devices = lo.devices;
  return l;
}

namespace {

using bench::human_bytes;
using bench::physical_memory_bytes;

void check_options(const BlockBenchOptions& o) {
  parse_layer_kind(o.kind);
  parse_overlap(o.overlap);
  MESHRT_CHECK(o.sp >= -1 && o.sp <= 1, "sp must be -1 (auto), 0 or 1");
  MESHRT_CHECK(
      o.batch >= 0 && o.seq >= 0 && o.hidden >= 0 && o.ffn >= 0 && o.heads >= 0 && o.layers >= 0,
      "--batch, --seq, --hidden, --ffn, --heads and --layers must be positive");
  MESHRT_CHECK(o.steps >= 0, "--steps " << o.steps << " must be >= 1");
  MESHRT_CHECK(o.warmup >= -1, "--warmup " << o.warmup << " must be >= 0");
  MESHRT_CHECK(o.bucket_mb > 0, "--bucket-mb " << o.bucket_mb << " must be positive");
  MESHRT_CHECK(o.zero == 0 || o.zero == 2 || o.zero == 3,
               "--zero " << o.zero
                         << ": the block benchmark runs ZeRO stage 0, 2 or 3 (stage 1 shards only "
                            "the optimizer state, and it runs no optimizer)");
  MESHRT_CHECK(o.zero != 2 || !o.fwd_only,
               "--zero 2 would be ignored: it shards the gradients and --fwd-only computes none; "
               "use --zero 3 (parameter shards, gathered in the forward) or drop --fwd-only");
  MESHRT_CHECK(o.zero == 0 || o.dump_path.empty() || o.fwd_only,
               "--dump with --zero " << o.zero
                                     << ": the gradients are kept as dp shards only; dump with "
                                        "--zero 0 (the same values) or --fwd-only");
  MESHRT_CHECK(!o.deterministic || (!o.fwd_only && o.dump_path.empty()),
               "--deterministic makes the gradients' dp sum layout independent: --fwd-only "
               "computes none and --dump would hold the last sequence's activations only; drop "
               "one of them");
  MESHRT_CHECK(o.peak_tflops >= 0, "--peak-tflops " << o.peak_tflops << " must be >= 0");
  try {
    parse_cp_comm(o.cp_comm);
  } catch (const Error& e) {
    MESHRT_FAIL("--cp-comm: " << e.message());
  }
  if (!o.dtype.empty()) {
    const DType dt = parse_dtype(o.dtype);
    MESHRT_CHECK(is_floating(dt), "--dtype " << o.dtype << ": use f32, bf16 or f16");
  }
  // Up front, so a typo does not cost a whole run.
  check_output_path(o.json_path, "--json");
  check_output_path(o.trace_path, "--trace");
  check_output_path(o.dump_path, "--dump");
  check_distinct_outputs(
      {{"--json", o.json_path}, {"--trace", o.trace_path}, {"--dump", o.dump_path}});
  check_outputs_spare_inputs(
      {{"--json", o.json_path}, {"--trace", o.trace_path}, {"--dump", o.dump_path}},
      {{"--plan-cluster", o.plan_cluster}});
  // The cluster too: read now (a preset name or a file, as plan --cluster takes), not found
  // missing only after the run (its peak for the run's dtype once that is known:
  // resolve_and_check).
  MESHRT_CHECK(o.plan_cluster.empty() || !o.fwd_only,
               "--plan-cluster " << o.plan_cluster
                                 << " with --fwd-only: the planner models forward + backward steps "
                                    "only, so a forward-only run gets no prediction; drop "
                                    "--plan-cluster or --fwd-only");
  if (!o.plan_cluster.empty()) (void)plan::load_cluster(o.plan_cluster, "", "--plan-cluster");
}

// Context parallelism (p.cp > 1): the layout rule and the options that cannot run with it yet.
void check_cp(const BlockBenchOptions& o, const BlockPlan& p) {
  if (p.cp == 1) return;
  MESHRT_CHECK(p.seq % (2 * static_cast<int64_t>(p.cp)) == 0,
               "--seq " << p.seq << " does not divide by 2 x cp = " << 2 * p.cp << " (--mesh "
                        << p.mesh
                        << "): context parallelism cuts the sequence into 2 x cp equal chunks, "
                           "rank i holding chunks i and 2cp-1-i; change --seq or cp");
  MESHRT_CHECK(!o.deterministic, "--deterministic with cp=" << p.cp << " (--mesh " << p.mesh
                                                            << "): its fixed-order sum takes "
                                                               "whole sequences; drop one of them");
}

void resolve_and_check(const BlockBenchOptions& o, BlockPlan& p) {
  p.kind = parse_layer_kind(o.kind);
  p.overlap = parse_overlap(o.overlap);
  p.world = p.launch->world_size();
  p.cuda = p.launch->local().front().device.is_cuda();

  // Sizes: what was asked, else a default that runs in seconds on this device.
  const bool c = p.cuda;
  ModelSpec m;  // the model's shape and dtype (model/model_spec.h), into p.cfg below
  m.dtype = !o.dtype.empty() ? parse_model_dtype(o.dtype) : (c ? DType::bf16 : DType::f32);
  // The cluster's peak for this dtype: a file without it is refused now, not after the run.
  if (!o.plan_cluster.empty())
    (void)plan::load_cluster(o.plan_cluster, dtype_name(m.dtype), "--plan-cluster");
  m.hidden = o.hidden > 0 ? o.hidden : (c ? 4096 : 1024);
  m.heads = o.heads > 0 ? o.heads : (c ? 32 : 16);
  // The default ffn is 4 x hidden: a hidden that large would overflow it (and be blamed on
  // --ffn, which the user never gave).
  m.ffn = cli::ffn_or_default(m.hidden, o.ffn);
  apply_model_spec(p.cfg, m);
  p.cfg.seed = o.seed;
  p.batch = o.batch > 0 ? o.batch : (c ? 4 : 1);
  p.seq = o.seq > 0 ? o.seq : (c ? 2048 : 512);
  MESHRT_CHECK(o.deterministic_grain == 1 || o.deterministic,
               "--deterministic-grain " << o.deterministic_grain
                                        << " would be ignored: it sizes the grains of "
                                           "--deterministic; add --deterministic or drop it");
  MESHRT_CHECK(o.deterministic_grain >= 1 && p.batch % o.deterministic_grain == 0,
               "--deterministic-grain " << o.deterministic_grain << " does not divide the "
                                        << p.batch
                                        << " sequences of a dp rank (--batch); use a grain "
                                           "that divides it (1 always does)");
  p.layers = o.layers > 0 ? o.layers : (c ? 2 : 1);
  p.steps = o.steps > 0 ? o.steps : (c ? 20 : 10);
  p.warmup = o.warmup >= 0 ? o.warmup : (c ? 5 : 2);

  // Mesh: dp, cp and tp; tp = world unless given.
  if (o.mesh.empty()) {
    p.mesh = kTpDim;
    p.mesh += "=" + std::to_string(p.world);
  } else {
    p.mesh = o.mesh;
  }
  std::vector<MeshDim> dims = parse_mesh_spec(p.mesh, p.world);
  for (const MeshDim& d : dims) {
    MESHRT_CHECK(d.name == kDpDim || d.name == kTpDim || d.name == kCpDim,
                 "--mesh " << p.mesh << ": dim '" << d.name
                           << "' is not one the block benchmark uses; name the dims " << kDpDim
                           << ", " << kCpDim << " and " << kTpDim << " (e.g. " << kDpDim << "=2,"
                           << kCpDim << "=2," << kTpDim << "=2)");
  }
  for (const MeshDim& d : dims) (d.name == kDpDim ? p.dp : d.name == kCpDim ? p.cp : p.tp) = d.size;
  p.cfg.cp_comm = parse_cp_comm(o.cp_comm);
  check_cp(o, p);
  cli::check_zero_has_dp(o.zero, p.dp * p.cp, p.mesh);
  p.sp_requested = o.sp == 1 || (o.sp == -1 && p.tp > 1);
  p.sp = p.sp_requested && p.tp > 1;
  MESHRT_CHECK(!(p.overlap == Overlap::Chunked && p.tp > 1 && !p.sp),
               "--overlap chunked splits the sequence all-gather / reduce-scatter into pieces and "
               "needs sequence parallelism: add --sp or use --overlap async");
  if (p.sp) {
    const char* why_sp = o.sp == 1 ? "--sp" : "sequence parallel (on by default when tp > 1)";
    const int64_t s = p.seq / p.cp;  // a cp rank's tokens (all of them at cp=1)
    const std::string what = p.cp > 1
                                 ? "--seq " + std::to_string(p.seq) +
                                       " / cp=" + std::to_string(p.cp) + " = " + std::to_string(s)
                                 : "--seq " + std::to_string(p.seq);
    MESHRT_CHECK(s % p.tp == 0, what << " does not divide by tp=" << p.tp << " under " << why_sp
                                     << "; change --seq or pass --no-sp");
    MESHRT_CHECK(p.overlap != Overlap::Chunked || s % (p.tp * p.tp) == 0,
                 "--overlap chunked needs " << what << " divisible by tp^2=" << p.tp * p.tp
                                            << ": change --seq or use --overlap async");
  }
  TpOptions topt{p.sp, p.overlap};
  // An MLP has no heads: its validation skips them.
  validate_block(p.cfg, p.tp, topt, p.seq, p.kind != LayerKind::Mlp, {}, p.cp);

  // Memory: refuse what cannot fit on the host instead of swapping or being killed.
  if (!p.cuda) {
    const double es = static_cast<double>(dtype_size(p.cfg.dtype));
    const double h = static_cast<double>(p.cfg.hidden), f = static_cast<double>(p.cfg.ffn);
    const double tok = static_cast<double>(p.batch) * static_cast<double>(p.seq) / p.cp;
    const double params = p.layers * (4 * h * h + 2 * h * f) / p.tp;
    const double acts = p.layers * tok * (12 * h / p.tp + 3 * f / p.tp + 6 * h);
    int local = static_cast<int>(p.launch->local().size());
    if (p.launch->kind() != LaunchKind::Threads) local = p.launch->local().front().local_size;
    const double need = (3 * params + 1.5 * acts) * es * local;
    const int64_t have = physical_memory_bytes();
    MESHRT_CHECK(have == 0 || need < 0.8 * static_cast<double>(have),
                 "this configuration needs about " << human_bytes(need) << " of host memory for "
                                                   << local << " rank(s) and the machine has "
                                                   << human_bytes(static_cast<double>(have))
                                                   << "; reduce --hidden, --ffn, --seq, --batch "
                                                      "or --layers");
  }
  p.flops = layer_flops(p.kind, p.batch * p.dp, p.seq, p.cfg.hidden, p.cfg.ffn, true);
  p.step_flops = step_flops(p.flops, p.layers, o.fwd_only);
}

}  // namespace

// Everything but the bootstrap depends only on the options and the world size, so every rank of a
// launch fails alike there: those errors are UniformErrors (printed once under mpirun). Bootstrap
// errors can differ by rank and are every rank's own.
BlockPlan make_block_plan(const BlockBenchOptions& o) {
  BlockPlan p;
  try {
    check_options(o);
  } catch (const Error& e) {
    throw bench::UniformError(e);
  }
  p.launch = launch_for(o, &p.devices);
  try {
    resolve_and_check(o, p);
  } catch (const Error& e) {
    throw bench::UniformError(e);
  }
  return p;
}

}  // namespace meshrt
