#include "collectives/host_comm.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <sched.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/host_transport.h"
#include "collectives/backend_registry.h"
#include "collectives/comm_detail.h"
#include "collectives/flight.h"
#include "collectives/host_reduce.h"
#include "collectives/ordered_comm.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace {

using detail::CallSig;
using detail::Deadline;
using detail::Op;

using detail::cpu_relax;

// A futex word that waiters sleep on and that every state change bumps. Waiters announce
// themselves in `sleepers` so that notify() costs no system call when nobody sleeps.
class WakeWord {
 public:
  void notify() {
    word_.fetch_add(1);
    if (sleepers_.load() > 0) wake_all();
  }
  uint32_t snapshot() const { return word_.load(); }
  void begin_sleep() { sleepers_.fetch_add(1); }
  void end_sleep() { sleepers_.fetch_sub(1); }
  // Sleeps while the word still equals `seen`, at most `max_s` seconds.
  void sleep(uint32_t seen, double max_s) {
#if defined(__linux__)
    if (max_s < 0) max_s = 0;
    timespec ts;
    ts.tv_sec = static_cast<time_t>(max_s);
    ts.tv_nsec = static_cast<long>((max_s - static_cast<double>(ts.tv_sec)) * 1e9);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr,
            0);
#else
    (void)seen;
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>(std::min(max_s, 0.0002) * 1e6)));
#endif
  }

 private:
  void wake_all() {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
#endif
  }
  alignas(64) std::atomic<uint32_t> word_{0};
  alignas(64) std::atomic<int> sleepers_{0};
};

class HostGroup;

// All groups split (transitively) from one world: a timeout or an error aborts all of them,
// since a rank stuck in one group usually stalls the others too.
class HostFamily {
 public:
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reason_;
  }
  void add(const std::shared_ptr<HostGroup>& g) {
    std::lock_guard<std::mutex> lk(mu_);
    groups_.push_back(g);
  }
  void abort(const std::string& why);

 private:
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
  std::vector<std::weak_ptr<HostGroup>> groups_;
};

// What a rank published for the collective it entered.
struct Desc {
  CallSig sig;
  const void* in = nullptr;
  void* out = nullptr;
  int key = 0;
};

struct alignas(64) Slot {
  std::atomic<uint64_t> arrived{0};               // seq of the collective this rank entered
  alignas(64) std::atomic<uint64_t> progress{0};  // (seq << 32) | steps done in that collective
  alignas(64) std::atomic<uint64_t> left{0};      // seq of the collective this rank finished
  alignas(64) Desc desc;
  // The data check's exchange (MESHRT_COMM_DEBUG=1): the words this rank posted for collective
  // `posted`, and the seq whose words it finished reading.
  alignas(64) std::atomic<uint64_t> posted{0};
  alignas(64) std::atomic<uint64_t> read{0};
  const std::vector<int64_t>* words = nullptr;
  std::shared_ptr<HostGroup> split_out;  // set by a split leader for its colour
  // A small all-reduce's input, copied here as the rank enters (two, by the seq's parity): the
  // peers read the copy, not the caller's buffer, so the rank leaves without waiting for them.
  alignas(64) unsigned char eager[2][detail::kHostEagerBytes];
};

// One direction of a rank pair: the sender posts, the receiver copies and takes.
struct alignas(64) Mailbox {
  std::atomic<uint64_t> posted{0};
  std::atomic<uint64_t> taken{0};
  const void* ptr = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
  // Filled by the receiver before `taken`: what it expected, and whether that matched.
  int64_t want_count = 0;
  DType want_dtype = DType::f32;
  bool matched = true;
};

class HostGroup : public std::enable_shared_from_this<HostGroup> {
 public:
  HostGroup(int n, std::string name, std::shared_ptr<HostFamily> family, CommConfig cfg,
            std::vector<int> world_ranks)
      : n_(n),
        name_(std::move(name)),
        family_(std::move(family)),
        cfg_(cfg),
        world_ranks_(std::move(world_ranks)),
        slots_(new Slot[static_cast<size_t>(n)]),
        mail_(new Mailbox[static_cast<size_t>(n) * static_cast<size_t>(n)]) {
    // Waiting: spin briefly (a peer that is running arrives within microseconds), then yield
    // for a while (on a busy machine this hands the core to the rank being waited for, which
    // beats spinning by an order of magnitude), then sleep on the futex. Spinning is skipped when
    // there are more ranks than cores. MESHRT_HOST_SPIN (pause iterations) and
    // MESHRT_HOST_YIELD_US tune the two phases.
    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    spin_ = static_cast<unsigned>(n) <= hw ? 128 : 0;
    spin_ = static_cast<unsigned>(env_int("MESHRT_HOST_SPIN", spin_));
    if (const int64_t us = env_int("MESHRT_HOST_YIELD_US", -1); us >= 0) yield_s_ = us * 1e-6;
  }

