#include "dist/style_plan.h"

#include <sstream>

#include "runtime/error.h"

namespace meshrt {

const char* linear_style_name(LinearStyle s) {
  switch (s) {
    case LinearStyle::Colwise:
      return "colwise";
    case LinearStyle::Rowwise:
      return "rowwise";
  }
  return "?";
}

StylePlan::StylePlan(std::initializer_list<std::pair<std::string, LinearStyle>> entries) {
  for (const auto& [pattern, style] : entries) add(pattern, style);
}

void StylePlan::add(std::string pattern, LinearStyle style) {
  MESHRT_CHECK(!pattern.empty(),
               "style plan: an empty layer pattern (give a layer name such as "
               "'mlp.fc1', or '*' for every layer)");
  for (const auto& e : entries_)
    MESHRT_CHECK(e.first != pattern, "style plan: layer pattern '"
                                         << pattern << "' given twice ("
                                         << linear_style_name(e.second) << " and "
                                         << linear_style_name(style) << "): keep one");
  entries_.emplace_back(std::move(pattern), style);
}

bool style_pattern_matches(std::string_view pattern, std::string_view name) {
  // Greedy glob over '*' with backtracking to the last star: linear in practice.
  size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

LinearStyle StylePlan::style_of(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.first == name) return e.second;
  for (const auto& e : entries_)
    if (style_pattern_matches(e.first, name)) return e.second;
  std::ostringstream known;
  for (size_t i = 0; i < entries_.size(); ++i)
    known << (i ? ", " : "") << "'" << entries_[i].first << "'";
  MESHRT_FAIL("style plan: no entry for layer '"
              << name << "' (patterns: " << (entries_.empty() ? "none" : known.str())
              << "): add the layer's name or a pattern matching it, e.g. '*'");
}

const StylePlan& default_style_plan() {
  static const StylePlan plan{{"attn.qkv", LinearStyle::Colwise},
                              {"attn.proj", LinearStyle::Rowwise},
                              {"mlp.fc1", LinearStyle::Colwise},
                              {"mlp.fc2", LinearStyle::Rowwise},
                              {"lm.head", LinearStyle::Colwise}};
  return plan;
}

}  // namespace meshrt
