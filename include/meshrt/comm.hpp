// meshrt's public C++ API: communicators, streams, events and collectives over the C API's
// handles (see meshrt.h for each call's contract: in-place forms, 0-element tensors, MPI's thread
// level, which communicator a stream belongs to). Every failure throws meshrt::Error.
#ifndef MESHRT_COMM_HPP_
#define MESHRT_COMM_HPP_

#include <meshrt/meshrt.h>
#include <meshrt/tensor.hpp>

#include <string>
#include <vector>

namespace meshrt {
namespace api_v1 {

// The completion of enqueued work; carries that work's errors. Destroying an Event (the object
// going out of scope) does not wait for the work, which runs on: only synchronize() waits.
class Event {
 public:
  Event() = default;
  explicit Event(meshrt_event_t h) noexcept : h_(h) {}
  // Blocks until the work is done; throws its error (a timeout, a peer's failure).
  void synchronize() const {
    check(meshrt_event_synchronize(h_.get()), "meshrt_event_synchronize");
  }
  bool done() const {
    int d = 0;
    check(meshrt_event_query(h_.get(), &d), "meshrt_event_query");
    return d != 0;
  }
  meshrt_event_t get() const noexcept { return h_.get(); }
  // Gives up ownership: the caller destroys the returned handle (meshrt_event_destroy).
  meshrt_event_t release() noexcept { return h_.release(); }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  detail::Handle<meshrt_event_t, meshrt_event_destroy> h_;
};

// An in-order queue of one communicator (Comm::new_stream, Comm::wrap_stream, or the
// communicator's default stream, borrowed: Comm::default_stream). Destroy a stream before its
// communicator; a stream that outlived it is refused by every call. Calls given no stream use
// the communicator's default stream.
class Stream {
 public:
  Stream() = default;
  // Takes ownership of a C handle (destroyed, after its work, with the object).
  explicit Stream(meshrt_stream_t h) noexcept : h_(h) {}
  // A stream someone else owns (a communicator's default stream): never destroyed here.
  static Stream borrow(meshrt_stream_t h) noexcept {
    Stream s;
    s.h_ = detail::Handle<meshrt_stream_t, meshrt_stream_destroy>::borrow(h);
    return s;
  }
  void synchronize() const {
    check(meshrt_stream_synchronize(h_.get()), "meshrt_stream_synchronize");
  }
  // Later work on this stream starts after `e`.
  void wait(const Event& e) const {
    check(meshrt_stream_wait_event(h_.get(), e.get()), "meshrt_stream_wait_event");
  }
  meshrt_stream_t get() const noexcept { return h_.get(); }
  // Whether the object destroys the stream (false for a borrowed one).
  bool owned() const noexcept { return h_.owned(); }
  // Gives up ownership: the caller destroys the returned handle (meshrt_stream_destroy).
  meshrt_stream_t release() noexcept { return h_.release(); }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  detail::Handle<meshrt_stream_t, meshrt_stream_destroy> h_;
};

// The id that names a world of threads (meshrt_get_unique_id): made by one rank, given to all.
inline meshrt_unique_id_t unique_id() {
  init();
  meshrt_unique_id_t id;
  check(meshrt_get_unique_id(&id), "meshrt_get_unique_id");
  return id;
}

// A config with every default (MESHRT_COMM_CONFIG_INITIALIZER); set fields, then pass it.
inline meshrt_comm_config_t comm_config() {
  meshrt_comm_config_t c = MESHRT_COMM_CONFIG_INITIALIZER;
  return c;
}

// A rank's device (meshrt_comm_device): CPU ranks as threads are cpu:<rank>.
struct Device {
  meshrt_device_type_t type = MESHRT_DEVICE_CPU;
  int index = 0;
};

// One rank's communicator (meshrt_comm_t). Move-only. An owned one is destroyed (after its work)
// with the object; a borrowed one (Comm::borrow, Mesh::comm) runs every call the same but is
// never destroyed by it.
class Comm {
 public:
  Comm() = default;
  // Takes ownership of a C handle.
  explicit Comm(meshrt_comm_t h) noexcept : h_(h) {}
  // A communicator someone else owns (a mesh's dim communicator, a handle the engine keeps and
  // destroys itself): collectives run on it, and the object never destroys it.
  static Comm borrow(meshrt_comm_t h) noexcept {
    Comm c;
    c.h_ = detail::Handle<meshrt_comm_t, meshrt_comm_destroy>::borrow(h);
    return c;
  }

