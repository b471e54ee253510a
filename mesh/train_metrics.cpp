#include "mesh/train_metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/output_file.h"

namespace meshrt {

namespace {

constexpr int kRankFields = 5;

bool keep_before(std::string_view line, long long first_step) {
  const long long s = metrics_line_step(line);
  return s >= 0 && s <= first_step;
}

}  // namespace

long long metrics_line_step(std::string_view line) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return -1;
  return j["step"].get<long long>();
}

TrainMetrics::TrainMetrics(const TrainConfig& cfg, Communicator& world, int first_step)
    : cfg_(cfg), world_(world), enabled_(!cfg.metrics.empty()) {
  if (!enabled_ || world.rank() != 0) return;
  if (first_step > 0)
    file_ = std::make_unique<AppendOutputFile>(cfg.metrics, "--metrics",
                                               AppendOutputFile::Start::Append, &keep_before,
                                               static_cast<long long>(first_step));
  else
    file_ = std::make_unique<AppendOutputFile>(cfg.metrics, "--metrics",
                                               AppendOutputFile::Start::Fresh);
}

TrainMetrics::~TrainMetrics() = default;

void TrainMetrics::record(Context& ctx, const StepStats& st, double grad_norm, int skipped_total) {
  if (!enabled_) return;
  const AllocatorStats mem = ctx.allocator().stats();
  const auto t0 = std::chrono::steady_clock::now();
  Stream& cs = ctx.compute_stream();
  const int n = world_.size();
  Tensor h = Tensor::empty({kRankFields}, DType::f32, ctx.host_allocator());
  float* p = h.data<float>();
  // Memory in KiB: f32 holds it exactly up to 16 GiB, within 1 KiB to 2 TiB.
  const float v[kRankFields] = {
      static_cast<float>(st.step_ms), static_cast<float>(st.tp_exposed_ms),
      static_cast<float>(st.dp_exposed_ms),
      static_cast<float>(static_cast<double>(mem.allocated_bytes) / 1024.0),
      static_cast<float>(static_cast<double>(mem.peak_allocated_bytes) / 1024.0)};
  std::copy(v, v + kRankFields, p);
  const bool cpu = ctx.device().is_cpu();
  Tensor in = cpu ? h : h.to(ctx.allocator_ptr(), cs);
  Tensor all = cpu ? Tensor::empty({n * kRankFields}, DType::f32, ctx.host_allocator())
                   : ctx.zeros({n * kRankFields}, DType::f32);
  world_.all_gather(in, all, cs).synchronize();
  Tensor r = cpu ? all : all.to(ctx.host_allocator(), cs);
  cs.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  gather_ms_ += std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (world_.rank() != 0) return;
  using nlohmann::json;
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
  j["tokens_per_s"] =
      st.step_ms > 0 ? static_cast<double>(cfg_.batch * cfg_.seq) / (st.step_ms / 1e3) : 0.0;
  double fastest = std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) fastest = std::min(fastest, r.item(i * kRankFields));
  json ranks = json::array();
  for (int i = 0; i < n; ++i) {
    const double step_ms = r.item(i * kRankFields), tp = r.item(i * kRankFields + 1),
                 dp = r.item(i * kRankFields + 2);
    ranks.push_back({{"rank", i},
                     {"step_ms", step_ms},
                     {"compute_ms", std::max(0.0, step_ms - tp - dp)},
                     {"tp_exposed_ms", tp},
                     {"dp_exposed_ms", dp},
                     {"mem_current_bytes", r.item(i * kRankFields + 3) * 1024.0},
                     {"mem_peak_bytes", r.item(i * kRankFields + 4) * 1024.0},
                     {"skew_ms", step_ms - fastest}});
  }
  j["ranks"] = std::move(ranks);
  // Rank 0's dp communication by kind (ZeRO: reduce-scatter and all-gather), in bytes.
  j["dp_bytes"] = {{"all_reduce", st.dp_all_reduce_bytes},
                   {"reduce_scatter", st.dp_reduce_scatter_bytes},
                   {"all_gather", st.dp_all_gather_bytes}};
  file_->append_line(j.dump());
  cost_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
}

void TrainMetrics::log_cost(const std::vector<StepStats>& steps, std::ostream& log) const {
  if (!enabled_ || steps.empty()) return;
  double total = 0;
  for (const StepStats& s : steps) total += s.step_ms;
  auto pct = [&](double ms) { return total > 0 ? 100.0 * ms / total : 0.0; };
  log << "metrics: " << steps.size() << " records -> " << cfg_.metrics << " (writing " << std::fixed
      << std::setprecision(2) << cost_ms_ << " ms, " << pct(cost_ms_)
      << "% of the step time; gathering the ranks' times " << gather_ms_ << " ms, "
      << pct(gather_ms_) << "%, mostly waiting for the slowest rank)" << std::endl;
}

}  // namespace meshrt
