#include "collectives/communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "collectives/algorithms/algorithm.h"
#include "collectives/comm_detail.h"
#include "collectives/comm_impl.h"
#include "collectives/fault.h"
#include "collectives/flight.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/ranges.h"

namespace meshrt {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg" || s == "mean") return ReduceOp::Avg;
  if (s == "max") return ReduceOp::Max;
  if (s == "min") return ReduceOp::Min;
  MESHRT_FAIL("unknown reduction '" << s << "': use one of sum, avg, max, min");
}

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::AllReduce:
      return "all_reduce";
    case CommOp::AllGather:
      return "all_gather";
    case CommOp::ReduceScatter:
      return "reduce_scatter";
    case CommOp::Broadcast:
      return "broadcast";
    case CommOp::AllToAll:
      return "all_to_all";
    case CommOp::Send:
      return "send";
    case CommOp::Recv:
      return "recv";
    case CommOp::Barrier:
      return "barrier";
    case CommOp::Split:
      return "split";
  }
  return "?";
}

CommOp parse_comm_op(std::string_view s) {
  if (s == "all_reduce" || s == "allreduce") return CommOp::AllReduce;
  if (s == "all_gather" || s == "allgather") return CommOp::AllGather;
  if (s == "reduce_scatter" || s == "reducescatter") return CommOp::ReduceScatter;
  if (s == "broadcast" || s == "bcast") return CommOp::Broadcast;
  if (s == "all_to_all" || s == "alltoall") return CommOp::AllToAll;
  MESHRT_FAIL("unknown collective '"
              << s
              << "': use one of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all");
}

bool comm_dtype_supported(DType dt, bool reduction) {
  switch (dt) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
    case DType::i32:
    case DType::i64:
      return true;
    case DType::u8:
      return !reduction;
  }
  return false;
}

CommConfig CommConfig::from_env() {
  CommConfig c;
  if (const std::string s = env_or("MESHRT_COMM_TIMEOUT"); !s.empty()) {
    const char* t = s.c_str();
    char* end = nullptr;
    double v = std::strtod(t, &end);
    MESHRT_CHECK(end != t && *end == '\0' && v >= 0,
                 "MESHRT_COMM_TIMEOUT='" << t
                                         << "' is not a number of seconds >= 0 (0 disables the "
                                            "watchdog; default 300)");
    c.timeout_s = v;
  }
  c.debug = env_switch("MESHRT_COMM_DEBUG");
  detail::check_flight_dir_from_env();
  if (std::string f = env_or("MESHRT_FAULT"); !f.empty()) {
    detail::parse_fault_spec(f);  // refuses a malformed spec here, saying what to change
    c.fault = std::move(f);
  }
  c.algo = env_or("MESHRT_ALGO");
  (void)detail::parse_algo_override(c.algo);  // refuses an unknown op or algorithm here
  return c;
}

std::string CommCall::str() const {
  return detail::CallSig::make(op, dtype, redop, count, root, seq).str();
}

int64_t CommCall::bytes() const {
  switch (op) {
    case CommOp::AllGather:
    case CommOp::Recv:
      return static_cast<int64_t>(out.nbytes());
    case CommOp::Barrier:
    case CommOp::Split:
      return 0;
    default:
      return static_cast<int64_t>(in.nbytes());
  }
}

CommImpl::~CommImpl() = default;

namespace {
// Set while split() makes a child on this thread: the child is not a root (no state of its own).
thread_local int tls_splitting = 0;
// Set while a communicator built over others makes its inner ones (detail::InnerCommScope).
thread_local int tls_inner = 0;
// Inside a composed algorithm on this thread: its calls run the backend's own algorithms.
thread_local int tls_composed = 0;
}  // namespace

detail::InnerCommScope::InnerCommScope() { ++tls_inner; }
detail::InnerCommScope::~InnerCommScope() { --tls_inner; }

