#include "collectives/mpi_comm.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include "collectives/comm_detail.h"
#include "collectives/host_reduce.h"
#include "collectives/mpi_check.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt {

namespace detail {

[[noreturn]] void mpi_fail(const char* call, int rc, const char* file, int line) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  int cls = rc;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    MPI_Error_class(rc, &cls);
    MPI_Error_string(rc, buf, &len);
  } else {
    std::snprintf(buf, sizeof(buf), "MPI error %d", rc);
    len = static_cast<int>(std::strlen(buf));
  }
  const char* base = std::strrchr(file, '/');
  throw CommError(std::string(call) + " failed: " + std::string(buf, static_cast<size_t>(len)) +
                  " (MPI error class " + std::to_string(cls) + ") [" + (base ? base + 1 : file) +
                  ":" + std::to_string(line) + "]");
}

}  // namespace detail

namespace {

using detail::CallSig;
using detail::Deadline;

constexpr int kWatchSlots = 1024;  // communicators whose progress other local ranks can see
constexpr int kP2PTag = 0x6d72;
constexpr size_t kStageInPlaceBytes = size_t{1} << 20;

// Process-wide MPI state. Leaked on purpose: it is used by the exit handler.
struct MpiProcess {
  std::mutex mu;
  bool we_initialized = false;
  bool finalized = false;
  std::atomic<bool> aborted{false};
  std::string reason;
  // Buffers of requests that never completed: MPI may still write into them.
  std::vector<std::shared_ptr<void>> graveyard;
  // Node-shared words: for each process on this node, kWatchSlots "entered seq" counters, so a
  // rank that times out can tell which local peers never arrived.
  MPI_Comm node_comm = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  std::vector<uint64_t*> node_words;  // by node-local index
  std::vector<int> world_to_node;     // world rank -> node-local index, -1 on another node
  int my_node_index = -1;
  int next_slot = 0;
};

MpiProcess& proc() {
  static MpiProcess* p = new MpiProcess;
  return *p;
}

void process_abort(const std::string& why) {
  MpiProcess& p = proc();
  std::lock_guard<std::mutex> lk(p.mu);
  if (!p.aborted.load()) {
    p.reason = why;
    p.aborted.store(true);
    MESHRT_LOG_ERROR("MPI communicators aborted: " << why);
  }
}

std::string abort_reason_now() {
  MpiProcess& p = proc();
  std::lock_guard<std::mutex> lk(p.mu);
  return p.reason;
}

void bury(std::shared_ptr<void> keep) {
  MpiProcess& p = proc();
  std::lock_guard<std::mutex> lk(p.mu);
  p.graveyard.push_back(std::move(keep));
}

bool mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void setup_watch_window() {
  MpiProcess& p = proc();
  if (p.node_comm != MPI_COMM_NULL) return;
  try {
    MESHRT_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &p.node_comm));
    MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(p.node_comm, MPI_ERRORS_RETURN));
    int nl = 0, me = 0, world = 0, wrank = 0;
    MESHRT_MPI_CHECK(MPI_Comm_size(p.node_comm, &nl));
    MESHRT_MPI_CHECK(MPI_Comm_rank(p.node_comm, &me));
    MESHRT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MESHRT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &wrank));
    uint64_t* base = nullptr;
    MESHRT_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(kWatchSlots * sizeof(uint64_t)),
                                             sizeof(uint64_t), MPI_INFO_NULL, p.node_comm, &base,
                                             &p.win));
    std::memset(base, 0, kWatchSlots * sizeof(uint64_t));
    p.node_words.assign(static_cast<size_t>(nl), nullptr);
    for (int i = 0; i < nl; ++i) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* ptr = nullptr;
      MESHRT_MPI_CHECK(MPI_Win_shared_query(p.win, i, &sz, &disp, &ptr));
      p.node_words[static_cast<size_t>(i)] = static_cast<uint64_t*>(ptr);
    }
    std::vector<int> node_world(static_cast<size_t>(nl));
    MESHRT_MPI_CHECK(MPI_Allgather(&wrank, 1, MPI_INT, node_world.data(), 1, MPI_INT, p.node_comm));
    p.world_to_node.assign(static_cast<size_t>(world), -1);
    for (int i = 0; i < nl; ++i)
      p.world_to_node[static_cast<size_t>(node_world[static_cast<size_t>(i)])] = i;
    p.my_node_index = me;
  } catch (const std::exception& e) {
    // Without shared windows the watchdog still works; it just cannot name missing ranks.
    MESHRT_LOG_WARN("MPI watchdog: no node-shared window (" << e.what()
                                                            << "); timeouts will not name ranks");
    p.node_words.clear();
    p.world_to_node.clear();
  }
}

