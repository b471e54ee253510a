// Which parallel style each linear layer of a block takes, by the layer's name, as PyTorch's
// `parallelize_module` plan: {"attn.qkv": colwise, "attn.proj": rowwise, "mlp.fc1": colwise,
// "mlp.fc2": rowwise}. A block looks its linears up by their names within the layer (the piece
// kind and the linear, "mlp.fc1"); a pattern may hold `*` (any run of characters, dots
// included: "*.qkv", "mlp.*", "*"). A new style is a new LinearStyle and a new entry here, not a
// new flag on the description. Plain data, no runtime: model/block_desc.h and the planner read it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshrt/export.h"

namespace meshrt {

// How a linear's [in, out] weight lies over tp: colwise splits out (dist/style.h's
// colwise_parallel), rowwise splits in (rowwise_parallel).
enum class LinearStyle : uint8_t { Colwise, Rowwise };
MESHRT_API const char* linear_style_name(LinearStyle s);  // "colwise", "rowwise"

class MESHRT_API StylePlan {
 public:
  StylePlan() = default;
  // Entries in lookup order; throws for an empty pattern or one given twice.
  StylePlan(std::initializer_list<std::pair<std::string, LinearStyle>> entries);
  void add(std::string pattern, LinearStyle style);
  // The style of the layer `name`: the entry whose pattern is `name` itself, else the first
  // entry whose wildcard pattern matches it. Throws naming the layer and every pattern when none
  // does.
  LinearStyle style_of(std::string_view name) const;
  const std::vector<std::pair<std::string, LinearStyle>>& entries() const { return entries_; }
  bool operator==(const StylePlan&) const = default;

 private:
  std::vector<std::pair<std::string, LinearStyle>> entries_;
};

// Whether `name` matches `pattern`, where `*` matches any run of characters (none included).
MESHRT_API bool style_pattern_matches(std::string_view pattern, std::string_view name);

// Megatron's layout, what the blocks always ran: attention qkv colwise and proj rowwise, MLP fc1
// colwise and fc2 rowwise, the LM head ("lm.head") colwise.
MESHRT_API const StylePlan& default_style_plan();

}  // namespace meshrt