Communicator::Communicator(int rank, int size, std::string name, Device device, CommConfig config,
                           std::unique_ptr<CommImpl> impl)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      device_(device),
      config_(config),
      impl_(std::move(impl)) {
  MESHRT_CHECK(size >= 1 && rank >= 0 && rank < size,
               "communicator '" << name_ << "': rank " << rank << " outside [0, " << size << ")");
  MESHRT_CHECK(impl_ != nullptr, "communicator '" << name_ << "' has no backend implementation");
  if (impl_->opens_ranges()) {
    // A root communicator (a world): its rank is the global rank. split() hands its children
    // (made while it runs) the parent's state and a gid derived from the parent's instead.
    if (tls_splitting == 0 && tls_inner == 0)
      state_ = detail::make_rank_state(rank_, size_, impl_->backend(), config_.fault);
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
    for (char ch : name_) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    gid_ = h;
  }
  auto plan = std::make_shared<const detail::AlgoPlan>(
      detail::AlgoWorld{impl_->backend(), size_, impl_->nodes()}, config_.algo);
  if (plan->any_composed()) composed_ = std::move(plan);
}

Communicator::~Communicator() = default;

std::string_view Communicator::backend() const { return impl_->backend(); }
bool Communicator::aborted() const { return impl_->aborted(); }
std::string Communicator::abort_reason() const { return impl_->abort_reason(); }

void Communicator::check_tensor(const char* what, const char* role, const Tensor& t,
                                bool reduction) const {
  MESHRT_CHECK(t.defined(), what << " on group '" << name_ << "': " << role << " is undefined");
  MESHRT_CHECK(comm_dtype_supported(t.dtype(), reduction),
               what << " on group '" << name_ << "': dtype " << dtype_name(t.dtype()) << " of "
                    << role << " is not supported"
                    << (reduction ? " for reductions (use f32, bf16, f16, i32 or i64)"
                                  : " (use f32, bf16, f16, i32, i64 or u8)"));
  MESHRT_CHECK(t.is_contiguous(), what << " on group '" << name_ << "': " << role << " " << t.str()
                                       << " with strides " << t.strides().str()
                                       << " is not contiguous; call contiguous() first");
  Device d = t.device();
  MESHRT_CHECK(d.type == device_.type && (d.is_cpu() || d.index == device_.index),
               what << " on group '" << name_ << "' (" << backend() << " backend, rank " << rank_
                    << " on " << device_.str() << "): " << role << " " << t.str()
                    << " is on the wrong device");
}