int int_count(int64_t n, const char* what) {
  MESHRT_CHECK(n <= INT_MAX, what << ": " << n << " elements exceed MPI's int count limit "
                                  << INT_MAX << "; split the tensor");
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;  // moved as bits; reduced through f32
    case DType::u8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

bool is_half(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

class MpiComm final : public Communicator {
 public:
  // Takes ownership of `comm`. Collective over its ranks.
  MpiComm(MPI_Comm comm, std::string name, CommConfig cfg)
      : Communicator(comm_rank(comm), comm_size(comm), name, Device::cpu(0), cfg),
        e_(std::make_shared<Engine>(comm, rank(), size(), std::move(name), cfg)) {}

  CommBackend backend() const override { return CommBackend::Mpi; }
  bool aborted() const override { return proc().aborted.load(); }
  std::string abort_reason() const override { return abort_reason_now(); }

 protected:
  void issue(Call call, Stream& stream) override {
    std::shared_ptr<Engine> e = e_;
    stream.enqueue([e, c = std::move(call)] { e->run(c); });
  }
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& name,
                                         uint64_t seq) override {
    return e_->split(color, key, name, seq);
  }
  void do_abort(const std::string& reason) override {
    process_abort("rank " + std::to_string(rank()) + " of group '" + name() + "': " + reason);
  }
  void wait_issued(uint64_t coll_seq, const std::unordered_map<int, uint64_t>& sent,
                   const std::unordered_map<int, uint64_t>& received) override {
    e_->orders.wait_issued(coll_seq, sent, received);
  }

 private:
  static int comm_rank(MPI_Comm c) {
    int r = 0;
    MESHRT_MPI_CHECK(MPI_Comm_rank(c, &r));
    return r;
  }
  static int comm_size(MPI_Comm c) {
    int s = 0;
    MESHRT_MPI_CHECK(MPI_Comm_size(c, &s));
    return s;
  }

  struct Engine {
    Engine(MPI_Comm c, int r, int n, std::string nm, CommConfig cf)
        : comm(c), rank(r), size(n), name(std::move(nm)), cfg(cf) {
      MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
      // Agree on a watch slot: the largest next free slot of any member.
      MpiProcess& p = proc();
      int mine = 0;
      {
        std::lock_guard<std::mutex> lk(p.mu);
        mine = p.next_slot;
      }
      int agreed = 0;
      MESHRT_MPI_CHECK(MPI_Allreduce(&mine, &agreed, 1, MPI_INT, MPI_MAX, comm));
      {
        std::lock_guard<std::mutex> lk(p.mu);
        p.next_slot = std::max(p.next_slot, agreed + 1);
      }
      slot = (agreed < kWatchSlots && !p.node_words.empty()) ? agreed : -1;
      MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
      MESHRT_MPI_CHECK(MPI_Comm_group(comm, &g));
      MESHRT_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
      std::vector<int> mine_ranks(static_cast<size_t>(size));
      for (int i = 0; i < size; ++i) mine_ranks[static_cast<size_t>(i)] = i;
      world_ranks.assign(static_cast<size_t>(size), -1);
      MESHRT_MPI_CHECK(
          MPI_Group_translate_ranks(g, size, mine_ranks.data(), wg, world_ranks.data()));
      MPI_Group_free(&g);
      MPI_Group_free(&wg);
    }
    ~Engine() {
      // A communicator with a pending request cannot be freed; after an abort leave it be.
      if (comm != MPI_COMM_NULL && mpi_live() && !proc().aborted.load()) MPI_Comm_free(&comm);
    }

    MPI_Comm comm;
    int rank;
    int size;
    std::string name;
    CommConfig cfg;
    int slot = -1;
    std::vector<int> world_ranks;
    detail::OrderBook orders;
    // Staging buffers kept between collectives: allocating (and first touching) large buffers
    // per call costs as much as the copy. Collectives run one at a time per rank, so a slot is
    // free when the next one starts; a request that never completes keeps its buffer (bury).
    std::shared_ptr<char> scratch_[2];
    size_t scratch_bytes_[2] = {0, 0};

    std::shared_ptr<char> scratch(int slot, size_t bytes) {
      if (scratch_bytes_[slot] < bytes) {
        char* p = static_cast<char*>(::operator new[](bytes, std::align_val_t{64}));
        scratch_[slot] =
            std::shared_ptr<char>(p, [](char* q) { ::operator delete[](q, std::align_val_t{64}); });
        scratch_bytes_[slot] = bytes;
      }
      return scratch_[slot];
    }

    std::string context(const std::string& call, uint64_t seq) const {
      return call + " on group '" + name + "' (seq " + std::to_string(seq) + ", rank " +
             std::to_string(rank) + ")";
    }

    void publish_entered(uint64_t seq) {
      MpiProcess& p = proc();
      if (slot < 0 || p.my_node_index < 0) return;
      __atomic_store_n(&p.node_words[static_cast<size_t>(p.my_node_index)][slot], seq,
                       __ATOMIC_RELEASE);
    }

    // Which ranks have not entered collective `seq`, as far as this node can see.
    std::string missing_ranks(uint64_t seq) const {
      MpiProcess& p = proc();
      if (slot < 0 || p.node_words.empty()) {
        return "which ranks never arrived is unknown (no node-shared window)";
      }
      std::vector<int> missing, remote;
      for (int j = 0; j < size; ++j) {
        int w = world_ranks[static_cast<size_t>(j)];
        int ni = (w >= 0 && static_cast<size_t>(w) < p.world_to_node.size())
                     ? p.world_to_node[static_cast<size_t>(w)]
                     : -1;
        if (ni < 0) {
          remote.push_back(j);
          continue;
        }
        uint64_t v =
            __atomic_load_n(&p.node_words[static_cast<size_t>(ni)][slot], __ATOMIC_ACQUIRE);
        if (v < seq) missing.push_back(j);
      }
      std::string s;
      if (!missing.empty()) s = detail::format_ranks(missing) + " never arrived";
      if (!remote.empty()) {
        s += (s.empty() ? "" : "; ") + detail::format_ranks(remote) +
             " run on other nodes (their state is unknown)";
      }
      if (s.empty()) s = "every rank entered it (one may be stuck inside it)";
      return s;
    }

    // Polls `req` until it completes, the communicators are aborted, or the deadline passes.
    // `keep` holds the buffers MPI uses; if the request never completes they are kept forever.
    void wait(MPI_Request* req, MPI_Status* st, const std::string& what, uint64_t seq,
              const Deadline& dl, const std::function<std::string()>& missing,
              const std::shared_ptr<void>& keep, int* rc_out = nullptr) {
      int done = 0;
      for (int64_t i = 0;; ++i) {
        int rc = MPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          if (rc_out) {
            *rc_out = rc;
            return;
          }
          detail::mpi_fail("MPI_Test", rc, __FILE__, __LINE__);
        }
        if (done) return;
        if (proc().aborted.load()) {
          bury(keep);
          throw CommError(context(what, seq) +
                          " failed: the communicators were aborted: " + abort_reason_now());
        }
        if (dl.passed()) {
          std::string msg = detail::timeout_message(what, name, seq, rank, cfg.timeout_s,
                                                    missing ? missing() : std::string());
          process_abort(msg);
          bury(keep);
          throw CommError(msg);
        }
        // MPI progresses only inside MPI calls: keep polling, but give the core away when
        // other threads or ranks want it, and back off on long waits.
        if (i < 1000) continue;
        if (i < 2000000) {
          sched_yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    }

    void wait_coll(MPI_Request* req, const std::string& what, uint64_t seq, const Deadline& dl,
                   const std::shared_ptr<void>& keep) {
      wait(
          req, nullptr, what, seq, dl, [this, seq] { return missing_ranks(seq); }, keep);
    }

    // Ranks compare their calls (always for ops whose per-rank counts must agree, every
    // collective under MESHRT_COMM_DEBUG=1): a mismatch raises on every rank alike.
    void compare_calls(const CallSig& mine, const std::string& what, uint64_t seq,
                       const Deadline& dl) {
      auto all = std::make_shared<std::vector<CallSig>>(static_cast<size_t>(size));
      auto me = std::make_shared<CallSig>(mine);
      MPI_Request req = MPI_REQUEST_NULL;
      MESHRT_MPI_CHECK(MPI_Iallgather(me.get(), CallSig::kWords, MPI_INT64_T, all->data(),
                                      CallSig::kWords, MPI_INT64_T, comm, &req));
      wait_coll(&req, what, seq, dl,
                std::make_shared<std::pair<decltype(all), decltype(me)>>(all, me));
      std::string mm = detail::mismatch_message(name, *all);
      if (!mm.empty()) throw CommError(mm);
    }

    void take_turn(detail::TicketOrder& order, const std::string& what, uint64_t seq,
                   const Deadline& dl) {
      if (!order.wait_turn(seq, dl)) {
        std::string msg = detail::timeout_message(
            what, name, seq, rank, cfg.timeout_s,
            "an earlier operation on this communicator never finished on this rank");
        process_abort(msg);
        throw CommError(msg);
      }
    }

    void run(const Call& c) {
      Deadline dl = Deadline::after(cfg.timeout_s);
      const std::string what = c.str();
      detail::TicketOrder& order = orders.order(c.op, c.peer);
      take_turn(order, what, c.seq, dl);
      detail::TicketGuard guard(order, c.seq);
      if (proc().aborted.load()) {
        throw CommError(context(what, c.seq) +
                        " failed: the communicators were aborted: " + abort_reason_now());
      }
      auto keep = std::make_shared<Call>(c);
      const bool p2p = c.op == CommOp::Send || c.op == CommOp::Recv;
      if (!p2p) {
        publish_entered(c.seq);
        const bool counts_matter =
            c.op == CommOp::AllGather || c.op == CommOp::ReduceScatter || c.op == CommOp::AllToAll;
        if (size > 1 && (cfg.debug || counts_matter)) {
          compare_calls(CallSig::make(c.op, c.dtype, c.redop, c.count, c.root, c.seq), what, c.seq,
                        dl);
        }
      }
      const size_t es = dtype_size(c.dtype);
      const MPI_Datatype t = mpi_type(c.dtype);
      MPI_Request req = MPI_REQUEST_NULL;
      void* out = c.out.defined() ? c.out.data_ptr() : nullptr;
      const void* in = c.in.defined() ? c.in.data_ptr() : nullptr;
      switch (c.op) {
        case CommOp::AllReduce: {
          const int n = int_count(c.count, "all_reduce");
          if (is_half(c.dtype)) {
            auto buf = scratch(0, static_cast<size_t>(n) * sizeof(float));
            float* tmp = reinterpret_cast<float*>(buf.get());
            detail::host_to_f32(c.dtype, in, tmp, n);
            MESHRT_MPI_CHECK(
                MPI_Iallreduce(MPI_IN_PLACE, tmp, n, MPI_FLOAT, mpi_op(c.redop), comm, &req));
            wait_coll(&req, what, c.seq, dl, buf);
            if (c.redop == ReduceOp::Avg) detail::host_divide(DType::f32, tmp, n, size);
            detail::host_from_f32(c.dtype, tmp, out, n);
          } else {
            // OpenMPI's non-blocking MPI_IN_PLACE all-reduce of large buffers is several times
            // slower than its out-of-place form (measured: bench/results/collectives-host.md),
            // so large in-place calls send from a staged copy instead.
            std::shared_ptr<char> stage;
            const void* src = c.in_place ? MPI_IN_PLACE : in;
            if (c.in_place && static_cast<size_t>(n) * es >= kStageInPlaceBytes) {
              stage = scratch(0, static_cast<size_t>(n) * es);
              std::memcpy(stage.get(), out, static_cast<size_t>(n) * es);
              src = stage.get();
            }
            MESHRT_MPI_CHECK(MPI_Iallreduce(src, out, n, t, mpi_op(c.redop), comm, &req));
            wait_coll(&req, what, c.seq, dl,
                      std::make_shared<std::pair<decltype(keep), decltype(stage)>>(keep, stage));
            if (c.redop == ReduceOp::Avg) detail::host_divide(c.dtype, out, n, size);
          }
          return;
        }
        case CommOp::ReduceScatter: {
          const int n = int_count(c.count, "reduce_scatter");
          int_count(c.count * size, "reduce_scatter");
          if (is_half(c.dtype)) {
            auto bin = scratch(0, static_cast<size_t>(c.count * size) * sizeof(float));
            auto bout = scratch(1, static_cast<size_t>(n) * sizeof(float));
            float* tin = reinterpret_cast<float*>(bin.get());
            float* tout = reinterpret_cast<float*>(bout.get());
            detail::host_to_f32(c.dtype, in, tin, c.count * size);
            MESHRT_MPI_CHECK(
                MPI_Ireduce_scatter_block(tin, tout, n, MPI_FLOAT, mpi_op(c.redop), comm, &req));
            wait_coll(&req, what, c.seq, dl,
                      std::make_shared<std::pair<decltype(bin), decltype(bout)>>(bin, bout));
            if (c.redop == ReduceOp::Avg) detail::host_divide(DType::f32, tout, n, size);
            detail::host_from_f32(c.dtype, tout, out, n);
          } else {
            // MPI's in-place form puts the result at the front of the buffer; ours is this
            // rank's block, so receive into a staging buffer instead.
            std::shared_ptr<char> stage;
            void* dst = out;
            if (c.in_place && n > 0) {
              stage = scratch(0, static_cast<size_t>(n) * es);
              dst = stage.get();
            }
            MESHRT_MPI_CHECK(MPI_Ireduce_scatter_block(in, dst, n, t, mpi_op(c.redop), comm, &req));
            wait_coll(&req, what, c.seq, dl,
                      std::make_shared<std::pair<decltype(keep), decltype(stage)>>(keep, stage));
            if (stage) std::memcpy(out, stage.get(), static_cast<size_t>(n) * es);
            if (c.redop == ReduceOp::Avg) detail::host_divide(c.dtype, out, n, size);
          }
          return;
        }
        case CommOp::AllGather: {
          const int n = int_count(c.count, "all_gather");
          int_count(c.count * size, "all_gather");
          if (c.in_place) {
            MESHRT_MPI_CHECK(
                MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, n, t, comm, &req));
          } else {
            MESHRT_MPI_CHECK(MPI_Iallgather(in, n, t, out, n, t, comm, &req));
          }
          wait_coll(&req, what, c.seq, dl, keep);
          return;
        }
        case CommOp::Broadcast: {
          const int n = int_count(c.count, "broadcast");
          if (rank == c.root && !c.in_place && n > 0)
            std::memcpy(out, in, static_cast<size_t>(n) * es);
          MESHRT_MPI_CHECK(MPI_Ibcast(out, n, t, c.root, comm, &req));
          wait_coll(&req, what, c.seq, dl, keep);
          return;
        }
        case CommOp::AllToAll: {
          const int n = int_count(c.count, "all_to_all");
          int_count(c.count * size, "all_to_all");
          std::shared_ptr<char> stage;
          const void* src = in;
          if (c.in_place && n > 0) {
            const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(size) * es;
            stage = scratch(0, bytes);
            std::memcpy(stage.get(), in, bytes);
            src = stage.get();
          }
          MESHRT_MPI_CHECK(MPI_Ialltoall(src, n, t, out, n, t, comm, &req));
          wait_coll(&req, what, c.seq, dl,
                    std::make_shared<std::pair<decltype(keep), decltype(stage)>>(keep, stage));
          return;
        }
        case CommOp::Barrier: {
          MESHRT_MPI_CHECK(MPI_Ibarrier(comm, &req));
          wait_coll(&req, what, c.seq, dl, keep);
          return;
        }
        case CommOp::Send: {
          const int n = int_count(c.count, "send");
          const std::string w =
              what + " to rank " + std::to_string(c.peer) + " (#" + std::to_string(c.seq) + ")";
          MESHRT_MPI_CHECK(MPI_Isend(in, n, t, c.peer, kP2PTag, comm, &req));
          wait(
              &req, nullptr, w, c.seq, dl,
              [&] { return "rank " + std::to_string(c.peer) + " never received it"; }, keep);
          return;
        }
        case CommOp::Recv: {
          const int n = int_count(c.count, "recv");
          const std::string w =
              what + " from rank " + std::to_string(c.peer) + " (#" + std::to_string(c.seq) + ")";
          MPI_Status st;
          int rc = MPI_SUCCESS;
          MESHRT_MPI_CHECK(MPI_Irecv(out, n, t, c.peer, kP2PTag, comm, &req));
          wait(
              &req, &st, w, c.seq, dl,
              [&] { return "rank " + std::to_string(c.peer) + " never sent it"; }, keep, &rc);
          int got = 0;
          if (rc == MPI_SUCCESS) MESHRT_MPI_CHECK(MPI_Get_count(&st, t, &got));
          if (rc != MPI_SUCCESS || got != n) {
            std::string sent =
                rc != MPI_SUCCESS ? "more than " + std::to_string(n) : std::to_string(got);
            throw CommError("send/recv mismatch on group '" + name + "': rank " +
                            std::to_string(c.peer) + " sent " + sent + " elements of " +
                            dtype_name(c.dtype) + " but rank " + std::to_string(rank) +
                            " receives " + dtype_name(c.dtype) + " count=" + std::to_string(n) +
                            " (message #" + std::to_string(c.seq) + " between them)");
          }
          return;
        }
        case CommOp::Split:
          break;
      }
      MESHRT_FAIL("MPI communicator: unexpected operation " << comm_op_name(c.op));
    }

    std::unique_ptr<Communicator> split(int color, int key, const std::string& new_name,
                                        uint64_t seq) {
      Deadline dl = Deadline::after(cfg.timeout_s);
      CallSig sig = CallSig::make(CommOp::Split, DType::f32, ReduceOp::Sum, 0, -1, seq);
      sig.color = color;
      const std::string what = sig.str();
      detail::TicketOrder& order = orders.order(CommOp::Split, -1);
      take_turn(order, what, seq, dl);
      detail::TicketGuard guard(order, seq);
      if (proc().aborted.load()) {
        throw CommError(context(what, seq) +
                        " failed: the communicators were aborted: " + abort_reason_now());
      }
      publish_entered(seq);
      // Non-blocking exchange first: it is the arrival check (with the watchdog), so the
      // blocking MPI_Comm_split below only starts once every rank is there.
      compare_calls(sig, what, seq, dl);
      MPI_Comm nc = MPI_COMM_NULL;
      MESHRT_MPI_CHECK(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, &nc));
      if (nc == MPI_COMM_NULL) return nullptr;
      return std::make_unique<MpiComm>(nc, new_name, cfg);
    }
  };

  std::shared_ptr<Engine> e_;
};

}  // namespace

