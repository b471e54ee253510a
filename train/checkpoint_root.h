// The --save folder of sharded checkpoints: the names meshrt gives what it writes there, the
// checkpoints it holds and which run wrote them, and removing only what meshrt wrote (pruning,
// stale temporaries of killed jobs, a checkpoint replaced by a newer one of the same step).
// Private to train/ (train/checkpoint.h is the public side: the lock and the folder check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace meshrt::detail {

inline constexpr const char* kCheckpointIndex = "index.json";
inline constexpr const char* kCheckpointLatest = "latest";
inline constexpr const char* kCheckpointLockFile = ".meshrt-lock";

// The temporaries a save makes in the --save folder, described once here (the save names them
// with checkpoint_temporary_name; the clean-up of what killed jobs left and the check of which
// entries of the folder are meshrt's read them with parse_checkpoint_temporary):
//   Save      .tmp-step-N-<id>  the directory the save writes, renamed to step-N when complete;
//   Replaced  .old-step-N-<id>  an existing step-N moved aside while a new one takes its place;
//   Latest    .latest-<id>      the new `latest` pointer, renamed over `latest`.
// <id> is the save's unique suffix, kCheckpointTemporaryIdLength characters (mkdtemp's XXXXXX).
enum class CheckpointTemporary { Save, Replaced, Latest };
inline constexpr size_t kCheckpointTemporaryIdLength = 6;
// `step`: the step-N name (ignored for Latest); `id`: the save's suffix.
std::string checkpoint_temporary_name(CheckpointTemporary kind, const std::string& step,
                                      const std::string& id);
// Whether `n` has the whole form of one of the temporaries above (true), with its kind and, for
// Save and Replaced, its step-N name.
bool parse_checkpoint_temporary(const std::string& n, CheckpointTemporary* kind, std::string* step);
// Whether `n` starts as one of the temporaries does (.tmp-, .old-, .latest-): names meshrt keeps
// for them in a --save folder, whole or not.
bool checkpoint_temporary_prefix(const std::string& n);

std::string checkpoint_step_name(int64_t step);  // step-00000012
std::string checkpoint_rank_file(int rank);      // rank-00003.safetensors
// The step of a step-N name as checkpoint_step_name writes it; -1 for any other name.
int64_t parse_checkpoint_step_name(const std::string& n);

// Reads a small regular file (never a device node or FIFO), at most `limit` bytes.
std::string read_checkpoint_file(const std::string& path, uint64_t limit);

// The checkpoints directly in `root`: (step-N name, the run id its index records; "" when it
// records none, "?" when the index cannot be read), sorted by step. Only step-N directories (not
// links) that hold an index.json count.
std::vector<std::pair<std::string, std::string>> checkpoints_in(const std::string& root);

// Removes from checkpoint directory `dir` the files meshrt names there (index.json first, so a
// half-removed directory is no checkpoint; rank-N.safetensors; with `temporaries` also the
// temporary files of an interrupted write), then the directory when that left it empty. Other
// files (a user's notes) and the directory holding them stay. Returns whether `dir` is gone.
bool remove_checkpoint_files(const std::string& dir, bool temporaries);

// `old` is checkpoint directory `final_dir` moved aside (a Replaced temporary) when a checkpoint of
// the same step replaced it: files meshrt did not write move into `final_dir` (unless a file of
// that name is there), meshrt's are removed, then `old`. When `final_dir` does not exist (a job
// killed between the two renames), `old` is renamed back instead.
void retire_replaced_checkpoint(const std::string& old, const std::string& final_dir);

// With the folder's lock held (so no live job is writing there): removes what killed jobs left in
// `root`, only under the names of a save's temporaries (parse_checkpoint_temporary): Save
// directories (their meshrt files), Latest pointer files, and Replaced directories
// (retire_replaced_checkpoint).
// Returns how many it cleaned up.
int remove_stale_checkpoint_temporaries(const std::string& root);

// --keep: with `newest` just published, keeps the `keep` newest checkpoints of run `run` (newest
// among them) and removes the files of older ones of that run (remove_checkpoint_files).
// Checkpoints of other runs are never touched.
void prune_checkpoints(const std::string& root, const std::string& run, int keep,
                       const std::string& newest);

// In a step folder without an index.json: the first file named as meshrt names its own (a rank
// file or its temporary), "" when none. A save of that step would take such a file over and
// --keep remove it, though meshrt did not write it; the user's other files are kept.
std::string unindexed_checkpoint_file(const std::string& step_dir);

}  // namespace meshrt::detail
