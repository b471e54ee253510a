#include "backends/mpi/mpi_comm.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include "backends/mpi/mpi_check.h"
#include "backends/mpi/mpi_process.h"
#include "collectives/bootstrap_transport.h"
#include "collectives/host_reduce.h"
#include "collectives/ordered_comm.h"
#include "runtime/error.h"

namespace meshrt {

namespace {

using detail::CallSig;
using detail::Deadline;
using detail::mpi_int_count;
using detail::mpi_process;
using detail::MpiProcess;
using detail::Op;

constexpr int kP2PTag = 0x6d72;
constexpr size_t kStageInPlaceBytes = size_t{1} << 20;

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

// One rank's side of an MPI communicator: one non-blocking MPI call per op, polled until it
// completes, the process's communicators are aborted, or the deadline passes.
class MpiEngine final : public detail::OrderedEngine {
 public:
  // Takes ownership of `comm`. Collective over its ranks.
  MpiEngine(MPI_Comm c, int rank, int size, std::string name, CommConfig cfg)
      : OrderedEngine(rank, size, std::move(name), cfg), comm(c) {
    MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    // Agree on a watch slot: the largest next free slot of any member.
    MpiProcess& p = mpi_process();
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
    slot = (agreed < detail::kMpiCommSlots && !p.node_words.empty()) ? agreed : -1;
    MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    MESHRT_MPI_CHECK(MPI_Comm_group(comm, &g));
    MESHRT_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
    std::vector<int> mine_ranks(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) mine_ranks[static_cast<size_t>(i)] = i;
    world_ranks.assign(static_cast<size_t>(size), -1);
    MESHRT_MPI_CHECK(MPI_Group_translate_ranks(g, size, mine_ranks.data(), wg, world_ranks.data()));
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
  }
  ~MpiEngine() override {
    // A communicator with a pending request cannot be freed; after an abort leave it be.
    if (comm != MPI_COMM_NULL && detail::mpi_live() && !mpi_process().aborted.load()) {
      MPI_Comm_free(&comm);
    }
  }

  static std::unique_ptr<Communicator> make(MPI_Comm c, std::string name, CommConfig cfg) {
    int r = 0, n = 0;
    MESHRT_MPI_CHECK(MPI_Comm_rank(c, &r));
    MESHRT_MPI_CHECK(MPI_Comm_size(c, &n));
    return detail::make_ordered_communicator(
        std::make_shared<MpiEngine>(c, r, n, std::move(name), cfg), Device::cpu(0));
  }

  std::string_view backend() const override { return "mpi"; }
  bool aborted() const override { return mpi_process().aborted.load(); }
  std::string abort_reason() const override { return detail::mpi_abort_reason(); }
  void abort_group(const std::string& why) override { detail::mpi_process_abort(why); }

 private:
  MPI_Comm comm;
  int slot = -1;
  std::vector<int> world_ranks;
  // Staging buffers kept between collectives: allocating (and first touching) large buffers
  // per call costs as much as the copy. Collectives run one at a time per rank, so a slot is
  // free when the next one starts; a request that never completes keeps its buffer (mpi_bury).
  std::shared_ptr<char> scratch_[2];
  size_t scratch_bytes_[2] = {0, 0};

  std::shared_ptr<char> scratch(int i, size_t bytes) {
    if (scratch_bytes_[i] < bytes) {
      char* p = static_cast<char*>(::operator new[](bytes, std::align_val_t{64}));
      scratch_[i] =
          std::shared_ptr<char>(p, [](char* q) { ::operator delete[](q, std::align_val_t{64}); });
      scratch_bytes_[i] = bytes;
    }
    return scratch_[i];
  }

  // The watchdog's view: this rank entered collective `seq` (node-shared word).
  void entering(const Op& op) override {
    MpiProcess& p = mpi_process();
    if (slot >= 0 && p.my_node_index >= 0) {
      __atomic_store_n(&p.node_words[static_cast<size_t>(p.my_node_index)][slot], op.seq(),
                       __ATOMIC_RELEASE);
    }
    // The exchange doubles as the arrival check (with the watchdog) of a split, so the blocking
    // MPI_Comm_split only starts once every rank is there.
    if (must_compare(static_cast<CommOp>(op.sig.op))) compare_calls(op);
  }