namespace {

const char* byte_ptr(const Tensor& t) { return static_cast<const char*>(t.data_ptr()); }

bool counted_for_faults(CommOp op) {
  return op != CommOp::Send && op != CommOp::Recv && op != CommOp::Split;
}

void copy_name(char* dst, size_t cap, std::string_view src) {
  const size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

// Stops the calling thread for good: it never returns, so nothing it owns is cleaned up.
[[noreturn]] void park_forever() {
  detail::flight_mark_parked();
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// What binds a stream to a rank (Stream::bind_comm_owner): alive as long as `st` (this world's
// state of the rank), and pointing at one address per global rank, so that the worlds of one
// rank share its streams while another rank's collective on them is refused.
std::shared_ptr<const void> rank_owner(const std::shared_ptr<detail::RankState>& st) {
  static std::mutex mu;
  static std::map<int, char> tokens;  // map nodes never move
  std::lock_guard<std::mutex> lk(mu);
  return std::shared_ptr<const void>(st, &tokens[st->global_rank]);
}

// Whether [a, a+na) and [b, b+nb) overlap.
bool overlaps(const char* a, size_t na, const char* b, size_t nb) {
  return na > 0 && nb > 0 && a < b + nb && b < a + na;
}

}  // namespace

Event Communicator::submit(CommCall& call, Stream& stream, const EventList& after) {
  if (composed_ && tls_composed == 0 && composed_->composed(call.op)) {
    const detail::Algorithm* a = composed_->pick(call.op, call.bytes());
    if (a->run) {
      ++tls_composed;
      struct Leave {
        ~Leave() { --tls_composed; }
      } leave;
      return a->run(*this, call, stream, after);
    }
  }
  // Under MESHRT_LAUNCH_BLOCKING communication still queues: its tasks wait for peers.
  NonBlockingEnqueue queued;
  Device sd = stream.device();
  MESHRT_CHECK(sd.type == device_.type, comm_op_name(call.op)
                                            << " on group '" << name_ << "': stream '"
                                            << stream.name() << "' is on " << sd.str()
                                            << " but the communicator runs on " << device_.str());
  if (aborted()) {
    throw CommError(std::string(comm_op_name(call.op)) + " on group '" + name_ +
                    "': the communicator was aborted: " + abort_reason());
  }
  detail::RankState* st = state_.get();
  int bound_rank = -1;
  MESHRT_CHECK(!st || stream.bind_comm_owner(rank_owner(state_), st->global_rank, &bound_rank),
               comm_op_name(call.op)
                   << " on group '" << name_ << "' (global rank " << (st ? st->global_rank : -1)
                   << "): stream '" << stream.name()
                   << "' carries the communication of global rank " << bound_rank
                   << "; each rank issues on streams of its own (its own Context's streams)");
  detail::FaultKind fault = detail::FaultKind::None;
  if (st && st->fault.active() && counted_for_faults(call.op) &&
      (!st->fault.has_op || st->fault.op == call.op)) {
    const uint64_t n = ++st->counted;
    if (st->fault.kind == detail::FaultKind::Slow ? n >= st->fault.step : n == st->fault.step) {
      fault = st->fault.kind;
    }
  }
  if (fault != detail::FaultKind::None) inject(fault, call, stream);
  if (fault == detail::FaultKind::Skip) {
    for (const Event& e : after) stream.wait(e);
    return stream.record();
  }
  if (call.op == CommOp::Send || call.op == CommOp::Recv) {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    auto& m = call.op == CommOp::Send ? send_seq_ : recv_seq_;
    call.seq = ++m[call.peer];
  } else {
    call.seq = next_seq_.fetch_add(1);
  }
  for (const Event& e : after) stream.wait(e);
  if (log_enabled(LogLevel::Trace)) {
    MESHRT_LOG(LogLevel::Trace, "comm '" << name_ << "' issue seq " << call.seq << " " << call.str()
                                         << " on stream '" << stream.name() << "'");
  }
  // Profiler range around the issue (NVTX in CUDA builds): "all_reduce world/tp" with the bytes;
  // the name is built only when ranges go somewhere.
  std::optional<ranges::Scoped> range;
  if (ranges::enabled() && impl_->opens_ranges())
    range.emplace(std::string(comm_op_name(call.op)) + " " + name_, uint64_t(call.bytes()));
  if (st && st->ring) {
    detail::FlightEntry e = flight_entry(call, stream);
    if (fault == detail::FaultKind::Slow || fault == detail::FaultKind::Corrupt) {
      copy_name(e.note, sizeof(e.note), std::string("injected ") + fault_kind_name(fault));
    }
    call.flight = st->ring;
    call.flight_id = st->ring->issue(e);
  }
  call.corrupt = fault == detail::FaultKind::Corrupt;
  impl_->issue(std::move(call), stream);
  return stream.record();
}

detail::FlightEntry Communicator::flight_entry(const CommCall& call, Stream& stream) const {
  detail::FlightEntry e;
  e.gid = gid_;
  e.seq = call.seq;
  copy_name(e.group, sizeof(e.group), name_);
  copy_name(e.stream, sizeof(e.stream), stream.name());
  e.group_rank = rank_;
  e.group_size = size_;
  e.root = call.root;
  e.peer = call.peer;
  e.op = static_cast<uint8_t>(call.op);
  e.dtype = static_cast<uint8_t>(call.dtype);
  e.redop = static_cast<uint8_t>(call.redop);
  e.count = call.count;
  e.bytes = call.bytes();
  e.enqueue_ns = detail::flight_now_ns();
  return e;
}

void Communicator::inject(detail::FaultKind kind, const CommCall& call, Stream& stream) {
  const detail::RankState& st = *state_;
  const bool p2p = call.op == CommOp::Send || call.op == CommOp::Recv;
  const uint64_t seq = p2p ? 0 : next_seq_.load();
  std::ostringstream os;
  os << "meshrt: injected fault (MESHRT_FAULT=" << st.fault.str() << "): rank " << st.global_rank
     << " " << fault_kind_name(kind) << " at " << call.str() << " on group '" << name_ << "' (seq "
     << seq << ", group rank " << rank_ << ", step " << st.counted.load() << ")";
  using detail::FaultKind;
  switch (kind) {
    case FaultKind::Slow:
      // Each collective from the step on is delayed; said once.
      if (st.counted.load() == st.fault.step)
        MESHRT_LOG_WARN(os.str().substr(8) << ", +" << st.fault.ms << " ms each from here on");
      std::this_thread::sleep_for(std::chrono::milliseconds(st.fault.ms));
      return;
    case FaultKind::Skip:
      MESHRT_LOG_WARN(os.str().substr(8) << ": not issued");
      if (st.ring) {
        detail::FlightEntry e = flight_entry(call, stream);
        e.seq = 0;  // never numbered: the rank's code skipped the call
        e.state = detail::FlightState::Skipped;
        copy_name(e.note, sizeof(e.note), "injected skip");
        st.ring->issue(e);
      }
      return;
    case FaultKind::Corrupt:
      if (backend() == "nccl") {
        MESHRT_LOG_WARN(os.str().substr(8) << ": not injected (the nccl backend does not corrupt "
                                              "device buffers; use the host or mpi backend)");
      } else {
        MESHRT_LOG_WARN(os.str().substr(8) << ": its result will be wrong");
      }
      return;
    case FaultKind::Hang:
      std::fprintf(stderr, "%s: the rank stops issuing\n", os.str().c_str());
      std::fflush(stderr);
      park_forever();
    case FaultKind::Crash:
      std::fprintf(stderr, "%s: %s\n", os.str().c_str(),
                   st.threads ? "the rank thread stops for good (no cleanup, its communicators "
                                "never answer)"
                              : "the process writes its flight record and exits (status 86)");
      std::fflush(stderr);
      if (st.threads) park_forever();
      // As the recorder's fatal-signal path would: the record first, then the process is gone.
      detail::flight_dump_all("crash: " + os.str().substr(8));
      std::_Exit(86);
    case FaultKind::None:
      return;
  }
}

Event Communicator::all_reduce(const Tensor& t, ReduceOp op, Stream& stream,
                               const EventList& after) {
  return all_reduce(t, t, op, stream, after);
}

Event Communicator::all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, Stream& stream,
                               const EventList& after) {
  check_tensor("all_reduce", "input", in, true);
  check_tensor("all_reduce", "output", out, true);
  MESHRT_CHECK(in.dtype() == out.dtype(), "all_reduce on group '"
                                              << name_ << "': input " << in.str() << " and output "
                                              << out.str() << " differ in dtype");
  MESHRT_CHECK(in.numel() == out.numel(), "all_reduce on group '"
                                              << name_ << "': input has " << in.numel()
                                              << " elements but output has " << out.numel());
  CommCall c;
  c.op = CommOp::AllReduce;
  c.dtype = in.dtype();
  c.redop = op;
  c.count = in.numel();
  c.in_place = in.numel() == 0 || in.data_ptr() == out.data_ptr();
  MESHRT_CHECK(
      c.in_place || !overlaps(byte_ptr(in), in.nbytes(), byte_ptr(out), out.nbytes()),
      "all_reduce on group '" << name_ << "': input and output overlap without being the same");
  c.in = in;
  c.out = out;
  return submit(c, stream, after);
}

Event Communicator::all_gather(const Tensor& in, const Tensor& out, Stream& stream,
                               const EventList& after) {
  check_tensor("all_gather", "input", in, false);
  check_tensor("all_gather", "output", out, false);
  MESHRT_CHECK(in.dtype() == out.dtype(), "all_gather on group '"
                                              << name_ << "': input " << in.str() << " and output "
                                              << out.str() << " differ in dtype");
  MESHRT_CHECK(out.numel() == in.numel() * size_,
               "all_gather on group '" << name_ << "': output has " << out.numel()
                                       << " elements but needs size " << size_ << " x input "
                                       << in.numel() << " = " << in.numel() * size_);
  CommCall c;
  c.op = CommOp::AllGather;
  c.dtype = in.dtype();
  c.count = in.numel();
  const char* mine = byte_ptr(out) + static_cast<size_t>(rank_) * in.nbytes();
  c.in_place = in.numel() == 0 || byte_ptr(in) == mine;
  MESHRT_CHECK(c.in_place || !overlaps(byte_ptr(in), in.nbytes(), byte_ptr(out), out.nbytes()),
               "all_gather on group '" << name_
                                       << "': input overlaps the output without being this rank's "
                                          "block of it (rank "
                                       << rank_ << ")");
  c.in = in;
  c.out = out;
  return submit(c, stream, after);
}

Event Communicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, Stream& stream,
                                   const EventList& after) {
  check_tensor("reduce_scatter", "input", in, true);
  check_tensor("reduce_scatter", "output", out, true);
  MESHRT_CHECK(in.dtype() == out.dtype(), "reduce_scatter on group '"
                                              << name_ << "': input " << in.str() << " and output "
                                              << out.str() << " differ in dtype");
  MESHRT_CHECK(in.numel() == out.numel() * size_,
               "reduce_scatter on group '" << name_ << "': input has " << in.numel()
                                           << " elements but needs size " << size_ << " x output "
                                           << out.numel() << " = " << out.numel() * size_);
  CommCall c;
  c.op = CommOp::ReduceScatter;
  c.dtype = in.dtype();
  c.redop = op;
  c.count = out.numel();
  const char* mine = byte_ptr(in) + static_cast<size_t>(rank_) * out.nbytes();
  c.in_place = out.numel() == 0 || byte_ptr(out) == mine;
  MESHRT_CHECK(c.in_place || !overlaps(byte_ptr(in), in.nbytes(), byte_ptr(out), out.nbytes()),
               "reduce_scatter on group '" << name_
                                           << "': output overlaps the input without being this "
                                              "rank's block of it (rank "
                                           << rank_ << ")");
  c.in = in;
  c.out = out;
  return submit(c, stream, after);
}

