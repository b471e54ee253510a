// The index of a sharded checkpoint (index.json), parsed and validated without touching any other
// file: load_checkpoint's first step, and a fuzz target's entry (tests/fuzz/fuzz_checkpoint_index).
// Private to train/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/shape.h"
#include "train/checkpoint.h"

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

// A ZeRO-sharded checkpoint (version 2, docs/zero.md "## Checkpoints"): each rank's file holds
// its dp shard of every bucket's flat padded buffers, tensor "zero.bucket<b>.<kind>" (kind
// "param" or a state name) of `shard` elements. The layout below says what each buffer holds.
struct CheckpointZeroParam {
  std::string name;
  int64_t offset = 0;    // elements into the bucket's flat buffer
  Shape shape, offsets;  // the tp-local block (shape) and where it sits in the full tensor
};

struct CheckpointZeroBucket {
  int64_t numel = 0, padded = 0, shard = 0;  // padded = shard * dp >= numel
  std::string dtype;                         // of "param" (states are F32)
  std::vector<CheckpointZeroParam> params;
};

struct CheckpointZeroTpRank {
  std::vector<std::string> files;  // by dp rank
  std::vector<CheckpointZeroBucket> buckets;
};

struct CheckpointZeroLayout {
  int stage = 0, dp = 0, tp = 0;   // dp = 0: not a sharded checkpoint
  std::vector<std::string> state;  // "exp_avg", "exp_avg_sq" or "momentum"
  std::vector<CheckpointZeroTpRank> tp_ranks;
};

// Name of bucket b's buffer `kind` in a ZeRO-sharded rank file.
std::string zero_tensor_name(size_t b, const std::string& kind);

struct CheckpointIndex {
  CheckpointMeta meta;
  int version = 1;                             // 1: whole (tp-sharded) tensors; 2: ZeRO dp shards
  CheckpointZeroLayout zero;                   // version 2 only
  std::map<std::string, uint64_t> file_bytes;  // per rank file: size and crc32c
  std::map<std::string, uint32_t> file_crc;
  std::map<std::string, CheckpointIndexTensor> tensors;
  int64_t optimizer_step = 0;
};

// Parses `text`, the index read from `index_path` of checkpoint `dir`: format, version, every
// `expect.config` field (a difference is named with both values), files (names inside `dir`,
// sizes, checksums) and tensors (shapes that fit in int64, shards inside their tensor, in listed
// files; version 2: the ZeRO layout, its buckets inside their padded sizes and their blocks inside
// their tensors). Throws an Error naming `index_path` on any problem.
CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& index_path,
                                       const std::string& dir, const CheckpointMeta& expect);

// The overlap of two row-major blocks of one tensor, `a` at offsets `ao` with shape `as` and `b`
// at `bo` / `bs`: calls fn(a_elem, b_elem, run) for each contiguous run of it (element offsets
// inside each block; trailing dims that both blocks cover whole merge into one run). Returns the
// overlap's element count (0 when empty). The resharding loads copy saved blocks with it.
int64_t for_each_overlap_run(const Shape& ao, const Shape& as, const Shape& bo, const Shape& bs,
                             const std::function<void(int64_t, int64_t, int64_t)>& fn);

}  // namespace meshrt::detail
