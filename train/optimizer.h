// Optimizers over local shards (fused multi-tensor SGD-momentum and AdamW) and gradient clipping
// by the global norm over tp and dp (replicated parameters counted once).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dist/data_parallel.h"
#include "kernels/ops.h"
#include "meshrt/export.h"
#include "runtime/safetensors.h"

namespace meshrt {

enum class OptimizerKind : uint8_t { Sgd, AdamW };
MESHRT_API OptimizerKind parse_optimizer(std::string_view s);

// The state an optimizer of kind `k` keeps per parameter element: its f32 tensors by name, as
// Optimizer::state() names them (AdamW "exp_avg" and "exp_avg_sq", SGD "momentum"), and their
// bytes per element (4 per tensor). The planner's memory and step time, the training memory
// report and the checkpoints read these rather than counting on their own.
MESHRT_API std::vector<std::string> optimizer_state_names(OptimizerKind k);
MESHRT_API double optimizer_state_bytes_per_element(OptimizerKind k);
// Whether `name` is a state tensor of any optimizer kind (a checkpoint's index lists them).
MESHRT_API bool is_optimizer_state_name(std::string_view name);

struct MESHRT_API OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  float lr = 1e-3f;
  float momentum = 0.9f;                            // SGD
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
  float weight_decay = 0.f;                         // of matrices only: AdamW decoupled, SGD as L2
  float clip_norm = 0.f;  // > 0: clip gradients to this global norm before the update
  // Measure the global gradient norm every step without clipping too (last_grad_norm): one more
  // pass over the gradients and a host sync, ~1-2% of a small CPU step (docs/watching.md), so
  // only when something records it (train --metrics).
  bool measure_grad_norm = false;
};

// Learning-rate schedules as llm.c and nanoGPT run them (docs/training.md). For the step index
// `it` (0-based: the update about to be applied), with W warmup steps and T total steps:
//   it < W:    lr * (it + 1) / W                                 (linear warmup from ~0)
//   constant:  lr
//   cosine:    min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr),  r = (it - W) / (T - W)
//   linear:    min_lr + (1 - r) * (lr - min_lr)
// computed in double and rounded once to f32.
enum class LrScheduleKind : uint8_t { Constant, Cosine, Linear };
MESHRT_API LrScheduleKind parse_lr_schedule(std::string_view s);
MESHRT_API const char* lr_schedule_name(LrScheduleKind k);

struct MESHRT_API LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Constant;
  int warmup_steps = 0;
  float min_lr = 0.f;
  int total_steps = 1;  // T: the run's --steps (the decay ends there)
};

// Throws saying what to change: warmup in [0, T), min_lr in [0, lr], min_lr only with a decay.
MESHRT_API void validate_lr_schedule(const LrSchedule& s, float lr);
// The schedule's value at step `it` in double (the oracle tests compare with it).
MESHRT_API double scheduled_lr_f64(const LrSchedule& s, double lr, int64_t it);
// The learning rate the optimizer applies at step `it`: exactly `lr` after warmup for constant.
MESHRT_API float scheduled_lr(const LrSchedule& s, float lr, int64_t it);

class MESHRT_API Optimizer {
 public:
  // With `zero` (a GradSync at ZeRO stage >= 1 over the same parameters), the state is kept for
  // this rank's shard of each bucket only, step() must be given that GradSync and ends with the
  // updated parameters all-gathered (stage 3: the shards updated in place; docs/zero.md).
  Optimizer(DeviceMesh& mesh, std::vector<Param*> params, OptimizerConfig cfg,
            GradSync* zero = nullptr);
  // One update with lr * lr_scale. With `sync`, waits for gradient bucket b (of grad_set) just
  // before updating its parameters, so updates of early buckets overlap later all-reduces.
  void step(GradSync* sync = nullptr, float lr_scale = 1.f, int grad_set = -1);
  // Global L2 norm of the gradients (collective over tp; dp replicas already agree after sync).
  // Sharded parameters contribute their shard; tp-replicated ones are counted once.
  double grad_norm();
  // The global gradient norm of the last step() (before clipping) when clip_norm > 0 or
  // measure_grad_norm, else -1 (and before the first step). Measuring it is one sum of squares
  // over the gradients, a small all-reduce over tp (over dp too with ZeRO 2 and 3) and a host sync.
  double last_grad_norm() const { return last_norm_; }
  int64_t steps() const { return step_; }
  // The base learning rate of later steps (the schedule sets it before each step).
  void set_lr(float lr);
  const OptimizerConfig& config() const { return cfg_; }
  const std::vector<Param*>& params() const { return params_; }

  // For checkpoints: parameter i's state tensors (handles: writing them restores the state), each
  // f32 with the shape and layout of the parameter's value, by name: AdamW "exp_avg" and
  // "exp_avg_sq", SGD "momentum". Sharded (ZeRO) state exists as such only between
  // gather_state() and scatter_state().
  NamedTensors state(size_t i) const;
  // ZeRO, collective over dp (no-ops otherwise): gather_state() assembles every parameter's full
  // (tp-local) state from the dp shards for state(); scatter_state() takes this rank's shard
  // back from it and frees the full copies. At stage 3 they gather and shard the parameters'
  // values too (GradSync::gather_all_params, shard_params). Checkpoints in the whole-tensor
  // format on dp = 1 use them; on dp > 1 the shards are saved as they are (checkpoint.h).
  void gather_state();
  void scatter_state();
  bool sharded() const { return zero_ != nullptr; }
  // The GradSync whose buckets shard the state (null unless sharded()).
  GradSync* zero_sync() const { return zero_; }
  // The names of a parameter's state tensors, as state() names them.
  std::vector<std::string> state_names() const;
  // ZeRO: this rank's shard of bucket b's state `k` (state_names()[k]), f32, shard_numel(b).
  const Tensor& shard_state(int b, size_t k) const;
  // Resuming after n updates: AdamW's bias correction continues from n, and SGD's momentum
  // buffers are taken as they are (not re-initialised from the first gradient) when n > 0.
  void set_steps(int64_t n);

 private:
  void update(const std::vector<Param*>& ps, float lr);
  void update_group(const std::vector<Param*>& ps, float lr, float weight_decay);
  // The fused update of parallel lists of values, gradients and states.
  void apply(const std::vector<Tensor>& w, const std::vector<Tensor>& g,
             const std::vector<Tensor>& m, const std::vector<Tensor>& v, float lr,
             float weight_decay);
  // ZeRO: this rank's shard of bucket b (weight decay on the pieces of matrices).
  void update_shard(int b, float lr);
  void step_sharded(float lr);
  double grad_norm_sharded();
  // --deterministic at stages 2 and 3: the whole gradients' norm, as stages 0 and 1 compute it.
  double grad_norm_gathered();
  // The norm of `grads` (one per parameter, in params_ order).
  double norm_of(const std::vector<Tensor>& grads);
  double norm_from_squares(const Tensor& acc_sharded, const Tensor& acc_repl);
  void scale_grads(float f);

  DeviceMesh& mesh_;
  std::vector<Param*> params_;
  OptimizerConfig cfg_;
  int64_t step_ = 0;
  double last_norm_ = -1;
  std::vector<Tensor> m_, v_;  // per parameter f32 states (ZeRO: only while gathered)
  GradSync* zero_ = nullptr;
  std::vector<Tensor> zm_, zv_;  // ZeRO: per bucket, this rank's shard of the states
  std::vector<size_t> index_of_;
  bool first_ = true;
};

}  // namespace meshrt