Event Communicator::broadcast(const Tensor& t, int root, Stream& stream, const EventList& after) {
  return broadcast(t, t, root, stream, after);
}

Event Communicator::broadcast(const Tensor& in, const Tensor& out, int root, Stream& stream,
                              const EventList& after) {
  MESHRT_CHECK(root >= 0 && root < size_, "broadcast on group '" << name_ << "': root " << root
                                                                 << " outside [0, " << size_
                                                                 << ")");
  check_tensor("broadcast", "input", in, false);
  check_tensor("broadcast", "output", out, false);
  MESHRT_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(),
               "broadcast on group '" << name_ << "': input " << in.str() << " and output "
                                      << out.str() << " differ in dtype or element count");
  CommCall c;
  c.op = CommOp::Broadcast;
  c.dtype = in.dtype();
  c.count = in.numel();
  c.root = root;
  c.in_place = in.numel() == 0 || in.data_ptr() == out.data_ptr();
  MESHRT_CHECK(
      c.in_place || !overlaps(byte_ptr(in), in.nbytes(), byte_ptr(out), out.nbytes()),
      "broadcast on group '" << name_ << "': input and output overlap without being the same");
  c.in = in;
  c.out = out;
  return submit(c, stream, after);
}

Event Communicator::all_to_all(const Tensor& in, const Tensor& out, Stream& stream,
                               const EventList& after) {
  check_tensor("all_to_all", "input", in, false);
  check_tensor("all_to_all", "output", out, false);
  MESHRT_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(),
               "all_to_all on group '" << name_ << "': input " << in.str() << " and output "
                                       << out.str() << " differ in dtype or element count");
  MESHRT_CHECK(in.numel() % size_ == 0, "all_to_all on group '" << name_ << "': " << in.numel()
                                                                << " elements do not split into "
                                                                << size_ << " equal blocks");
  CommCall c;
  c.op = CommOp::AllToAll;
  c.dtype = in.dtype();
  c.count = in.numel() / size_;
  c.in_place = in.numel() == 0 || in.data_ptr() == out.data_ptr();
  MESHRT_CHECK(
      c.in_place || !overlaps(byte_ptr(in), in.nbytes(), byte_ptr(out), out.nbytes()),
      "all_to_all on group '" << name_ << "': input and output overlap without being the same");
  c.in = in;
  c.out = out;
  return submit(c, stream, after);
}

