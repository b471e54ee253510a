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
inline namespace api_v1 {

// The completion of enqueued work; carries that work's errors.
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
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  detail::Handle<meshrt_event_t, meshrt_event_destroy> h_;
};

// An in-order queue of one communicator (meshrt_stream_create); destroy it before the
// communicator. Calls given no stream use the communicator's default stream.
class Stream {
 public:
  Stream() = default;
  explicit Stream(meshrt_stream_t h) noexcept : h_(h) {}
  void synchronize() const {
    check(meshrt_stream_synchronize(h_.get()), "meshrt_stream_synchronize");
  }
  // Later work on this stream starts after `e`.
  void wait(const Event& e) const {
    check(meshrt_stream_wait_event(h_.get(), e.get()), "meshrt_stream_wait_event");
  }
  meshrt_stream_t get() const noexcept { return h_.get(); }

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

// One rank's communicator (meshrt_comm_t). Move-only; destroyed (after its work) with the object.
class Comm {
 public:
  Comm() = default;
  explicit Comm(meshrt_comm_t h) noexcept : h_(h) {}

  // Rank `rank` of the `nranks` threads of world `id`; call from each rank's thread (collective).
  static Comm init_rank(int nranks, const meshrt_unique_id_t& id, int rank,
                        const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_rank(&h, nranks, id, rank, &config), "meshrt_comm_init_rank");
    return Comm(h);
  }
  // All `n` ranks of a new world from one thread (element i is rank i).
  static std::vector<Comm> init_all(int n, const meshrt_comm_config_t& config = comm_config()) {
    init();
    std::vector<meshrt_comm_t> hs(static_cast<size_t>(n > 0 ? n : 0));
    check(meshrt_comm_init_all(hs.data(), n, nullptr, &config), "meshrt_comm_init_all");
    std::vector<Comm> out;
    for (meshrt_comm_t h : hs) out.emplace_back(h);
    return out;
  }
  // This process's rank of an MPI job (loads the libmeshrt-mpi.so plugin; see meshrt.h).
  static Comm init_mpi(const meshrt_comm_config_t& config = comm_config()) {
    init();
    meshrt_comm_t h = nullptr;
    check(meshrt_comm_init_mpi(&h, nullptr, &config), "meshrt_comm_init_mpi");
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
  Event barrier(const Stream* stream = nullptr) const {
    meshrt_event_t e = nullptr;
    check(meshrt_barrier(h_.get(), s(stream), &e), "meshrt_barrier");
    return Event(e);
  }

  meshrt_comm_t get() const noexcept { return h_.get(); }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  static meshrt_stream_t s(const Stream* stream) { return stream ? stream->get() : nullptr; }
  detail::Handle<meshrt_comm_t, meshrt_comm_destroy> h_;
};

}  // namespace api_v1
}  // namespace meshrt

#endif  // MESHRT_COMM_HPP_