  // `world_ranks`: each member's rank in the family's root group (empty: this is the root).
  static std::shared_ptr<HostGroup> create(int n, std::string name,
                                           std::shared_ptr<HostFamily> family, CommConfig cfg,
                                           std::vector<int> world_ranks = {}) {
    auto g = std::make_shared<HostGroup>(n, std::move(name), family, cfg, std::move(world_ranks));
    family->add(g);
    return g;
  }

  int size() const { return n_; }
  const std::string& name() const { return name_; }
  const CommConfig& config() const { return cfg_; }
  bool is_root() const { return world_ranks_.empty(); }
  // Member r's rank in the root group of its family (the global rank on the threads backend).
  int world_rank(int r) const {
    return world_ranks_.empty() ? r : world_ranks_[static_cast<size_t>(r)];
  }
  HostFamily& family() { return *family_; }
  const std::shared_ptr<HostFamily>& family_ptr() const { return family_; }
  Slot& slot(int r) { return slots_[static_cast<size_t>(r)]; }
  Mailbox& mailbox(int src, int dst) {
    return mail_[static_cast<size_t>(src) * static_cast<size_t>(n_) + static_cast<size_t>(dst)];
  }
  void notify() { wake_.notify(); }

  // Waits until ready() holds. Spins briefly, yields, then sleeps on the futex word. Throws
  // CommError when the family is aborted, or, after aborting it, when `deadline` passes
  // (on_timeout() returns the message).
  template <class Ready, class Context, class OnTimeout>
  void wait(Ready ready, const Deadline& deadline, Context context, OnTimeout on_timeout) {
    for (unsigned i = 0; i < spin_; ++i) {
      if (ready()) return;
      cpu_relax();
    }
    const auto yield_until =
        detail::Clock::now() + std::chrono::duration_cast<detail::Clock::duration>(
                                   std::chrono::duration<double>(yield_s_));
    for (;;) {
      if (ready()) return;
      if (family_->aborted()) throw_aborted(context());
      if (deadline.passed()) {
        std::string msg = on_timeout();
        family_->abort(msg);
        throw CommError(msg);
      }
      if (detail::Clock::now() < yield_until) {
        sched_yield();
        continue;
      }
      uint32_t seen = wake_.snapshot();
      wake_.begin_sleep();
      if (ready() || family_->aborted()) {
        wake_.end_sleep();
        continue;
      }
      wake_.sleep(seen, std::min(0.05, std::max(0.0, deadline.left_s())));
      wake_.end_sleep();
    }
  }

  [[noreturn]] void throw_aborted(const std::string& context) {
    throw CommError(context + " failed: the communicator was aborted: " + family_->reason());
  }

 private:
  int n_;
  std::string name_;
  std::shared_ptr<HostFamily> family_;
  CommConfig cfg_;
  std::vector<int> world_ranks_;
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<Mailbox[]> mail_;
  WakeWord wake_;
  unsigned spin_;
  double yield_s_ = 50e-6;
};

void HostFamily::abort(const std::string& why) {
  std::vector<std::shared_ptr<HostGroup>> live;
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_.load()) {
      reason_ = why;
      aborted_.store(true, std::memory_order_release);
      first = true;
      // Not an error line: the failure that caused it reaches the caller as an exception and is
      // reported once there (the CLI's exit message).
      MESHRT_LOG_DEBUG("host communicators aborted: " << why);
    }
    for (auto& w : groups_) {
      if (auto g = w.lock()) live.push_back(std::move(g));
    }
  }
  for (auto& g : live) g->notify();
  if (first) {
    // Every rank thread's record, as it stood when the first rank gave up.
    detail::flight_dump_all(why);
  }
}

constexpr int kStepBits = 24;  // progress = (seq << kStepBits) | steps

