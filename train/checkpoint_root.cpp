#include "train/checkpoint_root.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "runtime/error.h"
#include "runtime/json_field.h"
#include "runtime/logging.h"
#include "train/checkpoint.h"

namespace meshrt {

namespace fs = std::filesystem;

namespace detail {

namespace {

bool all_digits(const std::string& s, size_t from, size_t to) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// A real directory (not a link to one).
bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(fs::symlink_status(p, ec));
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(fs::symlink_status(p, ec));
}

// rank-N.safetensors (N: at least 5 digits, as checkpoint_rank_file writes).
bool is_rank_file(const std::string& n) {
  const std::string ext = ".safetensors";
  return starts_with(n, "rank-") && n.size() >= 5 + 5 + ext.size() &&
         n.compare(n.size() - ext.size(), ext.size(), ext) == 0 &&
         all_digits(n, 5, n.size() - ext.size());
}

// What an interrupted write of a rank file leaves: OutputFile's ".rank-N.safetensors.tmp-...".
bool is_rank_temporary(const std::string& n) {
  const size_t t = n.find(".safetensors.tmp-");
  return n.size() > 1 && n[0] == '.' && t != std::string::npos && is_rank_file(n.substr(1, t + 11));
}

// The prefix of each kind of temporary (the one place that spells them).
const char* temporary_prefix(CheckpointTemporary kind) {
  switch (kind) {
    case CheckpointTemporary::Save:
      return ".tmp-";
    case CheckpointTemporary::Replaced:
      return ".old-";
    case CheckpointTemporary::Latest:
      return ".latest-";
  }
  return "";
}

constexpr CheckpointTemporary kTemporaries[] = {
    CheckpointTemporary::Save, CheckpointTemporary::Replaced, CheckpointTemporary::Latest};

}  // namespace

std::string checkpoint_temporary_name(CheckpointTemporary kind, const std::string& step,
                                      const std::string& id) {
  MESHRT_CHECK(id.size() == kCheckpointTemporaryIdLength,
               "internal: checkpoint temporary id '"
                   << id << "' is not " << kCheckpointTemporaryIdLength << " characters");
  if (kind == CheckpointTemporary::Latest) return temporary_prefix(kind) + id;
  return temporary_prefix(kind) + step + "-" + id;
}

bool parse_checkpoint_temporary(const std::string& n, CheckpointTemporary* kind,
                                std::string* step) {
  constexpr size_t id = kCheckpointTemporaryIdLength;
  for (CheckpointTemporary k : kTemporaries) {
    const size_t pl = std::strlen(temporary_prefix(k));
    if (!starts_with(n, temporary_prefix(k))) continue;
    if (k == CheckpointTemporary::Latest) {
      if (n.size() != pl + id) return false;
      *kind = k;
      step->clear();
      return true;
    }
    // <prefix>step-N-<id>
    if (n.size() < pl + id + 1 || n[n.size() - id - 1] != '-') return false;
    const std::string s = n.substr(pl, n.size() - pl - id - 1);
    if (parse_checkpoint_step_name(s) < 0) return false;
    *kind = k;
    *step = s;
    return true;
  }
  return false;
}

bool checkpoint_temporary_prefix(const std::string& n) {
  for (CheckpointTemporary k : kTemporaries)
    if (starts_with(n, temporary_prefix(k))) return true;
  return false;
}

std::string checkpoint_step_name(int64_t step) {
  std::ostringstream s;
  s << "step-" << std::setw(8) << std::setfill('0') << step;
  return s.str();
}

std::string checkpoint_rank_file(int rank) {
  std::ostringstream s;
  s << "rank-" << std::setw(5) << std::setfill('0') << rank << ".safetensors";
  return s.str();
}

int64_t parse_checkpoint_step_name(const std::string& n) {
  if (!starts_with(n, "step-") || n.size() > 24 || !all_digits(n, 5, n.size())) return -1;
  return std::stoll(n.substr(5));
}

std::string read_checkpoint_file(const std::string& path, uint64_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  MESHRT_CHECK(fd >= 0, "checkpoint: cannot open " << path << ": " << std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || static_cast<uint64_t>(sb.st_size) > limit) {
    ::close(fd);
    MESHRT_FAIL("checkpoint: " << path << " is not a regular file of at most " << limit
                               << " bytes");
  }
  std::string s(static_cast<size_t>(sb.st_size), '\0');
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t r = ::read(fd, s.data() + done, s.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  MESHRT_CHECK(done == s.size(), "checkpoint: short read of " << path);
  return s;
}

std::vector<std::pair<std::string, std::string>> checkpoints_in(const std::string& root) {
  std::vector<std::pair<int64_t, std::pair<std::string, std::string>>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    const int64_t step = parse_checkpoint_step_name(n);
    if (step < 0 || !is_dir(e.path()) || !is_file(e.path() / kCheckpointIndex)) continue;
    std::string run = "?";
    try {
      const std::string index = (e.path() / kCheckpointIndex).string();
      const auto j = parse_json_text(read_checkpoint_file(index, 64ull << 20), index);
      run = j.contains("run") && j["run"].is_string() ? j["run"].get<std::string>() : "";
    } catch (const std::exception&) {
    }
    found.push_back({step, {n, run}});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

bool remove_checkpoint_files(const std::string& dir, bool temporaries) {
  std::error_code ec;
  fs::remove(fs::path(dir) / kCheckpointIndex, ec);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if ((is_rank_file(n) || (temporaries && is_rank_temporary(n))) && is_file(e.path()))
      fs::remove(e.path(), ec);
  }
  if (::rmdir(dir.c_str()) == 0) return true;
  MESHRT_LOG_WARN("checkpoint: kept " << dir << ": it holds files meshrt did not write");
  return false;
}

void retire_replaced_checkpoint(const std::string& old, const std::string& final_dir) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final_dir, ec))) {
    MESHRT_CHECK(std::rename(old.c_str(), final_dir.c_str()) == 0,
                 "checkpoint: cannot move " << old << " back to " << final_dir << ": "
                                            << std::strerror(errno));
    return;
  }
  for (const auto& e : fs::directory_iterator(old, ec)) {
    const std::string n = e.path().filename().string();
    if (n == kCheckpointIndex || is_rank_file(n) || is_rank_temporary(n)) continue;
    const fs::path to = fs::path(final_dir) / n;
    if (!fs::exists(fs::symlink_status(to, ec))) fs::rename(e.path(), to, ec);
  }
  remove_checkpoint_files(old, /*temporaries=*/true);
}

