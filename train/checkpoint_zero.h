// ZeRO-sharded checkpoints (index version 2, docs/zero.md "## Checkpoints"): the bucket layout in
// the index, the checkpoint's files opened on demand and checked, and the reshard read that maps a
// parameter block's elements to the flat bucket shards that hold them. Private to train/.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/json_field.h"
#include "runtime/safetensors.h"
#include "train/checkpoint_index.h"

namespace meshrt::detail {

using checkpoint_json = nlohmann::ordered_json;

using IndexFields = JsonFields<checkpoint_json>;

// Field `name` of `f`: a non-negative integer that fits T. A float (1e20), a string, a negative
// or too large value is refused naming the field instead of wrapping.
template <class T>
T index_count(const IndexFields& f, const char* name) {
  return static_cast<T>(f.count(name, static_cast<uint64_t>(std::numeric_limits<T>::max())));
}

// An array of at most kMaxDims non-negative extents.
Shape index_shape(const checkpoint_json& j, const std::string& where);
// Element count of `s` and every stride fit in int64.
void check_index_shape_fits(const Shape& s, const std::string& where);

// The index's "zero" object `j`, validated against the index's files and tensors.
CheckpointZeroLayout parse_zero_layout(const IndexFields& j,
                                       const std::map<std::string, uint64_t>& files,
                                       const std::map<std::string, CheckpointIndexTensor>& tensors);
checkpoint_json zero_layout_json(const CheckpointZeroLayout& z);

// The files of checkpoint `dir`, opened on first use; each is checked against the index's size and
// crc32c (read whole once) before any of its bytes are used.
class CheckpointFiles {
 public:
  CheckpointFiles(std::string dir, const CheckpointIndex& idx) : dir_(std::move(dir)), idx_(idx) {}
  const SafetensorsReader& get(const std::string& file);

 private:
  std::string dir_;
  const CheckpointIndex& idx_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
};

// Throws naming the file when `path`'s size or crc32c differ from the index's.
void verify_checkpoint_file(const std::string& path, uint64_t bytes, uint32_t crc);

// Checks `n` elements of `dtype` at `p`, read from checkpoint file `file`, for a NaN or an
// infinity (integer dtypes pass): a checkpoint of a run whose weights had diverged is refused at
// load, naming the file and `tensor` (the model's name: "embed.weight", "embed.weight.exp_avg"),
// instead of failing the first step after the resume as if --lr were too large.
void check_finite_elements(const void* p, int64_t n, DType dtype, const std::string& file,
                           const std::string& tensor);

// Reads parameter elements out of a ZeRO-sharded checkpoint onto any layout.
class ZeroShardSource {
 public:
  // `tp_rank`: this rank's; of the saved copies of a replicated block, its own is read.
  ZeroShardSource(const CheckpointIndex& idx, CheckpointFiles& files, size_t tp_rank);
  // Elements [a, e) (row-major) of the block (offsets `off`, shape `local`) of tensor `name`'s
  // buffer `kind` ("param" or a state name), each `es` bytes, into dst. Same block as saved: reads
  // the range from the shards holding it; otherwise assembles the block from the saved blocks
  // that overlap it. Throws when the saved blocks do not cover it.
  void read(const std::string& name, const std::string& kind, size_t es, const Shape& off,
            const Shape& local, int64_t a, int64_t e, char* dst);

 private:
  struct Loc {
    size_t tp = 0, bucket = 0;
    const CheckpointZeroParam* p = nullptr;
  };
  // Elements [x, y) of tp rank t's bucket b's flat buffer `kind`, from the dp shards holding them,
  // all of model tensor `tensor` (checked finite under that name).
  void read_flat(size_t t, size_t b, const std::string& kind, size_t es, int64_t x, int64_t y,
                 char* dst, const std::string& tensor);

  const CheckpointIndex& idx_;
  CheckpointFiles& files_;
  size_t tp_rank_ = 0;
  std::map<std::string, std::vector<Loc>> locs_;
};

}  // namespace meshrt::detail
