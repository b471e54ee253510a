#include "runtime/output_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>

#include "runtime/error.h"

namespace meshrt {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxLinks = 40;  // as the kernel's own limit on symlinks in a path

std::string dir_of(const std::string& p) {
  const fs::path f(p);
  return f.has_parent_path() ? f.parent_path().string() : std::string(".");
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Refuses an existing target that is not a regular file.
void check_target_kind(const std::string& target, const std::string& path,
                       const std::string& what) {
  struct stat sb {};
  if (::stat(target.c_str(), &sb) != 0) return;  // absent: created
  MESHRT_CHECK(S_ISREG(sb.st_mode),
               what << " " << path
                    << (target == path ? std::string() : " (a link to " + target + ")") << " is "
                    << kind_of(sb.st_mode)
                    << ", not a regular file; give the name of a file to (over)write");
}

// What a failed step's errno means for the user: EFBIG names the file size limit that caused it.
std::string error_text(int err) {
  std::string s = std::strerror(err);
  struct rlimit rl {};
  if (err == EFBIG && ::getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    s += " (the file size limit, ulimit -f, is " + std::to_string(rl.rlim_cur) +
         " bytes; raise it or write less)";
  return s;
}

}  // namespace

void ignore_file_size_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGXFSZ, nullptr, &old) != 0) return;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) std::signal(SIGXFSZ, SIG_IGN);
  });
}

std::string resolve_output_path(const std::string& path, const std::string& what) {
  MESHRT_CHECK(!path.empty(), what << ": empty file name");
  std::string p = path;
  for (int i = 0; i < kMaxLinks; ++i) {
    struct stat sb {};
    if (::lstat(p.c_str(), &sb) != 0 || !S_ISLNK(sb.st_mode)) return p;
    std::string link(static_cast<size_t>(sb.st_size > 0 ? sb.st_size : 255) + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
    MESHRT_CHECK(n >= 0, what << " " << path << ": cannot read the link " << p << ": "
                              << std::strerror(errno));
    link.resize(static_cast<size_t>(n));
    p = !link.empty() && link[0] == '/' ? link : (fs::path(dir_of(p)) / link).string();
  }
  MESHRT_FAIL(what << " " << path << ": more than " << kMaxLinks
                   << " symbolic links (a loop?); give a file name");
}

OutputFile::OutputFile(const std::string& path, std::string what, bool durable)
    : path_(path), what_(std::move(what)), durable_(durable) {
  ignore_file_size_signal();
  target_ = resolve_output_path(path_, what_);
  check_target_kind(target_, path_, what_);
  // A unique name beside the target (the rename must not cross file systems): pid, a process-wide
  // counter and random bits, created exclusively; a clash (another host's pid) draws again.
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const std::string base = fs::path(target_).filename().string();
  const std::string dir = dir_of(target_);
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), ".tmp-%ld-%llu-%08x", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(counter++), rd());
    // A target name near NAME_MAX (255 bytes) would make the temporary's too long: its front is
    // enough, the suffix makes it unique.
    const size_t room = 255 - 1 - std::strlen(suffix);
    tmp_ = (fs::path(dir) / ("." + base.substr(0, std::min(base.size(), room)) + suffix)).string();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) {
      const int e = errno;
      tmp_.clear();
      MESHRT_FAIL(what_ << " " << path_ << ": cannot create a file in " << dir << ": "
                        << std::strerror(e));
    }
  }
  MESHRT_CHECK(fd_ >= 0, what_ << " " << path_ << ": no unused temporary name in " << dir);
  // An existing target keeps its permissions.
  struct stat sb {};
  if (::stat(target_.c_str(), &sb) == 0) (void)::fchmod(fd_, sb.st_mode & 07777);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::fail(const std::string& step, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  const std::string tmp = tmp_;
  tmp_.clear();
  MESHRT_FAIL(what_ << " " << path_ << ": " << step << " " << tmp << " failed: " << error_text(err)
                    << "; nothing was written to " << target_);
}

void OutputFile::write(const void* data, size_t n) {
  MESHRT_CHECK(fd_ >= 0, what_ << " " << path_ << ": write after commit or failure");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing", w < 0 ? errno : EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputFile::commit() {
  MESHRT_CHECK(fd_ >= 0, what_ << " " << path_ << ": commit after commit or failure");
  if (durable_ && ::fsync(fd_) != 0) fail("fsync of", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("closing", errno);
  // The target may have become a directory or a device since the constructor: refuse still.
  try {
    check_target_kind(target_, path_, what_);
  } catch (...) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
    throw;
  }
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) fail("renaming over the target", errno);
  tmp_.clear();
  if (durable_) {
    // The rename is durable once the directory entry is.
    const std::string dir = dir_of(target_);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool ok = dfd >= 0 && ::fsync(dfd) == 0;
    const int e = errno;
    if (dfd >= 0) ::close(dfd);
    MESHRT_CHECK(ok, what_ << " " << path_ << ": fsync of directory " << dir
                           << " failed: " << std::strerror(e));
  }
}