int remove_stale_checkpoint_temporaries(const std::string& root) {
  int cleaned = 0;
  std::error_code ec;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(root, ec)) entries.push_back(e.path());
  for (const fs::path& p : entries) {
    CheckpointTemporary kind{};
    std::string step;
    if (!parse_checkpoint_temporary(p.filename().string(), &kind, &step)) continue;
    if (kind == CheckpointTemporary::Save && is_dir(p)) {
      remove_checkpoint_files(p.string(), /*temporaries=*/true);
      ++cleaned;
    } else if (kind == CheckpointTemporary::Replaced && is_dir(p)) {
      retire_replaced_checkpoint(p.string(), root + "/" + step);
      ++cleaned;
    } else if (kind == CheckpointTemporary::Latest && is_file(p)) {
      fs::remove(p, ec);
      ++cleaned;
    }
  }
  if (cleaned > 0)
    MESHRT_LOG_INFO("checkpoint: cleaned up " << cleaned << " temporaries that killed jobs left in "
                                              << root);
  return cleaned;
}

void prune_checkpoints(const std::string& root, const std::string& run, int keep,
                       const std::string& newest) {
  if (keep <= 0) return;
  std::vector<std::string> mine;
  for (const auto& [n, r] : checkpoints_in(root))
    if (r == run && n != newest) mine.push_back(n);  // sorted by step
  // The new checkpoint counts as one of the `keep`.
  const size_t drop =
      mine.size() + 1 > static_cast<size_t>(keep) ? mine.size() + 1 - static_cast<size_t>(keep) : 0;
  for (size_t i = 0; i < drop && i < mine.size(); ++i)
    remove_checkpoint_files(root + "/" + mine[i], /*temporaries=*/false);
}

