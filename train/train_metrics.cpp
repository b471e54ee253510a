#include "train/train_metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/agree.h"
#include "model/block_desc.h"
#include "runtime/error.h"
#include "runtime/json_field.h"
#include "runtime/logging.h"
#include "runtime/output_file.h"

namespace meshrt {

namespace {

// Per rank: step, compute, tp exposed, dp exposed (ms), memory now, peak (KiB), device index, and
// (rank 0) whether a record could not be written.
constexpr int kRankFields = 8;

bool keep_before(std::string_view line, long long first_step) {
  const long long s = metrics_line_step(line);
  return s >= 0 && s <= first_step;
}

double tm_ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

long long metrics_line_step(std::string_view line) {
  nlohmann::json j;
  try {
    j = parse_json_or_discarded(std::string(line), "");
  } catch (const Error&) {
    return -1;  // nested past kJsonMaxDepth: not a record of ours either
  }
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return -1;
  return j["step"].get<long long>();
}

double train_step_flops(const TrainConfig& cfg) {
  const BlockConfig& b = cfg.model.block;
  double fwd =
      layer_flops(LayerKind::Transformer, cfg.batch, cfg.seq, b.hidden, b.ffn, true).forward() *
      cfg.model.layers;
  fwd += 2.0 * static_cast<double>(cfg.batch) * static_cast<double>(cfg.seq) *
         static_cast<double>(b.hidden) * static_cast<double>(cfg.model.vocab);
  return 3 * fwd;
}

int StragglerWatch::observe(const std::vector<double>& compute_ms, double* ratio) {
  const size_t n = compute_ms.size();
  run_.resize(n, 0);
  named_.resize(n, false);
  std::vector<double> sorted = compute_ms;
  std::sort(sorted.begin(), sorted.end());
  median_ = sorted[(n - 1) / 2];
  int flagged = -1;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = median_ > 0 ? compute_ms[i] / median_ : 0.0;
    run_[i] = r > threshold_ ? run_[i] + 1 : 0;
    if (run_[i] >= steps_ && !named_[i] && r > worst) {
      flagged = static_cast<int>(i);
      worst = r;
    }
  }
  if (flagged >= 0) {
    named_[static_cast<size_t>(flagged)] = true;
    *ratio = worst;
  }
  return flagged;
}

TrainMetrics::TrainMetrics(const TrainConfig& cfg, Context& ctx, Communicator& world,
                           int first_step, double model_flops)
    : cfg_(cfg),
      world_(world),
      enabled_(!cfg.metrics.empty() || cfg.watch_stragglers),
      model_flops_(model_flops),
      stragglers_(cfg.straggler_threshold, cfg.straggler_steps) {
  if (cfg.metrics.empty()) return;
  std::string err;
  try {
    if (world.rank() == 0 && first_step > 0)
      file_ = std::make_unique<AppendOutputFile>(cfg.metrics, "--metrics",
                                                 AppendOutputFile::Start::Append, &keep_before,
                                                 static_cast<long long>(first_step));
    else if (world.rank() == 0)
      file_ = std::make_unique<AppendOutputFile>(cfg.metrics, "--metrics",
                                                 AppendOutputFile::Start::Fresh);
  } catch (const std::exception& e) {
    err = error_message(e);
  }
  agree_error(ctx, world, err, "", "could not open the --metrics file");
}

TrainMetrics::~TrainMetrics() = default;

void TrainMetrics::record(Context& ctx, StepStats* st, double grad_norm, int skipped_total,
                          std::ostream* log) {
  if (!enabled_) return;
  const AllocatorStats mem = ctx.allocator().stats();
  const auto t0 = std::chrono::steady_clock::now();
  Stream& cs = ctx.compute_stream();
  const int n = world_.size();
  Tensor h = Tensor::empty({kRankFields}, DType::f32, ctx.host_allocator());
  // Memory in KiB: f32 holds it exactly up to 16 GiB, within 1 KiB to 2 TiB.
  const double v[kRankFields] = {st->step_ms,
                                 st->compute_ms,
                                 st->tp_exposed_ms,
                                 st->dp_exposed_ms,
                                 static_cast<double>(mem.allocated_bytes) / 1024.0,
                                 static_cast<double>(mem.peak_allocated_bytes) / 1024.0,
                                 static_cast<double>(ctx.device().index),
                                 write_error_.empty() ? 0.0 : 1.0};
  for (int i = 0; i < kRankFields; ++i) h.data<float>()[i] = static_cast<float>(v[i]);
  const bool cpu = ctx.device().is_cpu();
  Tensor in = cpu ? h : h.to(ctx.allocator_ptr(), cs);
  Tensor all = cpu ? Tensor::empty({n * kRankFields}, DType::f32, ctx.host_allocator())
                   : ctx.zeros({n * kRankFields}, DType::f32);
  world_.all_gather(in, all, cs).synchronize();
  Tensor r = cpu ? all : all.to(ctx.host_allocator(), cs);
  cs.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  gather_ms_ += tm_ms_since(t0);
  if (r.item(7) != 0) fail_write(ctx);  // rank 0's last record was not written
  if (world_.rank() != 0) return;
  device_type_ = cpu ? "cpu" : "cuda";
  std::vector<double> rv(static_cast<size_t>(n * kRankFields)), compute(static_cast<size_t>(n));
  for (int i = 0; i < n * kRankFields; ++i) rv[static_cast<size_t>(i)] = r.item(i);
  for (int i = 0; i < n; ++i) compute[static_cast<size_t>(i)] = rv[i * kRankFields + 1];
  double ratio = 0;
  if (const int s = stragglers_.observe(compute, &ratio); s >= 0) {
    st->straggler_rank = s;
    st->straggler_ratio = ratio;
    st->straggler_device =
        device_type_ + ":" + std::to_string(static_cast<int>(rv[s * kRankFields + 6]));
    if (log) {
      std::ostringstream line;
      line << "warning: straggler: rank " << s << " (" << st->straggler_device << ") computes "
           << std::fixed << std::setprecision(1) << compute[static_cast<size_t>(s)] << " ms, "
           << std::setprecision(2) << ratio << "x the median rank's " << std::setprecision(1)
           << stragglers_.median_ms() << " ms, for " << cfg_.straggler_steps
           << " steps in a row (to step " << st->step << "; --straggler-threshold "
           << cfg_.straggler_threshold << ")\n";
      print_line(*log, line.str());
    }
  }
  if (!file_) return;
  try {
    write(*st, rv, grad_norm, skipped_total);
  } catch (const std::exception& e) {
    write_error_ = "train: step " + std::to_string(st->step) + ": " + error_message(e);
  }
  cost_ms_ += tm_ms_since(t1);
}

void TrainMetrics::fail_write(Context& ctx) {
  agree_error(ctx, world_, write_error_, "", "could not write the --metrics file");
  // agree_error throws on every rank when rank 0's error is set, as the gather said it is.
  MESHRT_FAIL("internal: --metrics: rank 0's write error was announced but not agreed");
}

void TrainMetrics::finish(Context& ctx) {
  if (cfg_.metrics.empty()) return;
  agree_error(ctx, world_, write_error_, "", "could not write the --metrics file");
}

void TrainMetrics::write(const StepStats& st, const std::vector<double>& r, double grad_norm,
                         int skipped_total) {
  using nlohmann::json;
  const int n = world_.size();
  json j;
  j["schema"] = "meshrt.train.metrics";
  j["version"] = kMetricsVersion;
  j["step"] = st.step;
  j["loss"] = std::isfinite(st.loss) ? json(st.loss) : json(nullptr);
  if (!std::isnan(st.val_loss)) j["val_loss"] = st.val_loss;
  j["lr"] = st.lr;
  if (grad_norm >= 0) j["grad_norm"] = std::isfinite(grad_norm) ? json(grad_norm) : json(nullptr);
  j["skipped"] = st.skipped;
  j["skipped_steps"] = skipped_total;
  j["step_ms"] = st.step_ms;
  const double step_s = st.step_ms / 1e3;
  j["tokens_per_s"] = step_s > 0 ? static_cast<double>(cfg_.batch * cfg_.seq) / step_s : 0.0;
  const double tflops = step_s > 0 ? model_flops_ / step_s / 1e12 : 0.0;
  j["model_tflops_per_s"] = tflops;
  if (cfg_.peak_tflops > 0) j["mfu"] = tflops / (cfg_.peak_tflops * n);
  if (st.cp_imbalance > 0) {
    j["cp_imbalance"] = st.cp_imbalance;
    j["cp_standard_imbalance"] = st.cp_standard_imbalance;
  }
  // Ranks over the threshold for --straggler-steps steps in a row at this step: the slowest.
  int slow = -1;
  for (int i = 0; i < n; ++i)
    if (stragglers_.runs()[static_cast<size_t>(i)] >= cfg_.straggler_steps &&
        (slow < 0 || r[i * kRankFields + 1] > r[slow * kRankFields + 1]))
      slow = i;
  if (slow >= 0) j["straggler_rank"] = slow;
  double fastest = std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) fastest = std::min(fastest, r[i * kRankFields]);
  json ranks = json::array();
  for (int i = 0; i < n; ++i) {
    const double* f = &r[static_cast<size_t>(i * kRankFields)];
    ranks.push_back({{"rank", i},
                     {"device", device_type_ + ":" + std::to_string(static_cast<int>(f[6]))},
                     {"step_ms", f[0]},
                     {"compute_ms", f[1]},
                     {"tp_exposed_ms", f[2]},
                     {"dp_exposed_ms", f[3]},
                     {"mem_current_bytes", f[4] * 1024.0},
                     {"mem_peak_bytes", f[5] * 1024.0},
                     {"skew_ms", f[0] - fastest}});
  }
  j["ranks"] = std::move(ranks);
  // Rank 0's dp communication by kind (ZeRO: reduce-scatter and all-gather), in bytes.
  j["dp_bytes"] = {{"all_reduce", st.dp_all_reduce_bytes},
                   {"reduce_scatter", st.dp_reduce_scatter_bytes},
                   {"all_gather", st.dp_all_gather_bytes}};
  file_->append_line(j.dump());
}

void TrainMetrics::log_cost(const std::vector<StepStats>& steps, std::ostream& log) const {
  if (!file_ || steps.empty()) return;
  double total = 0;
  for (const StepStats& s : steps) total += s.step_ms;
  auto pct = [&](double ms) { return total > 0 ? 100.0 * ms / total : 0.0; };
  log << "metrics: " << steps.size() << " records -> " << cfg_.metrics << " (writing " << std::fixed
      << std::setprecision(2) << cost_ms_ << " ms, " << pct(cost_ms_)
      << "% of the step time; gathering the ranks' times " << gather_ms_ << " ms, "
      << pct(gather_ms_) << "%, mostly waiting for the slowest rank)" << std::endl;
}

}  // namespace meshrt
