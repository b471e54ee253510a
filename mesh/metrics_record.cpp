#include "mesh/metrics_record.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mesh/train_metrics.h"
#include "runtime/error.h"
#include "runtime/input_file.h"

namespace meshrt {

namespace {

using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Far above any real run's file (1 KiB a record for a million steps).
constexpr uint64_t kMaxMetricsBytes = uint64_t{1} << 30;

// A number field: required (absent throws), or optional (absent or null: NaN). null is accepted
// in either case (the writer writes it for non-finite values).
double mr_number(const json& j, const char* key, bool required, const std::string& where = "") {
  const auto it = j.find(key);
  if (it == j.end()) {
    MESHRT_CHECK(!required, "field '" << where << key << "' is missing");
    return kNaN;
  }
  if (it->is_null()) return kNaN;
  MESHRT_CHECK(it->is_number(),
               "field '" << where << key << "' is " << it->dump() << ", not a number");
  return it->get<double>();
}

long long mr_integer(const json& j, const char* key, const std::string& where = "") {
  const auto it = j.find(key);
  MESHRT_CHECK(it != j.end(), "field '" << where << key << "' is missing");
  MESHRT_CHECK(it->is_number_integer(),
               "field '" << where << key << "' is " << it->dump() << ", not an integer");
  return it->get<long long>();
}

MetricsRank mr_rank(const json& r, size_t i) {
  const std::string where = "ranks[" + std::to_string(i) + "].";
  MESHRT_CHECK(r.is_object(), "field 'ranks[" << i << "]' is not an object");
  MetricsRank k;
  k.rank = static_cast<int>(mr_integer(r, "rank", where));
  MESHRT_CHECK(k.rank == static_cast<long long>(i), "field '" << where << "rank' is " << k.rank
                                                              << " but ranks are in order: want "
                                                              << i);
  k.step_ms = mr_number(r, "step_ms", true, where);
  k.compute_ms = mr_number(r, "compute_ms", true, where);
  k.tp_exposed_ms = mr_number(r, "tp_exposed_ms", true, where);
  k.dp_exposed_ms = mr_number(r, "dp_exposed_ms", true, where);
  k.mem_current_bytes = mr_number(r, "mem_current_bytes", true, where);
  k.mem_peak_bytes = mr_number(r, "mem_peak_bytes", true, where);
  k.skew_ms = mr_number(r, "skew_ms", true, where);
  if (const auto d = r.find("device"); d != r.end()) {
    MESHRT_CHECK(d->is_string(),
                 "field '" << where << "device' is " << d->dump() << ", not a string");
    k.device = d->get<std::string>();
  }
  return k;
}

}  // namespace

MetricsRecord parse_metrics_record(std::string_view line) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  MESHRT_CHECK(!j.is_discarded(), "not valid JSON");
  MESHRT_CHECK(j.is_object(), "not a JSON object");
  const auto schema = j.find("schema");
  MESHRT_CHECK(schema != j.end() && schema->is_string() && *schema == "meshrt.train.metrics",
               "field 'schema' is " << (schema == j.end() ? "missing" : schema->dump())
                                    << ": not a meshrt train --metrics record");
  MetricsRecord m;
  const long long v = mr_integer(j, "version");
  MESHRT_CHECK(v >= 1 && v <= kMetricsVersion,
               "version " << v << " is not one this meshrt reads (1.." << kMetricsVersion
                          << "): use the meshrt that wrote the file");
  m.version = static_cast<int>(v);
  m.step = mr_integer(j, "step");
  MESHRT_CHECK(m.step >= 1, "field 'step' is " << m.step << ", not >= 1");
  m.loss = mr_number(j, "loss", true);
  m.val_loss = mr_number(j, "val_loss", false);
  m.lr = mr_number(j, "lr", true);
  m.grad_norm = mr_number(j, "grad_norm", false);
  m.step_ms = mr_number(j, "step_ms", true);
  m.tokens_per_s = mr_number(j, "tokens_per_s", true);
  m.mfu = mr_number(j, "mfu", false);
  const auto sk = j.find("skipped");
  MESHRT_CHECK(sk != j.end() && sk->is_boolean(),
               "field 'skipped' is " << (sk == j.end() ? "missing" : sk->dump() + ", not a bool"));
  m.skipped = sk->get<bool>();
  m.skipped_steps = mr_integer(j, "skipped_steps");
  if (j.contains("straggler_rank"))
    m.straggler_rank = static_cast<int>(mr_integer(j, "straggler_rank"));
  const auto ranks = j.find("ranks");
  MESHRT_CHECK(ranks != j.end() && ranks->is_array() && !ranks->empty(),
               "field 'ranks' is " << (ranks == j.end() ? "missing" : "not a non-empty array"));
  for (size_t i = 0; i < ranks->size(); ++i) m.ranks.push_back(mr_rank((*ranks)[i], i));
  MESHRT_CHECK(m.straggler_rank >= -1 && m.straggler_rank < static_cast<int>(m.ranks.size()),
               "field 'straggler_rank' is " << m.straggler_rank << ", not a rank of the "
                                            << m.ranks.size() << " in 'ranks'");
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
