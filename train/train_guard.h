// Guards of the training loop: the memory a run will need (checked before allocating), non-finite
// losses and gradients (naming the first bad tensor), and a stop request every rank agrees on.
#pragma once

#include <string>
#include <vector>

#include "train/train.h"

namespace meshrt {

// What one rank allocates to train `cfg` on a mesh of `world_size` ranks, in bytes: weights,
// gradients (per grad set, plus their bf16 communication copies), optimizer states, and the live
// activations of one micro-batch (saved for backward, with the logits), ZeRO's shares counted
// (cfg.dp.zero). An estimate: it errs high.
struct TrainMemory {
  double weights = 0, grads = 0, optimizer = 0, activations = 0;
  double total() const { return weights + grads + optimizer + activations; }
};
TrainMemory estimate_train_memory(const TrainConfig& cfg, int world_size);

// The step's verdict, identical on every rank: one world all-reduce of the local loss, the local
// gradients' sum of squares and the local stop flag.
struct StepVerdict {
  bool loss_finite = true, grads_finite = true, stop = false;
  int stop_signal = 0;  // with stop: the signal most ranks asked with (ties: the smaller), or 0
  bool finite() const { return loss_finite && grads_finite; }
};

// Collective over `world`. `sumsq` holds the sum of squares of this rank's gradients about to be
// applied (ops::sum_squares; zero when this step applies none), `loss` is a [1] f32 tensor; both on
// the compute stream.
// `stop_local`: this rank's stop request (a signal number, > 0 asks; 0: none).
StepVerdict agree_step(Context& ctx, Communicator& world, const Tensor& loss, const Tensor& sumsq,
                       int stop_local);

// Collective over `world`: whether any rank asks to stop (stop_local > 0), and with which signal
// (as StepVerdict). For points between steps where a stop must be agreed (validation batches).
StepVerdict agree_stop(Context& ctx, Communicator& world, int stop_local);

// Collective over `world`: the name of the first parameter (in `grads` order) whose gradient holds
// a NaN or an infinity on some rank, or "" when none does (the norm overflowed instead).
std::string first_nonfinite_grad(Context& ctx, Communicator& world,
                                 const std::vector<Param*>& grads);

}  // namespace meshrt
