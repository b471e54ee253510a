// Streams, events and collectives of the C API: each call resolves its handles, checks what the
// C side can get wrong (devices, read-only outputs, ops) and enqueues the Communicator's call.
#include "capi/capi_internal.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/thread_inline.h"

namespace meshrt::capi {

namespace {

ReduceOp reduce_op(meshrt_reduce_op_t op) {
  switch (op) {
    case MESHRT_SUM:
      return ReduceOp::Sum;
    case MESHRT_AVG:
      return ReduceOp::Avg;
    case MESHRT_MAX:
      return ReduceOp::Max;
    case MESHRT_MIN:
      return ReduceOp::Min;
  }
  fail(MESHRT_ERROR_INVALID_ARGUMENT,
       "op " + std::to_string(static_cast<int>(op)) +
           " is not a meshrt_reduce_op_t: use MESHRT_SUM, MESHRT_AVG, MESHRT_MAX or MESHRT_MIN");
}

// The tensor `h` names, checked against `c`'s device; `write`: the call writes it.
Tensor tensor_for(const CommObj& c, meshrt_tensor_t h, const char* what, bool write) {
  auto t = find_tensor(h, what);
  const Device d = t->tensor.device();
  const Device cd = c.comm->device();
  CAPI_CHECK(d.type == cd.type && (d.is_cpu() || d.index == cd.index),
             MESHRT_ERROR_INVALID_ARGUMENT,
             what << " " << t->tensor.str() << " is on " << d.str() << " but the communicator '"
                  << c.comm->name() << "' (rank " << c.comm->rank() << ") runs on " << cd.str()
                  << ": pass a tensor on the communicator's device");
  CAPI_CHECK(!write || !t->read_only, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " " << t->tensor.str()
                  << " was handed in read-only (DLPack flag READ_ONLY) but this call writes it: "
                     "pass a writable tensor");
  return t->tensor;
}

// Runs the communicator call `f(comm, stream)` and hands out its event.
template <class F>
void collective(meshrt_comm_t comm, meshrt_stream_t stream, meshrt_event_t* event, F&& f) {
  if (event) *event = nullptr;
  auto c = find_comm(comm);
  std::shared_ptr<StreamObj> keep;
  Stream& s = resolve_stream(*c, stream, &keep);
  Event e = f(*c, s);
  emit_event(e, event);
}

std::shared_ptr<StreamObj> find_stream(meshrt_stream_t h) {
  return find_handle<StreamObj>(h, Kind::Stream, "stream");
}

// Send / recv: `peer` must be another rank of the communicator.
void check_peer(const CommObj& c, int peer) {
  CAPI_CHECK(peer >= 0 && peer < c.comm->size() && peer != c.comm->rank(),
             MESHRT_ERROR_INVALID_ARGUMENT,
             "peer " << peer << " is not another rank of communicator '" << c.comm->name()
                     << "' (rank " << c.comm->rank() << " of " << c.comm->size() << ")");
}

// "rank 0 of communicator 'world' (0x...)": the handle tells apart worlds of the same name.
std::string owner_name(const CommObj& c) {
  std::ostringstream os;
  os << "rank " << c.ctx->rank() << " of communicator '" << c.comm->name() << "' ("
     << static_cast<const void*>(&c) << ")";
  return os.str();
}

}  // namespace

Stream& resolve_stream(const CommObj& c, meshrt_stream_t h, std::shared_ptr<StreamObj>* keep) {
  if (h == nullptr) return c.ctx->compute_stream();
  *keep = find_stream(h);
  Stream& s = *(*keep)->stream;
  const std::shared_ptr<const Context> owner = (*keep)->owner.lock();
  CAPI_CHECK(owner != nullptr, MESHRT_ERROR_INVALID_USAGE,
             "stream '" << s.name() << "' was created for " << (*keep)->owner_name
                        << ", which was destroyed: a stream does not outlive its communicator; "
                        << "destroy the stream and pass one created from this call's "
                        << "communicator (meshrt_stream_create, meshrt_comm_default_stream)");
  CAPI_CHECK(owner == c.ctx, MESHRT_ERROR_INVALID_ARGUMENT,
             "stream '" << s.name() << "' belongs to " << (*keep)->owner_name
                        << ", not to this call's " << owner_name(c)
                        << ": pass a stream created from this rank's communicator "
                        << "(meshrt_stream_create, meshrt_comm_default_stream)");
  const Device d = s.device();
  const Device cd = c.comm->device();
  CAPI_CHECK(d.type == cd.type && (d.is_cpu() || d.index == cd.index),
             MESHRT_ERROR_INVALID_ARGUMENT,
             "stream '" << s.name() << "' is on " << d.str() << " but the communicator runs on "
                        << cd.str() << ": create the stream from this communicator");
  return s;
}

void set_owner(StreamObj& s, const CommObj& c) {
  s.owner = c.ctx;
  s.owner_name = owner_name(c);
}

void emit_event(const Event& e, meshrt_event_t* out) {
  if (!out) return;
  auto obj = std::make_shared<EventObj>();
  obj->event = e;
  *out = static_cast<meshrt_event_t>(Registry::get().add(Kind::Event, obj));
}

}  // namespace meshrt::capi