bool mpi_launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                        "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"}) {
    if (const char* x = std::getenv(v); x && *x) return true;
  }
  // Inside an srun job step (not merely inside an allocation).
  return std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS");
}

void mpi_init() {
  MpiProcess& p = proc();
  std::lock_guard<std::mutex> lk(p.mu);
  int init = 0;
  MPI_Initialized(&init);
  if (init) {
    int fin = 0;
    MPI_Finalized(&fin);
    MESHRT_CHECK(!fin, "MPI was already finalised; meshrt cannot use it any more");
    int level = 0;
    MESHRT_MPI_CHECK(MPI_Query_thread(&level));
    MESHRT_CHECK(level == MPI_THREAD_MULTIPLE,
                 "MPI was initialised with thread level "
                     << level << "; meshrt issues MPI calls from stream threads and needs "
                     << "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
    return;
  }
  int provided = 0;
  MESHRT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MESHRT_CHECK(provided == MPI_THREAD_MULTIPLE, "this MPI library provides thread level "
                                                    << provided
                                                    << ", meshrt needs MPI_THREAD_MULTIPLE");
  p.we_initialized = true;
  std::atexit([] { mpi_finalize(); });
}

void mpi_finalize() {
  MpiProcess& p = proc();
  std::string reason;
  {
    std::lock_guard<std::mutex> lk(p.mu);
    if (!p.we_initialized || p.finalized || !mpi_live()) return;
    p.finalized = true;
    reason = p.reason;
  }
  if (p.aborted.load()) {
    // Peers may be blocked inside MPI waiting for us: end the whole job, non-zero.
    std::fprintf(stderr, "meshrt: aborting the MPI job after a communicator failure: %s\n",
                 reason.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
  }
  if (p.win != MPI_WIN_NULL) MPI_Win_free(&p.win);
  if (p.node_comm != MPI_COMM_NULL) MPI_Comm_free(&p.node_comm);
  MPI_Finalize();
}

int mpi_world_rank() {
  mpi_init();
  int r = 0;
  MESHRT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int mpi_world_size() {
  mpi_init();
  int s = 0;
  MESHRT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &s));
  return s;
}

std::unique_ptr<Communicator> make_mpi_world_communicator(CommConfig config) {
  mpi_init();
  {
    std::lock_guard<std::mutex> lk(proc().mu);
    setup_watch_window();
  }
  MPI_Comm c = MPI_COMM_NULL;
  MESHRT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
  return std::make_unique<MpiComm>(c, "world", config);
}

std::vector<std::string> mpi_world_allgather(const std::string& mine, CommConfig config) {
  mpi_init();
  const int n = mpi_world_size();
  const int len = int_count(static_cast<int64_t>(mine.size()), "mpi_world_allgather");
  auto mine_copy = std::make_shared<std::string>(mine);
  auto all = std::make_shared<std::vector<char>>(mine.size() * static_cast<size_t>(n));
  MPI_Request req = MPI_REQUEST_NULL;
  MESHRT_MPI_CHECK(MPI_Iallgather(mine_copy->data(), len, MPI_BYTE, all->data(), len, MPI_BYTE,
                                  MPI_COMM_WORLD, &req));
  Deadline dl = Deadline::after(config.timeout_s);
  int done = 0;
  while (!done) {
    MESHRT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (dl.passed()) {
      std::string msg = "bootstrap: exchanging " + std::to_string(len) +
                        " bytes between all MPI ranks did not complete within " +
                        std::to_string(config.timeout_s) + " s (MESHRT_COMM_TIMEOUT)";
      process_abort(msg);
      bury(std::make_shared<std::pair<decltype(mine_copy), decltype(all)>>(mine_copy, all));
      throw CommError(msg);
    }
    sched_yield();
  }
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    out.emplace_back(all->data() + static_cast<size_t>(r) * mine.size(), mine.size());
  }
  return out;
}

}  // namespace meshrt
