// Optimizers over local shards (fused multi-tensor SGD-momentum and AdamW) and gradient clipping
// by the global norm over tp and dp (replicated parameters counted once).
#pragma once

#include <vector>

#include "kernels/ops.h"
#include "mesh/data_parallel.h"
#include "meshrt/export.h"
#include "runtime/safetensors.h"

namespace meshrt {

enum class OptimizerKind : uint8_t { Sgd, AdamW };
MESHRT_API OptimizerKind parse_optimizer(std::string_view s);

struct MESHRT_API OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  float lr = 1e-3f;
  float momentum = 0.9f;                            // SGD
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
  float weight_decay = 0.f;
  float clip_norm = 0.f;  // > 0: clip gradients to this global norm before the update
};

class MESHRT_API Optimizer {
 public:
  Optimizer(DeviceMesh& mesh, std::vector<Param*> params, OptimizerConfig cfg);
  // One update with lr * lr_scale. With `sync`, waits for gradient bucket b (of grad_set) just
  // before updating its parameters, so updates of early buckets overlap later all-reduces.
  void step(GradSync* sync = nullptr, float lr_scale = 1.f, int grad_set = -1);
  // Global L2 norm of the gradients (collective over tp; dp replicas already agree after sync).
  // Sharded parameters contribute their shard; tp-replicated ones are counted once.
  double grad_norm();
  int64_t steps() const { return step_; }
  const OptimizerConfig& config() const { return cfg_; }
  const std::vector<Param*>& params() const { return params_; }

  // For checkpoints: parameter i's state tensors (handles: writing them restores the state), each
  // f32 with the shape and layout of the parameter's value, by name: AdamW "exp_avg" and
  // "exp_avg_sq", SGD "momentum".
  NamedTensors state(size_t i) const;
  // Resuming after n updates: AdamW's bias correction continues from n, and SGD's momentum
  // buffers are taken as they are (not re-initialised from the first gradient) when n > 0.
  void set_steps(int64_t n);

 private:
  void update(const std::vector<Param*>& ps, float lr);

  DeviceMesh& mesh_;
  std::vector<Param*> params_;
  OptimizerConfig cfg_;
  int64_t step_ = 0;
  std::vector<Tensor> m_, v_;  // per parameter f32 states
  std::vector<size_t> index_of_;
  bool first_ = true;
};

}  // namespace meshrt
