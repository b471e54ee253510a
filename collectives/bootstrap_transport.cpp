#include "collectives/bootstrap_transport.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "collectives/comm_detail.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/stop.h"

namespace meshrt {

namespace fs = std::filesystem;

namespace {

std::string default_run_id() {
  for (const char* v : {"MESHRT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    std::string s = env_or(v);
    if (!s.empty()) return s;
  }
  return "default";
}

bool read_file(const fs::path& p, std::string* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::ostringstream os;
  os << f.rdbuf();
  *out = os.str();
  return true;
}

void write_atomically(const fs::path& dir, const fs::path& final_path, const std::string& data) {
  // Built by appending: GCC 12 at -O3 warns falsely on `"." + string` (-Wrestrict, bug 105329).
  std::string name = ".";
  name += final_path.filename().string();
  name += ".tmp.";
  name += std::to_string(getpid());
  fs::path tmp = dir / name;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MESHRT_CHECK(f.good(), "rendezvous: cannot write " << tmp.string() << " (is " << dir.string()
                                                       << " writable by every rank?)");
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    f.flush();
    MESHRT_CHECK(f.good(), "rendezvous: writing " << tmp.string() << " failed");
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  MESHRT_CHECK(!ec, "rendezvous: renaming " << tmp.string() << " to " << final_path.string()
                                            << " failed: " << ec.message());
}

// Polls until every rank's file exists (or the deadline passes), reading them as they appear.
// Returns the ranks still missing.
std::vector<int> poll_files(int world, const std::function<fs::path(int)>& path_of,
                            std::vector<std::string>* contents, const detail::Deadline& dl) {
  std::vector<bool> have(static_cast<size_t>(world), false);
  auto sleep = std::chrono::microseconds(500);
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      if (have[static_cast<size_t>(r)]) continue;
      std::string s;
      if (read_file(path_of(r), &s)) {
        have[static_cast<size_t>(r)] = true;
        if (contents) (*contents)[static_cast<size_t>(r)] = std::move(s);
      } else {
        missing.push_back(r);
      }
    }
    if (missing.empty() || dl.passed()) return missing;
    // A stop request (SIGINT / SIGTERM) ends the wait: nothing has run that needs finishing.
    if (const int sig = stop_request(); sig != 0)
      throw CommError("rendezvous: stopped by signal " + std::to_string(sig) + " (" +
                      strsignal(sig) + ") while waiting for " + detail::format_ranks(missing));
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(100000));
  }
}

std::vector<std::string> file_allgather(const std::string& dir, const std::string& key, int rank,
                                        int world, const std::string& mine, double timeout_s,
                                        const std::string& run_in, const LaunchNames& names) {
  MESHRT_CHECK(world >= 1 && rank >= 0 && rank < world,
               "rendezvous: rank " << rank << " outside [0, " << world << ")");
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  MESHRT_CHECK(fs::is_directory(dir, ec),
               "rendezvous directory '"
                   << dir << (exists ? "' is not a directory (" : "' does not exist (")
                   << names.rendezvous_dir
                   << "): give a directory on a file system every "
                      "rank can see");
  const std::string run = run_in.empty() ? default_run_id() : run_in;
  const fs::path d(dir);
  const std::string stem = "meshrt." + run + "." + key + ".";
  auto data_path = [&](int r) { return d / (stem + std::to_string(r)); };
  auto ack_path = [&](int r) { return d / (stem + "ack." + std::to_string(r)); };
  MESHRT_CHECK(!fs::exists(data_path(rank), ec) && !fs::exists(ack_path(rank), ec),
               "rendezvous: " << data_path(rank).string()
                              << " (or its .ack) already exists, left by an earlier job: use a "
                                 "fresh directory or a unique MESHRT_RUN_ID");
  // Whatever happens, this rank's own files go when it leaves: a later launch in the same
  // directory with the same run id must not find them ("left by an earlier job").
  struct Cleanup {
    fs::path data, ack;
    ~Cleanup() {
      std::error_code ec;
      fs::remove(data, ec);
      fs::remove(ack, ec);
    }
  } cleanup{data_path(rank), ack_path(rank)};
  write_atomically(d, data_path(rank), detail::rendezvous_file(world, mine));

  detail::Deadline dl = detail::Deadline::after(timeout_s);
  std::vector<std::string> got(static_cast<size_t>(world));
  std::vector<int> missing = poll_files(world, data_path, &got, dl);
  if (!missing.empty()) {
    throw CommError("rendezvous '" + key + "' in " + dir + ": " + detail::format_ranks(missing) +
                    " never wrote " + stem + "<rank> within " + std::to_string(timeout_s) +
                    " s (is every rank started with the same " + names.world_size + " and " +
                    names.rendezvous_dir + "?)");
  }
  std::vector<std::string> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    out[static_cast<size_t>(r)] = detail::rendezvous_payload(
        got[static_cast<size_t>(r)], world, data_path(r).string(), names.world_size);
  // Three phases so that no file outlives the exchange: acknowledge having read every data
  // file; once every rank acknowledged, remove our data file; once every data file is gone
  // (so every rank has seen every acknowledgement), the Cleanup removes our acknowledgement.
  write_atomically(d, ack_path(rank), "");
  detail::Deadline ack_dl = detail::Deadline::after(std::min(timeout_s, 5.0));
  if (poll_files(world, ack_path, nullptr, ack_dl).empty()) {
    fs::remove(data_path(rank), ec);
    auto sleep = std::chrono::microseconds(500);
    for (;;) {
      bool any = false;
      for (int r = 0; r < world && !any; ++r) any = fs::exists(data_path(r), ec);
      if (!any || ack_dl.passed()) break;
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(100000));
    }
  }
  return out;
}

class FileTransport final : public BootstrapTransport {
 public:
  FileTransport(std::string dir, int rank, int size, double timeout_s, std::string run,
                LaunchNames names)
      : dir_(std::move(dir)),
        rank_(rank),
        size_(size),
        timeout_s_(timeout_s),
        run_(std::move(run)),
        names_(std::move(names)) {
    MESHRT_CHECK(size >= 1 && rank >= 0 && rank < size,
                 "rendezvous: rank " << rank << " outside [0, " << size << ")");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> all_gather(const std::string& key, const std::string& mine) override {
    return file_allgather(dir_, key, rank_, size_, mine, timeout_s_, run_, names_);
  }

 private:
  std::string dir_;
  int rank_, size_;
  double timeout_s_;
  std::string run_;
  LaunchNames names_;
};

}  // namespace

namespace detail {

std::string rendezvous_file(int world, const std::string& payload) {
  return "meshrt-rendezvous world=" + std::to_string(world) + "\n" + payload;
}

std::string rendezvous_payload(const std::string& contents, int world, const std::string& path,
                               const std::string& world_size) {
  const std::string header = rendezvous_file(world, "");
  MESHRT_CHECK(contents.compare(0, header.size(), header) == 0,
               "rendezvous: " << path << " was written for another world size "
                              << "(expected '" << header.substr(0, header.size() - 1)
                              << "'): stale file or mismatched " << world_size);
  return contents.substr(header.size());
}

}  // namespace detail

std::unique_ptr<BootstrapTransport> make_file_transport(const std::string& dir, int rank, int size,
                                                        double timeout_s, const std::string& run,
                                                        const LaunchNames& names) {
  return std::make_unique<FileTransport>(dir, rank, size, timeout_s, run, names);
}

}  // namespace meshrt