  // Rank `rank` of the `nranks` threads of world `id`; call from each rank's thread (collective).
  static Comm init_rank(int nranks, const meshrt_unique_id_t& id, int rank,
                        const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_rank(&h, nranks, id, rank, &config), "meshrt_comm_init_rank");
    return Comm(h);
  }
  // All `n` ranks of a new world from one thread (element i is rank i); `devices` empty: CPU
  // ranks (or GPUs 0..n-1 with a CUDA config), else rank i's GPU.
  static std::vector<Comm> init_all(int n, const meshrt_comm_config_t& config = comm_config(),
                                    const std::vector<int>& devices = {}) {
    init();
    std::vector<meshrt_comm_t> hs(static_cast<size_t>(n > 0 ? n : 0));
    check(meshrt_comm_init_all(hs.data(), n, devices.empty() ? nullptr : devices.data(), &config),
          "meshrt_comm_init_all");
    std::vector<Comm> out;
    for (meshrt_comm_t h : hs) out.emplace_back(h);
    return out;
  }
  // This process's rank of an MPI job (loads the libmeshrt-mpi.so plugin; see meshrt.h).
  // `mpi_comm`: an MPI_Comm* (as void*) congruent to MPI_COMM_WORLD, or nullptr for it.
  static Comm init_mpi(const meshrt_comm_config_t& config = comm_config(),
                       void* mpi_comm = nullptr) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_mpi(&h, mpi_comm, &config), "meshrt_comm_init_mpi");
    return Comm(h);
  }
  // Rank `rank` of `nranks` processes meeting through files in `dir` (collective).
  static Comm init_file(const std::string& dir, int nranks, int rank,
                        const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_file(&h, dir.c_str(), nranks, rank, &config), "meshrt_comm_init_file");
    return Comm(h);
  }
  // Rank `rank` of `nranks` processes meeting over TCP at rank 0's host:port (collective).
  static Comm init_tcp(const std::string& host, int port, int nranks, int rank,
                       const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_tcp(&h, host.c_str(), port, nranks, rank, &config),
          "meshrt_comm_init_tcp");
    return Comm(h);
  }
  // This process's rank as its launcher started it (meshrt_comm_init_env): mpirun / srun, or
  // torchrun's RANK / WORLD_SIZE with MESHRT_RENDEZVOUS or MASTER_ADDR / MASTER_PORT.
  static Comm init_env(const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_env(&h, &config), "meshrt_comm_init_env");
    return Comm(h);
  }
  // Wraps an engine's ncclComm_t (as void*) on CUDA device `device`, not owned by meshrt.
  static Comm adopt_nccl(void* nccl_comm, int device,
                         const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_adopt_nccl(&h, nccl_comm, device, &config), "meshrt_comm_adopt_nccl");
    return Comm(h);
  }

  int rank() const {
    int r = 0;
    check(meshrt_comm_rank(h_.get(), &r), "meshrt_comm_rank");
    return r;
  }
  int size() const {
    int s = 0;
    check(meshrt_comm_size(h_.get(), &s), "meshrt_comm_size");
    return s;
  }
  Device device() const {
    Device d;
    check(meshrt_comm_device(h_.get(), &d.type, &d.index), "meshrt_comm_device");
    return d;
  }
  // Fails this communicator's pending and later work (and that of every communicator sharing
  // its ranks) with MESHRT_ERROR_COMM; safe from any thread.
  void abort() const { check(meshrt_comm_abort(h_.get()), "meshrt_comm_abort"); }
  // Collective: the ranks with the same colour, ranked by (key, rank); an empty Comm for colour <
  // 0.
  Comm split(int color, int key) const {
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_split(h_.get(), color, key, &h), "meshrt_comm_split");
    return Comm(h);
  }
  Stream new_stream() const {
    meshrt_stream_t s = nullptr;
    check(meshrt_stream_create(h_.get(), &s), "meshrt_stream_create");
    return Stream(s);
  }
  // Wraps the engine's cudaStream_t (as void*), not owned (CUDA communicators only).
  Stream wrap_stream(void* native) const {
    meshrt_stream_t s = nullptr;
    check(meshrt_stream_wrap(h_.get(), native, &s), "meshrt_stream_wrap");
    return Stream(s);
  }
  // The communicator's default stream (what no stream means), borrowed: it goes with the
  // communicator.
  Stream default_stream() const {
    meshrt_stream_t s = nullptr;
    check(meshrt_comm_default_stream(h_.get(), &s), "meshrt_comm_default_stream");
    return Stream::borrow(s);
  }
  // A tensor of `shape` allocated by meshrt on this communicator's device.
  Tensor empty(const std::vector<int64_t>& shape, DLDataType dtype) const {
    meshrt_tensor_t t = nullptr;
    check(meshrt_tensor_empty(h_.get(), static_cast<int>(shape.size()), shape.data(), dtype, &t),
          "meshrt_tensor_empty");
    return Tensor(t);
  }

  // Collectives, enqueued on `stream` (nullptr: the default stream); the Event completes with them.
  Event all_reduce(const Tensor& send, const Tensor& recv, meshrt_reduce_op_t op = MESHRT_SUM,
                   const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_all_reduce(h_.get(), send.get(), recv.get(), op, s(stream), &e),
          "meshrt_all_reduce");
    return Event(e);
  }
  Event all_gather(const Tensor& send, const Tensor& recv, const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_all_gather(h_.get(), send.get(), recv.get(), s(stream), &e), "meshrt_all_gather");
    return Event(e);
  }
  Event reduce_scatter(const Tensor& send, const Tensor& recv, meshrt_reduce_op_t op = MESHRT_SUM,
                       const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_reduce_scatter(h_.get(), send.get(), recv.get(), op, s(stream), &e),
          "meshrt_reduce_scatter");
    return Event(e);
  }
  Event broadcast(const Tensor& send, const Tensor& recv, int root,
                  const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_broadcast(h_.get(), send.get(), recv.get(), root, s(stream), &e),
          "meshrt_broadcast");
    return Event(e);
  }
  Event all_to_all(const Tensor& send, const Tensor& recv, const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_all_to_all(h_.get(), send.get(), recv.get(), s(stream), &e), "meshrt_all_to_all");
    return Event(e);
  }
  // Point to point: a send completes once `peer` received it, so a rank that sends to and
  // receives from a peer posts the two on different streams.
  Event send(const Tensor& tensor, int peer, const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_send(h_.get(), tensor.get(), peer, s(stream), &e), "meshrt_send");
    return Event(e);
  }
  Event recv(const Tensor& tensor, int peer, const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_recv(h_.get(), tensor.get(), peer, s(stream), &e), "meshrt_recv");
    return Event(e);
  }
  Event barrier(const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_barrier(h_.get(), s(stream), &e), "meshrt_barrier");
    return Event(e);
  }

  meshrt_comm_t get() const noexcept { return h_.get(); }
  // Whether the object destroys the communicator (false for a borrowed one).
  bool owned() const noexcept { return h_.owned(); }
  // Gives up ownership: returns the C handle, which the caller now destroys
  // (meshrt_comm_destroy); the object is empty afterwards.
  meshrt_comm_t release() noexcept { return h_.release(); }
  // Destroys an owned communicator now (after its work), throwing when meshrt refuses (the
  // destructor cannot report it); a borrowed one is only let go. The object is empty afterwards.
  void destroy() { h_.destroy("meshrt_comm_destroy"); }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  static meshrt_stream_t s(const Stream* stream) { return stream ? stream->get() : nullptr; }
  detail::Handle<meshrt_comm_t, meshrt_comm_destroy> h_;
};

}  // namespace api_v1
// meshrt::Tensor, meshrt::Comm, ... in user code: api_v1 is a namespace of its own (not
// inline), so a file that also includes the library's internal headers (whose meshrt::Tensor,
// Stream, Event and Error are other types) compiles, and names these meshrt::api_v1::Tensor.
using namespace api_v1;
}  // namespace meshrt

#endif  // MESHRT_COMM_HPP_
