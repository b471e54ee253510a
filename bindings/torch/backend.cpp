// The "meshrt" torch.distributed backend: each torch collective becomes one or a few meshrt
// collectives on CPU tensors used in place (DLPack views, no copy when the tensor is contiguous).
#include "backend.h"

#include "backend_cuda.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

namespace meshrt_torch {
namespace {

using c10d::ReduceOp;

bool dl_dtype(at::ScalarType t, DLDataType* out) {
  switch (t) {
    case at::kFloat:
      *out = {kDLFloat, 32, 1};
      return true;
    case at::kBFloat16:
      *out = {kDLBfloat, 16, 1};
      return true;
    case at::kHalf:
      *out = {kDLFloat, 16, 1};
      return true;
    case at::kInt:
      *out = {kDLInt, 32, 1};
      return true;
    case at::kLong:
      *out = {kDLInt, 64, 1};
      return true;
    case at::kByte:
      *out = {kDLUInt, 8, 1};
      return true;
    default:
      return false;
  }
}

std::string dtype_name(at::ScalarType t) { return std::string(c10::getDtypeNames(t).first); }

const char* op_name(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::BAND:
      return "BAND";
    case ReduceOp::BOR:
      return "BOR";
    case ReduceOp::BXOR:
      return "BXOR";
    case ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

bool reducible(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kInt || t == at::kLong;
}

bool native(ReduceOp::RedOpType op, meshrt_reduce_op_t* out) {
  switch (op) {
    case ReduceOp::SUM:
      *out = MESHRT_SUM;
      return true;
    case ReduceOp::AVG:
      *out = MESHRT_AVG;
      return true;
    case ReduceOp::MIN:
      *out = MESHRT_MIN;
      return true;
    case ReduceOp::MAX:
      *out = MESHRT_MAX;
      return true;
    default:
      return false;
  }
}

// A flat view of contiguous t as meshrt moves it: its own dtype when meshrt has it, else bytes.
at::Tensor movable(const at::Tensor& t) {
  at::Tensor f = t.reshape({-1});
  DLDataType dt;
  if (dl_dtype(f.scalar_type(), &dt)) return f;
  return f.view(at::kByte);
}

// Rows [size, n] reduced over dim 0 with an op meshrt has no kernel for.
at::Tensor reduce_rows(const at::Tensor& rows, ReduceOp::RedOpType op) {
  if (op == ReduceOp::PRODUCT) return at::prod(rows, 0, false, rows.scalar_type());
  at::Tensor acc = rows[0].clone();
  for (int64_t r = 1; r < rows.size(0); ++r) {
    if (op == ReduceOp::BAND) acc.bitwise_and_(rows[r]);
    if (op == ReduceOp::BOR) acc.bitwise_or_(rows[r]);
    if (op == ReduceOp::BXOR) acc.bitwise_xor_(rows[r]);
  }
  return acc;
}

// x * the PREMUL_SUM factor, in place.
void premultiply(const at::Tensor& x, const ReduceOp& op) {
  auto sup = c10::dynamic_intrusive_pointer_cast<c10d::PreMulSumSupplement>(op.supplement_);
  if (!sup) return;
  if (sup->tensor_factor.defined()) {
    x.mul_(sup->tensor_factor.to(x.device()));
  } else {
    x.mul_(sup->double_factor);
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// A TCP port nobody listens on now (rank 0 listens there right after).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

[[noreturn]] void throw_dist(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

// Whether torch will wait for the call right away (async_op=False): options.asyncOp, which
// torch has since 2.7; older torch does not say, and every call counts as asynchronous.
template <class O>
auto waited_at_once(const O& o, int) -> decltype(bool(o.asyncOp)) {
  return !o.asyncOp;
}
template <class O>
bool waited_at_once(const O&, long) {
  return false;
}

// Around a call torch waits for at once: meshrt's inline mode (meshrt_thread_inline), so that
// the collective runs on this thread when the communicator's stream is idle, with no hand-off to
// the stream's thread and back; behind queued work it queues as before.
class InlineScope {
 public:
  explicit InlineScope(bool on) : on_(on) {
    if (on_) meshrt_thread_inline(1, &prev_);
  }
  ~InlineScope() {
    if (on_) meshrt_thread_inline(prev_, nullptr);
  }
  InlineScope(const InlineScope&) = delete;
  InlineScope& operator=(const InlineScope&) = delete;

 private:
  bool on_;
  int prev_ = 0;
};

}  // namespace

// ---- Completer --------------------------------------------------------------------------------

Completer::~Completer() { stop(); }

void Completer::push(c10::intrusive_ptr<MeshrtWork> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
      queue_.push_back(std::move(work));
      cv_.notify_one();
      return;
    }
  }
  // Stopped (the backend is being destroyed): complete it here, outside the lock (the future's
  // callbacks may ask for other futures).
  work->finalize(true);
}

void Completer::loop() {
  for (;;) {
    c10::intrusive_ptr<MeshrtWork> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    w->finalize(true);
  }
}

void Completer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

// ---- MeshrtWork ---------------------------------------------------------------------------------

MeshrtWork::MeshrtWork(int rank, c10d::OpType type, std::string op, Pending pending,
                       std::weak_ptr<Completer> completer)
    : c10d::Work(rank, type),
      rank_(rank),
      op_(std::move(op)),
      pending_(std::move(pending)),
      completer_(std::move(completer)) {}

MeshrtWork::~MeshrtWork() {
  try {
    finalize(true);
  } catch (...) {
  }
}

bool MeshrtWork::finalize(bool block) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return true;
  for (; next_event_ < pending_.events.size(); ++next_event_) {
    meshrt_event_t ev = pending_.events[next_event_];
    if (!block) {
      int ready = 0;
      if (meshrt_event_query(ev, &ready) == MESHRT_SUCCESS && !ready) return false;
    }
    const meshrt_status_t s = meshrt_event_synchronize(ev);
    if (s != MESHRT_SUCCESS && !error_) {
      std::ostringstream msg;
      msg << "meshrt: rank " << rank_ << ": " << op_ << " failed (" << meshrt_status_string(s)
          << "): " << meshrt_last_error();
      error_ = std::make_exception_ptr(
          c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg.str()));
    }
    meshrt_event_destroy(ev);
  }
  if (!error_) {
    try {
      for (auto& f : pending_.finish) f();
      for (auto& f : pending_.copy_back) f();
    } catch (const std::exception& e) {
      error_ = std::make_exception_ptr(c10::DistBackendError(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "meshrt: rank " + std::to_string(rank_) + ": " + op_ + " failed: " + e.what()));
    }
  }
  pending_.finish.clear();
  pending_.copy_back.clear();
  pending_.keep.clear();
  done_ = true;
  complete_future_locked();
  return true;
}

void MeshrtWork::complete_future_locked() {
  if (!future_ || future_->completed()) return;
  if (error_) {
    future_->setError(error_);
  } else {
    future_->markCompleted(c10::IValue(pending_.outputs));
  }
}

bool MeshrtWork::isCompleted() {
  if (done_) return true;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  lock.unlock();
  return finalize(false);
}

bool MeshrtWork::isSuccess() const { return done_ && !error_; }

std::exception_ptr MeshrtWork::exception() const { return done_ ? error_ : nullptr; }

bool MeshrtWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout || timeout.count() <= 0) {
    finalize(true);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!finalize(false)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw_dist("meshrt: rank " + std::to_string(rank_) + ": " + op_ + " not done after " +
                   std::to_string(timeout.count()) +
                   " ms (the timeout given to Work.wait); a peer may be missing or slow");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

std::vector<at::Tensor> MeshrtWork::result() { return pending_.outputs; }

c10::intrusive_ptr<c10::ivalue::Future> MeshrtWork::getFuture() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!future_) {
      future_ =
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    }
    if (done_) {
      complete_future_locked();
      return future_;
    }
  }
  auto c = completer_.lock();
  auto self = c10::intrusive_ptr<MeshrtWork>::reclaim_copy(this);
  if (c) {
    c->push(self);
  } else {
    finalize(true);
  }
  return future_;
}

