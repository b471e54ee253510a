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

[[noreturn]] void jf_too_deep(const std::string& where) {
  MESHRT_FAIL(where << (where.empty() ? "" : ": ")
                    << "not valid JSON here: arrays and objects nest "
                    << "more than " << kJsonMaxDepth
                    << " levels deep (meshrt's JSON files nest a few); is it the right file?");
}

// Parses with a callback that refuses containers past kJsonMaxDepth: nothing below that depth
// is built (the callback discards it), and the parse is then refused. The parser itself keeps
// its own stack on the heap; only the values it builds would recurse when copied or rendered.
template <class J>
J jf_parse(const std::string& text, const std::string& where, bool allow_exceptions) {
  bool too_deep = false;
  const typename J::parser_callback_t cb = [&too_deep](int depth, nlohmann::json::parse_event_t ev,
                                                       J&) {
    const bool opens = ev == nlohmann::json::parse_event_t::object_start ||
                       ev == nlohmann::json::parse_event_t::array_start;
    // `depth`: the containers already open around this one.
    if (opens && depth >= kJsonMaxDepth) too_deep = true;
    return !too_deep;
  };
  J j;
  try {
    j = J::parse(text, cb, allow_exceptions);
  } catch (const nlohmann::json::exception& e) {
    if (too_deep) jf_too_deep(where);
    const std::string why = jf_parse_error(e);
    const bool literal = why.find("invalid literal") != std::string::npos ||
                         why.find("overflow") != std::string::npos;
    MESHRT_FAIL(where << (where.empty() ? "" : ": ") << "not valid JSON: " << why
                      << (literal ? " (numbers must be finite: JSON has no NaN or Infinity)" : ""));
  }
  if (too_deep) jf_too_deep(where);
  return j;
}

constexpr size_t kValueTextMax = 60;

// The start of v's JSON text, written until it is longer than `cap` characters.
template <class J>
void jf_brief(const J& v, std::string& out, size_t cap) {
  const auto quoted = [cap](const std::string& s) {
    return J(s.substr(0, cap + 1)).dump(-1, ' ', false, J::error_handler_t::replace);
  };
  if (v.is_object() || v.is_array()) {
    out += v.is_object() ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= cap; ++it) {
      if (!first) out += ',';
      first = false;
      if (v.is_object()) out += quoted(it.key()) + ":";
      jf_brief(it.value(), out, cap);
    }
    if (out.size() <= cap) out += v.is_object() ? '}' : ']';
  } else if (v.is_string()) {
    out += quoted(v.template get_ref<const std::string&>());
  } else {
    out += v.dump();
  }
}

template <class J>
std::string jf_value_text(const J& v) {
  std::string out;
  jf_brief(v, out, kValueTextMax);
  return json_value_text(out);
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
  constexpr size_t kMax = kValueTextMax;
  return dump.size() <= kMax ? dump : dump.substr(0, kMax - 3) + "...";
}

std::string json_value_text(const nlohmann::json& v) { return jf_value_text(v); }
std::string json_value_text(const nlohmann::ordered_json& v) { return jf_value_text(v); }

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  return jf_parse<nlohmann::json>(text, where, true);
}

nlohmann::ordered_json parse_ordered_json_text(const std::string& text, const std::string& where) {
  return jf_parse<nlohmann::ordered_json>(text, where, true);
}

nlohmann::json parse_json_or_discarded(const std::string& text, const std::string& where) {
  return jf_parse<nlohmann::json>(text, where, false);
}

nlohmann::ordered_json parse_ordered_json_or_discarded(const std::string& text,
                                                       const std::string& where) {
  return jf_parse<nlohmann::ordered_json>(text, where, false);
}

}  // namespace meshrt
