#include "train/metrics_record.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/json_field.h"
#include "train/train_metrics.h"

namespace meshrt {

namespace {

using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Far above any real run's file (1 KiB a record for a million steps).
constexpr uint64_t kMaxMetricsBytes = uint64_t{1} << 30;

using MetricsFields = JsonFields<json>;

// A number field >= 0: required (absent throws) or optional (absent: NaN). `nullable`: null reads
// as NaN (the writer writes null for a loss or gradient norm that was not finite).
double mr_number(const MetricsFields& f, const char* key, bool required, bool nullable = false) {
  if (!f.has(key) && !required) return kNaN;
  if (nullable && f.at(key, "a number >= 0 (or null)").is_null()) return kNaN;
  return f.number(key, json_at_least(0));
}

MetricsRank mr_rank(const json& r, size_t i) {
  const MetricsFields f(r, "", "ranks[" + std::to_string(i) + "].");
  MetricsRank k;
  k.rank = static_cast<int>(f.integer("rank", 0, std::numeric_limits<int>::max()));
  const std::string want = std::to_string(i) + " (ranks are listed in rank order)";
  if (k.rank != static_cast<int>(i)) f.fail("rank", r.at("rank"), want);
  k.step_ms = mr_number(f, "step_ms", true);
  k.compute_ms = mr_number(f, "compute_ms", true);
  k.tp_exposed_ms = mr_number(f, "tp_exposed_ms", true);
  k.dp_exposed_ms = mr_number(f, "dp_exposed_ms", true);
  k.mem_current_bytes = mr_number(f, "mem_current_bytes", true);
  k.mem_peak_bytes = mr_number(f, "mem_peak_bytes", true);
  k.skew_ms = mr_number(f, "skew_ms", true);
  k.device = f.string_or("device", "");
  return k;
}

}  // namespace

MetricsRecord parse_metrics_record(std::string_view line) {
  const json j = parse_json_text(std::string(line), "");
  MESHRT_CHECK(j.is_object(), "not a JSON object");
  const auto schema = j.find("schema");
  MESHRT_CHECK(schema != j.end() && schema->is_string() && *schema == "meshrt.train.metrics",
               "field 'schema' is " << (schema == j.end() ? "missing" : json_value_text(*schema))
                                    << ": not a meshrt train --metrics record");
  // No location: read_metrics_file puts "FILE:LINE" in front.
  const MetricsFields f(j, "");
  MetricsRecord m;
  const long long v = f.integer("version", 0, std::numeric_limits<int>::max());
  MESHRT_CHECK(v >= 1 && v <= kMetricsVersion,
               "version " << v << " is not one this meshrt reads (1.." << kMetricsVersion
                          << "): use the meshrt that wrote the file");
  m.version = static_cast<int>(v);
  m.step = f.integer("step", 1, std::numeric_limits<int64_t>::max());
  m.loss = mr_number(f, "loss", true, /*nullable=*/true);
  m.val_loss = mr_number(f, "val_loss", false, /*nullable=*/true);
  m.lr = mr_number(f, "lr", true);
  m.grad_norm = mr_number(f, "grad_norm", false, /*nullable=*/true);
  m.step_ms = mr_number(f, "step_ms", true);
  m.tokens_per_s = mr_number(f, "tokens_per_s", true);
  m.mfu = mr_number(f, "mfu", false);
  m.skipped = f.boolean("skipped");
  m.skipped_steps = f.integer("skipped_steps", 0, m.step);
  const json& ranks = f.array("ranks");
  MESHRT_CHECK(!ranks.empty(), "field 'ranks' is [], not a list of one object per rank");
  for (size_t i = 0; i < ranks.size(); ++i) m.ranks.push_back(mr_rank(ranks[i], i));
  if (f.has("straggler_rank"))
    m.straggler_rank =
        static_cast<int>(f.integer("straggler_rank", 0, static_cast<int64_t>(m.ranks.size()) - 1));
  return m;
}

std::vector<MetricsRecord> read_metrics_file(const std::string& path) {
  const std::string text = read_input_file(path, "report", kMaxMetricsBytes);
  std::vector<MetricsRecord> out;
  size_t pos = 0;
  for (long long line = 1; pos < text.size(); ++line) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a record being written
    const std::string_view l(text.data() + pos, nl - pos);
    pos = nl + 1;
    // A blank line (an editor's, or between two files joined by hand) holds no record.
    if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    try {
      MetricsRecord r = parse_metrics_record(l);
      MESHRT_CHECK(out.empty() || r.step > out.back().step,
                   "step " << r.step << " follows step " << out.back().step
                           << ": steps must rise (two runs appended to one file?)");
      MESHRT_CHECK(out.empty() || r.ranks.size() == out.back().ranks.size(),
                   r.ranks.size() << " ranks but the line before has " << out.back().ranks.size());
      out.push_back(std::move(r));
    } catch (const Error& e) {
      MESHRT_FAIL(path << ":" << line << ": " << e.message());
    }
  }
  MESHRT_CHECK(!out.empty(), path << ": no metrics record (an empty file, or the run wrote none "
                                     "yet); pass a file written by meshrt train --metrics");
  return out;
}

}  // namespace meshrt