// One rank's side of a host group: the transport (the shared slots and mailboxes) and the wiring;
// the collectives' algorithms run over its HostTransport side (collectives/algorithms/).
class HostEngine final : public detail::OrderedEngine, public detail::HostTransport {
 public:
  HostEngine(std::shared_ptr<HostGroup> group, int r, Device d)
      : OrderedEngine(r, group->size(), group->name(), group->config()),
        g(std::move(group)),
        dev(d),
        plan_(detail::AlgoWorld{"host", size(), 1}, config().algo) {
    MESHRT_CHECK(detail::algos::eager.capacity <= static_cast<int64_t>(detail::kHostEagerBytes),
                 "internal: the eager algorithm's capacity exceeds the slots' eager buffers");
  }

  std::string_view backend() const override { return "host"; }
  bool aborted() const override { return g->family().aborted(); }
  std::string abort_reason() const override { return g->family().reason(); }
  void abort_group(const std::string& why) override { g->family().abort(why); }

 private:
  std::shared_ptr<HostGroup> g;
  Device dev;
  detail::AlgoPlan plan_;  // which algorithm runs each call (collectives/algorithms/)
  // The seq of an eager all-reduce this rank left without waiting for the others (0: none).
  uint64_t eager_left_ = 0;

  void barrier(const CommCall& c, const Op& op) override {
    enter(op.sig, nullptr, nullptr, 0, op);
    leave(c.seq, op);
  }

  // Publishes this rank's call and waits until every rank entered the same collective; then
  // compares the calls (always: it costs nothing here, and a mismatch would read out of bounds).
  // `eager_bytes` > 0: copies that much of `in` into this rank's eager buffer for the peers.
  void enter(const CallSig& sig, const void* in, void* out, int key, const Op& op,
             size_t eager_bytes = 0) {
    const uint64_t seq = static_cast<uint64_t>(sig.seq);
    const int n = g->size();
    Slot& me = g->slot(rank());
    // After an eager all-reduce this rank left without waiting: before it overwrites what the
    // peers read there (its call, its eager buffer), each must have left that collective.
    if (eager_left_ != 0) {
      await_all(&Slot::left, eager_left_, op, "did not finish the previous collective");
      eager_left_ = 0;
    }
    if (eager_bytes > 0) std::memcpy(me.eager[seq & 1], in, eager_bytes);
    me.desc.sig = sig;
    me.desc.in = in;
    me.desc.out = out;
    me.desc.key = key;
    me.arrived.store(seq);
    g->notify();
    await_all(&Slot::arrived, seq, op, "never arrived");
    std::vector<CallSig> sigs(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) sigs[static_cast<size_t>(j)] = g->slot(j).desc.sig;
    std::vector<int> globals;
    if (!g->is_root())
      for (int j = 0; j < n; ++j) globals.push_back(g->world_rank(j));
    std::string mm = detail::mismatch_message(g->name(), sigs, globals);
    if (!mm.empty()) {
      // Everyone sees the same calls and fails the same way; leave together so that the next
      // collective starts from a clean state.
      leave(seq, op);
      throw CommError(mm);
    }
  }

  std::vector<int64_t> exchange_words(const Op& op, const std::vector<int64_t>& mine) override {
    const uint64_t seq = op.seq();
    const int n = g->size();
    Slot& me = g->slot(rank());
    me.words = &mine;
    me.posted.store(seq);
    g->notify();
    await_all(&Slot::posted, seq, op, "never reached the data check");
    std::vector<int64_t> all;
    all.reserve(mine.size() * static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      const std::vector<int64_t>& w = *g->slot(j).words;
      all.insert(all.end(), w.begin(), w.end());
    }
    // `mine` lives on this rank's stack frame: wait until every rank has read it.
    me.read.store(seq);
    g->notify();
    await_all(&Slot::read, seq, op, "did not finish the data check");
    return all;
  }

  // HostTransport: what the algorithms see of the slots.
  int rank() const override { return OrderedEngine::rank(); }
  int size() const override { return OrderedEngine::size(); }
  void enter(const Op& op, const void* in, void* out, size_t eager_bytes) override {
    enter(op.sig, in, out, 0, op, eager_bytes);
  }
  const void* peer_in(int j) const override { return g->slot(j).desc.in; }
  void* peer_out(int j) const override { return g->slot(j).desc.out; }
  const void* peer_eager(int j, uint64_t seq) const override { return g->slot(j).eager[seq & 1]; }
  void leave_early(uint64_t seq) override {
    g->slot(rank()).left.store(seq);
    g->notify();
    eager_left_ = seq;
  }

