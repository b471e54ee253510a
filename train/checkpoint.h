// Sharded checkpoints: one safetensors file per rank and an index, written atomically (temporary
// directory, fsync, rename, `latest` pointer) and loaded onto any mesh by byte-range reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/parallel.h"
#include "meshrt/export.h"
#include "train/optimizer.h"

namespace meshrt {

struct MESHRT_API CheckpointOptions {
  std::string save;        // root directory of the checkpoints ("": none are written)
  int save_every = 0;      // > 0: also every this many steps (always at the last step)
  int keep = 0;            // > 0: keep only the newest this many checkpoints
  std::string resume;      // a root (its `latest`) or one checkpoint directory ("": fresh start)
  bool overwrite = false;  // write into a --save folder holding another run's checkpoints
  // Resume although the token stream differs from the one the checkpoint recorded (another file
  // of the same length, or the file rewritten): --resume-other-data.
  bool resume_other_data = false;
};

// What a checkpoint records besides tensors. `config` holds the fields a resumed run must agree
// with (model shape, dtype, optimizer, seed), compared as strings and named when they differ.
struct MESHRT_API CheckpointMeta {
  int64_t step = 0;   // optimizer updates applied; also the data position (samples are a pure
  uint64_t seed = 0;  // function of (seed, step, dp rank)) and, with the seed, the RNG state
  std::vector<std::pair<std::string, std::string>> config;
  std::string mesh;  // the layout it was saved from ("dp=2,tp=2"); informational on load
  // The run lineage: drawn at a fresh start (new_checkpoint_run_id), kept by a resumed run. --keep
  // prunes only checkpoints of this run; a --save folder holding others is refused.
  std::string run;
  // Steps the run skipped as non-finite so far (--skip-nonfinite): a resumed run continues the
  // count. Informational on load (0 for checkpoints that predate it).
  int64_t skipped_steps = 0;
  // The training tokens' identity (TokenFile::digest()): "" for synthetic tokens and in
  // checkpoints that predate it (those resume on any data of the recorded format and length).
  // Loading refuses an `expect` whose digest differs from the recorded one unless
  // `other_data_ok` (of `expect`; --resume-other-data).
  std::string data_digest;
  bool other_data_ok = false;
};

// 16 random hex digits naming a new run lineage.
MESHRT_API std::string new_checkpoint_run_id();

// Whether the loop writes a checkpoint after finishing step `step` (1-based) of `last`:
// every save_every steps, at the last step, and when the loop stops early.
MESHRT_API bool checkpoint_due(const CheckpointOptions& o, int step, int last, bool stopping);

// The test hook MESHRT_CHECKPOINT_FAULT ("rank=R[,mode=kill|throw]": rank R fails while it writes
// a checkpoint), checked before a run of `world` ranks starts: a value not of that form, or R
// outside [0, world), is refused naming the variable and the value.
MESHRT_API void check_checkpoint_fault_env(int world);

// Refuses a --save root that exists and is not a directory (a file, a device node) or cannot be
// created; creates it otherwise. Messages name the path and the reason.
MESHRT_API void prepare_checkpoint_root(const std::string& root);
// Refuses a `latest` that is not a step pointer and step-N entries that are not folders: what a
// save would replace that meshrt did not write (prepare_checkpoint_root calls it).
MESHRT_API void check_checkpoint_root_entries(const std::string& root);
// Whether `name`, an entry of a --save folder, is one meshrt writes or replaces there: step-N
// folders, `latest`, the lock and a save's temporaries (.tmp-*, .old-*, .latest-*: described in
// train/checkpoint_root.h, with the names checkpoint_temporary_name gives them). Other files
// in the folder (a run's metrics beside its checkpoints) are the user's.
MESHRT_API bool checkpoint_entry_name(const std::string& name);

// A job's hold on a --save folder: an exclusive flock(2) on root/.meshrt-lock (the file stays;
// the lock dies with the process, so a killed job never leaves a lock that blocks). The file
// records the holder's pid and host for the message another job gets.
class CheckpointLock;

// Takes the lock of directory `root`, or shares the hold this process already has (its rank
// threads and its saves). Throws naming the folder and the holder when another process has it.
MESHRT_API std::shared_ptr<CheckpointLock> lock_checkpoint_root(const std::string& root);

// Refuses a --save folder holding checkpoints (step-N/ with an index) of another run than `run`,
// unless `overwrite`, or `resumed_dir` (the checkpoint a run resumes from, "" for none) is in it.
// The message names the folder, the checkpoints found and the ways out.
MESHRT_API void check_checkpoint_root_owner(const std::string& root, const std::string& run,
                                            bool overwrite, const std::string& resumed_dir);

// Collective: a run's start with --save. Rank 0 creates `root` when needed, locks it, checks it
// (check_checkpoint_root_owner) and removes what killed jobs left there (only temporaries under
// names meshrt gives them: .tmp-step-N-*, .old-step-N-*, .latest-*). Any failure throws on every
// rank with rank 0's message. Returns the lock on rank 0 (hold it for the run), null elsewhere.
MESHRT_API std::shared_ptr<CheckpointLock> open_checkpoint_root(const std::string& root,
                                                                const std::string& run,
                                                                bool overwrite,
                                                                const std::string& resumed_dir,
                                                                DeviceMesh& mesh);

// Whether save_checkpoint writes `opt`'s ZeRO dp shards as they are (index version 2: ZeRO stage
// >= 1 on dp > 1, a mesh of dp and tp only) rather than whole tensors (version 1, for which a
// sharded optimizer's state must be gathered first: Optimizer::gather_state).
MESHRT_API bool checkpoint_saves_shards(const DeviceMesh& mesh, const Optimizer* opt);

// Collective over the mesh's world. Writes root/step-<step> (each rank its shards of `params` and
// of the optimizer's state, replicas written once; with ZeRO on dp > 1 (checkpoint_saves_shards)
// its dp shard of every bucket's flat parameters and states, nothing gathered, and the buckets'
// layout in the index) through a temporary directory unique to this
// job, then points root/latest at it and, with keep > 0, removes older checkpoints of meta.run
// (which must be set). Rank 0 holds the folder's lock during the save (lock_checkpoint_root) and
// first removes stale temporaries. A checkpoint of the same step is replaced; files in it that
// meshrt did not write move into the new one. meshrt removes only files it names (index.json,
// rank-N.safetensors, its temporaries): a pruned directory holding other files stays, without
// its index. A rank that fails or dies before the rename leaves the previous checkpoint and
// `latest` untouched; a failure throws on every rank with the failing rank's message.
// Returns the checkpoint's directory.
MESHRT_API std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                                       DeviceMesh& mesh, const std::vector<Param*>& params,
                                       const Optimizer* opt, int keep);

