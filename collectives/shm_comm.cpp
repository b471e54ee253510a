#include "collectives/shm_comm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/shm_transport.h"
#include "collectives/backend_registry.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/comm_detail.h"
#include "collectives/flight.h"
#include "collectives/host_reduce.h"
#include "collectives/mpi_backend.h"
#include "collectives/ordered_comm.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/shared_host_memory.h"

namespace meshrt {

namespace {

using detail::CallSig;
using detail::Op;

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the shm backend needs lock-free (address-free) 32- and 64-bit atomics");

constexpr uint64_t kShmMagic = 0x6d6573687368'6d31ULL;  // "meshshm1"
constexpr uint32_t kShmVersion = 2;
// Bytes of one staging buffer (each rank has two, used alternately).
constexpr size_t kChunk = detail::kShmChunkBytes;
// Bytes of one point-to-point mailbox (one per ordered pair of ranks).
constexpr size_t kMailBytes = size_t{256} << 10;
constexpr char kNamePrefix[] = "meshrt-shm-";
constexpr size_t kReasonBytes = 512;
constexpr size_t kStatusBytes = 256;

using detail::cpu_relax;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// ---- the segment's layout ----------------------------------------------------------------------

struct alignas(64) ShmHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t n;
  uint64_t bytes;
  alignas(64) std::atomic<uint32_t> wake;  // bumped by every step; waiters sleep on it (futex)
  std::atomic<int32_t> sleepers;
  alignas(64) std::atomic<uint32_t> aborted;  // 0, 1 (writing the reason), 2 (reason readable)
  char reason[kReasonBytes];
};

// Host blocks of at least this many bytes are shared memory in an shm rank's process
// (runtime/shared_host_memory.h: those under 256 KiB carved from 2 MiB slabs), so collectives
// above the table's one-step limit (collectives/algorithms/table.cpp) can run between the ranks'
// own buffers.
constexpr size_t kSharedBlockBytes = size_t{4} << 10;
// Peers' blocks kept mapped per communicator (beyond it the least recently used one that the
// current call does not use is unmapped).
constexpr size_t kMaxPeerMaps = 64;

// A rank's input and output of a zero-copy collective: their blocks' descriptors in its process,
// ids, sizes and the buffers' offsets in them (ok = 0: not both in shared memory).
struct ShmBuffers {
  int32_t ok;
  int32_t fd[2];  // input, output
  uint64_t id[2], block[2], offset[2];
};

// What a rank publishes before a step and its peers read after it: indexed by the use (two
// alternate, so a rank writes the next use's while peers still read this one's).
struct alignas(64) ShmArea {
  CallSig sig;
  int64_t key;
  int32_t ok;
  char status[kStatusBytes];
  ShmBuffers bufs;
};

struct alignas(64) ShmSlot {
  std::atomic<uint64_t> step;  // how many steps this rank posted on this communicator
  // World segment only, for the watchdog's "likely culprit": how many waits the rank's process
  // is inside, and a heartbeat those waits beat (steady-clock ns; kGaveUp after an abort).
  alignas(64) std::atomic<uint64_t> busy;
  std::atomic<uint64_t> beat;
  alignas(64) ShmArea area[2];
};

constexpr uint64_t kGaveUp = ~uint64_t{0};
constexpr uint64_t kStaleNs = 1000000000ull;  // a waiting rank beats far more often than this

uint64_t steady_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(detail::Clock::now().time_since_epoch())
          .count());
}

// Marks this rank's process as waiting inside a collective (world segment) while it lives; a
// wait that ends by an exception leaves it marked as having given up.
class WaitMark {
 public:
  explicit WaitMark(ShmSlot& s) : s_(s), uncaught_(std::uncaught_exceptions()) {
    s_.beat.store(steady_ns(), std::memory_order_release);
    s_.busy.fetch_add(1);
  }
  ~WaitMark() {
    if (std::uncaught_exceptions() == uncaught_) {
      s_.busy.fetch_sub(1);
    } else {
      s_.beat.store(kGaveUp, std::memory_order_release);
    }
  }
  void beat() {
    if (s_.beat.load(std::memory_order_relaxed) != kGaveUp)
      s_.beat.store(steady_ns(), std::memory_order_release);
  }
  WaitMark(const WaitMark&) = delete;
  WaitMark& operator=(const WaitMark&) = delete;

 private:
  ShmSlot& s_;
  int uncaught_;
};

// One direction of a rank pair: the sender posts chunks, the receiver takes them.
struct alignas(64) ShmMail {
  std::atomic<uint64_t> posted;
  alignas(64) std::atomic<uint64_t> taken;
  alignas(64) uint64_t msg;  // the message (per-pair number) the posted chunks belong to
  int64_t count;
  int32_t dtype;
  // Written by the receiver before `taken` when the first chunk did not match its recv.
  uint64_t bad_msg;
  int64_t want_count;
  int32_t want_dtype;
};

struct Layout {
  size_t slots, data, mail, bytes;
  explicit Layout(int n) {
    const size_t un = static_cast<size_t>(n);
    slots = round_up(sizeof(ShmHeader), 64);
    data = round_up(slots + un * sizeof(ShmSlot), 4096);
    mail = data + un * 2 * kChunk;
    bytes = mail + un * un * (round_up(sizeof(ShmMail), 64) + kMailBytes);
  }
};

std::string mib(uint64_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << static_cast<double>(bytes) / static_cast<double>(1 << 20) << " MiB";
  return os.str();
}