Event Communicator::send(const Tensor& t, int peer, Stream& stream, const EventList& after) {
  MESHRT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
               "send on group '" << name_ << "' from rank " << rank_ << ": peer " << peer
                                 << " must be another rank in [0, " << size_ << ")");
  check_tensor("send", "tensor", t, false);
  CommCall c;
  c.op = CommOp::Send;
  c.dtype = t.dtype();
  c.count = t.numel();
  c.peer = peer;
  c.in = t;
  return submit(c, stream, after);
}

Event Communicator::recv(const Tensor& t, int peer, Stream& stream, const EventList& after) {
  MESHRT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
               "recv on group '" << name_ << "' at rank " << rank_ << ": peer " << peer
                                 << " must be another rank in [0, " << size_ << ")");
  check_tensor("recv", "tensor", t, false);
  CommCall c;
  c.op = CommOp::Recv;
  c.dtype = t.dtype();
  c.count = t.numel();
  c.peer = peer;
  c.out = t;
  return submit(c, stream, after);
}

Event Communicator::barrier(Stream& stream, const EventList& after) {
  CommCall c;
  c.op = CommOp::Barrier;
  return submit(c, stream, after);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  if (aborted()) {
    throw CommError("split on group '" + name_ +
                    "': the communicator was aborted: " + abort_reason());
  }
  uint64_t seq = next_seq_.fetch_add(1);
  std::string n = name;
  if (n.empty() && color >= 0) n = name_ + "/split" + std::to_string(color);
  detail::RankState* st = state_.get();
  uint64_t id = 0;
  if (st && st->ring) {
    detail::FlightEntry e;
    e.gid = gid_;
    e.seq = seq;
    copy_name(e.group, sizeof(e.group), name_);
    copy_name(e.stream, sizeof(e.stream), "(caller)");
    e.group_rank = rank_;
    e.group_size = size_;
    e.op = static_cast<uint8_t>(CommOp::Split);
    e.enqueue_ns = detail::flight_now_ns();
    id = st->ring->issue(e);
    st->ring->started(id);
  }
  std::unique_ptr<Communicator> child;
  ++tls_splitting;
  try {
    child = impl_->split(color < 0 ? kNoColor : color, key, n, seq);
  } catch (...) {
    --tls_splitting;
    if (id) st->ring->ended(id, false);
    throw;
  }
  --tls_splitting;
  if (id) st->ring->ended(id, true);
  if (child && !state_ && child->impl_->opens_ranges() && tls_inner == 0) {
    // Split from a forwarding communicator: the child starts its own state (without the fault,
    // whose rank is a global one).
    child->state_ =
        detail::make_rank_state(child->rank_, child->size_, child->impl_->backend(), "");
  } else if (child && state_ && child->impl_->opens_ranges()) {
    child->state_ = state_;
    uint64_t h = gid_ ^ (0x9e3779b97f4a7c15ull + (seq << 6) + static_cast<uint64_t>(color));
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    child->gid_ = h ^ (h >> 29);
  }
  return child;
}

void Communicator::abort(const std::string& reason) { impl_->abort(reason); }

void Communicator::wait_idle() {
  std::unordered_map<int, uint64_t> sent, received;
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    sent = send_seq_;
    received = recv_seq_;
  }
  impl_->wait_issued(next_seq_.load() - 1, sent, received);
}

}  // namespace meshrt
