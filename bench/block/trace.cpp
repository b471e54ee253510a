#include "bench/block/trace.h"

#include <cstdio>
#include <sstream>

#include "collectives/comm_impl.h"
#include "dist/device_mesh.h"
#include "runtime/error.h"
#include "runtime/ranges.h"

namespace meshrt {

namespace {

// JSON string escaping for names (quotes, backslashes, control characters).
std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace

TraceRecorder::TraceRecorder(int rank, Stream& compute) : rank_(rank), compute_(compute) {
  tracks_[&compute] = 0;
  track_names_[0] = "compute";
}

int TraceRecorder::track_of(Stream& s) {
  auto it = tracks_.find(&s);
  if (it != tracks_.end()) return it->second;
  const std::string n = s.name();
  // DeviceMesh names a dim's stream "comm.<dim>".
  static const std::string tp_stream = "comm." + std::string(kTpDim),
                           dp_stream = "comm." + std::string(kDpDim);
  int tid = 0;
  if (n == tp_stream && !track_names_.count(1)) {
    tid = 1;
  } else if (n == dp_stream && !track_names_.count(2)) {
    tid = 2;
  } else {
    tid = 3;
    while (track_names_.count(tid)) ++tid;
  }
  tracks_[&s] = tid;
  track_names_[tid] = n;
  return tid;
}

void TraceRecorder::begin_step(int step, double host_offset_us) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  step_ = step;
  base_us_ = host_offset_us;
  base_ = compute_.record_timed();
  ++markers_;
}

int TraceRecorder::begin(Stream& stream, std::string name, std::string args_json,
                         uint64_t payload) {
  const bool ranged = ranges::enabled();
  if (ranged) ranges::push(name, payload);
  try {
    return open_slice(stream, std::move(name), std::move(args_json), ranged);
  } catch (...) {
    if (ranged) ranges::pop();  // no handle reaches end(): close the range here
    throw;
  }
}

int TraceRecorder::begin_slice(Stream& stream, std::string name, std::string args_json) {
  return open_slice(stream, std::move(name), std::move(args_json), false);
}

int TraceRecorder::open_slice(Stream& stream, std::string name, std::string args_json,
                              bool ranged) {
  if (!enabled_) return ranged ? kRangeOnly : kNone;
  std::lock_guard<std::mutex> lk(mu_);
  Open o;
  o.ranged = ranged;
  o.stream = &stream;
  o.tid = track_of(stream);
  o.name = std::move(name);
  o.args = std::move(args_json);
  o.start = stream.record_timed();
  ++markers_;
  open_.push_back(std::move(o));
  return static_cast<int>(open_.size()) - 1;
}

void TraceRecorder::end(int handle) {
  if (handle == kRangeOnly) ranges::pop();
  if (handle < 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  Open& o = open_.at(static_cast<size_t>(handle));
  if (o.ranged) ranges::pop();  // first, so that a failing record() leaves no range open
  o.stop = o.stream->record_timed();
  ++markers_;
}

void TraceRecorder::end_step() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  for (const Open& o : open_) {
    if (!o.stop.valid()) continue;
    const double t0 = base_us_ + 1000.0 * o.start.elapsed_ms(base_);
    const double t1 = base_us_ + 1000.0 * o.stop.elapsed_ms(base_);
    if (!out_.empty() || os.tellp() > 0) os << ",\n";
    os << "{\"ph\":\"X\",\"pid\":" << rank_ << ",\"tid\":" << o.tid << ",\"ts\":" << t0
       << ",\"dur\":" << (t1 > t0 ? t1 - t0 : 0.0) << ",\"name\":\"" << esc(o.name)
       << "\",\"args\":{\"step\":" << step_ << (o.args.empty() ? "" : ",") << o.args << "}}";
  }
  out_ += os.str();
  open_.clear();
  base_ = Event();
}

std::string TraceRecorder::serialize() const {
  std::ostringstream os;
  os << "{\"ph\":\"M\",\"pid\":" << rank_ << ",\"name\":\"process_name\",\"args\":{\"name\":\"rank "
     << rank_ << "\"}},\n";
  os << "{\"ph\":\"M\",\"pid\":" << rank_
     << ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" << rank_ << "}}";
  for (auto& [tid, name] : track_names_) {
    os << ",\n{\"ph\":\"M\",\"pid\":" << rank_ << ",\"tid\":" << tid
       << ",\"name\":\"thread_name\",\"args\":{\"name\":\"" << esc(name) << "\"}}";
    os << ",\n{\"ph\":\"M\",\"pid\":" << rank_ << ",\"tid\":" << tid
       << ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" << tid << "}}";
  }
  if (!out_.empty()) os << ",\n" << out_;
  return os.str();
}

