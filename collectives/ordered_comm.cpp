#include "collectives/ordered_comm.h"

#include <exception>
#include <utility>

#include "collectives/data_check.h"
#include "collectives/flight.h"
#include "runtime/error.h"

namespace meshrt::detail {

std::string Op::str() const {
  std::string s = sig.str();
  const auto o = static_cast<CommOp>(sig.op);
  if (peer >= 0 && (o == CommOp::Send || o == CommOp::Recv)) {
    s += (o == CommOp::Send ? " to rank " : " from rank ") + std::to_string(peer) + " (#" +
         std::to_string(sig.seq) + ")";
  }
  return s;
}

OrderedEngine::OrderedEngine(int rank, int size, std::string name, CommConfig cfg)
    : rank_(rank), size_(size), name_(std::move(name)), cfg_(cfg) {}

OrderedEngine::~OrderedEngine() = default;

std::string OrderedEngine::rank_label(int group_rank) const {
  return "rank " + std::to_string(group_rank);
}

bool OrderedEngine::must_compare(CommOp op) const {
  if (size_ <= 1) return false;
  return cfg_.debug || op == CommOp::AllGather || op == CommOp::ReduceScatter ||
         op == CommOp::AllToAll || op == CommOp::Split;
}

std::string OrderedEngine::context(const Op& op) const {
  return op.str() + " on group '" + name_ + "' (seq " + std::to_string(op.seq()) + ", " +
         rank_label(rank_) + ")";
}

void OrderedEngine::throw_aborted(const Op& op) const {
  throw CommError(context(op) + " failed: the communicator was aborted: " + abort_reason());
}

std::string OrderedEngine::timeout(const Op& op, const std::string& missing) const {
  return timeout_message(op.str(), name_, op.seq(), rank_label(rank_), cfg_, missing);
}

void OrderedEngine::fail_timeout(const Op& op, const std::string& missing) {
  std::string msg = timeout(op, missing);
  abort_group(msg);
  throw CommError(msg);
}

void OrderedEngine::take_turn(TicketOrder& order, const Op& op) {
  if (!order.wait_turn(op.seq(), op.dl)) {
    fail_timeout(op,
                 "an earlier operation on this communicator never finished on this rank (is its "
                 "stream blocked?)");
  }
}

namespace {

// Marks the call's flight-recorder entry ended (failed when an exception leaves the scope).
class FlightEnd {
 public:
  explicit FlightEnd(const CommCall& c) : c_(c), uncaught_(std::uncaught_exceptions()) {}
  ~FlightEnd() {
    if (c_.flight) c_.flight->ended(c_.flight_id, std::uncaught_exceptions() == uncaught_);
  }
  FlightEnd(const FlightEnd&) = delete;
  FlightEnd& operator=(const FlightEnd&) = delete;