// ---- MeshrtBackend: life
// -------------------------------------------------------------------------

namespace {
// A communicator of `size` ranks met through torch's store: rank 0 listens on a free TCP port and
// publishes its host and port under `key`; the others read them and connect (127.0.0.1 on the
// same host).
meshrt_comm_t bootstrap(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                        int rank, int size, const meshrt_comm_config_t& cfg,
                        const std::string& who) {
  meshrt_comm_t comm = nullptr;
  meshrt_status_t s;
  std::string where;
  if (size == 1) {
    const bool cuda = cfg.device_type == MESHRT_DEVICE_CUDA;
    s = meshrt_comm_init_all(&comm, 1, cuda ? &cfg.device_index : nullptr, &cfg);
    where = "one rank";
  } else {
    std::string host;
    int port = -1;
    if (rank == 0) {
      port = free_port();
      if (port <= 0) throw_dist(who + ": no free TCP port for the rendezvous");
      const std::string v = host_name() + " " + std::to_string(port);
      store->set(key, std::vector<uint8_t>(v.begin(), v.end()));
      host = "0.0.0.0";
    } else {
      const std::vector<uint8_t> got = store->get(key);
      std::istringstream in(std::string(got.begin(), got.end()));
      in >> host >> port;
      if (host == host_name()) host = "127.0.0.1";
    }
    where = "TCP " + host + ":" + std::to_string(port);
    s = meshrt_comm_init_tcp(&comm, host.c_str(), port, size, rank, &cfg);
  }
  if (s != MESHRT_SUCCESS) {
    throw_dist(who + ": creating the communicator (" + where + ") failed (" +
               meshrt_status_string(s) + "): " + meshrt_last_error());
  }
  return comm;
}

meshrt_comm_config_t comm_config(double timeout_s) {
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  cfg.timeout_s = timeout_s;
  cfg.init_timeout_s = timeout_s;
  return cfg;
}
}  // namespace