using namespace meshrt;
using namespace meshrt::capi;

extern "C" {

// ---- streams and events ----

meshrt_status_t meshrt_stream_create(meshrt_comm_t comm, meshrt_stream_t* stream) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    CAPI_CHECK(stream != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "stream is NULL: pass the address of a meshrt_stream_t");
    *stream = nullptr;
    const Device d = c->comm->device();
    auto obj = std::make_shared<StreamObj>();
    obj->owned = backend_for(d).create_stream(d.index, "capi");
    obj->stream = obj->owned.get();
    set_owner(*obj, *c);
    *stream = static_cast<meshrt_stream_t>(Registry::get().add(Kind::Stream, obj));
  });
}

meshrt_status_t meshrt_stream_wrap(meshrt_comm_t comm, void* native, meshrt_stream_t* stream) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    CAPI_CHECK(stream != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "stream is NULL: pass the address of a meshrt_stream_t");
    *stream = nullptr;
    const Device d = c->comm->device();
    CAPI_CHECK(d.is_cuda(), MESHRT_ERROR_UNSUPPORTED,
               "meshrt_stream_wrap wraps a cudaStream_t, but communicator '"
                   << c->comm->name() << "' runs on " << d.str()
                   << " (host streams have no native handle): use meshrt_stream_create");
    auto obj = std::make_shared<StreamObj>();
    obj->owned = backend_for(d).wrap_stream(d.index, native, "capi.external");
    obj->stream = obj->owned.get();
    set_owner(*obj, *c);
    *stream = static_cast<meshrt_stream_t>(Registry::get().add(Kind::Stream, obj));
  });
}

meshrt_status_t meshrt_comm_default_stream(meshrt_comm_t comm, meshrt_stream_t* stream) {
  return guarded(__func__, [&] {
    auto c = find_comm(comm);
    CAPI_CHECK(stream != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "stream is NULL: pass the address of a meshrt_stream_t");
    *stream = static_cast<meshrt_stream_t>(c->default_stream_handle);
  });
}

meshrt_status_t meshrt_stream_synchronize(meshrt_stream_t stream) {
  return guarded(__func__, [&] { find_stream(stream)->stream->synchronize(); });
}

meshrt_status_t meshrt_stream_wait_event(meshrt_stream_t stream, meshrt_event_t event) {
  return guarded(__func__, [&] {
    auto s = find_stream(stream);
    auto e = find_handle<EventObj>(event, Kind::Event, "event");
    s->stream->wait(e->event);
  });
}

meshrt_status_t meshrt_stream_destroy(meshrt_stream_t stream) {
  return guarded(__func__, [&] {
    if (stream == nullptr) return;
    auto s = find_stream(stream);
    CAPI_CHECK(!s->is_default, MESHRT_ERROR_INVALID_USAGE,
               "stream is a communicator's default stream: it goes with meshrt_comm_destroy");
    Registry::get().remove(stream, Kind::Stream);
    try {
      s->stream->synchronize();
    } catch (...) {
      // the work's errors were reported through its events
    }
  });
}

meshrt_status_t meshrt_event_synchronize(meshrt_event_t event) {
  return guarded(__func__,
                 [&] { find_handle<EventObj>(event, Kind::Event, "event")->event.synchronize(); });
}

