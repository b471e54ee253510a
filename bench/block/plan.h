// The block benchmark's plan: options resolved against the launch (devices, mesh, default shapes)
// and validated before any rank starts, with the FLOP counts the report needs.
#pragma once

#include <memory>
#include <string>

#include "bench/block/block_bench.h"
#include "collectives/bootstrap.h"
#include "model/block_desc.h"
#include "model/stack.h"

namespace meshrt {

struct BlockPlan {
  LayerKind kind = LayerKind::Transformer;  // what the mesh block stack builds
  std::unique_ptr<Launch> launch;
  std::string devices;
  bool cuda = false;
  int world = 1, dp = 1, tp = 1, cp = 1;
  std::string mesh;
  bool sp = false;
  bool sp_requested = false;
  Overlap overlap = Overlap::Async;
  BlockConfig cfg;
  int64_t batch = 1, seq = 1;
  int layers = 1, steps = 1, warmup = 0;
  LayerFlops flops;  // per layer, global batch
  double step_flops = 0;
};

// Validates the options (errors say which flag to change) and bootstraps the launch.
BlockPlan make_block_plan(const BlockBenchOptions& o);

// The launch for these options: the devices asked for, else what this machine has (`*devices`
// is set to the spec used).
std::unique_ptr<Launch> launch_for(const BlockBenchOptions& o, std::string* devices);

}  // namespace meshrt