c10::intrusive_ptr<MeshrtBackend> MeshrtBackend::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s) {
  const std::string who = "meshrt: rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (meshrt_init(MESHRT_API_VERSION) != MESHRT_SUCCESS) {
    throw_dist(who + ": meshrt_init failed: " + meshrt_last_error());
  }
  meshrt_comm_t comm =
      bootstrap(store, "meshrt/rendezvous", rank, size, comm_config(timeout_s), who);
  return c10::make_intrusive<MeshrtBackend>(comm, store, rank, size, timeout_s);
}

MeshrtBackend::MeshrtBackend(meshrt_comm_t comm, c10::intrusive_ptr<c10d::Store> store, int rank,
                             int size, double timeout_s)
    : c10d::Backend(rank, size),
      comm_(comm),
      store_(std::move(store)),
      timeout_s_(timeout_s),
      completer_(std::make_shared<Completer>()) {}

MeshrtBackend::~MeshrtBackend() { shutdown(); }

void MeshrtBackend::shutdown() {
  std::lock_guard<std::mutex> lock(destroy_mu_);
  if (comm_ == nullptr) return;
  completer_->stop();
  if (send_stream_) meshrt_stream_destroy(send_stream_);
  if (recv_stream_) meshrt_stream_destroy(recv_stream_);
  send_stream_ = recv_stream_ = nullptr;
  {
    std::lock_guard<std::mutex> cuda_lock(cuda_mu_);
    for (auto& [native, s] : cuda_streams_) meshrt_stream_destroy(s);
    cuda_streams_.clear();
    if (cuda_comm_) meshrt_comm_destroy(cuda_comm_);
    cuda_comm_ = nullptr;
  }
  meshrt_comm_destroy(comm_);
  comm_ = nullptr;
}

void MeshrtBackend::abort() {
  std::lock_guard<std::mutex> lock(destroy_mu_);
  if (comm_ != nullptr) meshrt_comm_abort(comm_);
  std::lock_guard<std::mutex> cuda_lock(cuda_mu_);
  if (cuda_comm_ != nullptr) meshrt_comm_abort(cuda_comm_);
}

// ---- MeshrtBackend: helpers
// ----------------------------------------------------------------------

void MeshrtBackend::fail(const std::string& op, const std::string& cause) const {
  throw_dist("meshrt: rank " + std::to_string(rank_) + ": " + op + ": " + cause);
}

void MeshrtBackend::check(meshrt_status_t s, const std::string& op) const {
  if (s == MESHRT_SUCCESS) return;
  fail(op, std::string(meshrt_status_string(s)) + ": " + meshrt_last_error());
}

void MeshrtBackend::check_tensor(const at::Tensor& t, const std::string& op) const {
  if (comm_ == nullptr) fail(op, "the process group was shut down (destroy_process_group)");
  if (!t.defined()) fail(op, "an undefined tensor was passed");
  if (t.layout() != at::kStrided) fail(op, "only dense (strided) tensors are supported");
  if (t.device().is_cuda() && cuda_built()) return;
  if (!t.device().is_cpu()) {
    fail(op, t.device().str() +
                 " tensors are not supported by this build of meshrt.torch (CPU tensors only); "
                 "use backend \"cpu:meshrt,cuda:nccl\" or move the tensor to the CPU");
  }
}

meshrt_comm_t MeshrtBackend::cuda_comm(int device, const char* name) {
  std::lock_guard<std::mutex> lock(cuda_mu_);
  if (cuda_comm_ != nullptr) {
    if (device != cuda_device_) {
      fail(name, "this rank's CUDA collectives of this group run on cuda:" +
                     std::to_string(cuda_device_) + ", not cuda:" + std::to_string(device) +
                     " (one GPU per rank and group): move the tensor to cuda:" +
                     std::to_string(cuda_device_));
    }
    return cuda_comm_;
  }
  // The first CUDA collective of the group, which every rank issues in the same place: the ranks
  // meet through torch's store again and make meshrt's NCCL communicator on their GPUs.
  meshrt_comm_config_t cfg = comm_config(timeout_s_);
  cfg.device_type = MESHRT_DEVICE_CUDA;
  cfg.device_index = device;
  const std::string who =
      "meshrt: rank " + std::to_string(rank_) + ": " + name + " on cuda:" + std::to_string(device);
  cuda_comm_ = bootstrap(store_, "meshrt/rendezvous/cuda", rank_, size_, cfg, who);
  cuda_device_ = device;
  return cuda_comm_;
}