  // Waits until every rank finished this collective: after it, no rank reads our buffers.
  void leave(uint64_t seq, const Op& op) override {
    g->slot(rank()).left.store(seq);
    g->notify();
    await_all(&Slot::left, seq, op, "did not finish");
  }

  // Waits until every rank's `mark` reached `seq`; a timeout names the ranks that did not.
  void await_all(std::atomic<uint64_t> Slot::*mark, uint64_t seq, const Op& op, const char* what) {
    const int n = g->size();
    auto behind = [&](int j) { return (g->slot(j).*mark).load() < seq; };
    auto all_reached = [&] {
      for (int j = 0; j < n; ++j) {
        if (behind(j)) return false;
      }
      return true;
    };
    if (all_reached()) return;
    g->wait(
        all_reached, op.dl, [&] { return context(op); },
        [&] { return timeout(op, ranks_where(n, behind) + " " + what); });
  }

  // "rank 3" / "ranks 1, 2" in the root group, "rank 5 [group rank 1], rank 7 [group rank 2]"
  // in a split group: the ranks where `pred` holds.
  std::string ranks_where(int n, const std::function<bool(int)>& pred) const {
    std::vector<int> r;
    for (int j = 0; j < n; ++j) {
      if (pred(j)) r.push_back(j);
    }
    if (r.empty() || g->is_root()) return r.empty() ? std::string() : detail::format_ranks(r);
    std::string s;
    for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + rank_label(r[i]);
    return s;
  }

  std::string rank_label(int group_rank) const override {
    return detail::global_rank_label(g->world_rank(group_rank), group_rank, g->is_root());
  }

  void publish_progress(uint64_t seq, uint64_t steps) {
    g->slot(rank()).progress.store((seq << kStepBits) | steps);
    g->notify();
  }

  void wait_progress(int j, uint64_t seq, uint64_t steps, const Op& op) {
    const uint64_t want = (seq << kStepBits) | steps;
    Slot& s = g->slot(j);
    if (s.progress.load() >= want) return;
    g->wait([&] { return s.progress.load() >= want; }, op.dl, [&] { return context(op); },
            [&] {
              return timeout(op, rank_label(j) + " stalled inside the collective (step " +
                                     std::to_string(steps) + ")");
            });
  }

  // The table's choice (collectives/algorithms/): eager for small all-reduces, flat for the rest
  // (collectives/algorithms/eager.cpp, flat.cpp), over this engine's slots.
  void all_reduce(const CommCall& c, const Op& op) override {
    const int64_t bytes = c.count * static_cast<int64_t>(dtype_size(c.dtype));
    if (g->size() > 1 && c.count > 0 &&
        plan_.pick(CommOp::AllReduce, bytes) == &detail::algos::eager)
      return detail::eager_all_reduce(*this, c, op);
    detail::flat_all_reduce(*this, c, op);
  }
  void reduce_scatter(const CommCall& c, const Op& op) override {
    detail::flat_reduce_scatter(*this, c, op);
  }
  void all_gather(const CommCall& c, const Op& op) override {
    detail::flat_all_gather(*this, c, op);
  }
  void broadcast(const CommCall& c, const Op& op) override { detail::flat_broadcast(*this, c, op); }
  void all_to_all(const CommCall& c, const Op& op) override {
    detail::flat_all_to_all(*this, c, op);
  }

  std::string p2p_mismatch(const Mailbox& m, int sender, int receiver, uint64_t k) const {
    std::ostringstream os;
    os << "send/recv mismatch on group '" << g->name() << "': rank " << sender << " sends "
       << dtype_name(m.dtype) << " count=" << m.count << " to rank " << receiver << " (message #"
       << k << " between them) but rank " << receiver << " receives " << dtype_name(m.want_dtype)
       << " count=" << m.want_count;
    return os.str();
  }

  void send(const CommCall& c, const Op& op) override {
    Mailbox& m = g->mailbox(rank(), c.peer);
    const uint64_t k = c.seq;
    m.ptr = c.in.data_ptr();
    m.count = c.count;
    m.dtype = c.dtype;
    m.posted.store(k);
    g->notify();
    if (m.taken.load() < k) {
      g->wait([&] { return m.taken.load() >= k; }, op.dl, [&] { return context(op); },
              [&] { return timeout(op, rank_label(c.peer) + " never posted the matching recv"); });
    }
    if (!m.matched) throw CommError(p2p_mismatch(m, rank(), c.peer, k));
  }

