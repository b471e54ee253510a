// Fields of the JSON files meshrt reads from the user (cluster files, sweeps for `plan --compare`,
// metrics records, checkpoint indexes, tune state): type and range checked where they enter, one
// way. Every error names where (the file, and the object in it), the field, the value found and
// what to give instead, e.g.
//   c.json: field 'memory_gib' is -1, not a number > 0
//   c.json: field 'collectives.intra' is missing; give an object
// and never a JSON library's exception text.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace meshrt {

// What a number field accepts: finite, within [lo, hi] (an end excluded when `*_open`).
struct JsonRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool holds(double x) const;
  std::string str() const;  // "a number > 0", "a number in [0, 1]", "a number"
};
JsonRange json_positive();                              // > 0
JsonRange json_at_least(double lo);                     // >= lo
JsonRange json_between(double lo, double hi);           // [lo, hi]
std::string json_integer_text(int64_t lo, int64_t hi);  // "an integer >= 1", "... in [0, 9]"
std::string json_count_text(uint64_t hi);               // "an integer in [0, hi]"

// "WHERE: field 'NAME' is FOUND, not EXPECTED" (FOUND empty: "is missing; give EXPECTED"; WHERE
// empty: no "WHERE: "; NAME empty: "WHERE is FOUND, not EXPECTED").
[[noreturn]] void json_field_fail(const std::string& where, const std::string& name,
                                  const std::string& found, const std::string& expected);
// A value as an error message shows it: its JSON text, at most 60 characters.
std::string json_value_text(const std::string& dump);
// The same of a parsed value, written only as far as those 60 characters go: an error never
// renders a whole (possibly large) value to show its start.
std::string json_value_text(const nlohmann::json& v);
std::string json_value_text(const nlohmann::ordered_json& v);

// The deepest nesting of arrays and objects a JSON file meshrt reads may have (its own files nest
// a few levels). Deeper input is refused while it is parsed, before any value is built: rendering
// or copying a value nested ~100k levels deep recurses once per level and overflows the stack.
constexpr int kJsonMaxDepth = 64;

// `text` parsed, or "WHERE: not valid JSON: parse error at line L, column C: ..." (WHERE empty:
// without "WHERE: "); nesting past kJsonMaxDepth is refused ("WHERE: not valid JSON here: arrays
// and objects nest more than 64 levels deep; ..."). Every JSON file meshrt reads is parsed by one
// of these three.
nlohmann::json parse_json_text(const std::string& text, const std::string& where);
nlohmann::ordered_json parse_ordered_json_text(const std::string& text, const std::string& where);
// As parse_json_text, but text that is not JSON gives a discarded value (is_discarded()) for the
// caller to refuse in its own words; too deep a nesting still throws as above.
nlohmann::json parse_json_or_discarded(const std::string& text, const std::string& where);
nlohmann::ordered_json parse_ordered_json_or_discarded(const std::string& text,
                                                       const std::string& where);

// The fields of one JSON object `obj`, which sits at `prefix` ("" for the top level, else e.g.
// "collectives.intra.") in the file `where` names. Each getter refuses a missing field, a value
// of another type or out of range with json_field_fail.
template <class J>
class JsonFields {
 public:
  // Refuses an `obj` that is not an object (naming it `prefix` without its dot, or `where` when
  // `prefix` is empty).
  JsonFields(const J& obj, std::string where, std::string prefix = "")
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {
    if (!obj_.is_object()) {
      if (prefix_.empty()) json_field_fail(where_, "", json_value_text(obj_), "an object");
      json_field_fail(where_, prefix_.substr(0, prefix_.size() - 1), json_value_text(obj_),
                      "an object");
    }
  }

  bool has(const char* key) const { return obj_.contains(key); }
  const J& raw() const { return obj_; }
  const std::string& where() const { return where_; }
  std::string name(const std::string& key) const { return prefix_ + key; }
  [[noreturn]] void fail(const std::string& key, const J& v, const std::string& expected) const {
    json_field_fail(where_, name(key), json_value_text(v), expected);
  }

  const J& at(const char* key, const std::string& expected) const {
    const auto it = obj_.find(key);
    if (it == obj_.end()) json_field_fail(where_, name(key), "", expected);
    return *it;
  }
  double number(const char* key, const JsonRange& r) const {
    const J& v = at(key, r.str());
    if (!v.is_number() || !r.holds(v.template get<double>())) fail(key, v, r.str());
    return v.template get<double>();
  }
  double number_or(const char* key, const JsonRange& r, double absent) const {
    return has(key) ? number(key, r) : absent;
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    const std::string want = json_integer_text(lo, hi);
    const J& v = at(key, want);
    bool ok = false;
    if (v.is_number_unsigned()) {  // above int64's range: above any hi
      const uint64_t u = v.template get<uint64_t>();
      ok = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
           static_cast<int64_t>(u) >= lo && static_cast<int64_t>(u) <= hi;
    } else if (v.is_number_integer()) {
      ok = v.template get<int64_t>() >= lo && v.template get<int64_t>() <= hi;
    }
    if (!ok) fail(key, v, want);
    return v.template get<int64_t>();
  }
  // A count: an integer in [0, hi] (the whole uint64 range for hi = its max).
  uint64_t count(const char* key, uint64_t hi) const {
    const std::string want = json_count_text(hi);
    const J& v = at(key, want);
    const bool ok = v.is_number_integer() &&
                    (v.is_number_unsigned() || v.template get<int64_t>() >= 0) &&
                    v.template get<uint64_t>() <= hi;
    if (!ok) fail(key, v, want);
    return v.template get<uint64_t>();
  }
  std::string string(const char* key) const {
    const J& v = at(key, "a string");
    if (!v.is_string()) fail(key, v, "a string");
    return v.template get<std::string>();
  }
  std::string string_or(const char* key, const std::string& absent) const {
    return has(key) ? string(key) : absent;
  }
  bool boolean(const char* key) const {
    const J& v = at(key, "true or false");
    if (!v.is_boolean()) fail(key, v, "true or false");
    return v.template get<bool>();
  }
  bool boolean_or(const char* key, bool absent) const { return has(key) ? boolean(key) : absent; }
  JsonFields object(const char* key) const {
    return JsonFields(at(key, "an object"), where_, name(key) + ".");
  }
  const J& array(const char* key) const {
    const J& v = at(key, "an array");
    if (!v.is_array()) fail(key, v, "an array");
    return v;
  }

 private:
  const J& obj_;
  std::string where_, prefix_;
};

}  // namespace meshrt