MeshrtBackend::Target MeshrtBackend::target(const at::Tensor& t, const char* name) {
  if (!t.device().is_cuda()) return {comm_, nullptr};
  const int device = t.device().index();
  meshrt_comm_t comm = cuda_comm(device, name);
  // torch's current stream on that device, wrapped once (meshrt does not own it).
  void* native = current_cuda_stream(device);
  std::lock_guard<std::mutex> lock(cuda_mu_);
  auto it = cuda_streams_.find(native);
  if (it == cuda_streams_.end()) {
    meshrt_stream_t s = nullptr;
    check(meshrt_stream_wrap(comm, native, &s), name);
    it = cuda_streams_.emplace(native, s).first;
  }
  return {comm, it->second};
}

at::Tensor MeshrtBackend::out_buffer(Pending& p, const at::Tensor& t, bool keep_values) {
  if (t.is_contiguous()) return t;
  at::Tensor tmp = keep_values ? t.contiguous() : at::empty(t.sizes(), t.options());
  p.copy_back.push_back([t, tmp]() { t.copy_(tmp); });
  return tmp;
}

meshrt_stream_t MeshrtBackend::p2p_stream(bool send_side) {
  meshrt_stream_t& s = send_side ? send_stream_ : recv_stream_;
  if (s == nullptr) check(meshrt_stream_create(comm_, &s), send_side ? "send" : "recv");
  return s;
}

namespace {
// One borrowed meshrt tensor, released once the call is enqueued (the Work keeps the memory).
struct Borrowed {
  meshrt_tensor_t h = nullptr;
  Borrowed() = default;
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed() {
    if (h) meshrt_tensor_destroy(h);
  }
};

meshrt_status_t borrow(const at::Tensor& flat, Borrowed* out) {
  DLTensor d{};
  int64_t n = flat.numel();
  d.data = flat.data_ptr();
  d.device = flat.device().is_cuda()
                 ? DLDevice{kDLCUDA, static_cast<int32_t>(flat.device().index())}
                 : DLDevice{kDLCPU, 0};
  d.ndim = 1;
  dl_dtype(flat.scalar_type(), &d.dtype);
  d.shape = &n;
  d.strides = nullptr;
  d.byte_offset = 0;
  return meshrt_tensor_from_dltensor(&d, &out->h);
}
}  // namespace

#define MESHRT_BORROW(var, tensor, name) \
  Borrowed var;                          \
  check(borrow(tensor, &var), name)

void MeshrtBackend::all_reduce_into(Pending& p, const at::Tensor& buf, ReduceOp op,
                                    const char* name) {
  const auto t = buf.scalar_type();
  const std::string what = std::string(name) + " " + op_name(op.op_) + " of " + dtype_name(t);
  if (!reducible(t)) {
    fail(name, what +
                   " is not supported (meshrt reduces float32, bfloat16, float16, int32 "
                   "and int64)");
  }
  const bool bitwise = op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR;
  if (bitwise && !at::isIntegralType(t, false)) {
    fail(name, what + " is not supported (bitwise ops take integer tensors)");
  }
  at::Tensor flat = buf.reshape({-1});
  meshrt_reduce_op_t mop = MESHRT_SUM;
  if (op == ReduceOp::PREMUL_SUM) premultiply(flat, op);
  if (op == ReduceOp::PREMUL_SUM || native(op.op_, &mop)) {
    MESHRT_BORROW(h, flat, name);
    const Target tg = target(flat, name);
    meshrt_event_t ev = nullptr;
    check(meshrt_all_reduce(tg.comm, h.h, h.h, mop, tg.stream, &ev), name);
    p.add(ev, {flat});
    return;
  }
  if (op != ReduceOp::PRODUCT && !bitwise) fail(name, what + " is not supported");
  // PRODUCT and the bitwise ops: gather every rank's tensor, reduce here.
  at::Tensor rows = at::empty({size_, flat.numel()}, flat.options());
  all_gather_into(p, flat, rows, name);
  const auto rop = op.op_;
  p.finish.push_back([flat, rows, rop]() { flat.copy_(reduce_rows(rows, rop)); });
}