 private:
  const CommCall& c_;
  int uncaught_;
};

}  // namespace

void OrderedEngine::run(const CommCall& c) {
  const Op op{CallSig::make(c.op, c.dtype, c.redop, c.count, c.root, c.seq), c.peer,
              Deadline::after(cfg_.timeout_s)};
  FlightEnd flight_end(c);
  TicketOrder& order = orders_.order(c.op, c.peer);
  take_turn(order, op);
  if (c.flight) c.flight->started(c.flight_id);
  try {
    run_op(c, op);
  } catch (...) {
    // A collective that fails after an abort may leave peers (threads, processes on shared
    // memory, MPI requests) still reading or writing this rank's buffers: they check for the
    // abort only between steps. Keep the buffers from the allocator for good (a use after free,
    // seen after a process was stopped and resumed past the timeout); the process is failing.
    if (aborted()) {
      c.in.keep_forever();
      c.out.keep_forever();
    }
    throw;
  }
}

void OrderedEngine::run_op(const CommCall& c, const Op& op) {
  TicketOrder& order = orders_.order(c.op, c.peer);
  TicketGuard guard(order, c.seq);
  if (aborted()) throw_aborted(op);
  if (c.op != CommOp::Send && c.op != CommOp::Recv) entering(op);
  // MESHRT_COMM_DEBUG=1: digest this rank's input before the collective may overwrite it.
  const bool check = cfg_.debug && size_ > 1 && data_checked(c.op);
  DataDigest digest;
  if (check) digest.before(c, size_);
  run_backend_op(c, op);
  if (c.corrupt && c.out.defined() && c.out.numel() > 0) {
    corrupt_first_element(c.out.data_ptr(), c.dtype);
  }
  if (!check) return;
  digest.after(c, size_);
  const std::vector<int64_t> all = exchange_words(op, digest.words());
  DataVerdict v = verify_data(c, size_, name_, all, [this](int r) { return rank_label(r); });
  if (v.culprits.empty()) return;
  if (c.flight) c.flight->data_bad(c.flight_id, v.culprits);
  // Every rank reaches the same verdict and raises it; the collectives that follow still run.
  throw CommError(v.message);
}

void OrderedEngine::run_backend_op(const CommCall& c, const Op& op) {
  switch (c.op) {
    case CommOp::AllReduce:
      return all_reduce(c, op);
    case CommOp::AllGather:
      return all_gather(c, op);
    case CommOp::ReduceScatter:
      return reduce_scatter(c, op);
    case CommOp::Broadcast:
      return broadcast(c, op);
    case CommOp::AllToAll:
      return all_to_all(c, op);
    case CommOp::Send:
      return send(c, op);
    case CommOp::Recv:
      return recv(c, op);
    case CommOp::Barrier:
      return barrier(c, op);
    case CommOp::Split:
      break;
  }
  MESHRT_FAIL(backend() << " communicator: unexpected operation " << comm_op_name(c.op));
}

std::unique_ptr<Communicator> OrderedEngine::run_split(int color, int key, const std::string& name,
                                                       uint64_t seq) {
  Op op{CallSig::make(CommOp::Split, DType::f32, ReduceOp::Sum, 0, -1, seq), -1,
        Deadline::after(cfg_.timeout_s)};
  op.sig.color = color;
  TicketOrder& order = orders_.order(CommOp::Split, -1);
  take_turn(order, op);
  TicketGuard guard(order, seq);
  if (aborted()) throw_aborted(op);
  entering(op);
  return split(color, key, name, op);
}

namespace {

class OrderedImpl final : public CommImpl {
 public:
  explicit OrderedImpl(std::shared_ptr<OrderedEngine> e) : e_(std::move(e)) {}

  std::string_view backend() const override { return e_->backend(); }
  void issue(CommCall call, Stream& stream) override {
    // The queued call holds stream-ordered blocks as a host kernel does (Tensor::stream_ref):
    // `stream` is recorded as a user, so no stream reuses them before the call ran.
    call.in = call.in.stream_ref(stream);
    call.out = call.out.stream_ref(stream);
    stream.enqueue([e = e_, c = std::move(call)] { e->run(c); });
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      uint64_t seq) override {
    return e_->run_split(color, key, name, seq);
  }
  void abort(const std::string& reason) override {
    e_->abort_group("rank " + std::to_string(e_->rank()) + " of group '" + e_->name() +
                    "': " + reason);
  }
  bool aborted() const override { return e_->aborted(); }
  std::string abort_reason() const override { return e_->abort_reason(); }
  void wait_issued(uint64_t coll_seq, const std::unordered_map<int, uint64_t>& sent,
                   const std::unordered_map<int, uint64_t>& received) override {
    e_->orders().wait_issued(coll_seq, sent, received);
  }

 private:
  std::shared_ptr<OrderedEngine> e_;
};

}  // namespace

std::unique_ptr<Communicator> make_ordered_communicator(std::shared_ptr<OrderedEngine> e,
                                                        Device device) {
  const int rank = e->rank(), size = e->size();
  std::string name = e->name();
  CommConfig cfg = e->config();
  return std::make_unique<Communicator>(rank, size, std::move(name), device, cfg,
                                        std::make_unique<OrderedImpl>(std::move(e)));
}

}  // namespace meshrt::detail
