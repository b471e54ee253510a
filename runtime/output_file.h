// Files meshrt writes for the user or for a later run (--json, --trace, --dump, plots,
// checkpoints): one way to write them, so every writer gets the same guarantees.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshrt/export.h"

namespace meshrt {

// A file written whole, then published atomically:
// - the bytes go to a temporary file with a unique name in the target's directory (two jobs
//   writing one path never share it), renamed over the target by commit(); a reader never sees
//   half a file;
// - a symlink at `path` is followed (the file it points to is replaced, the link stays); a target
//   that exists and is not a regular file (a directory, a device node such as /dev/null, a FIFO)
//   is refused before anything is written;
// - every write, the fsync (when durable) and the close are checked: a failure throws an Error
//   naming `what`, the file and the errno text, and removes the temporary file. So does
//   destruction without commit(). A file size limit (`ulimit -f`) is such a failure too: the
//   constructor calls ignore_file_size_signal(), so write() fails with EFBIG, and the message
//   names the limit.
// `what` names the file in messages: a flag ("--json") or a role ("checkpoint").
class MESHRT_API OutputFile {
 public:
  // durable: fsync the file before the rename and its directory after it, so the file survives a
  // crash of the machine once commit() returns (checkpoints need it; reports do not).
  OutputFile(const std::string& path, std::string what, bool durable = false);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Flushes, closes and renames over the target. Throws (and removes the temporary) on failure.
  void commit();

  const std::string& path() const { return path_; }      // as given
  const std::string& target() const { return target_; }  // after following symlinks
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& step, int err);

  std::string path_, what_, target_, tmp_;
  bool durable_ = false;
  int fd_ = -1;
};

// An append-only stream of lines (--metrics): a reader may tail it while the run goes on.
// - the target is checked as OutputFile checks it (symlinks followed; a directory, FIFO, device
//   or socket refused, also when one appears between the check and the open: it is opened
//   non-blocking and fstat'ed);
// - `keep_if` given: the lines already there that it keeps are rewritten first, atomically through
//   OutputFile (lines it drops are gone, the rest keep their order); otherwise the file is
//   started empty (replaced atomically) or, with `append`, continued as it is;
// - each append_line() is one write() of the whole line with its newline (never interleaved with
//   another writer's line in O_APPEND mode), checked: a failure throws naming `what`, the file and
//   the errno text. No fsync: a line is visible to readers once append_line returns.
class MESHRT_API AppendOutputFile {
 public:
  enum class Start : uint8_t { Fresh, Append };
  AppendOutputFile(const std::string& path, std::string what, Start start,
                   bool (*keep_if)(std::string_view line, long long arg) = nullptr,
                   long long keep_arg = 0);
  ~AppendOutputFile();
  AppendOutputFile(const AppendOutputFile&) = delete;
  AppendOutputFile& operator=(const AppendOutputFile&) = delete;

  // `line` without its newline.
  void append_line(std::string_view line);
  const std::string& target() const { return target_; }

 private:
  std::string path_, what_, target_;
  int fd_ = -1;
  std::string buf_;
};

// SIGXFSZ (a write past `ulimit -f`) kills the process by default, leaving temporary files
// behind. Once per process, if its action is still the default, this ignores it: the write fails
// with EFBIG instead, and the writer reports it like a full disk. A handler the program installed
// is left alone.
MESHRT_API void ignore_file_size_signal();

// Writes `text` to `path` as OutputFile does, in one call.
MESHRT_API void write_output_file(const std::string& path, std::string_view text,
                                  const std::string& what, bool durable = false);

// What `path` resolves to after following symlinks (relative links resolve against the link's
// directory); `path` itself when it is not a link. Throws on a symlink loop.
MESHRT_API std::string resolve_output_path(const std::string& path, const std::string& what);

// Checks before a run that `path` can be written (so a typo does not cost a whole run): its
// directory exists and is writable, and it is not an existing non-regular file. Messages start
// with `what` and `path` and say what to change.
MESHRT_API void check_output_path(const std::string& path, const std::string& what);

// Refuses two outputs that name the same file (after following symlinks), e.g. `--json F
// --trace F`: the second would replace the first. Pairs of (what, path); empty paths are skipped.
MESHRT_API void check_distinct_outputs(
    const std::vector<std::pair<std::string, std::string>>& outputs);

// Refuses an output that would replace one of the run's inputs (after following symlinks): the
// same file (`--metrics` naming the `--data` file), or a file inside an input folder (a file of
// the checkpoint being resumed). Pairs of (what, path); empty paths and inputs that do not exist
// (preset names) are skipped.
MESHRT_API void check_outputs_spare_inputs(
    const std::vector<std::pair<std::string, std::string>>& outputs,
    const std::vector<std::pair<std::string, std::string>>& inputs);

// Refuses an output at or inside `folder`, a folder meshrt manages (`what` names it: "--save",
// "--out"; `holds` says what it holds: "checkpoints"): a later save, prune or resume would replace
// the output, or read it as its own. With `managed`, only outputs under the entries of `folder` it
// accepts (given the entry's name, e.g. "step-00000004") are refused. Empty paths are skipped.
MESHRT_API void check_outputs_outside(
    const std::vector<std::pair<std::string, std::string>>& outputs, const std::string& what,
    const std::string& folder, const std::string& holds,
    const std::function<bool(const std::string&)>& managed = {});

}  // namespace meshrt