void MeshrtBackend::all_gather_into(Pending& p, const at::Tensor& in, const at::Tensor& out,
                                    const char* name) {
  at::Tensor fin = movable(in), fout = movable(out);
  if (fout.numel() != fin.numel() * size_) {
    fail(name, "the output holds " + std::to_string(out.numel()) + " elements, not " +
                   std::to_string(size_) + " x the input's " + std::to_string(in.numel()));
  }
  MESHRT_BORROW(hi, fin, name);
  MESHRT_BORROW(ho, fout, name);
  const Target tg = target(fin, name);
  meshrt_event_t ev = nullptr;
  check(meshrt_all_gather(tg.comm, hi.h, ho.h, tg.stream, &ev), name);
  p.add(ev, {fin, fout});
}

void MeshrtBackend::reduce_scatter_into(Pending& p, const at::Tensor& in, const at::Tensor& out,
                                        ReduceOp op, const char* name) {
  const auto t = in.scalar_type();
  if (in.numel() != out.numel() * size_) {
    fail(name, "the input holds " + std::to_string(in.numel()) + " elements, not " +
                   std::to_string(size_) + " x the output's " + std::to_string(out.numel()));
  }
  meshrt_reduce_op_t mop = MESHRT_SUM;
  if (!reducible(t) || !(native(op.op_, &mop) || op == ReduceOp::PREMUL_SUM)) {
    // Everything else goes through an all-reduce of the whole input (refusals happen there).
    at::Tensor whole = in.reshape({-1}).clone();
    all_reduce_into(p, whole, op, name);
    const int64_t n = out.numel(), r = rank_;
    at::Tensor fout = out.reshape({-1});
    p.finish.push_back([whole, fout, n, r]() { fout.copy_(whole.narrow(0, r * n, n)); });
    return;
  }
  at::Tensor fin = in.reshape({-1});
  if (op == ReduceOp::PREMUL_SUM) {
    fin = fin.clone();
    premultiply(fin, op);
  }
  at::Tensor fout = out.reshape({-1});
  MESHRT_BORROW(hi, fin, name);
  MESHRT_BORROW(ho, fout, name);
  const Target tg = target(fin, name);
  meshrt_event_t ev = nullptr;
  check(meshrt_reduce_scatter(tg.comm, hi.h, ho.h, mop, tg.stream, &ev), name);
  p.add(ev, {fin, fout});
}

void MeshrtBackend::broadcast_into(Pending& p, const at::Tensor& buf, int root, const char* name) {
  if (root < 0 || root >= size_) {
    fail(name, "root " + std::to_string(root) + " is not a rank of this group of " +
                   std::to_string(size_));
  }
  at::Tensor flat = movable(buf);
  MESHRT_BORROW(h, flat, name);
  const Target tg = target(flat, name);
  meshrt_event_t ev = nullptr;
  check(meshrt_broadcast(tg.comm, h.h, h.h, root, tg.stream, &ev), name);
  p.add(ev, {flat});
}

void MeshrtBackend::all_to_all_into(Pending& p, const at::Tensor& in, const at::Tensor& out,
                                    const char* name) {
  at::Tensor fin = movable(in), fout = movable(out);
  if (fin.numel() != fout.numel() || fin.numel() % size_ != 0) {
    fail(name, "input and output must hold the same number of elements, divisible by the " +
                   std::to_string(size_) + " ranks (input " + std::to_string(in.numel()) +
                   ", output " + std::to_string(out.numel()) + ")");
  }
  MESHRT_BORROW(hi, fin, name);
  MESHRT_BORROW(ho, fout, name);
  const Target tg = target(fin, name);
  meshrt_event_t ev = nullptr;
  check(meshrt_all_to_all(tg.comm, hi.h, ho.h, tg.stream, &ev), name);
  p.add(ev, {fin, fout});
}

// Uneven splits (in elements): every rank pads its blocks to the largest block of any rank.
void MeshrtBackend::all_to_all_uneven(Pending& p, const at::Tensor& in, const at::Tensor& out,
                                      std::vector<int64_t> out_splits,
                                      std::vector<int64_t> in_splits, const char* name) {
  int64_t local = 0;
  for (int64_t v : in_splits) local = std::max(local, v);
  for (int64_t v : out_splits) local = std::max(local, v);
  at::Tensor m = at::full({1}, local, at::kLong);
  {
    const InlineScope inline_scope(true);  // waited for right here
    Pending q;
    all_reduce_into(q, m, ReduceOp(ReduceOp::MAX), name);
    c10::make_intrusive<MeshrtWork>(rank_, c10d::OpType::ALLTOALL_BASE, name, std::move(q),
                                    std::weak_ptr<Completer>())
        ->wait();
  }
  const int64_t block = m.item<int64_t>();
  at::Tensor fin = movable(in), fout = movable(out);
  const int64_t scale = fin.numel() / std::max<int64_t>(in.numel(), 1);  // bytes per element
  at::Tensor send = at::zeros({size_, block * scale}, fin.options());
  at::Tensor recv = at::empty({size_, block * scale}, fin.options());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t n = in_splits[static_cast<size_t>(r)] * scale;
    send[r].narrow(0, 0, n).copy_(fin.narrow(0, off, n));
    off += n;
  }
  all_to_all_into(p, send, recv, name);
  p.finish.push_back([recv, fout, out_splits, scale]() {
    int64_t o = 0;
    for (size_t r = 0; r < out_splits.size(); ++r) {
      const int64_t n = out_splits[r] * scale;
      fout.narrow(0, o, n).copy_(recv[static_cast<int64_t>(r)].narrow(0, 0, n));
      o += n;
    }
  });
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::make_work(c10d::OpType type, const char* op,
                                                        Pending p) {
  return c10::make_intrusive<MeshrtWork>(rank_, type, op, std::move(p), completer_);
}

