// What the C API's source files share: the status error, the one exception boundary, the live
// handle registry and the objects behind the opaque handles.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "collectives/bootstrap_transport.h"
#include "collectives/communicator.h"
#include "meshrt/meshrt.h"
#include "runtime/context.h"
#include "runtime/logging.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt::capi {

// An error with the status the C caller gets; raised by the C API's own checks.
class StatusError : public std::exception {
 public:
  StatusError(meshrt_status_t status, std::string message)
      : status_(status), message_(std::move(message)) {}
  meshrt_status_t status() const { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  meshrt_status_t status_;
  std::string message_;
};

[[noreturn]] void fail(meshrt_status_t status, const std::string& message);

// Records `message` as the calling thread's last error ("<fn>: <message>") and returns status.
meshrt_status_t set_error(meshrt_status_t status, const char* fn, const std::string& message);

// Maps the exception being handled to a status and records its message (call in a catch block).
meshrt_status_t status_from_current_exception(const char* fn);

// The one boundary between C callers and C++: runs f, turning every exception into a status and
// a message. No exception leaves it.
template <class F>
meshrt_status_t guarded(const char* fn, F&& f) noexcept {
  try {
    f();
    return MESHRT_SUCCESS;
  } catch (...) {
    return status_from_current_exception(fn);
  }
}

}  // namespace meshrt::capi

// CAPI_CHECK(cond, MESHRT_ERROR_INVALID_ARGUMENT, "rank " << r << " ...")
#define CAPI_CHECK(cond, status, msg)               \
  do {                                              \
    if (!(cond)) {                                  \
      std::ostringstream capi_os_;                  \
      capi_os_ << msg;                              \
      ::meshrt::capi::fail(status, capi_os_.str()); \
    }                                               \
  } while (0)

namespace meshrt::capi {

// ---- objects behind the handles ----

struct CommObj {
  // Declared first, destroyed last: the default stream and allocator outlive the communicator.
  std::shared_ptr<Context> ctx;
  // Process launches: the transport lives as long as the communicator (backends may keep it).
  std::shared_ptr<BootstrapTransport> transport;
  // Owned, or (a mesh's dim communicator) aliasing the mesh that owns it.
  std::shared_ptr<Communicator> comm;
  void* default_stream_handle = nullptr;  // its StreamObj's handle, removed with the comm
  bool mesh_owned = false;                // handed out by meshrt_mesh_comm: the mesh frees it
};

struct StreamObj {
  Stream* stream = nullptr;
  std::unique_ptr<Stream> owned;  // created by meshrt_stream_create / wrap
  std::shared_ptr<Context> keep;  // default streams: the context owning the stream
  bool is_default = false;
  // The rank's context it was created for (the communicator's): another rank's communicator
  // refuses it, as work of two ranks queued on one stream waits for itself; so does every
  // communicator once that one was destroyed (a new context may reuse the old one's address).
  std::weak_ptr<const Context> owner;
  // "rank 0 of communicator 'world' (0x...)": the handle it was created from
  std::string owner_name;
};

struct EventObj {
  Event event;
};

struct TensorObj {
  Tensor tensor;
  bool read_only = false;
};

enum class Kind { Comm, Stream, Event, Tensor, Mesh, Mlp, Attn };
const char* kind_name(Kind k);  // "communicator", ...

// Every live handle of the process: a handle is the address of its object, and a call finds the
// object here before touching it, so a destroyed or invented handle is an error, not a crash.
class Registry {
 public:
  static Registry& get();
  void* add(Kind kind, std::shared_ptr<void> obj);
  // The object behind `h`, kept alive for the caller; throws (argument `what`) when h is NULL or
  // not a live handle of this kind.
  std::shared_ptr<void> find(const void* h, Kind kind, const char* what);
  // Removes and returns it (nullptr when not live).
  std::shared_ptr<void> remove(const void* h, Kind kind);

 private:
  std::mutex mu_;
  std::unordered_map<const void*, std::pair<Kind, std::shared_ptr<void>>> live_;
};

template <class T>
std::shared_ptr<T> find_handle(const void* h, Kind kind, const char* what) {
  return std::static_pointer_cast<T>(Registry::get().find(h, kind, what));
}
// Also makes the calling thread's log lines (and those of streams it creates) carry the
// communicator's global rank: an engine may drive every rank from one thread.
inline std::shared_ptr<CommObj> find_comm(meshrt_comm_t h, const char* what = "comm") {
  auto c = find_handle<CommObj>(h, Kind::Comm, what);
  set_log_rank(c->ctx->rank(), c->ctx->world_size());
  return c;
}
inline std::shared_ptr<TensorObj> find_tensor(meshrt_tensor_t h, const char* what) {
  return find_handle<TensorObj>(h, Kind::Tensor, what);
}

// An output argument: NULL is refused naming it.
inline void check_out(const void* out, const char* what) {
  CAPI_CHECK(out != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " is NULL: pass the address of a handle to fill in");
}

// Checks every MESHRT_ variable meshrt reads (dist/environment.h, the command line's check too):
// meshrt_init and every communicator init call it. A bad value is MESHRT_ERROR_INVALID_ARGUMENT
// naming the variable, its value and what is accepted.
void check_environment_variables();

// Whether meshrt_init accepted the caller's API version; require_init throws when not.
std::atomic<bool>& initialized();
void require_init();

// Registers a new communicator object (context for its device, default stream) around `comm`.
meshrt_comm_t register_comm(std::unique_ptr<Communicator> comm, int local_ranks,
                            std::shared_ptr<BootstrapTransport> transport = nullptr);

// The stream `h` names for work of `c` (NULL: c's default stream); checks its device.
Stream& resolve_stream(const CommObj& c, meshrt_stream_t h, std::shared_ptr<StreamObj>* keep);

// Records `c`'s rank as the owner of stream `s` (resolve_stream refuses it for other ranks).
void set_owner(StreamObj& s, const CommObj& c);

// Stores a new event handle in *out (when out is not NULL).
void emit_event(const Event& e, meshrt_event_t* out);

}  // namespace meshrt::capi