// Why the segment `name` (`bytes` for `n` ranks) could not be reserved: the error `e`, and
// /dev/shm's free space against the size needed.
std::string no_room_message(const std::string& name, int n, size_t bytes, int e) {
  std::ostringstream os;
  os << "shm: cannot reserve the " << bytes << " bytes (" << mib(bytes)
     << ") of the shared-memory segment /dev/shm" << name << " for " << n
     << " ranks: " << std::strerror(e);
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t free_b = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    os << "; /dev/shm has " << free_b << " bytes (" << mib(free_b) << ") free";
  }
  os << ": free space in /dev/shm (df -h /dev/shm) or make it larger (docker run --shm-size=1g; "
        "mount -o remount,size=1G /dev/shm)";
  return os.str();
}

// One mapping of a communicator's segment.
class Segment {
 public:
  // Creates (O_EXCL: never an existing one) and maps the segment `name` for `n` ranks.
  static std::shared_ptr<Segment> create(const std::string& name, int n) {
    const Layout lay(n);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    MESHRT_CHECK(fd >= 0, "shm: cannot create shared-memory segment /dev/shm"
                              << name << ": " << std::strerror(errno)
                              << " (is /dev/shm mounted and writable?)");
    auto seg = std::shared_ptr<Segment>(new Segment(name, n, lay));
    seg->linked_ = true;  // unlinked by seg's destructor when this throws
    // Every page reserved now: on a full /dev/shm a write to an unreserved page is a SIGBUS.
    if (const int e = reserve_shared_pages(fd, lay.bytes); e != 0) {
      close(fd);
      MESHRT_FAIL(no_room_message(name, n, lay.bytes, e));
    }
    seg->map(fd);
    ShmHeader* h = new (seg->base_) ShmHeader{};
    h->version = kShmVersion;
    h->n = static_cast<uint32_t>(n);
    h->bytes = lay.bytes;
    // Published last: a rank that maps the segment sees a whole header once it sees the magic
    // (a release store; no fence, which ThreadSanitizer does not model).
    std::atomic_ref<uint64_t>(h->magic).store(kShmMagic, std::memory_order_release);
    return seg;
  }

  // Maps the existing segment `name`, checking that it was made for `n` ranks by this version.
  static std::shared_ptr<Segment> open(const std::string& name, int n) {
    const Layout lay(n);
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    MESHRT_CHECK(fd >= 0, "shm: cannot open shared-memory segment /dev/shm"
                              << name << ": " << std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != lay.bytes) {
      close(fd);
      MESHRT_FAIL("shm: /dev/shm" << name << " has " << st.st_size << " bytes, not the "
                                  << lay.bytes << " of a " << n
                                  << "-rank segment (ranks started with different world sizes?)");
    }
    auto seg = std::shared_ptr<Segment>(new Segment(name, n, lay));
    seg->map(fd);
    ShmHeader& h = seg->header();
    const uint64_t magic = std::atomic_ref<uint64_t>(h.magic).load(std::memory_order_acquire);
    MESHRT_CHECK(magic == kShmMagic && h.version == kShmVersion && h.n == static_cast<uint32_t>(n),
                 "shm: /dev/shm" << name << " is not a meshrt segment of version " << kShmVersion
                                 << " for " << n << " ranks (a different meshrt build?)");
    return seg;
  }

  ~Segment() {
    unlink();
    if (base_ != nullptr) munmap(base_, layout_.bytes);
  }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Removes the name (the mapping stays): once every rank has mapped it, nothing can be left
  // in /dev/shm, whatever happens to the processes later.
  void unlink() {
    if (!linked_) return;
    linked_ = false;
    shm_unlink(name_.c_str());
  }

  const std::string& name() const { return name_; }
  int size() const { return n_; }
  ShmHeader& header() { return *static_cast<ShmHeader*>(base_); }
  ShmSlot& slot(int r) {
    return reinterpret_cast<ShmSlot*>(bytes_at(layout_.slots))[static_cast<size_t>(r)];
  }
  char* data(int r, uint64_t use) {
    return bytes_at(layout_.data + (static_cast<size_t>(r) * 2 + use % 2) * kChunk);
  }
  ShmMail& mail(int src, int dst) { return *reinterpret_cast<ShmMail*>(mail_at(src, dst)); }
  char* mail_data(int src, int dst) { return mail_at(src, dst) + round_up(sizeof(ShmMail), 64); }