// ---- MeshrtBackend: torch's collectives
// ----------------------------------------------------------

c10::intrusive_ptr<c10d::Work> MeshrtBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  Pending p;
  for (auto& t : tensors) {
    check_tensor(t, "broadcast");
    broadcast_into(p, out_buffer(p, t, true), static_cast<int>(opts.rootRank), "broadcast");
  }
  p.outputs = tensors;
  return make_work(c10d::OpType::BROADCAST, "broadcast", std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  Pending p;
  for (auto& t : tensors) {
    check_tensor(t, "all_reduce");
    all_reduce_into(p, out_buffer(p, t, true), opts.reduceOp, "all_reduce");
  }
  p.outputs = tensors;
  return make_work(c10d::OpType::ALLREDUCE, "all_reduce", std::move(p));
}

// One all-reduce over the tensors packed together when they share a dtype, else one each.
c10::intrusive_ptr<c10d::Work> MeshrtBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  const char* name = "all_reduce_coalesced";
  Pending p;
  bool same = !tensors.empty();
  for (auto& t : tensors) {
    check_tensor(t, name);
    same = same && t.scalar_type() == tensors[0].scalar_type();
  }
  if (same && tensors.size() > 1) {
    std::vector<at::Tensor> flats;
    for (auto& t : tensors) flats.push_back(t.reshape({-1}));
    at::Tensor packed = at::cat(flats);
    all_reduce_into(p, packed, opts.reduceOp, name);
    std::vector<at::Tensor> outs = tensors;
    p.finish.push_back([packed, outs]() {
      int64_t off = 0;
      for (const auto& t : outs) {
        t.copy_(packed.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
      }
    });
  } else {
    for (auto& t : tensors) all_reduce_into(p, out_buffer(p, t, true), opts.reduceOp, name);
  }
  p.outputs = tensors;
  return make_work(c10d::OpType::ALLREDUCE_COALESCED, name, std::move(p));
}

// meshrt has no rooted reduce: an all-reduce, into a copy on the other ranks.
c10::intrusive_ptr<c10d::Work> MeshrtBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  Pending p;
  if (opts.rootRank < 0 || opts.rootRank >= size_) {
    fail("reduce", "root " + std::to_string(opts.rootRank) + " is not a rank of this group of " +
                       std::to_string(size_));
  }
  for (auto& t : tensors) {
    check_tensor(t, "reduce");
    at::Tensor buf = rank_ == opts.rootRank ? out_buffer(p, t, true) : t.contiguous().clone();
    all_reduce_into(p, buf, opts.reduceOp, "reduce");
  }
  p.outputs = tensors;
  return make_work(c10d::OpType::REDUCE, "reduce", std::move(p));
}

namespace {
// Copies block r of a flat gathered buffer into outs[r] (each of n elements).
void unpack_blocks(const at::Tensor& flat, const std::vector<at::Tensor>& outs, int64_t n) {
  for (size_t r = 0; r < outs.size(); ++r) {
    outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  }
}
}  // namespace