  void recv(const CommCall& c, const Op& op) override {
    Mailbox& m = g->mailbox(c.peer, rank());
    const uint64_t k = c.seq;
    if (m.posted.load() < k) {
      g->wait([&] { return m.posted.load() >= k; }, op.dl, [&] { return context(op); },
              [&] { return timeout(op, rank_label(c.peer) + " never posted the matching send"); });
    }
    m.want_count = c.count;
    m.want_dtype = c.dtype;
    m.matched = m.count == c.count && m.dtype == c.dtype;
    if (m.matched && c.count > 0) {
      std::memcpy(c.out.data_ptr(), m.ptr, static_cast<size_t>(c.count) * dtype_size(c.dtype));
    }
    const bool ok = m.matched;
    std::string msg = ok ? std::string() : p2p_mismatch(m, c.peer, rank(), k);
    m.taken.store(k);
    g->notify();
    if (!ok) throw CommError(msg);
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      const Op& op) override {
    const uint64_t seq = op.seq();
    // CallSig::matches ignores the colour, which legitimately differs between ranks.
    enter(op.sig, nullptr, nullptr, key, op);
    const int n = g->size();
    Slot& me = g->slot(rank());
    std::vector<std::pair<int, int>> members;  // (key, old rank)
    for (int j = 0; j < n; ++j) {
      if (color >= 0 && g->slot(j).desc.sig.color == color) {
        members.push_back({g->slot(j).desc.key, j});
      }
    }
    std::sort(members.begin(), members.end());
    std::shared_ptr<HostGroup> ng;
    int new_rank = -1;
    int leader = -1;
    if (color >= 0) {
      leader = members.front().second;
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].second == rank()) new_rank = static_cast<int>(i);
      }
      if (leader == rank()) {
        std::vector<int> world;
        for (const auto& m : members) world.push_back(g->world_rank(m.second));
        me.split_out = HostGroup::create(static_cast<int>(members.size()), name, g->family_ptr(),
                                         g->config(), std::move(world));
        publish_progress(seq, 1);
        ng = me.split_out;
      } else {
        wait_progress(leader, seq, 1, op);
        ng = g->slot(leader).split_out;
      }
    }
    leave(seq, op);
    if (leader == rank()) me.split_out.reset();  // every member has its copy now
    if (!ng) return nullptr;
    return make_host_communicator(ng, new_rank, dev);
  }

 public:
  static std::unique_ptr<Communicator> make_host_communicator(std::shared_ptr<HostGroup> g,
                                                              int rank, Device dev) {
    return detail::make_ordered_communicator(std::make_shared<HostEngine>(std::move(g), rank, dev),
                                             dev);
  }
};

std::string host_refuses(const WorldPlan& plan) {
  if (plan.device_type != DeviceType::CPU) {
    return "it moves CPU tensors; CUDA devices need a GPU backend (nccl)";
  }
  if (plan.kind != LaunchKind::Threads && plan.world_size > 1) {
    return "it runs ranks as threads of one process, but this process is " + plan.str() +
           ": launch them with mpirun / srun (mpi backend), or run them as threads with " +
           plan.names.threads(plan.world_size);
  }
  return "";
}

WorldFactory host_prepare(const WorldPlan& plan) {
  auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(
      make_host_communicators(static_cast<int>(plan.local.size()), "world", plan.config));
  return [comms](int i) { return std::move((*comms)[static_cast<size_t>(i)]); };
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_host_communicators(int n, const std::string& name,
                                                                   CommConfig config) {
  MESHRT_CHECK(n >= 1, "make_host_communicators: need at least one rank, got " << n);
  auto family = std::make_shared<HostFamily>();
  auto g = HostGroup::create(n, name, family, config);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    comms.push_back(HostEngine::make_host_communicator(g, r, Device::cpu(r)));
  }
  return comms;
}

namespace detail {
void register_host_backend(std::vector<CommBackend>& registry) {
  add_collective_backend(registry, {"host", 10, host_refuses, host_prepare});
}
}  // namespace detail

}  // namespace meshrt