  void notify() {
    ShmHeader& h = header();
    h.wake.fetch_add(1, std::memory_order_release);
    if (h.sleepers.load(std::memory_order_acquire) > 0) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h.wake), FUTEX_WAKE, INT_MAX, nullptr,
              nullptr, 0);
    }
  }
  // Sleeps while the wake word is `seen`, at most `max_s` seconds (shared futex: any process).
  void sleep(uint32_t seen, double max_s) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(max_s);
    ts.tv_nsec = static_cast<long>((max_s - static_cast<double>(ts.tv_sec)) * 1e9);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header().wake), FUTEX_WAIT, seen, &ts, nullptr,
            0);
  }

  // Marks the segment aborted with `why` (the first reason wins) and wakes every waiter.
  void abort(const std::string& why) {
    ShmHeader& h = header();
    uint32_t expect = 0;
    if (h.aborted.compare_exchange_strong(expect, 1)) {
      const size_t len = std::min(why.size(), kReasonBytes - 1);
      std::memcpy(h.reason, why.data(), len);
      h.reason[len] = '\0';
      h.aborted.store(2, std::memory_order_release);
    }
    notify();
  }
  bool aborted() { return header().aborted.load(std::memory_order_acquire) != 0; }
  std::string abort_reason() {
    ShmHeader& h = header();
    for (int i = 0; i < 100000 && h.aborted.load(std::memory_order_acquire) == 1; ++i) cpu_relax();
    if (h.aborted.load(std::memory_order_acquire) != 2) return "a peer aborted the communicator";
    return std::string(h.reason, strnlen(h.reason, kReasonBytes));
  }

 private:
  Segment(std::string name, int n, Layout lay) : name_(std::move(name)), n_(n), layout_(lay) {}
  void map(int fd) {
    void* p = mmap(nullptr, layout_.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    MESHRT_CHECK(p != MAP_FAILED, "shm: cannot map /dev/shm" << name_ << " (" << layout_.bytes
                                                             << " bytes): " << std::strerror(e));
    base_ = p;
  }
  char* bytes_at(size_t off) { return static_cast<char*>(base_) + off; }
  char* mail_at(int src, int dst) {
    const size_t i = static_cast<size_t>(src) * static_cast<size_t>(n_) + static_cast<size_t>(dst);
    return bytes_at(layout_.mail + i * (round_up(sizeof(ShmMail), 64) + kMailBytes));
  }

  std::string name_;
  int n_;
  Layout layout_;
  void* base_ = nullptr;
  bool linked_ = false;
};

// ---- the abort domain: every shm communicator of this process ---------------------------------

struct ShmProcess {
  std::mutex mu;
  std::atomic<bool> aborted{false};
  std::string reason;
  std::vector<std::weak_ptr<Segment>> segments;
};
ShmProcess& shm_process() {
  static auto* p = new ShmProcess;  // never destroyed: used until the last communicator goes
  return *p;
}

void shm_track(const std::shared_ptr<Segment>& seg) {
  ShmProcess& p = shm_process();
  std::lock_guard<std::mutex> lk(p.mu);
  std::erase_if(p.segments, [](const std::weak_ptr<Segment>& w) { return w.expired(); });
  p.segments.push_back(seg);
}

std::string shm_abort_reason() {
  ShmProcess& p = shm_process();
  std::lock_guard<std::mutex> lk(p.mu);
  return p.reason;
}

// Fails every shm communicator of this process and tells the peers through each segment.
void shm_abort(const std::string& why) {
  ShmProcess& p = shm_process();
  std::vector<std::shared_ptr<Segment>> live;
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(p.mu);
    if (!p.aborted.load()) {
      p.reason = why;
      p.aborted.store(true, std::memory_order_release);
      first = true;
      MESHRT_LOG_DEBUG("shm communicators aborted: " << why);
    }
    for (auto& w : p.segments) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->abort(why);
  if (!first) return;
  detail::flight_dump_all(why);
  // Under mpirun (MPI bootstrapped the job): end through MPI_Abort at exit, not MPI_Finalize,
  // which would wait for peers that may be gone. (Marked directly: the record is written and
  // the cause reported once already.)
  if (const detail::MpiBackend* mpi = detail::mpi_backend_if_loaded()) mpi->mark_aborted(why);
}

// ---- the peers' processes ------------------------------------------------------------------