c10::intrusive_ptr<c10d::Work> MeshrtBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = "all_gather";
  const InlineScope inline_scope(waited_at_once(opts, 0));
  if (outputs.size() != inputs.size()) fail(name, "one output list per input is needed");
  Pending p;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], name);
    if (outputs[i].size() != static_cast<size_t>(size_)) {
      fail(name, "the output list holds " + std::to_string(outputs[i].size()) +
                     " tensors, not one per rank (" + std::to_string(size_) + ")");
    }
    at::Tensor in = inputs[i].contiguous().reshape({-1});
    for (auto& o : outputs[i]) {
      check_tensor(o, name);
      if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type()) {
        fail(name, "every output must match the input (" + std::to_string(in.numel()) + " " +
                       dtype_name(in.scalar_type()) + "), got " + std::to_string(o.numel()) + " " +
                       dtype_name(o.scalar_type()));
      }
    }
    at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
    all_gather_into(p, in, flat, name);
    std::vector<at::Tensor> outs = outputs[i];
    const int64_t n = in.numel();
    p.finish.push_back([flat, outs, n]() { unpack_blocks(flat, outs, n); });
    p.outputs.insert(p.outputs.end(), outs.begin(), outs.end());
  }
  return make_work(c10d::OpType::ALLGATHER, name, std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = "all_gather_into_tensor";
  const InlineScope inline_scope(waited_at_once(opts, 0));
  if (outputs.size() != inputs.size()) fail(name, "one output per input is needed");
  Pending p;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], name);
    check_tensor(outputs[i], name);
    if (inputs[i].scalar_type() != outputs[i].scalar_type()) {
      fail(name, "the output is " + dtype_name(outputs[i].scalar_type()) + ", the input " +
                     dtype_name(inputs[i].scalar_type()));
    }
    all_gather_into(p, inputs[i].contiguous(), out_buffer(p, outputs[i], false), name);
  }
  p.outputs = outputs;
  return make_work(c10d::OpType::_ALLGATHER_BASE, name, std::move(p));
}

// meshrt has no rooted gather: an all-gather whose blocks only the root keeps.
c10::intrusive_ptr<c10d::Work> MeshrtBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  const char* name = "gather";
  if (inputs.size() != 1) fail(name, "exactly one input tensor is needed");
  check_tensor(inputs[0], name);
  const bool root = rank_ == opts.rootRank;
  if (root && (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_))) {
    fail(name, "the root needs one output list of " + std::to_string(size_) + " tensors");
  }
  Pending p;
  at::Tensor in = inputs[0].contiguous().reshape({-1});
  at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
  all_gather_into(p, in, flat, name);
  if (root) {
    std::vector<at::Tensor> outs = outputs[0];
    const int64_t n = in.numel();
    p.finish.push_back([flat, outs, n]() { unpack_blocks(flat, outs, n); });
    p.outputs = outs;
  }
  return make_work(c10d::OpType::GATHER, name, std::move(p));
}

