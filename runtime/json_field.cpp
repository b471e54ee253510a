#include "runtime/json_field.h"

#include <cstdio>

#include "runtime/error.h"

namespace meshrt {

namespace {

std::string jf_num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

// A parse error's text without the library's "[json.exception.parse_error.101] " tag.
std::string jf_parse_error(const std::exception& e) {
  std::string w = e.what();
  if (!w.empty() && w[0] == '[') {
    const size_t close = w.find("] ");
    if (close != std::string::npos) w = w.substr(close + 2);
  }
  return w;
}

template <class J>
J jf_parse(const std::string& text, const std::string& where) {
  try {
    return J::parse(text);
  } catch (const nlohmann::json::exception& e) {
    const std::string why = jf_parse_error(e);
    const bool literal = why.find("invalid literal") != std::string::npos ||
                         why.find("overflow") != std::string::npos;
    MESHRT_FAIL(where << (where.empty() ? "" : ": ") << "not valid JSON: " << why
                      << (literal ? " (numbers must be finite: JSON has no NaN or Infinity)" : ""));
  }
}

}  // namespace

bool JsonRange::holds(double x) const {
  return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

std::string JsonRange::str() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return "a number in " + std::string(lo_open ? "(" : "[") + jf_num(lo) + ", " + jf_num(hi) +
           (hi_open ? ")" : "]");
  if (has_lo) return std::string("a number ") + (lo_open ? "> " : ">= ") + jf_num(lo);
  if (has_hi) return std::string("a number ") + (hi_open ? "< " : "<= ") + jf_num(hi);
  return "a finite number";
}

JsonRange json_positive() { return JsonRange{0, JsonRange().hi, true, false}; }
JsonRange json_at_least(double lo) { return JsonRange{lo, JsonRange().hi, false, false}; }
JsonRange json_between(double lo, double hi) { return JsonRange{lo, hi, false, false}; }

std::string json_integer_text(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return "an integer >= " + std::to_string(lo);
  return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string json_count_text(uint64_t hi) { return "an integer in [0, " + std::to_string(hi) + "]"; }

void json_field_fail(const std::string& where, const std::string& name, const std::string& found,
                     const std::string& expected) {
  // An object that is not one, named by `where` alone: "c.json is [1,2], not an object".
  const std::string at =
      name.empty() ? where : (where.empty() ? "" : where + ": ") + "field '" + name + "'";
  if (found.empty()) MESHRT_FAIL(at << " is missing; give " << expected);
  MESHRT_FAIL(at << " is " << found << ", not " << expected);
}

std::string json_value_text(const std::string& dump) {
  constexpr size_t kMax = 60;
  return dump.size() <= kMax ? dump : dump.substr(0, kMax - 3) + "...";
}

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  return jf_parse<nlohmann::json>(text, where);
}

nlohmann::ordered_json parse_ordered_json_text(const std::string& text, const std::string& where) {
  return jf_parse<nlohmann::ordered_json>(text, where);
}

}  // namespace meshrt