// The pids of the world's ranks, watched through pidfds (kill(pid, 0) where there are none) so
// that a rank waiting for a peer notices at once when its process is gone.
class Peers {
 public:
  explicit Peers(std::vector<pid_t> pids) : pids_(std::move(pids)) {
    for (pid_t p : pids_) {
      int fd = -1;
#if defined(SYS_pidfd_open)
      if (p != getpid()) fd = static_cast<int>(syscall(SYS_pidfd_open, p, 0));
#endif
      fds_.push_back(fd);
    }
  }
  ~Peers() {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;
  pid_t pid(int global_rank) const { return pids_[static_cast<size_t>(global_rank)]; }
  // Whether the process of `global_rank` has ended (exited or killed; a zombie counts).
  bool dead(int global_rank) const {
    const size_t i = static_cast<size_t>(global_rank);
    if (fds_[i] >= 0) {
      pollfd pfd{fds_[i], POLLIN, 0};
      return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    }
    if (kill(pids_[i], 0) != 0 && errno == ESRCH) return true;
    std::ifstream f("/proc/" + std::to_string(pids_[i]) + "/stat");
    std::string s;
    std::getline(f, s);
    const size_t close_paren = s.rfind(')');
    return close_paren != std::string::npos && close_paren + 2 < s.size() &&
           s[close_paren + 2] == 'Z';
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> fds_;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "/meshrt-shm-<creator pid>-<token>": the pid lets a later launch tell a dead job's segment.
std::string segment_name(const std::string& token) {
  return "/" + std::string(kNamePrefix) + std::to_string(getpid()) + "-" + token;
}

}  // namespace

namespace {

// One rank's side of a shm communicator: the transport (the segment's areas, staging buffers,
// steps and mailboxes, the peers' mapped buffers) and the wiring; the collectives' algorithms run
// over its ShmTransport side (collectives/algorithms/shm_transport.h: uses and steps; a use's
// area alternates as its buffer does).
class ShmEngine final : public detail::OrderedEngine, public detail::ShmTransport {
 public:
  ShmEngine(std::shared_ptr<Segment> seg, std::shared_ptr<Segment> world_seg,
            std::shared_ptr<Peers> peers, std::vector<int> world, int rank, std::string name,
            CommConfig cfg, std::string token,
            std::shared_ptr<const std::vector<int>> labels = nullptr)
      : OrderedEngine(rank, seg->size(), std::move(name), cfg),
        seg_(std::move(seg)),
        world_seg_(std::move(world_seg)),
        peers_(std::move(peers)),
        world_(std::move(world)),
        token_(std::move(token)),
        labels_(std::move(labels)),
        plan_(detail::AlgoWorld{"shm", size(), 1}, config().algo) {
    // As the host backend: spin briefly unless the ranks outnumber the cores, yield a while,
    // then sleep on the segment's futex word.
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    spin_ = static_cast<unsigned>(size()) <= hw ? 256 : 0;
    shm_track(seg_);
    enable_shared_host_memory(kSharedBlockBytes);
  }
  ~ShmEngine() override {
    for (auto& [key, m] : peer_maps_) munmap(m.base, m.bytes);
  }
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;

  static std::unique_ptr<Communicator> make(std::shared_ptr<ShmEngine> e) {
    return detail::make_ordered_communicator(std::move(e), Device::cpu(0));
  }

  std::string_view backend() const override { return "shm"; }
  bool aborted() const override { return shm_process().aborted.load(std::memory_order_acquire); }
  std::string abort_reason() const override { return shm_abort_reason(); }
  void abort_group(const std::string& why) override { shm_abort(why); }

 private:
  std::shared_ptr<Segment> seg_;
  std::shared_ptr<Segment> world_seg_;  // the world's: every rank's activity words
  std::shared_ptr<Peers> peers_;
  std::vector<int> world_;  // group rank -> global rank
  std::string token_;       // the job's segment token: split segments are named from it
  // The transport's processes are one node of a larger job: their ranks in it (for messages).
  std::shared_ptr<const std::vector<int>> labels_;
  detail::AlgoPlan plan_;  // which algorithm runs each call (collectives/algorithms/)
  unsigned spin_ = 0;
  // Collective state, touched only inside collective turns (one at a time per rank).
  uint64_t step_ = 0, use_ = 0;
  // Peers' shared host blocks mapped here: (group rank, block id) -> mapping.
  struct PeerMap {
    void* base;
    size_t bytes;
    uint64_t used;  // the zero-copy call that last used it
  };
  std::map<std::pair<int, uint64_t>, PeerMap> peer_maps_;
  uint64_t map_calls_ = 0;

  std::string rank_label(int group_rank) const override {
    int g = group_rank >= 0 && group_rank < size() ? world_[static_cast<size_t>(group_rank)] : -1;
    if (g >= 0 && labels_) g = (*labels_)[static_cast<size_t>(g)];
    return detail::global_rank_label(g, group_rank, name() == "world" && g == group_rank);
  }

  ShmArea& area(int r, uint64_t use) { return seg_->slot(r).area[use % 2]; }

  void check_abort(const Op& op) {
    if (aborted()) throw_aborted(op);
    if (seg_->aborted()) {
      shm_abort(seg_->abort_reason());  // a peer gave up: fail this process's groups too
      throw_aborted(op);
    }
  }

  // A peer the wait depends on whose process ended fails the call at once, naming it.
  void check_peers(const Op& op, const std::vector<int>& behind) {
    for (int j : behind) {
      const int g = world_[static_cast<size_t>(j)];
      if (!peers_->dead(g)) continue;
      const std::string msg = context(op) + " failed: " + rank_label(j) + " (pid " +
                              std::to_string(peers_->pid(g)) +
                              ") is gone: its process ended (killed, crashed or exited) while "
                              "this rank waited for it; the communicators were aborted";
      shm_abort(msg);
      throw CommError(msg);
    }
  }

  // What the process of global rank `g` is doing, from its activity words.
  std::string activity(int g) const {
    ShmSlot& w = world_seg_->slot(g);
    const uint64_t busy = w.busy.load(std::memory_order_acquire);
    const uint64_t beat = w.beat.load(std::memory_order_acquire);
    if (beat == kGaveUp) return "gave up after an abort";
    if (busy == 0) return "not inside any collective";
    if (steady_ns() - beat > kStaleNs) return "not responding inside a collective";
    return "waiting in another collective";
  }

  // The watchdog's list: the ranks behind, each with what it is doing, then the ranks of the
  // job outside every collective or not responding (every rank computes the same list, so the
  // ranks agree on the culprit whichever group they time out in).
  std::string missing_text(const std::vector<int>& behind, const std::string& what) const {
    std::string s;
    for (size_t i = 0; i < behind.size(); ++i) {
      s += (i ? ", " : "") + rank_label(behind[i]) + " (" +
           activity(world_[static_cast<size_t>(behind[i])]) + ")";
    }
    s = s.empty() ? "every rank arrived (one may be stuck inside it)" : s + " " + what;
    std::vector<int> stalled;
    const int me = world_[static_cast<size_t>(rank())];
    for (int g = 0; g < world_seg_->size(); ++g) {
      const std::string a = g == me ? "" : activity(g);
      if (a == "not inside any collective" || a == "not responding inside a collective")
        stalled.push_back(g);
    }
    if (!stalled.empty()) {
      s += "; likely culprit: " + detail::format_ranks(stalled) +
           " (not inside any collective, or not responding)";
    }
    return s;
  }

  // Waits until ready(): spins, yields, then sleeps on the segment's futex word; between sleeps
  // it checks for an abort, for the processes of the ranks behind() names, and the deadline.
  template <class Ready>
  void await(Ready ready, const Op& op, const std::function<std::vector<int>()>& behind,
             const std::string& what) {
    for (unsigned i = 0; i < spin_; ++i) {
      if (ready()) return;
      cpu_relax();
    }
    const auto start = detail::Clock::now();
    auto next_check = start;
    ShmHeader& h = seg_->header();
    WaitMark mark(world_seg_->slot(world_[static_cast<size_t>(rank())]));
    for (;;) {
      if (ready()) return;
      check_abort(op);
      const auto now = detail::Clock::now();
      if (now >= next_check) {
        mark.beat();
        check_peers(op, behind());
        next_check = now + std::chrono::milliseconds(2);
      }
      if (op.dl.passed()) fail_timeout(op, missing_text(behind(), what));
      if (now - start < std::chrono::microseconds(50)) {
        sched_yield();
        continue;
      }
      const uint32_t seen = h.wake.load();
      h.sleepers.fetch_add(1);
      if (!ready() && !seg_->aborted() && !aborted()) {
        seg_->sleep(seen, std::min(0.002, std::max(0.0, op.dl.left_s())));
      }
      h.sleepers.fetch_sub(1);
    }
  }

  // Posts this rank's next step and waits until every rank of the group posted it.
  void step_all(const Op& op, const char* what) override {
    const uint64_t s = ++step_;
    seg_->slot(rank()).step.store(s, std::memory_order_release);
    seg_->notify();
    const int n = size();
    auto ready = [&] {
      for (int j = 0; j < n; ++j) {
        if (seg_->slot(j).step.load(std::memory_order_acquire) < s) return false;
      }
      return true;
    };
    if (ready()) return;
    await(
        ready, op,
        [&] {
          std::vector<int> b;
          for (int j = 0; j < n; ++j) {
            if (seg_->slot(j).step.load(std::memory_order_acquire) < s) b.push_back(j);
          }
          return b;
        },
        what);
  }

  // ShmTransport: what the algorithms see of the segment.
  int rank() const override { return OrderedEngine::rank(); }
  int size() const override { return OrderedEngine::size(); }
  uint64_t next_use() override { return ++use_; }
  char* buffer(int r, uint64_t use) override { return seg_->data(r, use); }
  void enter(const Op& op, uint64_t use) override { enter_call(op, use, 0); }

  // The first step of a collective: publishes the call (and a split's key) and compares every
  // rank's.
  void enter_call(const Op& op, uint64_t use, int64_t key) {
    ShmArea& a = area(rank(), use);
    a.sig = op.sig;
    a.key = key;
    step_all(op, "never arrived");
    std::vector<CallSig> sigs(static_cast<size_t>(size()));
    for (int j = 0; j < size(); ++j) sigs[static_cast<size_t>(j)] = area(j, use).sig;
    const std::string mm = detail::mismatch_message(name(), sigs);
    if (!mm.empty()) throw CommError(mm);
  }

  std::vector<int64_t> exchange_words(const Op& op, const std::vector<int64_t>& mine) override {
    const size_t bytes = mine.size() * sizeof(int64_t);
    MESHRT_CHECK(bytes <= kChunk,
                 "shm: the data check's " << mine.size() << " words do not fit one buffer");
    const uint64_t use = ++use_;
    if (bytes > 0) std::memcpy(seg_->data(rank(), use), mine.data(), bytes);
    step_all(op, "never reached the data check");
    std::vector<int64_t> all(mine.size() * static_cast<size_t>(size()));
    for (int j = 0; j < size(); ++j) {
      if (bytes > 0)
        std::memcpy(all.data() + mine.size() * static_cast<size_t>(j), seg_->data(j, use), bytes);
    }
    return all;
  }

  void barrier(const CommCall&, const Op& op) override { enter(op, ++use_); }

  // Group rank r's shared block `id` (its descriptor `fd` in r's process) mapped here, or null
  // when it cannot be (another user's process, /proc hidden): the caller falls back to copies.
  char* map_peer_block(int r, int fd, uint64_t id, uint64_t bytes) {
    const auto key = std::make_pair(r, id);
    if (auto it = peer_maps_.find(key); it != peer_maps_.end()) {
      it->second.used = map_calls_;
      return static_cast<char*>(it->second.base);
    }
    const pid_t pid = peers_->pid(world_[static_cast<size_t>(r)]);
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    const int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (f < 0) {
      MESHRT_LOG_DEBUG("shm: cannot open " << path << " (errno " << errno << "): copies instead");
      return nullptr;
    }
    struct stat st {};
    void* p = MAP_FAILED;
    if (fstat(f, &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes)
      p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    close(f);
    if (p == MAP_FAILED) return nullptr;
    if (peer_maps_.size() >= kMaxPeerMaps) {
      // Unmaps the least recently used block that this call does not use.
      auto lru = peer_maps_.end();
      for (auto it = peer_maps_.begin(); it != peer_maps_.end(); ++it)
        if (it->second.used < map_calls_ &&
            (lru == peer_maps_.end() || it->second.used < lru->second.used))
          lru = it;
      if (lru != peer_maps_.end()) {
        munmap(lru->second.base, lru->second.bytes);
        peer_maps_.erase(lru);
      }
    }
    peer_maps_[key] = {p, static_cast<size_t>(bytes), map_calls_};
    return static_cast<char*>(p);
  }

  // Publishes where this rank's input and output lie in shared host memory (ok = 0 when not).
  static ShmBuffers shared_buffers(const CommCall& c, size_t in_bytes, size_t out_bytes) {
    ShmBuffers b{};
    SharedHostRange in{}, out{};
    b.ok = shared_host_memory_enabled() && find_shared_host_range(c.in.data_ptr(), in_bytes, &in) &&
           find_shared_host_range(c.out.data_ptr(), out_bytes, &out);
    if (!b.ok) return b;
    b.fd[0] = in.fd, b.fd[1] = out.fd;
    b.id[0] = in.id, b.id[1] = out.id;
    b.block[0] = in.block_bytes, b.block[1] = out.block_bytes;
    b.offset[0] = in.offset, b.offset[1] = out.offset;
    return b;
  }

  // Every rank's input and output, mapped here, when they all lie in shared host memory and
  // every rank could map every peer's (two steps: publish, agree); empty otherwise, the same on
  // every rank, which then run the copying algorithm.
  bool map_all_buffers(const CommCall& c, const Op& op, size_t in_bytes, size_t out_bytes,
                       std::vector<char*>& ins, std::vector<char*>& outs) override {
    const int n = size();
    ins.assign(static_cast<size_t>(n), nullptr);
    outs.assign(static_cast<size_t>(n), nullptr);
    const uint64_t use = ++use_;
    ++map_calls_;
    area(rank(), use).bufs = shared_buffers(c, in_bytes, out_bytes);
    enter(op, use);
    for (int j = 0; j < n; ++j)
      if (!area(j, use).bufs.ok) return false;
    bool mapped = true;
    for (int j = 0; j < n && mapped; ++j) {
      const ShmBuffers& b = area(j, use).bufs;
      if (j == rank()) {
        ins[static_cast<size_t>(j)] = static_cast<char*>(c.in.data_ptr());
        outs[static_cast<size_t>(j)] = static_cast<char*>(c.out.data_ptr());
        continue;
      }
      char* i = map_peer_block(j, b.fd[0], b.id[0], b.block[0]);
      char* o = i ? map_peer_block(j, b.fd[1], b.id[1], b.block[1]) : nullptr;
      mapped = i && o;
      if (mapped) {
        ins[static_cast<size_t>(j)] = i + b.offset[0];
        outs[static_cast<size_t>(j)] = o + b.offset[1];
      }
    }
    const uint64_t use2 = ++use_;
    area(rank(), use2).ok = mapped ? 1 : 0;
    step_all(op, "stalled inside the collective");
    for (int j = 0; j < n; ++j)
      if (!area(j, use2).ok) return false;
    return true;
  }

  // The table's choice (collectives/algorithms/): one_step, zero_copy (staged where the buffers
  // are not all shared) or staged (collectives/algorithms/one_step.cpp, zero_copy.cpp,
  // staged.cpp), over this engine's segment.
  void all_reduce(const CommCall& c, const Op& op) override {
    const size_t es = dtype_size(c.dtype);
    if (size() == 1) {
      if (!c.in_place && c.count > 0)
        std::memcpy(c.out.data_ptr(), c.in.data_ptr(), static_cast<size_t>(c.count) * es);
      return;
    }
    const detail::Algorithm* algo =
        plan_.pick(CommOp::AllReduce, c.count * static_cast<int64_t>(es));
    if (algo == &detail::algos::zero_copy && detail::zero_copy_all_reduce(*this, c, op)) return;
    // one_step's capacity is one buffer (longer messages are staged)
    if (algo == &detail::algos::one_step && c.count <= static_cast<int64_t>(kChunk / es))
      return detail::one_step_all_reduce(*this, c, op);
    detail::staged_all_reduce(*this, c, op);
  }

  void reduce_scatter(const CommCall& c, const Op& op) override {
    const int64_t bytes = c.count * static_cast<int64_t>(dtype_size(c.dtype)) * size();
    if (plan_.pick(CommOp::ReduceScatter, bytes) == &detail::algos::zero_copy &&
        detail::zero_copy_reduce_scatter(*this, c, op))
      return;
    detail::staged_reduce_scatter(*this, c, op);
  }

  void all_gather(const CommCall& c, const Op& op) override {
    const int64_t bytes = c.count * static_cast<int64_t>(dtype_size(c.dtype)) * size();
    if (plan_.pick(CommOp::AllGather, bytes) == &detail::algos::zero_copy &&
        detail::zero_copy_all_gather(*this, c, op))
      return;
    detail::staged_all_gather(*this, c, op);
  }

  void broadcast(const CommCall& c, const Op& op) override {
    detail::staged_broadcast(*this, c, op);
  }
  void all_to_all(const CommCall& c, const Op& op) override {
    detail::staged_all_to_all(*this, c, op);
  }

  std::string p2p_mismatch(const ShmMail& m, int sender, int receiver, uint64_t k) const {
    std::ostringstream os;
    os << "send/recv mismatch on group '" << name() << "': rank " << sender << " sends "
       << dtype_name(static_cast<DType>(m.dtype)) << " count=" << m.count << " to rank " << receiver
       << " (message #" << k << " between them) but rank " << receiver << " receives "
       << dtype_name(static_cast<DType>(m.want_dtype)) << " count=" << m.want_count;
    return os.str();
  }

  // Waits until `ready()`, watching `peer` (the one rank a point-to-point wait depends on).
  template <class Ready>
  void await_peer(Ready ready, const Op& op, int peer, const char* what) {
    if (ready()) return;
    await(
        ready, op, [&] { return ready() ? std::vector<int>{} : std::vector<int>{peer}; }, what);
  }

  // Chunk by chunk through the pair's mailbox; completes once the peer took the last chunk.
  void send(const CommCall& c, const Op& op) override {
    ShmMail& m = seg_->mail(rank(), c.peer);
    char* box = seg_->mail_data(rank(), c.peer);
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    const char* src = static_cast<const char*>(c.in.data_ptr());
    uint64_t posted = m.posted.load(std::memory_order_relaxed);  // only this rank writes it
    auto taken_all = [&] { return m.taken.load(std::memory_order_acquire) >= posted; };
    for (size_t off = 0, i = 0; i == 0 || off < bytes; ++i) {
      await_peer(taken_all, op, c.peer, "never posted the matching recv");
      if (i > 0 && m.bad_msg == c.seq) throw CommError(p2p_mismatch(m, rank(), c.peer, c.seq));
      if (i == 0) {
        m.msg = c.seq;
        m.count = c.count;
        m.dtype = static_cast<int32_t>(c.dtype);
      }
      const size_t len = std::min(kMailBytes, bytes - off);
      if (len > 0) std::memcpy(box, src + off, len);
      m.posted.store(++posted, std::memory_order_release);
      seg_->notify();
      off += len;
    }
    await_peer(taken_all, op, c.peer, "never received it");
    if (m.bad_msg == c.seq) throw CommError(p2p_mismatch(m, rank(), c.peer, c.seq));
  }

  void recv(const CommCall& c, const Op& op) override {
    ShmMail& m = seg_->mail(c.peer, rank());
    const char* box = seg_->mail_data(c.peer, rank());
    const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
    char* dst = static_cast<char*>(c.out.data_ptr());
    uint64_t taken = m.taken.load(std::memory_order_relaxed);  // only this rank writes it
    auto posted_next = [&] { return m.posted.load(std::memory_order_acquire) > taken; };
    for (size_t off = 0, i = 0; i == 0 || off < bytes; ++i) {
      await_peer(posted_next, op, c.peer, "never posted the matching send");
      if (i == 0 && (m.count != c.count || m.dtype != static_cast<int32_t>(c.dtype))) {
        m.want_count = c.count;
        m.want_dtype = static_cast<int32_t>(c.dtype);
        m.bad_msg = c.seq;
        const std::string msg = p2p_mismatch(m, c.peer, rank(), c.seq);
        m.taken.store(++taken, std::memory_order_release);
        seg_->notify();
        throw CommError(msg);
      }
      const size_t len = std::min(kMailBytes, bytes - off);
      if (len > 0) std::memcpy(dst + off, box, len);
      m.taken.store(++taken, std::memory_order_release);
      seg_->notify();
      off += len;
    }
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& new_name,
                                      const Op& op) override;
};

void set_status(ShmArea& a, const std::string& err) {
  a.ok = err.empty() ? 1 : 0;
  const size_t len = std::min(err.size(), kStatusBytes - 1);
  std::memcpy(a.status, err.data(), len);
  a.status[len] = '\0';
}

// Three uses of the parent's segment: the calls (colour and key) are published and compared;
// each colour's leader (its lowest key) creates the group's segment; the other members map it,
// and once every member did, the leader unlinks it.
std::unique_ptr<Communicator> ShmEngine::split(int color, int key, const std::string& new_name,
                                               const Op& op) {
  const uint64_t use1 = ++use_;
  enter_call(op, use1, key);  // CallSig::matches ignores the colour, which differs between ranks
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
  for (int j = 0; j < size(); ++j) {
    const ShmArea& a = area(j, use1);
    if (color >= 0 && a.sig.color == color) members.push_back({a.key, j});
  }
  std::sort(members.begin(), members.end());
  const int leader = color >= 0 ? members.front().second : -1;
  int new_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank()) new_rank = static_cast<int>(i);
  }
  std::string name;
  if (leader >= 0) {
    const std::string what =
        seg_->name() + ":" + std::to_string(op.seq()) + ":" + std::to_string(color);
    name = "/" + std::string(kNamePrefix) +
           std::to_string(peers_->pid(world_[static_cast<size_t>(leader)])) + "-" + token_ + "-" +
           hex64(fnv1a(what));
  }
  std::shared_ptr<Segment> ns;
  std::string err;
  const uint64_t use2 = ++use_;
  if (leader == rank()) {
    try {
      ns = Segment::create(name, static_cast<int>(members.size()));
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  set_status(area(rank(), use2), err);
  step_all(op, "stalled inside the split");
  if (leader >= 0 && leader != rank()) {
    const ShmArea& la = area(leader, use2);
    if (!la.ok) {
      err = "its leader could not create the segment: " + std::string(la.status);
    } else {
      try {
        ns = Segment::open(name, static_cast<int>(members.size()));
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
  }
  const uint64_t use3 = ++use_;
  set_status(area(rank(), use3), err);
  step_all(op, "stalled inside the split");
  if (leader == rank() && ns) ns->unlink();  // every member mapped it, or failed to
  for (const auto& m : members) {
    const ShmArea& a = area(m.second, use3);
    if (!a.ok) {
      throw CommError("split of group '" + this->name() + "' into '" + new_name + "' failed on " +
                      rank_label(m.second) + ": " + a.status);
    }
  }
  if (color < 0) return nullptr;
  std::vector<int> world;
  for (const auto& m : members) world.push_back(world_[static_cast<size_t>(m.second)]);
  return make(std::make_shared<ShmEngine>(std::move(ns), world_seg_, peers_, std::move(world),
                                          new_rank, new_name, config(), token_, labels_));
}

std::string random_token() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(detail::Clock::now().time_since_epoch().count());
  return hex64(((static_cast<uint64_t>(rd()) << 32) ^ rd()) ^ (t * 0x9e3779b97f4a7c15ull));
}

// Every rank's pid from the rendezvous's answers ("<pid>", or "!<why it could not map>").
std::vector<pid_t> pids_of(const std::vector<std::string>& answers) {
  std::vector<pid_t> pids;
  for (size_t j = 0; j < answers.size(); ++j) {
    const std::string& a = answers[j];
    if (!a.empty() && a[0] == '!') {
      throw CommError("shm: rank " + std::to_string(j) +
                      " could not map the job's shared-memory segment: " + a.substr(1));
    }
    char* end = nullptr;
    const long pid = std::strtol(a.c_str(), &end, 10);
    MESHRT_CHECK(!a.empty() && *end == '\0' && pid > 0,
                 "shm: rank " << j << " answered '" << a << "' at the rendezvous, not a pid "
                              << "(ranks of different meshrt versions?)");
    pids.push_back(static_cast<pid_t>(pid));
  }
  return pids;
}

std::string shm_refuses(const WorldPlan& plan) {
  if (plan.device_type != DeviceType::CPU) {
    return "it moves CPU tensors; CUDA devices need a GPU backend (nccl)";
  }
  if (plan.kind == LaunchKind::Threads) {
    return "its ranks are processes; ranks that are threads of one process share memory already "
           "(host backend)";
  }
  if (plan.world_size <= 1) return "a single process has no peer to share memory with";
  const int local = plan.local.empty() ? 0 : plan.local[0].local_size;
  if (local != plan.world_size) {
    return "its ranks share one node's memory, but only " + std::to_string(local) + " of the " +
           std::to_string(plan.world_size) +
           " processes run on this node: use the mpi backend across nodes";
  }
  return "";
}

WorldFactory shm_prepare(const WorldPlan& plan) {
  MESHRT_CHECK(
      plan.transport != nullptr,
      "shm backend: " << plan.str() << " has no rendezvous to share the segment's name through");
  BootstrapTransport* tr = plan.transport;
  const CommConfig cfg = plan.config;
  return [tr, cfg](int) { return make_shm_world_communicator(*tr, cfg); };
}

}  // namespace

std::unique_ptr<Communicator> make_shm_world_communicator(BootstrapTransport& tr, CommConfig config,
                                                          std::vector<int> global_ranks,
                                                          std::string group) {
  const int n = tr.size(), r = tr.rank();
  std::shared_ptr<Segment> seg;
  std::string answer;
  if (r == 0) {
    detail::shm_remove_stale_segments();
    try {
      seg = Segment::create(segment_name(random_token()), n);
      answer = seg->name();
    } catch (const std::exception& e) {
      answer = "!" + std::string(e.what());
    }
  }
  // Rank 0 unlinks the name on every way out: once every rank mapped it, or on failure.
  struct Unlink {
    std::shared_ptr<Segment>& s;
    ~Unlink() {
      if (s) s->unlink();
    }
  } unlink_on_exit{seg};
  const std::vector<std::string> names = tr.all_gather("shm.segment", answer);
  const std::string& name = names[0];
  if (name.empty() || name[0] == '!') {
    throw CommError("shm: rank 0 could not create the job's shared-memory segment: " +
                    (name.empty() ? std::string("no name received") : name.substr(1)));
  }
  std::string mine = std::to_string(getpid());
  if (r != 0) {
    try {
      seg = Segment::open(name, n);
    } catch (const std::exception& e) {
      mine = "!" + std::string(e.what());
    }
  }
  const std::vector<pid_t> pids = pids_of(tr.all_gather("shm.mapped", mine));
  if (seg) seg->unlink();
  std::vector<int> world(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) world[static_cast<size_t>(j)] = j;
  const std::string token = name.substr(std::strlen(kNamePrefix) + 1);
  std::shared_ptr<const std::vector<int>> labels;
  if (!global_ranks.empty()) {
    MESHRT_CHECK(static_cast<int>(global_ranks.size()) == n,
                 "shm: " << global_ranks.size() << " global ranks for " << n << " processes");
    labels = std::make_shared<const std::vector<int>>(std::move(global_ranks));
  }
  auto e = std::make_shared<ShmEngine>(seg, seg, std::make_shared<Peers>(pids), std::move(world), r,
                                       std::move(group), config, token, std::move(labels));
  return ShmEngine::make(std::move(e));
}

namespace detail {

std::vector<std::string> shm_remove_stale_segments() {
  std::vector<std::string> removed;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return removed;
  const size_t plen = std::strlen(kNamePrefix);
  while (const dirent* e = readdir(d)) {
    const std::string nm = e->d_name;
    if (nm.compare(0, plen, kNamePrefix) != 0) continue;
    const char* p = nm.c_str() + plen;
    char* end = nullptr;
    const long pid = std::strtol(p, &end, 10);
    if (end == p || *end != '-' || pid <= 0) continue;
    // Alive, or not ours to judge (EPERM): left alone.
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (shm_unlink(("/" + nm).c_str()) == 0) removed.push_back(nm);
  }
  closedir(d);
  if (!removed.empty()) {
    MESHRT_LOG_INFO("shm: removed " << removed.size()
                                    << " stale segment(s) of killed jobs from /dev/shm");
  }
  return removed;
}

void register_shm_backend(std::vector<CommBackend>& registry) {
  add_collective_backend(registry, {"shm", 25, shm_refuses, shm_prepare});
}

}  // namespace detail

}  // namespace meshrt