// meshrt has no scatter: the root broadcasts every block, each rank keeps its own.
c10::intrusive_ptr<c10d::Work> MeshrtBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  const char* name = "scatter";
  if (outputs.size() != 1) fail(name, "exactly one output tensor is needed");
  check_tensor(outputs[0], name);
  const bool root = rank_ == opts.rootRank;
  if (root && (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_))) {
    fail(name, "the root needs one input list of " + std::to_string(size_) + " tensors");
  }
  Pending p;
  const int64_t n = outputs[0].numel();
  at::Tensor flat;
  if (root) {
    std::vector<at::Tensor> flats;
    for (auto& t : inputs[0]) flats.push_back(t.reshape({-1}));
    flat = at::cat(flats);
  } else {
    flat = at::empty({size_ * n}, outputs[0].options());
  }
  broadcast_into(p, flat, static_cast<int>(opts.rootRank), name);
  at::Tensor out = outputs[0];
  const int64_t r = rank_;
  p.finish.push_back(
      [flat, out, n, r]() { out.copy_(flat.narrow(0, r * n, n).view(out.sizes())); });
  p.outputs = outputs;
  return make_work(c10d::OpType::SCATTER, name, std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter";
  const InlineScope inline_scope(waited_at_once(opts, 0));
  if (outputs.size() != inputs.size()) fail(name, "one input list per output is needed");
  Pending p;
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_tensor(outputs[i], name);
    if (inputs[i].size() != static_cast<size_t>(size_)) {
      fail(name, "the input list holds " + std::to_string(inputs[i].size()) +
                     " tensors, not one per rank (" + std::to_string(size_) + ")");
    }
    std::vector<at::Tensor> flats;
    for (auto& t : inputs[i]) {
      check_tensor(t, name);
      flats.push_back(t.reshape({-1}));
    }
    reduce_scatter_into(p, at::cat(flats), out_buffer(p, outputs[i], false), opts.reduceOp, name);
  }
  p.outputs = outputs;
  return make_work(c10d::OpType::REDUCE_SCATTER, name, std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor";
  const InlineScope inline_scope(waited_at_once(opts, 0));
  if (outputs.size() != inputs.size()) fail(name, "one output per input is needed");
  Pending p;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], name);
    check_tensor(outputs[i], name);
    reduce_scatter_into(p, inputs[i].contiguous(), out_buffer(p, outputs[i], false), opts.reduceOp,
                        name);
  }
  p.outputs = outputs;
  return make_work(c10d::OpType::_REDUCE_SCATTER_BASE, name, std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  const char* name = "all_to_all_single";
  const InlineScope inline_scope(waited_at_once(opts, 0));
  check_tensor(input, name);
  check_tensor(output, name);
  Pending p;
  at::Tensor in = input.contiguous();
  at::Tensor out = out_buffer(p, output, false);
  if (input_splits.empty() && output_splits.empty()) {
    all_to_all_into(p, in, out, name);
  } else {
    const auto sizes = [&](std::vector<int64_t> s, const at::Tensor& t) {
      const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
      const int64_t row = rows > 0 ? t.numel() / rows : 0;
      if (s.empty()) s.assign(static_cast<size_t>(size_), rows / size_);
      if (s.size() != static_cast<size_t>(size_)) {
        fail(name, "the splits name " + std::to_string(s.size()) + " ranks, the group has " +
                       std::to_string(size_));
      }
      int64_t total = 0;
      for (auto& v : s) {
        total += v;
        v *= row;
      }
      if (total != rows) {
        fail(name, "the splits add up to " + std::to_string(total) + " rows, the tensor has " +
                       std::to_string(rows));
      }
      return s;
    };
    all_to_all_uneven(p, in, out, sizes(output_splits, output), sizes(input_splits, input), name);
  }
  p.outputs = {output};
  return make_work(c10d::OpType::ALLTOALL_BASE, name, std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  const char* name = "all_to_all";
  const InlineScope inline_scope(waited_at_once(opts, 0));
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != inputs.size()) {
    fail(name,
         "one input and one output tensor per rank (" + std::to_string(size_) + ") are needed");
  }
  Pending p;
  std::vector<at::Tensor> ins;
  std::vector<int64_t> in_splits, out_splits;
  for (size_t r = 0; r < inputs.size(); ++r) {
    check_tensor(inputs[r], name);
    check_tensor(outputs[r], name);
    ins.push_back(inputs[r].reshape({-1}));
    in_splits.push_back(inputs[r].numel());
    out_splits.push_back(outputs[r].numel());
  }
  at::Tensor in = at::cat(ins);
  int64_t total = 0;
  for (int64_t v : out_splits) total += v;
  at::Tensor flat = at::empty({total}, in.options());
  const bool even = std::all_of(in_splits.begin(), in_splits.end(),
                                [&](int64_t v) { return v == in_splits[0]; }) &&
                    in_splits == out_splits;
  if (even) {
    all_to_all_into(p, in, flat, name);
  } else {
    all_to_all_uneven(p, in, flat, out_splits, in_splits, name);
  }
  std::vector<at::Tensor> outs = outputs;
  p.finish.push_back([flat, outs]() {
    int64_t off = 0;
    for (const auto& o : outs) {
      o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  });
  p.outputs = outputs;
  return make_work(c10d::OpType::ALLTOALL, name, std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                   int tag) {
  (void)tag;
  Pending p;
  for (auto& t : tensors) {
    check_tensor(t, "send");
    if (t.device().is_cuda())
      fail("send",
           "send of CUDA tensors is not supported by meshrt.torch (its collectives take them)");
    at::Tensor flat = movable(t.contiguous());
    MESHRT_BORROW(h, flat, "send");
    meshrt_event_t ev = nullptr;
    check(meshrt_send(comm_, h.h, dst, p2p_stream(true), &ev), "send");
    p.add(ev, {flat});
  }
  p.outputs = tensors;
  return make_work(c10d::OpType::SEND, "send", std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                   int tag) {
  (void)tag;
  Pending p;
  for (auto& t : tensors) {
    check_tensor(t, "recv");
    if (t.device().is_cuda())
      fail("recv",
           "recv of CUDA tensors is not supported by meshrt.torch (its collectives take them)");
    at::Tensor flat = movable(out_buffer(p, t, false));
    MESHRT_BORROW(h, flat, "recv");
    meshrt_event_t ev = nullptr;
    check(meshrt_recv(comm_, h.h, src, p2p_stream(false), &ev), "recv");
    p.add(ev, {flat});
  }
  p.outputs = tensors;
  return make_work(c10d::OpType::RECV, "recv", std::move(p));
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  (void)tensors;
  (void)tag;
  fail("recv", "receiving from any source is not supported (name the source rank)");
}

c10::intrusive_ptr<c10d::Work> MeshrtBackend::barrier(const c10d::BarrierOptions& opts) {
  const InlineScope inline_scope(waited_at_once(opts, 0));
  if (comm_ == nullptr) fail("barrier", "the process group was shut down");
  Pending p;
  meshrt_event_t ev = nullptr;
  check(meshrt_barrier(comm_, nullptr, &ev), "barrier");
  p.events.push_back(ev);
  return make_work(c10d::OpType::BARRIER, "barrier", std::move(p));
}

}  // namespace meshrt_torch