meshrt_status_t meshrt_event_query(meshrt_event_t event, int* done) {
  return guarded(__func__, [&] {
    auto e = find_handle<EventObj>(event, Kind::Event, "event");
    CAPI_CHECK(done != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
               "done is NULL: pass the address of an int");
    *done = e->event.query() ? 1 : 0;
  });
}

meshrt_status_t meshrt_event_destroy(meshrt_event_t event) {
  return guarded(__func__, [&] {
    if (event == nullptr) return;
    CAPI_CHECK(Registry::get().remove(event, Kind::Event) != nullptr, MESHRT_ERROR_INVALID_USAGE,
               "event (" << static_cast<void*>(event)
                         << ") is not a live event handle: it was destroyed already or never "
                            "created by meshrt");
  });
}

meshrt_status_t meshrt_thread_inline(int on, int* previous) {
  return guarded(__func__, [&] {
    CAPI_CHECK(on == 0 || on == 1, MESHRT_ERROR_INVALID_ARGUMENT,
               "on is " << on << ": pass 1 (run calls on idle CPU streams on this thread) or 0");
    const bool prev = set_thread_inline(on == 1);
    if (previous) *previous = prev ? 1 : 0;
  });
}

// ---- collectives ----

meshrt_status_t meshrt_all_reduce(meshrt_comm_t comm, meshrt_tensor_t send, meshrt_tensor_t recv,
                                  meshrt_reduce_op_t op, meshrt_stream_t stream,
                                  meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      const ReduceOp rop = reduce_op(op);
      return c.comm->all_reduce(tensor_for(c, send, "send", send == recv),
                                tensor_for(c, recv, "recv", true), rop, s);
    });
  });
}

meshrt_status_t meshrt_all_gather(meshrt_comm_t comm, meshrt_tensor_t send, meshrt_tensor_t recv,
                                  meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      return c.comm->all_gather(tensor_for(c, send, "send", false),
                                tensor_for(c, recv, "recv", true), s);
    });
  });
}

meshrt_status_t meshrt_reduce_scatter(meshrt_comm_t comm, meshrt_tensor_t send,
                                      meshrt_tensor_t recv, meshrt_reduce_op_t op,
                                      meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      const ReduceOp rop = reduce_op(op);
      return c.comm->reduce_scatter(tensor_for(c, send, "send", false),
                                    tensor_for(c, recv, "recv", true), rop, s);
    });
  });
}

meshrt_status_t meshrt_broadcast(meshrt_comm_t comm, meshrt_tensor_t send, meshrt_tensor_t recv,
                                 int root, meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      CAPI_CHECK(root >= 0 && root < c.comm->size(), MESHRT_ERROR_INVALID_ARGUMENT,
                 "root " << root << " is outside [0, " << c.comm->size() << ") of communicator '"
                         << c.comm->name() << "'");
      const Tensor out = tensor_for(c, recv, "recv", true);
      if (send == nullptr || send == recv) return c.comm->broadcast(out, root, s);
      return c.comm->broadcast(tensor_for(c, send, "send", false), out, root, s);
    });
  });
}

meshrt_status_t meshrt_all_to_all(meshrt_comm_t comm, meshrt_tensor_t send, meshrt_tensor_t recv,
                                  meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      return c.comm->all_to_all(tensor_for(c, send, "send", send == recv),
                                tensor_for(c, recv, "recv", true), s);
    });
  });
}

meshrt_status_t meshrt_send(meshrt_comm_t comm, meshrt_tensor_t tensor, int peer,
                            meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      check_peer(c, peer);
      return c.comm->send(tensor_for(c, tensor, "tensor", false), peer, s);
    });
  });
}

meshrt_status_t meshrt_recv(meshrt_comm_t comm, meshrt_tensor_t tensor, int peer,
                            meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) {
      check_peer(c, peer);
      return c.comm->recv(tensor_for(c, tensor, "tensor", true), peer, s);
    });
  });
}

meshrt_status_t meshrt_barrier(meshrt_comm_t comm, meshrt_stream_t stream, meshrt_event_t* event) {
  return guarded(__func__, [&] {
    collective(comm, stream, event, [&](CommObj& c, Stream& s) { return c.comm->barrier(s); });
  });
}

}  // extern "C"
