// The one description of a model's shape and layout that the command line, the planner and the C
// API share: `meshrt plan`'s --model string, the model flags of `bench block|mlp|attn`, `sweep`
// and `train` (tools' add_model_flags), and the C API's block configs all fill a ModelSpec; the
// executors' BlockConfig (model/blocks.h: block_config) and the cost model (plan/) read it.
// Plain data, no runtime.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "meshrt/export.h"
#include "model/block_desc.h"
#include "runtime/dtype.h"

namespace meshrt {

// A decoder stack of `layers` layers of `kind` (attention + MLP by default), plus, when vocab > 0,
// a vocab-parallel embedding and LM head.
struct MESHRT_API ModelSpec {
  int64_t hidden = 1024, heads = 16, ffn = 4096, seq = 512, vocab = 0;
  int layers = 1;
  DType dtype = DType::bf16;                // f32 | bf16 | f16: weights, activations, gradients
  LayerKind kind = LayerKind::Transformer;  // the layers' kind (key kind=block|mlp|attn)
  int64_t params() const;                   // every parameter of the model (full, not sharded)
};

// The dtypes a model computes in: f32, bf16, f16. Throws "dtype 'x': use f32, bf16 or f16".
MESHRT_API DType parse_model_dtype(std::string_view s);

// The largest value of a size key (hidden, heads, ffn, seq, vocab) and of layers, on the command
// line and in --model alike (larger ones overflow the planner's counts long before they fit).
constexpr int64_t kModelMaxSize = (int64_t{1} << 40) - 1;
constexpr int kModelMaxLayers = 100000;

// "hidden=4096,heads=32,ffn=11008,layers=32,seq=4096,vocab=32000[,kind=mlp]" (any order; ffn
// defaults to 4 x hidden, vocab to 0, layers to 1; dtype stays bf16). Throws meshrt::Error naming
// the key to change, as `flag` (the option the string came with: "--model").
MESHRT_API ModelSpec parse_model_spec(const std::string& s, const std::string& flag = "--model");

}  // namespace meshrt
