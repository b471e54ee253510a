// The index of a sharded checkpoint (index.json), parsed and validated without touching any other
// file: load_checkpoint's first step, and a fuzz target's entry (tests/fuzz/fuzz_checkpoint_index).
// Private to mesh/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mesh/checkpoint.h"
#include "runtime/shape.h"

namespace meshrt::detail {

struct CheckpointShardRef {
  std::string file;
  Shape offsets, shape;
};

struct CheckpointIndexTensor {
  std::string dtype;
  Shape shape;
  std::vector<CheckpointShardRef> shards;
};

struct CheckpointIndex {
  CheckpointMeta meta;
  std::map<std::string, uint64_t> file_bytes;  // per rank file: size and crc32c
  std::map<std::string, uint32_t> file_crc;
  std::map<std::string, CheckpointIndexTensor> tensors;
  int64_t optimizer_step = 0;
};

// Parses `text`, the index read from `index_path` of checkpoint `dir`: format, version, every
// `expect.config` field (a difference is named with both values), files (names inside `dir`,
// sizes, checksums) and tensors (shapes that fit in int64, shards inside their tensor, in listed
// files). Throws an Error naming `index_path` on any problem.
CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& index_path,
                                       const std::string& dir, const CheckpointMeta& expect);

}  // namespace meshrt::detail