// The checkpoint directory `path` names: root/<latest> when it holds a `latest` pointer, else
// `path` itself when it holds an index. Throws when it is neither.
MESHRT_API std::string resolve_checkpoint(const std::string& path);

// Reads the index of checkpoint `path` (see resolve_checkpoint) and checks its format and every
// `expect.config` field (no tensors are read): a resumed run's early check.
MESHRT_API CheckpointMeta read_checkpoint_meta(const std::string& path,
                                               const CheckpointMeta& expect);

// Collective. Loads checkpoint `dir` (see resolve_checkpoint) into `params` and the optimizer
// state on this mesh, whatever mesh it was saved from: each rank reads only the byte ranges of
// its shards (from a ZeRO-sharded checkpoint the ranges of the bucket shards holding the elements
// it keeps: onto the same layout only its own file; a ZeRO optimizer's state and, at stage 3, its
// parameters are loaded as this rank's shards, at stages 1 and 2 the parameters then all-gathered
// over dp). Before anything is modified it checks the index, every `expect.config` field (a
// difference is named with both values), tensor names, shapes and dtypes against the model, file
// sizes and checksums; any problem throws on every rank naming the file, and leaves params
// untouched. Returns the saved meta.
MESHRT_API CheckpointMeta load_checkpoint(const std::string& dir, const CheckpointMeta& expect,
                                          DeviceMesh& mesh, const std::vector<Param*>& params,
                                          Optimizer* opt);

}  // namespace meshrt