  std::string rank_label(int group_rank) const override {
    const int w =
        group_rank >= 0 && group_rank < size() ? world_ranks[static_cast<size_t>(group_rank)] : -1;
    return detail::global_rank_label(w, group_rank, w == group_rank && name() == "world");
  }

  // Which ranks have not entered collective `seq`, as far as this node can see, named by
  // global rank, each with what it is doing; and the ranks of this node that are not making
  // progress (outside every collective, or stopped), which every rank computes alike, so the
  // ranks of a job agree on the culprit even when they wait on different groups.
  std::string missing_ranks(uint64_t seq) const {
    MpiProcess& p = mpi_process();
    if (slot < 0 || p.node_words.empty()) {
      return "which ranks never arrived is unknown (no node-shared window)";
    }
    std::vector<std::string> missing;
    std::vector<int> remote;
    for (int j = 0; j < size(); ++j) {
      int w = world_ranks[static_cast<size_t>(j)];
      int ni = (w >= 0 && static_cast<size_t>(w) < p.world_to_node.size())
                   ? p.world_to_node[static_cast<size_t>(w)]
                   : -1;
      if (ni < 0) {
        remote.push_back(w);
        continue;
      }
      uint64_t v = __atomic_load_n(&p.node_words[static_cast<size_t>(ni)][slot], __ATOMIC_ACQUIRE);
      if (v < seq) {
        missing.push_back(rank_label(j) + " (" + detail::mpi_rank_activity(ni) + ")");
      }
    }
    std::string s;
    for (size_t i = 0; i < missing.size(); ++i) s += (i ? ", " : "") + missing[i];
    if (!missing.empty()) s += " never arrived";
    if (!remote.empty()) {
      s += (s.empty() ? "" : "; ") + detail::format_ranks(remote) +
           " run on other nodes (their state is unknown)";
    }
    if (s.empty()) s = "every rank entered it (one may be stuck inside it)";
    const std::vector<int> stalled = detail::mpi_stalled_ranks();
    if (!stalled.empty()) {
      s += "; likely culprit: " + detail::format_ranks(stalled) +
           " (not inside any collective, or not responding)";
    }
    return s;
  }