std::string unindexed_checkpoint_file(const std::string& step_dir) {
  std::error_code ec;
  if (fs::exists(fs::path(step_dir) / kCheckpointIndex, ec)) return "";
  for (const auto& e : fs::directory_iterator(step_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (is_rank_file(n) || is_rank_temporary(n)) return n;
  }
  return "";
}

}  // namespace detail

// --- the lock ---

class CheckpointLock {
 public:
  CheckpointLock(int fd, std::string root) : fd_(fd), root_(std::move(root)) {}
  ~CheckpointLock() { ::close(fd_); }  // closing the file releases the flock
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_;
  std::string root_;
};

namespace {

std::string host_name() {
  char h[256] = {};
  return ::gethostname(h, sizeof(h) - 1) == 0 ? std::string(h) : std::string("?");
}

}  // namespace

std::shared_ptr<CheckpointLock> lock_checkpoint_root(const std::string& root) {
  struct stat sb {};
  MESHRT_CHECK(::stat(root.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode),
               "--save " << root << ": not a directory");
  // One hold per process and folder: the ranks (threads) of this job and its saves share it.
  static std::mutex mu;
  static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<CheckpointLock>> held;
  std::lock_guard<std::mutex> lk(mu);
  const auto key = std::make_pair(sb.st_dev, sb.st_ino);
  if (auto it = held.find(key); it != held.end())
    if (auto p = it->second.lock()) return p;
  const std::string path = root + "/" + detail::kCheckpointLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  MESHRT_CHECK(fd >= 0, "--save " << root << ": cannot open the lock file " << path << ": "
                                  << std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char buf[256] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    // A file system without locks (some network mounts): saving still works, unguarded.
    if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS) {
      auto p = std::make_shared<CheckpointLock>(fd, root);
      held[key] = p;
      MESHRT_LOG_WARN("--save " << root << ": cannot lock " << path << " (" << std::strerror(e)
                                << "): a second job on this folder would not be refused");
      return p;
    }
    ::close(fd);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    MESHRT_CHECK(e != EWOULDBLOCK,
                 "--save " << root << ": another job is writing checkpoints there (" << path
                           << " is locked by " << (holder.empty() ? "another process" : holder)
                           << "); wait for it to end or give this run another "
                              "--save folder");
    MESHRT_FAIL("--save " << root << ": cannot lock " << path << ": " << std::strerror(e));
  }
  // Who holds it, for the message another job gets; the lock itself dies with this process.
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host_name() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0)
    MESHRT_LOG_DEBUG("checkpoint: cannot record the holder in " << path);
  auto p = std::make_shared<CheckpointLock>(fd, root);
  held[key] = p;
  return p;
}

std::string new_checkpoint_run_id() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << std::setfill('0') << std::setw(8) << rd() << std::setw(8) << rd();
  return s.str();
}

void check_checkpoint_root_owner(const std::string& root, const std::string& run, bool overwrite,
                                 const std::string& resumed_dir) {
  if (overwrite) return;
  std::vector<std::string> foreign;
  for (const auto& [n, r] : detail::checkpoints_in(root))
    if (r != run) foreign.push_back(n);
  if (foreign.empty()) return;
  // Resuming from a checkpoint in this folder continues it, whoever wrote the others.
  std::error_code ec;
  if (!resumed_dir.empty()) {
    fs::path r = fs::absolute(resumed_dir, ec).lexically_normal();
    if (!r.has_filename()) r = r.parent_path();  // a trailing '/'
    if (fs::equivalent(r.parent_path(), root, ec)) return;
  }
  std::string names;
  for (size_t i = 0; i < foreign.size() && i < 4; ++i) names += (i ? ", " : "") + foreign[i];
  if (foreign.size() > 4) names += ", ... (" + std::to_string(foreign.size()) + " in all)";
  MESHRT_FAIL("--save " << root << " holds checkpoints of another run (" << names
                        << "): continue that run with --resume " << root
                        << ", or pass --overwrite to write this run's checkpoints there too "
                           "(replacing those of the same step; --keep never removes the "
                           "others), or give another --save folder");
}

}  // namespace meshrt
