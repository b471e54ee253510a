// The training loop's checkpoint steps: what a run records, resuming before the first step and
// saving after a step (train/checkpoint.h does the work).
#pragma once

#include <ostream>

#include "train/checkpoint.h"
#include "train/train.h"

namespace meshrt {

// Rejects checkpoint options the loop cannot honour (before any rank starts).
void validate_checkpointing(const TrainConfig& cfg);

// The meta a run at `step` records: the model fields and optimizer that must match on resume.
CheckpointMeta train_checkpoint_meta(const TrainConfig& cfg, int64_t step);

// A run's hold on its --save folder: the run lineage its checkpoints record (the resumed
// checkpoint's, else a new one) and, on rank 0, the folder's lock (held for the run).
struct CheckpointSession {
  std::string run;
  std::shared_ptr<CheckpointLock> lock;
};

// Collective, before resuming: with --save, opens the folder (open_checkpoint_root: lock, refusal
// of another run's checkpoints without --overwrite, cleanup of killed jobs' temporaries).
CheckpointSession open_checkpointing(const TrainConfig& cfg, DeviceMesh& mesh);

// Loads cfg.checkpoint.resume (when set) into the model's parameters and the optimizer; returns
// the number of steps already done (0 without --resume) and sets *skipped_steps to the run's
// skipped steps so far (0 without --resume). Rank 0 logs what it loaded.
int resume_training(const TrainConfig& cfg, DeviceMesh& mesh, const std::vector<Param*>& params,
                    Optimizer& opt, std::ostream* log, int* skipped_steps);

// Writes the checkpoint of step `step` (`skipped_steps`: the run's skipped steps so far) under
// cfg.checkpoint.save; rank 0 logs where.
void save_training(const TrainConfig& cfg, const CheckpointSession& session, int step,
                   int skipped_steps, DeviceMesh& mesh, const std::vector<Param*>& params,
                   Optimizer& opt, std::ostream* log);

}  // namespace meshrt