  // Polls `req` until it completes, the communicators are aborted, or the deadline passes.
  // `keep` holds the buffers MPI uses; if the request never completes they are kept forever.
  void wait(MPI_Request* req, MPI_Status* st, const Op& op,
            const std::function<std::string()>& missing, const std::shared_ptr<void>& keep,
            int* rc_out = nullptr) {
    int done = 0;
    detail::MpiWaitMark mark;  // what other local ranks see this process doing
    for (int64_t i = 0;; ++i) {
      mark.beat();
      int rc = MPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        if (rc_out) {
          *rc_out = rc;
          return;
        }
        detail::mpi_fail("MPI_Test", rc, __FILE__, __LINE__);
      }
      if (done) {
        mark.finished();
        return;
      }
      if (aborted()) {
        detail::mpi_bury(keep);
        throw_aborted(op);
      }
      if (op.dl.passed()) {
        detail::mpi_bury(keep);
        fail_timeout(op, missing());
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

  void wait_coll(MPI_Request* req, const Op& op, const std::shared_ptr<void>& keep) {
    const uint64_t seq = op.seq();
    wait(
        req, nullptr, op, [this, seq] { return missing_ranks(seq); }, keep);
  }

  // Every rank's call signature, compared: a mismatch raises on every rank alike.
  void compare_calls(const Op& op) {
    auto all = std::make_shared<std::vector<CallSig>>(static_cast<size_t>(size()));
    auto me = std::make_shared<CallSig>(op.sig);
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Iallgather(me.get(), CallSig::kWords, MPI_INT64_T, all->data(),
                                    CallSig::kWords, MPI_INT64_T, comm, &req));
    wait_coll(&req, op, std::make_shared<std::pair<decltype(all), decltype(me)>>(all, me));
    std::string mm = detail::mismatch_message(name(), *all,
                                              name() == "world" ? std::vector<int>{} : world_ranks);
    if (!mm.empty()) throw CommError(mm);
  }

  std::vector<int64_t> exchange_words(const Op& op, const std::vector<int64_t>& mine) override {
    auto me = std::make_shared<std::vector<int64_t>>(mine);
    auto all = std::make_shared<std::vector<int64_t>>(mine.size() * static_cast<size_t>(size()));
    const int n = static_cast<int>(mine.size());
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(
        MPI_Iallgather(me->data(), n, MPI_INT64_T, all->data(), n, MPI_INT64_T, comm, &req));
    wait_coll(&req, op, both(all, me));
    return *all;
  }

  template <class A, class B>
  static std::shared_ptr<void> both(A a, B b) {
    return std::make_shared<std::pair<A, B>>(std::move(a), std::move(b));
  }

  void all_reduce(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "all_reduce");
    const size_t es = dtype_size(c.dtype);
    void* out = c.out.data_ptr();
    const void* in = c.in.data_ptr();
    MPI_Request req = MPI_REQUEST_NULL;
    if (detail::is_half_float(c.dtype)) {
      auto buf = scratch(0, static_cast<size_t>(n) * sizeof(float));
      float* wide = reinterpret_cast<float*>(buf.get());
      detail::reduce_through_f32(
          c.dtype, c.redop, in, n, out, n, size(), wide, wide, [&](float*, float* w) {
            MESHRT_MPI_CHECK(
                MPI_Iallreduce(MPI_IN_PLACE, w, n, MPI_FLOAT, mpi_op(c.redop), comm, &req));
            wait_coll(&req, op, buf);
          });
      return;
    }
    // OpenMPI's non-blocking MPI_IN_PLACE all-reduce of large buffers is several times slower
    // than its out-of-place form (measured: bench/results/collectives-host.md), so large
    // in-place calls send from a staged copy instead.
    std::shared_ptr<char> stage;
    const void* src = c.in_place ? MPI_IN_PLACE : in;
    if (c.in_place && static_cast<size_t>(n) * es >= kStageInPlaceBytes) {
      stage = scratch(0, static_cast<size_t>(n) * es);
      std::memcpy(stage.get(), out, static_cast<size_t>(n) * es);
      src = stage.get();
    }
    MESHRT_MPI_CHECK(MPI_Iallreduce(src, out, n, mpi_type(c.dtype), mpi_op(c.redop), comm, &req));
    wait_coll(&req, op, both(std::make_shared<CommCall>(c), stage));
    if (c.redop == ReduceOp::Avg) detail::host_divide(c.dtype, out, n, size());
  }

  void reduce_scatter(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "reduce_scatter");
    mpi_int_count(c.count * size(), "reduce_scatter");
    const size_t es = dtype_size(c.dtype);
    void* out = c.out.data_ptr();
    const void* in = c.in.data_ptr();
    MPI_Request req = MPI_REQUEST_NULL;
    if (detail::is_half_float(c.dtype)) {
      auto bin = scratch(0, static_cast<size_t>(c.count * size()) * sizeof(float));
      auto bout = scratch(1, static_cast<size_t>(n) * sizeof(float));
      detail::reduce_through_f32(
          c.dtype, c.redop, in, c.count * size(), out, n, size(),
          reinterpret_cast<float*>(bin.get()), reinterpret_cast<float*>(bout.get()),
          [&](float* wide_in, float* wide_out) {
            MESHRT_MPI_CHECK(MPI_Ireduce_scatter_block(wide_in, wide_out, n, MPI_FLOAT,
                                                       mpi_op(c.redop), comm, &req));
            wait_coll(&req, op, both(bin, bout));
          });
      return;
    }
    // MPI's in-place form puts the result at the front of the buffer; ours is this rank's
    // block, so receive into a staging buffer instead.
    std::shared_ptr<char> stage;
    void* dst = out;
    if (c.in_place && n > 0) {
      stage = scratch(0, static_cast<size_t>(n) * es);
      dst = stage.get();
    }
    MESHRT_MPI_CHECK(
        MPI_Ireduce_scatter_block(in, dst, n, mpi_type(c.dtype), mpi_op(c.redop), comm, &req));
    wait_coll(&req, op, both(std::make_shared<CommCall>(c), stage));
    if (stage) std::memcpy(out, stage.get(), static_cast<size_t>(n) * es);
    if (c.redop == ReduceOp::Avg) detail::host_divide(c.dtype, out, n, size());
  }

