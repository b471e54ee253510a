// Sharded checkpoints: one safetensors file per rank and an index, written atomically (temporary
// directory, fsync, rename, `latest` pointer) and loaded onto any mesh by byte-range reads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mesh/optimizer.h"
#include "mesh/parallel.h"
#include "meshrt/export.h"

namespace meshrt {

struct MESHRT_API CheckpointOptions {
  std::string save;    // root directory of the checkpoints ("": none are written)
  int save_every = 0;  // > 0: also every this many steps (always at the last step)
  int keep = 0;        // > 0: keep only the newest this many checkpoints
  std::string resume;  // a root (its `latest`) or one checkpoint directory ("": fresh start)
};

// What a checkpoint records besides tensors. `config` holds the fields a resumed run must agree
// with (model shape, dtype, optimizer, seed), compared as strings and named when they differ.
struct MESHRT_API CheckpointMeta {
  int64_t step = 0;   // optimizer updates applied; also the data position (samples are a pure
  uint64_t seed = 0;  // function of (seed, step, dp rank)) and, with the seed, the RNG state
  std::vector<std::pair<std::string, std::string>> config;
  std::string mesh;  // the layout it was saved from ("dp=2,tp=2"); informational on load
};

// Whether the loop writes a checkpoint after finishing step `step` (1-based) of `last`:
// every save_every steps, at the last step, and when the loop stops early.
MESHRT_API bool checkpoint_due(const CheckpointOptions& o, int step, int last, bool stopping);

// Refuses a --save root that exists and is not a directory (a file, a device node) or cannot be
// created; creates it otherwise. Messages name the path and the reason.
MESHRT_API void prepare_checkpoint_root(const std::string& root);

// Collective over the mesh's world. Writes root/step-<step> (each rank its shards of `params` and
// of the optimizer's state, replicas written once) through a temporary directory unique to this
// job, then points root/latest at it and, with keep > 0, removes older checkpoints. A rank that
// fails or dies before the rename leaves the previous checkpoint and `latest` untouched.
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
// its shards. Before anything is modified it checks the index, every `expect.config` field (a
// difference is named with both values), tensor names, shapes and dtypes against the model, file
// sizes and checksums; any problem throws on every rank naming the file, and leaves params
// untouched. Returns the saved meta.
MESHRT_API CheckpointMeta load_checkpoint(const std::string& dir, const CheckpointMeta& expect,
                                          DeviceMesh& mesh, const std::vector<Param*>& params,
                                          Optimizer* opt);

}  // namespace meshrt