// ---- TracingCommunicator ------------------------------------------------------------------------

namespace {

// Forwards every call to `inner` (which opens the profiler range), bracketed by a trace slice.
class TracingImpl final : public CommImpl {
 public:
  TracingImpl(std::unique_ptr<Communicator> owned, Communicator& inner, TraceRecorder* rec,
              StreamTimes* times)
      : owned_(std::move(owned)), inner_(&inner), rec_(rec), times_(times) {
    const std::string& n = inner.name();
    if (times_ && (n.size() < times_->suffix.size() ||
                   n.compare(n.size() - times_->suffix.size(), n.npos, times_->suffix) != 0))
      times_ = nullptr;  // another group: forwarded untimed (its splits may still match)
    split_times_ = times;
  }

  std::string_view backend() const override { return inner_->backend(); }
  bool aborted() const override { return inner_->aborted(); }
  std::string abort_reason() const override { return inner_->abort_reason(); }
  bool opens_ranges() const override { return false; }
  void abort(const std::string& reason) override { inner_->abort(reason); }

  void issue(CommCall call, Stream& stream) override {
    int h = -1;
    if (rec_ && rec_->enabled()) {
      std::ostringstream args;
      args << "\"group\":\"" << inner_->name() << "\",\"dtype\":\"" << dtype_name(call.dtype)
           << "\",\"count\":" << call.count << ",\"bytes\":" << call.bytes();
      h = rec_->begin_slice(stream, comm_op_name(call.op), args.str());
    }
    const Event t0 = times_ ? stream.record_timed() : Event();
    switch (call.op) {
      case CommOp::AllReduce:
        inner_->all_reduce(call.in, call.out, call.redop, stream);
        break;
      case CommOp::AllGather:
        inner_->all_gather(call.in, call.out, stream);
        break;
      case CommOp::ReduceScatter:
        inner_->reduce_scatter(call.in, call.out, call.redop, stream);
        break;
      case CommOp::Broadcast:
        inner_->broadcast(call.in, call.out, call.root, stream);
        break;
      case CommOp::AllToAll:
        inner_->all_to_all(call.in, call.out, stream);
        break;
      case CommOp::Send:
        inner_->send(call.in, call.peer, stream);
        break;
      case CommOp::Recv:
        inner_->recv(call.out, call.peer, stream);
        break;
      case CommOp::Barrier:
        inner_->barrier(stream);
        break;
      case CommOp::Split:
        MESHRT_FAIL("tracing communicator: split is not issued on a stream");
    }
    if (times_) times_->add(t0, stream.record_timed(), static_cast<int64_t>(call.bytes()));
    if (h >= 0) rec_->end(h);
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      uint64_t) override {
    std::unique_ptr<Communicator> c = inner_->split(color, key, name);
    if (!c) return nullptr;
    return std::make_unique<TracingCommunicator>(std::move(c), rec_, split_times_);
  }

  void wait_issued(uint64_t, const std::unordered_map<int, uint64_t>&,
                   const std::unordered_map<int, uint64_t>&) override {
    inner_->wait_idle();
  }

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  TraceRecorder* rec_;
  StreamTimes* times_;        // this group's, when its name matches
  StreamTimes* split_times_;  // passed on to splits
};

}  // namespace

TracingCommunicator::TracingCommunicator(Communicator& inner, TraceRecorder* rec,
                                         StreamTimes* times)
    : TracingCommunicator(inner, nullptr, rec, times) {}

// `owned` is a reference so that nothing moves it before `inner` is bound to its object.
TracingCommunicator::TracingCommunicator(std::unique_ptr<Communicator> inner, TraceRecorder* rec,
                                         StreamTimes* times)
    : TracingCommunicator(*inner, std::move(inner), rec, times) {}

TracingCommunicator::TracingCommunicator(Communicator& inner, std::unique_ptr<Communicator>&& owned,
                                         TraceRecorder* rec, StreamTimes* times)
    : Communicator(inner.rank(), inner.size(), inner.name(), inner.device(), inner.config(),
                   std::make_unique<TracingImpl>(std::move(owned), inner, rec, times)) {}

void StreamTimes::add(Event start, Event stop, int64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.emplace_back(std::move(start), std::move(stop));
  t_.bytes += bytes;
  t_.count++;
}

CommTimes StreamTimes::times() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [a, b] : pending_) {
    try {
      b.synchronize();
      t_.comm_ms += b.elapsed_ms(a);
    } catch (...) {
      // a failed call reports its error where its result is waited for
    }
  }
  pending_.clear();
  return t_;
}

void StreamTimes::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.clear();
  t_ = CommTimes{};
}

}  // namespace meshrt