void write_output_file(const std::string& path, std::string_view text, const std::string& what,
                       bool durable) {
  OutputFile f(path, what, durable);
  f.write(text);
  f.commit();
}

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) return;
  const std::string target = resolve_output_path(path, what);
  const std::string dir = dir_of(target);
  std::error_code ec;
  MESHRT_CHECK(fs::is_directory(dir, ec), what << " " << path << ": directory " << dir
                                               << " does not exist; create it or choose another "
                                                  "path");
  check_target_kind(target, path, what);
  MESHRT_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0,
               what << " " << path << ": directory " << dir << " is not writable");
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  struct Resolved {
    const std::string *what, *path;
    std::string norm;
    bool exists;
    dev_t dev;
    ino_t ino;
  };
  std::vector<Resolved> rs;
  for (const auto& [what, path] : outputs) {
    if (path.empty()) continue;
    Resolved r{&what, &path, "", false, 0, 0};
    const std::string t = resolve_output_path(path, what);
    std::error_code ec;
    r.norm = fs::absolute(t, ec).lexically_normal().string();
    struct stat sb {};
    if (::stat(t.c_str(), &sb) == 0) {
      r.exists = true;
      r.dev = sb.st_dev;
      r.ino = sb.st_ino;
    }
    for (const Resolved& o : rs) {
      const bool same =
          o.norm == r.norm || (o.exists && r.exists && o.dev == r.dev && o.ino == r.ino);
      MESHRT_CHECK(!same, *o.what << " " << *o.path << " and " << what << " " << path
                                  << " name the same file; give each output its own file");
    }
    rs.push_back(std::move(r));
  }
}

namespace {

// Whether `p` lies below `dir` (both canonical), not at it.
bool strictly_inside(const fs::path& p, const fs::path& dir) {
  const std::string rel = p.lexically_relative(dir).string();
  return !(rel.empty() || rel == "." || rel.rfind("..", 0) == 0);
}

}  // namespace

void check_outputs_spare_inputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                                const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [owhat, opath] : outputs) {
    if (opath.empty()) continue;
    std::error_code ec;
    const fs::path out = fs::weakly_canonical(resolve_output_path(opath, owhat), ec);
    if (ec) continue;  // check_output_path reports what is wrong with it
    struct stat os {};
    const bool out_exists = ::stat(out.c_str(), &os) == 0;
    for (const auto& [iwhat, ipath] : inputs) {
      if (ipath.empty()) continue;
      struct stat is {};
      if (::stat(ipath.c_str(), &is) != 0) continue;
      const fs::path in = fs::weakly_canonical(ipath, ec);
      if (ec) continue;
      const bool same =
          (out_exists && os.st_dev == is.st_dev && os.st_ino == is.st_ino) || out == in;
      MESHRT_CHECK(!same, owhat << " " << opath << " is the input " << iwhat << " " << ipath
                                << ": writing it would replace that input; give " << owhat
                                << " another file");
      MESHRT_CHECK(!S_ISDIR(is.st_mode) || !strictly_inside(out, in),
                   owhat << " " << opath << " lies inside the input " << iwhat << " " << ipath
                         << ": writing it would change that input; give " << owhat
                         << " a file outside it");
    }
  }
}

void check_outputs_outside(const std::vector<std::pair<std::string, std::string>>& outputs,
                           const std::string& what, const std::string& folder,
                           const std::string& holds,
                           const std::function<bool(const std::string&)>& managed) {
  if (folder.empty()) return;
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(folder, ec);
  if (ec) return;
  for (const auto& [owhat, opath] : outputs) {
    if (opath.empty()) continue;
    const fs::path out = fs::weakly_canonical(resolve_output_path(opath, owhat), ec);
    if (ec || (out != dir && !strictly_inside(out, dir))) continue;
    const fs::path rel = out.lexically_relative(dir);
    if (managed && out != dir && !managed(rel.begin()->string())) continue;
    MESHRT_FAIL(owhat << " " << opath << (out == dir ? " is " : " lies inside ") << what << " "
                      << folder << " (" << holds
                      << ", whose files meshrt manages: a later save, prune or resume would "
                         "replace or read it); give "
                      << owhat << " a path outside it");
  }
}

AppendOutputFile::AppendOutputFile(const std::string& path, std::string what, Start start,
                                   bool (*keep_if)(std::string_view, long long), long long keep_arg)
    : path_(path), what_(std::move(what)) {
  ignore_file_size_signal();
  check_output_path(path_, what_);
  target_ = resolve_output_path(path_, what_);
  std::error_code ec;
  const bool exists = fs::exists(target_, ec);
  if (keep_if != nullptr && exists) {
    std::ifstream in(target_, std::ios::binary);
    MESHRT_CHECK(in.good(), what_ << " " << path_ << ": cannot read it: " << std::strerror(errno));
    std::string kept, line;
    while (std::getline(in, line))
      if (!line.empty() && keep_if(line, keep_arg)) kept += line + "\n";
    write_output_file(path_, kept, what_);
  } else if (start == Start::Fresh || !exists) {
    write_output_file(path_, "", what_);
  }
  fd_ = ::open(target_.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  MESHRT_CHECK(fd_ >= 0,
               what_ << " " << path_ << ": cannot open it for appending: " << std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    MESHRT_FAIL(what_ << " " << path_ << " is " << kind_of(sb.st_mode)
                      << ", not a regular file; give the name of a file to write");
  }
}

AppendOutputFile::~AppendOutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendOutputFile::append_line(std::string_view line) {
  buf_.assign(line);
  buf_ += '\n';
  // Whole lines only: a write stopped part-way (a full disk, the file size limit) is cut back to
  // the last whole line, and its errno is reported by the write that fails after it.
  struct stat sb {};
  const off_t before = ::fstat(fd_, &sb) == 0 ? sb.st_size : -1;
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (done > 0 && before >= 0) (void)::ftruncate(fd_, before);
      MESHRT_FAIL(what_ << " " << path_ << ": write failed after " << done << " of " << buf_.size()
                        << " bytes of a record: " << error_text(err)
                        << "; the file keeps its whole lines");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace meshrt