  void all_gather(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "all_gather");
    mpi_int_count(c.count * size(), "all_gather");
    const MPI_Datatype t = mpi_type(c.dtype);
    MPI_Request req = MPI_REQUEST_NULL;
    if (c.in_place) {
      MESHRT_MPI_CHECK(
          MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c.out.data_ptr(), n, t, comm, &req));
    } else {
      MESHRT_MPI_CHECK(MPI_Iallgather(c.in.data_ptr(), n, t, c.out.data_ptr(), n, t, comm, &req));
    }
    wait_coll(&req, op, std::make_shared<CommCall>(c));
  }

  void broadcast(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "broadcast");
    void* out = c.out.data_ptr();
    if (rank() == c.root && !c.in_place && n > 0) {
      std::memcpy(out, c.in.data_ptr(), static_cast<size_t>(n) * dtype_size(c.dtype));
    }
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Ibcast(out, n, mpi_type(c.dtype), c.root, comm, &req));
    wait_coll(&req, op, std::make_shared<CommCall>(c));
  }

  void all_to_all(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "all_to_all");
    mpi_int_count(c.count * size(), "all_to_all");
    const MPI_Datatype t = mpi_type(c.dtype);
    std::shared_ptr<char> stage;
    const void* src = c.in.data_ptr();
    if (c.in_place && n > 0) {
      const size_t bytes =
          static_cast<size_t>(n) * static_cast<size_t>(size()) * dtype_size(c.dtype);
      stage = scratch(0, bytes);
      std::memcpy(stage.get(), src, bytes);
      src = stage.get();
    }
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Ialltoall(src, n, t, c.out.data_ptr(), n, t, comm, &req));
    wait_coll(&req, op, both(std::make_shared<CommCall>(c), stage));
  }

  void barrier(const CommCall& c, const Op& op) override {
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Ibarrier(comm, &req));
    wait_coll(&req, op, std::make_shared<CommCall>(c));
  }

  void send(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "send");
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Isend(c.in.data_ptr(), n, mpi_type(c.dtype), c.peer, kP2PTag, comm, &req));
    wait(
        &req, nullptr, op, [&] { return "rank " + std::to_string(c.peer) + " never received it"; },
        std::make_shared<CommCall>(c));
  }

  void recv(const CommCall& c, const Op& op) override {
    const int n = mpi_int_count(c.count, "recv");
    const MPI_Datatype t = mpi_type(c.dtype);
    MPI_Status st;
    int rc = MPI_SUCCESS;
    MPI_Request req = MPI_REQUEST_NULL;
    MESHRT_MPI_CHECK(MPI_Irecv(c.out.data_ptr(), n, t, c.peer, kP2PTag, comm, &req));
    wait(
        &req, &st, op, [&] { return "rank " + std::to_string(c.peer) + " never sent it"; },
        std::make_shared<CommCall>(c), &rc);
    int got = 0;
    if (rc == MPI_SUCCESS) MESHRT_MPI_CHECK(MPI_Get_count(&st, t, &got));
    if (rc != MPI_SUCCESS || got != n) {
      std::string sent = rc != MPI_SUCCESS ? "more than " + std::to_string(n) : std::to_string(got);
      throw CommError("send/recv mismatch on group '" + name() + "': rank " +
                      std::to_string(c.peer) + " sent " + sent + " elements of " +
                      dtype_name(c.dtype) + " but rank " + std::to_string(rank()) + " receives " +
                      dtype_name(c.dtype) + " count=" + std::to_string(n) + " (message #" +
                      std::to_string(c.seq) + " between them)");
    }
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& new_name,
                                      const Op&) override {
    MPI_Comm nc = MPI_COMM_NULL;
    MESHRT_MPI_CHECK(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, &nc));
    if (nc == MPI_COMM_NULL) return nullptr;
    return make(nc, new_name, config());
  }
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(CommConfig config) {
  mpi_init();
  {
    std::lock_guard<std::mutex> lk(mpi_process().mu);
    detail::mpi_setup_watch_window();
  }
  MPI_Comm c = MPI_COMM_NULL;
  MESHRT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
  return MpiEngine::make(c, "world", config);
}

}  // namespace meshrt
